"""rla.align on Gemma 3: every row equals the oracle written from docs/families.md bit for bit
(tests/gemma_spec.py), unalign restores HF's modules bit for bit, the report says what is aligned
and what is left as is."""

from __future__ import annotations

import pytest
import torch

import rla
from rla import profiles
from align_spec import PROFILES, single_thread  # noqa: F401  (fixture)
from gemma_spec import VARIANT, gemma_points, spec_forward, tiny_gemma3
from profile_rows import DISTINCT  # each way of rounding once


@pytest.fixture(scope="module")
def gemma():
    return tiny_gemma3()


def _ids(seq=20, batch=2):
    return torch.randint(0, 128, (batch, seq), generator=torch.Generator().manual_seed(3))


def test_variant_table_is_rla_profiles():
    for name in PROFILES:
        assert profiles.get(name).variants.get("zero_centred_norm", {}) == VARIANT.get(name, {}), name
        assert set(profiles.get(name).variant_evidence.get("zero_centred_norm", {})) == set(VARIANT.get(name, {}))


def test_oracle_under_hf_points_is_the_unaligned_model(gemma):
    ids = _ids()
    with torch.no_grad():
        assert torch.equal(spec_forward(gemma, ids, gemma_points("hf")), gemma(ids).logits)


@pytest.mark.parametrize("profile", DISTINCT)
def test_aligned_equals_the_row_bit_for_bit_and_unalign_restores(gemma, profile):
    ids = _ids()
    with torch.no_grad():
        before = gemma(ids).logits
        rla.align(gemma, profile)
        try:
            got = gemma(ids).logits
        finally:
            rla.unalign(gemma)
        want = spec_forward(gemma, ids, gemma_points(profile))
        after = gemma(ids).logits
    assert torch.equal(got, want), f"{profile}: {(got == want).float().mean():.4f} of logits equal"
    assert torch.equal(after, before)
    if profile != "hf":  # the rows are not HF: the test can tell them apart
        assert not torch.equal(got, before)


@pytest.mark.parametrize("regions", [("rope",), ("swiglu",), ("rmsnorm",), ("rope", "rmsnorm")])
def test_one_region_at_a_time(gemma, regions):
    ids = _ids(seq=12)
    with torch.no_grad(), rla.aligned(gemma, "vllm", regions):
        got = gemma(ids).logits
    with torch.no_grad():
        assert torch.equal(got, spec_forward(gemma, ids, gemma_points("vllm-0.33", regions)))


def test_unalign_restores_every_module_and_backward_runs(gemma):
    state = {id(m): dict(m.__dict__) for m in gemma.modules()}
    rla.align(gemma, "vllm-eager")
    ids = _ids(seq=10)
    loss = gemma(ids).logits.float().logsumexp(-1).mean()
    loss.backward()
    grads = {n: p.grad for n, p in gemma.named_parameters()}
    gemma.zero_grad(set_to_none=True)
    rla.unalign(gemma)
    assert all(g is not None and torch.isfinite(g).all() for n, g in grads.items() if "embed" not in n)
    for m in gemma.modules():
        assert dict(m.__dict__).keys() == state[id(m)].keys(), type(m).__name__
        assert all(m.__dict__[k] is v for k, v in state[id(m)].items() if k not in ("_parameters", "_buffers", "_modules"))


def test_report_says_what_is_aligned_and_left(gemma):
    report = rla.align(gemma, "vllm-eager")
    rla.unalign(gemma)
    assert report.family == "gemma3_text"
    assert report.counts["rmsnorm"] == {"decoder layers": 3, "zero-centred RMSNorm": 13, "q_norm/k_norm": 6}
    assert report.counts["swiglu"] == {"GeGLU mlp (gelu tanh)": 3}
    text = str(report)
    assert "'vllm-0.33-eager/zero_centred_norm'" in text and "norm_residual': 'fp32_sum'" in text
    assert "left as is: attention" in text and "embedding scale" in text


def test_refusals_name_the_problem(gemma):
    with pytest.raises(NotImplementedError, match="engine-backed ops cover the Llama-shaped"):
        rla.align(gemma, "vllm", ops=rla.ops)
    gemma.config.hidden_activation = "gelu"
    try:
        with pytest.raises(ValueError, match="hidden_activation is 'gelu'"):
            rla.align(gemma, "vllm")
    finally:
        gemma.config.hidden_activation = "gelu_pytorch_tanh"
    assert rla.alignment_of(gemma) is None


def test_deepcopy_and_pickle_keep_the_alignment(gemma):
    import copy
    import io

    ids = _ids(seq=10)
    rla.align(gemma, "vllm")
    try:
        with torch.no_grad():
            want = gemma(ids).logits
        copied = copy.deepcopy(gemma)
        buf = io.BytesIO()
        torch.save(gemma, buf)
        buf.seek(0)
        loaded = torch.load(buf, weights_only=False)
    finally:
        rla.unalign(gemma)
    with torch.no_grad():
        assert torch.equal(copied(ids).logits, want) and torch.equal(loaded(ids).logits, want)
    assert rla.alignment_of(loaded).profile.name == "vllm-0.33"
    rla.unalign(loaded)
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, gemma(ids).logits)


def _post_norm_flipped(name: str):
    """The row with its zero_centred_norm variant's post_norm_out flipped, and the oracle's points."""
    row = profiles.get(name)
    other = "round" if row.variant("zero_centred_norm").post_norm_out == "fp32" else "fp32"
    pts = gemma_points(name)
    pts["post_norm_out"] = other
    return row.replace_variant("zero_centred_norm", name=f"{name}-post-norm-{other}", post_norm_out=other), pts


@pytest.mark.parametrize("name", ["vllm-0.33", "vllm-0.33-eager", "hf"])
def test_post_norm_out_is_the_oracle_and_visible_in_the_logits(gemma, name):
    """Under the other post_norm_out value (fp32 for the rows that round, round for vllm-0.33) the
    aligned model is the oracle with that value, bit for bit, and not the row's own logits."""
    ids = _ids()
    flipped, pts = _post_norm_flipped(name)
    with torch.no_grad():
        with rla.aligned(gemma, name):
            own = gemma(ids).logits
        with rla.aligned(gemma, flipped) as report:
            got = gemma(ids).logits
        assert torch.equal(got, spec_forward(gemma, ids, pts))
    assert not torch.equal(got, own)
    assert (("post_norm_out='fp32'" in str(report)) is (pts["post_norm_out"] == "fp32"))


def test_post_norm_out_fp32_backward_and_gradient_checkpointing():
    """Under vllm-0.33 (post_norm_out='fp32') backward runs through the fp32 chain; checkpointed
    layers give the same gradients bit for bit; the chain's gradients are not the rounded row's."""
    model = tiny_gemma3()
    ids = _ids(seq=10)

    def grads(profile, checkpointing: bool):
        model.train()
        if checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        try:
            with rla.aligned(model, profile):
                model(ids).logits.float().logsumexp(-1).mean().backward()
        finally:
            model.gradient_checkpointing_disable()
            model.eval()
        out = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        model.zero_grad(set_to_none=True)
        return out

    plain, checkpointed = grads("vllm-0.33", False), grads("vllm-0.33", True)
    assert plain.keys() == checkpointed.keys() and all(torch.equal(plain[n], checkpointed[n]) for n in plain)
    assert all(torch.isfinite(g).all() for g in plain.values())
    rounded = grads(_post_norm_flipped("vllm-0.33")[0], False)
    assert any(not torch.equal(plain[n], rounded[n]) for n in plain)
