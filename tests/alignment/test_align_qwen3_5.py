"""rla.align on Qwen3.5 (dense): every row equals the oracle written from docs/families.md bit
for bit (tests/qwen3_5_spec.py), unalign restores HF's modules, the report says which layers'
mixers are left as they are."""

from __future__ import annotations

import pytest
import torch
from packaging.version import Version

import rla
from rla.alignment import compat
from align_spec import PROFILES, single_thread  # noqa: F401  (fixture)
from qwen3_5_spec import ATTENTION, qwen3_5_points, spec_forward, tiny_qwen3_5
from rla import profiles
from profile_rows import DISTINCT  # each way of rounding once


pytestmark = pytest.mark.skipif(compat.TRANSFORMERS_VERSION < Version("5.24"),
                                reason="rla.align reads this family's 5.24 layout; older releases are refused "
                                       "(test_align_families_refused.py)")

@pytest.fixture(scope="module")
def qwen():
    return tiny_qwen3_5()


def _ids(seq=12):
    return torch.randint(0, 128, (2, seq), generator=torch.Generator().manual_seed(4))


def test_variant_table_is_rla_profiles():
    from gemma_spec import VARIANT

    for name in PROFILES:
        row = profiles.get(name)
        assert row.variants.get("qwen3_5", {}) == ATTENTION.get(name, {}), name
        assert row.variants.get("zero_centred_norm", {}) == VARIANT.get(name, {}), name


def test_sglang_attention_points_hold_at_this_head_size(qwen):
    """The tiny model's head size (32) is outside SGLang's fused-RoPE sizes: the row rounds the tables
    there, Qwen3.5's attention does not (its fused kernel reads the fp32 cache); the report says both."""
    report = rla.align(qwen, "sglang-0.5.23")
    rla.unalign(qwen)
    assert report.head_size == 32 and report.variant == "qwen3_5"
    ran = report.ran()
    assert (ran.rope_cos_sin, ran.rope_apply, ran.qk_norm_out) == ("fp32", "fused", "round")
    assert profiles.get("sglang-0.5.23").at_head_size(32).rope_cos_sin == "round"
    text = str(report)
    assert "head size 32: 'sglang-0.5.23' rounds" in text
    assert "follow 'sglang-0.5.23@head_size=32/qwen3_5': {'rope_cos_sin': 'fp32', 'rope_apply': 'fused'}" in text
    assert "1 self_attn" in text and "cos/sin fp32, apply fused, inv_freq on device, q/k-norm out round" in text


@pytest.mark.parametrize("profile", ["vllm-0.26", "vllm-0.33", "vllm-0.33-eager"])
def test_vllm_attention_points(qwen, profile):
    """vLLM's Qwen3.5 attention rounds the q/k norm before the rotation in both modes (its fused
    kernel): the default rows' fp32 q/k-norm output gives way to round, the eager rows' round stands."""
    report = rla.align(qwen, profile)
    rla.unalign(qwen)
    assert report.variant == "qwen3_5" and report.ran().qk_norm_out == "round"
    assert (report.ran().rope_cos_sin, report.ran().rope_apply) == ("round", "fused")
    row = profiles.get(profile)
    if row.qk_norm_out == "fp32":
        assert f"follow '{profile}/qwen3_5': {{'qk_norm_out': 'round'}}" in str(report)
    else:
        assert "qwen3_5" not in row.variants


def test_oracle_under_hf_points_is_the_unaligned_model(qwen):
    with torch.no_grad():
        assert torch.equal(spec_forward(qwen, _ids(), qwen3_5_points("hf")), qwen(_ids()).logits)


@pytest.mark.parametrize("profile", DISTINCT)
def test_aligned_equals_the_row_bit_for_bit_and_unalign_restores(qwen, profile):
    ids = _ids()
    with torch.no_grad():
        before = qwen(ids).logits
        rla.align(qwen, profile)
        try:
            got = qwen(ids).logits
        finally:
            rla.unalign(qwen)
        want = spec_forward(qwen, ids, qwen3_5_points(profile))
        after = qwen(ids).logits
    assert torch.equal(got, want), f"{profile}: {(got == want).float().mean():.4f} of logits equal"
    assert torch.equal(after, before)
    if profile != "hf":
        assert not torch.equal(got, before)


def test_report_names_what_is_left_and_backward_runs(qwen):
    report = rla.align(qwen, "vllm")
    try:
        qwen(_ids(8)).logits.float().logsumexp(-1).mean().backward()
    finally:
        rla.unalign(qwen)
    norm_grads = [p.grad for n, p in qwen.named_parameters() if "norm" in n and "linear_attn" not in n]
    qwen.zero_grad(set_to_none=True)
    assert all(g is not None and torch.isfinite(g).all() for g in norm_grads)
    assert report.counts["rmsnorm"] == {"decoder layers": 3, "zero-centred RMSNorm": 7, "q_norm/k_norm": 2}
    text = str(report)
    assert "2 of 3 layers are linear attention" in text and "Gated DeltaNet" in text and "output gate" in text


def test_deepcopy_and_pickle_keep_the_alignment(qwen):
    import copy
    import io

    ids = _ids(seq=10)
    rla.align(qwen, "vllm")
    try:
        with torch.no_grad():
            want = qwen(ids).logits
        copied = copy.deepcopy(qwen)
        buf = io.BytesIO()
        torch.save(qwen, buf)
        buf.seek(0)
        loaded = torch.load(buf, weights_only=False)
    finally:
        rla.unalign(qwen)
    with torch.no_grad():
        assert torch.equal(copied(ids).logits, want) and torch.equal(loaded(ids).logits, want)
    assert rla.alignment_of(loaded).profile.name == "vllm-0.33"
    rla.unalign(loaded)
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, qwen(ids).logits)
