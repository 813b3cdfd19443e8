"""Gemma 4's model-body variant points under rla.align: ``ple_inputs``, ``ple_add``, ``stream_variance``,
``embed_variance`` (rla.profiles.variant_points; the vllm default rows' gemma4 variant sets all four).

The oracle is tests/gemma4_spec.py's ``spec_forward(..., chains=...)``, written before the points
existed: under vllm-0.33 the aligned model equals it with the four chains bit for bit (logits and every
layer's stream), under each point alone with that chain alone, and each chain changes the logits; unalign
restores HF's model; the backward runs, reaches every parameter the forward reads, and is autograd of the
oracle's expression to bf16's accuracy. The model is hidden 96 wide, where sqrt(96) and 96**-0.5 are no
bf16 numbers, so the embedding's product and the per-layer projection's scale round (at 64 they are exact
and two of the chains change nothing)."""

from __future__ import annotations

import pytest
import torch
from packaging.version import Version

import rla
from rla import profiles
from rla.alignment import compat
from align_spec import single_thread  # noqa: F401  (fixture)
from gemma4_spec import CHAIN_OF, CHAINS, gemma4_points, spec_forward, tiny_gemma4

pytestmark = pytest.mark.skipif(compat.TRANSFORMERS_VERSION < Version("5.24"),
                                reason="Gemma 4 is aligned on transformers >= 5.24")

BF16 = torch.bfloat16
FOUR = tuple(chain for _, chain in CHAIN_OF.values())


@pytest.fixture(scope="module")
def gemma4():
    return tiny_gemma4(hidden_size=96)


def _ids(seq=20, batch=2):
    return torch.randint(0, 128, (batch, seq), generator=torch.Generator().manual_seed(3))


def _aligned(model, row, ids):
    """(logits, each layer's output rounded) of ``model`` aligned to ``row``."""
    streams = []
    hooks = [layer.register_forward_hook(lambda m, a, out: streams.append(out.to(BF16)))
             for layer in model.model.layers]
    try:
        with torch.no_grad(), rla.aligned(model, row):
            logits = model(ids).logits
    finally:
        for h in hooks:
            h.remove()
    return logits, streams


def _spec(model, ids, chains):
    streams = []
    with torch.no_grad():
        logits = spec_forward(model, ids, gemma4_points("vllm-0.33"), streams=streams, chains=chains)
    return logits, streams


def _only(point):
    """vllm-0.33 with one model-body point at the compiled graph's value, the others at HF's (None: all four)."""
    hf = {p: first for p, (first, _) in CHAIN_OF.items() if p != point}
    return profiles.get("vllm-0.33").replace_variant("gemma4", name=f"vllm-0.33-only-{point or 'none'}", **hf)


def test_the_points_are_the_oracles_chains():
    assert set(FOUR) <= set(CHAINS) and set(CHAIN_OF) == {"ple_inputs", "ple_add", "stream_variance", "embed_variance"}
    for point, (first, _) in CHAIN_OF.items():
        assert profiles.VARIANT_POINTS[point][0] == first and profiles.VARIANT_POINT_KINDS[point] == ("gemma4",)


def test_vllm_033_is_the_oracle_with_the_four_chains_logits_and_streams(gemma4):
    ids = _ids()
    with torch.no_grad():
        before = gemma4(ids).logits
    got, got_streams = _aligned(gemma4, "vllm-0.33", ids)
    want, want_streams = _spec(gemma4, ids, FOUR)
    assert torch.equal(got, want), f"{(got == want).float().mean():.4f} of logits equal"
    assert len(got_streams) == len(want_streams) == len(gemma4.model.layers)
    for i, (a, b) in enumerate(zip(got_streams, want_streams)):
        assert torch.equal(a, b), i
    assert not torch.equal(got, _spec(gemma4, ids, ())[0])  # the chains show
    with torch.no_grad():
        assert torch.equal(gemma4(ids).logits, before)  # unalign restored HF's model


@pytest.mark.parametrize("point", list(CHAIN_OF))
def test_each_point_alone_is_its_chain_alone(gemma4, point):
    ids = _ids()
    got, streams = _aligned(gemma4, _only(point), ids)
    want, want_streams = _spec(gemma4, ids, (CHAIN_OF[point][1],))
    assert torch.equal(got, want) and all(torch.equal(a, b) for a, b in zip(streams, want_streams)), point
    assert not torch.equal(got, _spec(gemma4, ids, ())[0]), point  # the point changes the logits


