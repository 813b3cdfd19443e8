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
from qwen3_5_spec import qwen3_5_points, spec_forward, tiny_qwen3_5
from profile_rows import DISTINCT  # each way of rounding once


pytestmark = pytest.mark.skipif(compat.TRANSFORMERS_VERSION < Version("5.24"),
                                reason="rla.align reads this family's 5.24 layout; older releases are refused "
                                       "(test_align_families_refused.py)")

@pytest.fixture(scope="module")
def qwen():
    return tiny_qwen3_5()


def _ids(seq=12):
    return torch.randint(0, 128, (2, seq), generator=torch.Generator().manual_seed(4))


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
