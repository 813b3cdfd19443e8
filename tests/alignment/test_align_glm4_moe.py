"""rla.align on GLM-4 MoE (partial rotary, optional q/k norms, routed + shared experts): every row
equals the oracle bit for bit (tests/glm4_moe_spec.py), with and without q/k norms; unalign
restores HF's modules; the report says what is left as is (the router)."""

from __future__ import annotations

import pytest
import torch
from packaging.version import Version

import rla
from rla.alignment import compat
from align_spec import PROFILES, SPEC, single_thread  # noqa: F401  (fixture)
from glm4_moe_spec import spec_forward, tiny_glm4_moe
from profile_rows import DISTINCT  # each way of rounding once


pytestmark = pytest.mark.skipif(compat.TRANSFORMERS_VERSION < Version("5.24"),
                                reason="rla.align reads this family's 5.24 layout; older releases are refused "
                                       "(test_align_families_refused.py)")

@pytest.fixture(scope="module", params=[True, False], ids=["qk_norm", "no_qk_norm"])
def glm(request):
    return tiny_glm4_moe(qk_norm=request.param)


def _ids(seq=12):
    return torch.randint(0, 128, (2, seq), generator=torch.Generator().manual_seed(4))


def test_oracle_under_hf_points_is_the_unaligned_model(glm):
    with torch.no_grad():
        assert torch.equal(spec_forward(glm, _ids(), SPEC["hf"]), glm(_ids()).logits)


@pytest.mark.parametrize("profile", DISTINCT)
def test_aligned_equals_the_row_bit_for_bit_and_unalign_restores(glm, profile):
    ids = _ids()
    with torch.no_grad():
        before = glm(ids).logits
        rla.align(glm, profile)
        try:
            got = glm(ids).logits
        finally:
            rla.unalign(glm)
        want = spec_forward(glm, ids, SPEC[profile])
        after = glm(ids).logits
    assert torch.equal(got, want), f"{profile}: {(got == want).float().mean():.4f} of logits equal"
    assert torch.equal(after, before)
    if profile != "hf":
        assert not torch.equal(got, before)


def test_report(glm):
    report = rla.align(glm, "vllm")
    rla.unalign(glm)
    assert report.counts["swiglu"] == {"mlp": 1, "experts": 1, "shared_expert": 1}
    assert "left as is: the router" in str(report)
    qk = glm.model.layers[0].self_attn.__dict__["_modules"].get("q_norm") is not None
    assert report.counts["rmsnorm"].get("q_norm/k_norm", 0) == (4 if qk else 0)
    if qk:  # vllm-0.33's q/k norm -> RoPE chain on a partial rotary: two ops, said so
        assert any("partial RoPE runs as two ops" in n for n in report.notes)