def test_the_report_lists_the_points(gemma4):
    report = rla.align(gemma4, "vllm-0.33")
    rla.unalign(gemma4)
    ran = report.to_dict()["variant_points"]
    assert {p: ran[p] for p in CHAIN_OF} == {"ple_inputs": "fused", "ple_add": "rounded", "stream_variance": "fp32",
                                             "embed_variance": "fp32"}
    text = str(report)
    for point in CHAIN_OF:
        assert f"{point}=" in text, point
    eager = rla.align(gemma4, "vllm-0.33-eager")
    rla.unalign(gemma4)
    assert {p: eager.to_dict()["variant_points"][p] for p in CHAIN_OF} == {p: f for p, (f, _) in CHAIN_OF.items()}
    assert not any(f"{p}=" in str(eager) for p in CHAIN_OF)


def test_a_forward_from_inputs_embeds_has_no_unrounded_embedding(gemma4):
    """Without ids the first norm has no fp32 product to read: the oracle without ``embed_variance_fp32``."""
    ids = _ids(seq=12)
    with torch.no_grad():
        embeds = gemma4.model.embed_tokens(ids)
        per_layer = gemma4.model.embed_tokens_per_layer(ids).reshape(*ids.shape, len(gemma4.model.layers), -1)
        with rla.aligned(gemma4, _only("embed_variance")):
            got = gemma4(inputs_embeds=embeds.clone(), per_layer_inputs=per_layer).logits
            with_ids = gemma4(ids).logits
    assert torch.equal(got, _spec(gemma4, ids, ())[0])
    assert torch.equal(with_ids, _spec(gemma4, ids, ("embed_variance_fp32",))[0])


def _grads(model, forward):
    model.zero_grad(set_to_none=True)
    forward().float().logsumexp(-1).mean().backward()
    out = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return out


def test_backward_reaches_every_parameter_and_is_the_oracles_gradient(gemma4):
    """Under vllm-0.33 every parameter the forward reads gets a finite gradient, and each is autograd
    of the oracle's expression (spec_forward with the four chains) to bf16's accuracy. Not bit for bit:
    the oracle's backward rounds after each bf16 op (autograd of PyTorch's bf16 ops), rla's ops compute
    theirs in fp32 and round once to their input's dtype. The largest gap is stream_variance's: the
    layer's RN(s) is read by its input norm and by its residual add; the aligned layer's are two bf16
    tensors, each gradient rounded to bf16 before autograd adds them at s, where the oracle's one fp32
    RN(s) adds them first and rounds the sum once (the oracle with two rounded copies agrees with the
    aligned model to a cosine of 0.99997 on every parameter; as written, 0.9996 at the per-layer
    projection norm, the deepest). The row without the chains is further (0.97 there), so 0.9995 tells
    the chains' backward from none."""
    ids = _ids(seq=16)
    with rla.aligned(gemma4, "vllm-0.33"):
        got = _grads(gemma4, lambda: gemma4(ids).logits)
    with rla.aligned(gemma4, _only(None)):
        plain = _grads(gemma4, lambda: gemma4(ids).logits)
    want = _grads(gemma4, lambda: spec_forward(gemma4, ids, gemma4_points("vllm-0.33"), chains=FOUR))
    assert got.keys() == want.keys() and all(torch.isfinite(g).all() for g in got.values())
    assert {"model.embed_tokens.weight", "model.embed_tokens_per_layer.weight"} <= got.keys()

    def cos(a, b):
        return torch.nn.functional.cosine_similarity(a.float().flatten(), b.float().flatten(), dim=0).item()

    low = {n: cos(got[n], want[n]) for n in got if cos(got[n], want[n]) < 0.9995}
    assert not low, low
    assert min(cos(plain[n], want[n]) for n in want) < 0.9995


def test_torch_compile_keeps_the_chains(gemma4):
    """torch.compile (AOT autograd, eager kernels: no C++ compiler needed) of the aligned model gives the
    eager aligned logits; the embedding's fp32 product reaches the first norm through it (without it the
    logits would be the oracle's without embed_variance_fp32, which differ: test_each_point_alone_...)."""
    ids = _ids(seq=12)
    with torch.no_grad(), rla.aligned(gemma4, "vllm-0.33"):
        want = gemma4(ids).logits
        torch._dynamo.reset()
        try:
            got = torch.compile(gemma4, backend="aot_eager")(ids).logits
        finally:
            torch._dynamo.reset()
    assert torch.equal(got, want)
    assert not torch.equal(got, _spec(gemma4, ids, tuple(c for c in FOUR if c != "embed_variance_fp32"))[0])
