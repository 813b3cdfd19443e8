"""rla.align on GPT-OSS: every row equals the oracle written from docs/families.md bit for bit
(tests/gpt_oss_spec.py), unalign restores HF's modules bit for bit, the report says what is
aligned and what is left as is (attention sinks, the router)."""

from __future__ import annotations

import pytest
import torch
from packaging.version import Version

import rla
from rla.alignment import compat
from rla import profiles
from align_spec import PROFILES, single_thread  # noqa: F401  (fixture)
from gpt_oss_spec import VARIANT, gpt_oss_points, spec_forward, tiny_gpt_oss
from profile_rows import DISTINCT  # each way of rounding once


pytestmark = pytest.mark.skipif(compat.TRANSFORMERS_VERSION < Version("5.24"),
                                reason="rla.align reads this family's 5.24 layout; older releases are refused "
                                       "(test_align_families_refused.py)")

@pytest.fixture(scope="module")
def oss():
    return tiny_gpt_oss()


def _ids(seq=16):
    return torch.randint(0, 128, (2, seq), generator=torch.Generator().manual_seed(4))


def test_variant_table_is_rla_profiles():
    for name in PROFILES:
        assert profiles.get(name).variants.get("gpt_oss", {}) == VARIANT.get(name, {}), name


def test_oracle_under_hf_points_is_the_unaligned_model(oss):
    with torch.no_grad():
        assert torch.equal(spec_forward(oss, _ids(), gpt_oss_points("hf")), oss(_ids()).logits)


@pytest.mark.parametrize("profile", DISTINCT)
def test_aligned_equals_the_row_bit_for_bit_and_unalign_restores(oss, profile):
    ids = _ids()
    with torch.no_grad():
        before = oss(ids).logits
        rla.align(oss, profile)
        try:
            got = oss(ids).logits
        finally:
            rla.unalign(oss)
        want = spec_forward(oss, ids, gpt_oss_points(profile))
        after = oss(ids).logits
    assert torch.equal(got, want), f"{profile}: {(got == want).float().mean():.4f} of logits equal"
    assert torch.equal(after, before)
    if profile != "hf":
        assert not torch.equal(got, before)


def test_report_and_backward(oss):
    report = rla.align(oss, "vllm-eager")
    try:
        oss(_ids(8)).logits.float().logsumexp(-1).mean().backward()
    finally:
        rla.unalign(oss)
    grads = [p.grad for n, p in oss.named_parameters() if "experts" in n]
    oss.zero_grad(set_to_none=True)
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    assert report.counts["swiglu"] == {"mlp": 0, "experts": 2}
    text = str(report)
    assert "'vllm-0.33-eager/gpt_oss': {'swiglu': 'fused'}" in text and "attention sinks" in text
    assert "swiglu   0 mlp, 2 experts             fused" in text  # the table prints the points that ran
    with pytest.raises(NotImplementedError, match="engine-backed ops cover"):
        rla.align(oss, "vllm", ops=rla.ops)
