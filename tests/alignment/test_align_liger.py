"""rla.align on a model Liger Kernel has patched, with the real liger-kernel package's own patch functions.

Liger's Triton kernels cannot run on a CPU machine (Triton finds no driver): a forward that calls
any of them raises. That is what makes these tests prove something on CPU: the Liger-patched
model fails before alignment; after ``rla.align`` its logits and gradients equal, bit for bit, those
of the same weights aligned without Liger, so no Liger kernel runs anywhere in the forward or
backward, and every region Liger patched was replaced. Liger's fused linear cross-entropy (the
``*ForCausalLM.forward`` it installs) stays, and without labels it computes plain logits on CPU;
with labels in training mode it is a Triton kernel, measured on the GPU instead
(``rla bench e2e``, the ``liger-flce`` arms).
"""

from __future__ import annotations

import importlib

import pytest
import torch

import rla
from align_spec import tiny_config, tiny_model, tokens

lk = pytest.importorskip("liger_kernel.transformers", reason="liger-kernel is in the test-frameworks extra")

FAMILIES = ("qwen2", "qwen3", "llama")
PREFIX = {"qwen2": "Qwen2", "qwen3": "Qwen3", "llama": "Llama"}


@pytest.fixture
def restore_transformers():
    """Liger's patch functions assign transformers' module globals and class attributes (the
    causal LM's forward) for the whole process; put every one of them back after the test."""
    saved = []
    for family in (*FAMILIES, "qwen3_moe"):
        modeling = importlib.import_module(f"transformers.models.{family}.modeling_{family}")
        classes = {v: dict(vars(v)) for v in vars(modeling).values()
                   if isinstance(v, type) and v.__module__ == modeling.__name__}
        saved.append((modeling, dict(vars(modeling)), classes))
    yield
    for modeling, globals_, classes in saved:
        for name, value in globals_.items():
            setattr(modeling, name, value)
        for klass, attrs in classes.items():
            for name in [n for n in vars(klass) if n not in attrs]:
                delattr(klass, name)
            for name in ("forward",):
                if name in attrs and vars(klass).get(name) is not attrs[name]:
                    setattr(klass, name, attrs[name])


def _liger_instance(family, model):
    """Liger on a built model, as TRL (transformers' Trainer) and verl apply it."""
    getattr(lk, f"apply_liger_kernel_to_{family}")(model=model)  # Liger's defaults: rope, rms_norm, swiglu, FLCE
    return model


def _liger_class(family, reference):
    """Liger before the model is built, as OpenRLHF's AutoLigerKernelForCausalLM does; same weights."""
    import transformers

    getattr(lk, f"apply_liger_kernel_to_{family}")()
    model = transformers.AutoModelForCausalLM.from_config(tiny_config(family), dtype=torch.bfloat16,
                                                          attn_implementation="eager")
    model.load_state_dict(reference.state_dict())
    assert type(model.model.norm).__name__ == "LigerRMSNorm"
    assert type(model.model.layers[0].mlp).__name__ == "LigerSwiGLUMLP"
    return model.eval()


def _logits_and_grads(model, ids):
    model.zero_grad(set_to_none=True)
    logits = model(ids).logits
    logits.float().logsumexp(-1).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return logits.detach(), grads


@pytest.mark.parametrize("mode", ["instance", "class"])
@pytest.mark.parametrize("family", FAMILIES)
def test_aligned_over_liger_equals_aligned_without_liger(family, mode, restore_transformers):
    ids = tokens()
    plain = tiny_model(family)
    rla.align(plain, "vllm")
    expected_logits, expected_grads = _logits_and_grads(plain, ids)

    fresh = tiny_model(family)
    model = _liger_instance(family, fresh) if mode == "instance" else _liger_class(family, fresh)
    with pytest.raises(RuntimeError, match="driver"):  # Liger's Triton kernels: no CPU backend
        model(ids)
    report = rla.align(model, "vllm")
    logits, grads = _logits_and_grads(model, ids)

    assert torch.equal(logits, expected_logits)
    assert grads.keys() == expected_grads.keys()
    for name, grad in grads.items():
        assert torch.equal(grad, expected_grads[name]), name
    notes = "\n".join(report.notes)
    assert "replace Liger's RoPE" in notes and "RMSNorm" in notes and "SwiGLU MLP" in notes
    assert "fused linear cross-entropy" in notes  # Liger's causal-LM forward is kept, and said so


def test_unalign_gives_liger_its_forwards_back(restore_transformers):
    model = _liger_instance("qwen2", tiny_model("qwen2"))
    liger_forwards = {n: m.__dict__["forward"] for n, m in model.named_modules() if "forward" in m.__dict__}
    rla.align(model, "vllm")
    rla.unalign(model)
    assert {n: m.__dict__["forward"] for n, m in model.named_modules() if "forward" in m.__dict__} == liger_forwards


def test_regions_not_aligned_keep_liger_and_the_report_says_so(restore_transformers):
    ids = tokens()
    model = _liger_instance("qwen2", tiny_model("qwen2"))
    report = rla.align(model, "vllm", regions=("rope",))
    assert any("RMSNorm" in n and "SwiGLU MLP" in n and "not aligned" in n for n in report.notes)
    with pytest.raises(RuntimeError, match="driver"):  # Liger's norms and MLPs still run
        model(ids)


def test_liger_moe_experts_are_refused_naming_liger(restore_transformers):
    import transformers

    lk.apply_liger_kernel_to_qwen3_moe()
    model = transformers.AutoModelForCausalLM.from_config(tiny_config("qwen3_moe"), dtype=torch.bfloat16,
                                                          attn_implementation="eager")
    with pytest.raises(NotImplementedError, match="Liger") as e:
        rla.align(model, "vllm")
    assert "use_liger_kernel" in str(e.value) and "use_liger" in str(e.value)
    assert rla.alignment_of(model) is None
