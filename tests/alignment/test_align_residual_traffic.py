"""An aligned layer's fp32_sum / fp32_carry traffic savings (issue #36), the same bits as before.

With rla's own ops, a layer i > 0 under ``fp32_sum`` runs its input norm and its residual RN(s) as
one ``rla.ops.rms_norm_and_round``, and under ``fp32_carry`` the add + norm does not form the
RN(x + r) nothing reads (``add_rms_norm(new_residual=False)``). ``rla.alignment.rmsnorm.SWITCHES``
turns both off, which is the code before the change; every test here compares the two:

- Qwen2 / Qwen3 / Llama tiny models under every ``fp32_sum`` row (and a ``rounded_sum`` row, where
  nothing changes): logits and every parameter gradient equal, bit for bit; the new ops called
  where they apply (layers - 1 fused input norms, an add + norm without its residual in every
  layer under ``fp32_carry``) and not elsewhere; no more kept for backward than before;
- gradient checkpointing and ``torch.compile(fullgraph=True, backend="aot_eager")`` on a
  two-layer model (the one-layer compile test in test_align_training.py has no layer i > 0);
- Gemma 3 (zero-centred norms) keeps its separate ops;
- on a GPU (``gpu`` marks): Qwen2 / Qwen3 on the fused kernels, the same comparison.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

import rla
from align_spec import tiny_model, tokens
from gemma_spec import tiny_gemma3
from rla import ops, profiles
from rla.alignment import rmsnorm
from saved_memory import kept_storages

FP32_SUM = [n for n in ("vllm", "rla", "sglang") if profiles.get(n).norm_residual == "fp32_sum"]
CUDA = torch.cuda.is_available() and importlib.util.find_spec("triton") is not None
BUILDERS = {"qwen2": lambda: tiny_model("qwen2"), "qwen3": lambda: tiny_model("qwen3"),
            "llama": lambda: tiny_model("llama"), "gemma3": tiny_gemma3}


def _step(model_fn, profile, on, monkeypatch, device="cpu", checkpointing=False, compile_=False, batch=2, seq=16):
    """One training step -> (logits, parameter gradients, bytes kept for backward, calls of the new
    ops: [fused input norms, add + norms without their residual])."""
    for name in rmsnorm.SWITCHES:
        monkeypatch.setitem(rmsnorm.SWITCHES, name, on)
    model = model_fn().train().to(device)
    if checkpointing:
        model.gradient_checkpointing_enable()
    rla.align(model, profile)
    ids = tokens(batch=batch, seq=seq).to(device)
    calls = [0, 0]
    plain_round, plain_add = ops.rms_norm_and_round, ops.add_rms_norm

    def rms_norm_and_round(*a, **k):
        calls[0] += 1
        return plain_round(*a, **k)

    def add_rms_norm(*a, **k):
        calls[1] += k.get("new_residual", True) is False
        return plain_add(*a, **k)

    if not compile_:  # the layers look the ops up at call time
        monkeypatch.setattr(ops, "rms_norm_and_round", rms_norm_and_round)
        monkeypatch.setattr(ops, "add_rms_norm", add_rms_norm)
    run = torch.compile(model, backend="aot_eager", fullgraph=True) if compile_ else model
    try:
        with kept_storages(model.parameters()) as kept:
            out = run(ids, labels=ids)
    finally:
        monkeypatch.setattr(ops, "rms_norm_and_round", plain_round)
        monkeypatch.setattr(ops, "add_rms_norm", plain_add)
    out.loss.backward()
    return out.logits.detach(), [p.grad for p in model.parameters()], sum(kept.values()), calls, model.config


def _equal(new, old):
    logits, grads, kept, _, _ = new
    logits_old, grads_old, kept_old, calls_old, _ = old
    assert calls_old == [0, 0]  # switched off: the separate ops
    assert torch.equal(logits, logits_old)
    assert all(g is not None and torch.equal(g, h) for g, h in zip(grads, grads_old))
    assert sum(g.abs().sum() > 0 for g in grads) > len(grads) // 2  # not a graph without gradients
    assert kept <= kept_old


@pytest.mark.parametrize("profile", FP32_SUM + ["vllm-eager"])
@pytest.mark.parametrize("family", ["qwen2", "qwen3", "llama"])
def test_aligned_model_bitwise_with_and_without_the_savings(family, profile, monkeypatch):
    new = _step(BUILDERS[family], profile, True, monkeypatch)
    old = _step(BUILDERS[family], profile, False, monkeypatch)
    _equal(new, old)
    p, layers = profiles.get(profile), new[4].num_hidden_layers
    fp32_sum, carry = p.norm_residual == "fp32_sum", p.residual_stream == "fp32_carry"
    assert new[3] == [layers - 1 if fp32_sum else 0, layers if carry and fp32_sum else 0]
    assert new[2] == old[2]  # the same tensors kept: s by the norm, x and s by the add + norm


def test_gradient_checkpointing_bitwise(monkeypatch):
    new = _step(BUILDERS["qwen3"], "vllm", True, monkeypatch, checkpointing=True)
    old = _step(BUILDERS["qwen3"], "vllm", False, monkeypatch, checkpointing=True)
    _equal(new, old)
    assert new[3][0] > 0  # the recomputed forward runs the new ops too


def test_torch_compile_two_layers_bitwise(monkeypatch):
    torch._dynamo.reset()
    two = lambda: tiny_model("qwen3", num_hidden_layers=2)  # noqa: E731  (layer 1 reads the fp32 sum)
    try:
        compiled = _step(two, "vllm", True, monkeypatch, compile_=True)
        compiled_old = _step(two, "vllm", False, monkeypatch, compile_=True)
        eager = _step(two, "vllm", True, monkeypatch)
        old = _step(two, "vllm", False, monkeypatch)
    finally:
        torch._dynamo.reset()
    assert eager[3] == [1, 2]
    _equal(compiled, compiled_old)  # kept bytes compared within one mode: AOT autograd keeps its own set
    _equal(eager, old)
    assert torch.equal(compiled[0], old[0]) and all(torch.equal(g, h) for g, h in zip(compiled[1], old[1]))


def test_zero_centred_layers_keep_their_ops(monkeypatch):
    new = _step(BUILDERS["gemma3"], "vllm", True, monkeypatch)
    old = _step(BUILDERS["gemma3"], "vllm", False, monkeypatch)
    _equal(new, old)
    assert new[3] == [0, 0]


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU and Triton")
@pytest.mark.parametrize("profile", FP32_SUM)
@pytest.mark.parametrize("family", ["qwen2", "qwen3"])
def test_aligned_model_bitwise_with_and_without_the_savings_gpu(family, profile, monkeypatch):
    new = _step(BUILDERS[family], profile, True, monkeypatch, device="cuda")
    old = _step(BUILDERS[family], profile, False, monkeypatch, device="cuda")
    _equal(new, old)
    assert new[2] == old[2] and new[3][0] == new[4].num_hidden_layers - 1


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU and Triton")
def test_torch_compile_two_layers_bitwise_gpu(monkeypatch):
    torch._dynamo.reset()
    two = lambda: tiny_model("qwen3", num_hidden_layers=2)  # noqa: E731
    try:
        compiled = _step(two, "vllm", True, monkeypatch, device="cuda", compile_=True)
        compiled_old = _step(two, "vllm", False, monkeypatch, device="cuda", compile_=True)
        old = _step(two, "vllm", False, monkeypatch, device="cuda")
    finally:
        torch._dynamo.reset()
    _equal(compiled, compiled_old)
    assert torch.equal(compiled[0], old[0]) and all(torch.equal(g, h) for g, h in zip(compiled[1], old[1]))
