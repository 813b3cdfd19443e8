"""rla.align on Qwen3.5 (dense): every row equals the oracle written from docs/families.md bit
for bit (tests/qwen3_5_spec.py), one region at a time too; unalign restores HF's modules; the report
says which layers' mixers are left as they are and counts the attention output gate (the ``attn_gate``
point, in the swiglu region), whose rewrite of HF's source refuses a forward of another shape."""

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
    assert (ran.rope_cos_sin, ran.rope_apply, ran.qk_norm_out, ran.attn_gate) == ("fp32", "fused", "round", "fused")
    assert profiles.get("sglang-0.5.23").at_head_size(32).rope_cos_sin == "round"
    text = str(report)
    assert "head size 32: 'sglang-0.5.23' rounds" in text
    assert ("follow 'sglang-0.5.23@head_size=32/qwen3_5': {'rope_cos_sin': 'fp32', 'rope_apply': 'fused', "
            "'attn_gate': 'fused'}") in text
    assert "1 self_attn" in text and "cos/sin fp32, apply fused, inv_freq on device, q/k-norm out round" in text


@pytest.mark.parametrize("profile", ["vllm-0.26", "vllm-0.33", "vllm-0.33-eager"])
def test_vllm_attention_points(qwen, profile):
    """vLLM's Qwen3.5 attention rounds the q/k norm before the rotation in both modes (its fused
    kernel): the default rows' fp32 q/k-norm output gives way to round, the eager rows' round stands;
    the output gate is rounded once in default mode (Inductor), per op in eager mode (HF's ops)."""
    report = rla.align(qwen, profile)
    rla.unalign(qwen)
    assert report.variant == "qwen3_5" and report.ran().qk_norm_out == "round"
    assert (report.ran().rope_cos_sin, report.ran().rope_apply) == ("round", "fused")
    row = profiles.get(profile)
    if row.qk_norm_out == "fp32":
        assert report.ran().attn_gate == "fused"
        assert f"follow '{profile}/qwen3_5': {{'qk_norm_out': 'round', 'attn_gate': 'fused'}}" in str(report)
    else:
        assert report.ran().attn_gate == "per_op" and row.variants["qwen3_5"] == {"attn_gate": "per_op"}
        assert report.ran().points() == row.variant("zero_centred_norm").points()  # the q/k points: the row's


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
    assert report.counts["swiglu"] == {"mlp": 3, "attention output gate": 1}
    text = str(report)
    assert "2 of 3 layers are linear attention" in text and "Gated DeltaNet" in text
    assert "output gate" not in " ".join(n for n in report.notes if n.startswith("left as is"))
    without = rla.align(qwen, "vllm", regions=("rope", "rmsnorm"))
    rla.unalign(qwen)
    assert "left as is: the attention output gate" in str(without) and "swiglu" not in without.counts


@pytest.mark.parametrize("region", ["rope", "swiglu", "rmsnorm"])
def test_one_region_at_a_time(qwen, region):
    """Each region alone equals the oracle with the row's points in that region only (the output gate's with
    the swiglu region: alone it rebuilds the attention forward without the rope region's rotary)."""
    ids = _ids()
    with torch.no_grad():
        before = qwen(ids).logits
        for profile in ("vllm-0.33", "sglang-0.5.23", "vllm-0.33-eager"):
            rla.align(qwen, profile, regions=(region,))
            try:
                got = qwen(ids).logits
            finally:
                rla.unalign(qwen)
            assert torch.equal(got, spec_forward(qwen, ids, qwen3_5_points(profile, (region,)))), (region, profile)
            assert torch.equal(qwen(ids).logits, before)


def test_the_gate_alone_moves_the_logits_and_flipped_breaks_the_row(qwen):
    """Under vllm-0.33 the aligned model is the oracle with the gate rounded once and not with HF's gate;
    a row whose variant says per_op is the oracle with HF's gate (the point is read, not assumed)."""
    ids = _ids()
    row = profiles.get("vllm-0.33")
    per_op = row.replace_variant("qwen3_5", name="vllm-0.33-gate-per-op", attn_gate="per_op")
    pts = qwen3_5_points("vllm-0.33")
    with torch.no_grad():
        got = {}
        for prof in (row, per_op):
            rla.align(qwen, prof)
            try:
                got[prof.name] = qwen(ids).logits
            finally:
                rla.unalign(qwen)
        fused_want = spec_forward(qwen, ids, pts)
        pts.attention["attn_gate"] = "per_op"
        per_op_want = spec_forward(qwen, ids, pts)
    assert torch.equal(got["vllm-0.33"], fused_want) and torch.equal(got["vllm-0.33-gate-per-op"], per_op_want)
    assert not torch.equal(fused_want, per_op_want)


def test_a_forward_of_another_shape_is_refused_before_anything_changes(qwen, monkeypatch):
    """The swiglu region rewrites HF's ``attn_output * torch.sigmoid(gate)``; a forward without that product
    (here one that gates with ``F.sigmoid``) is refused naming what differs, and nothing is patched."""
    attn = next(layer.self_attn for layer in qwen.model.layers if layer.block_type == "full_attention")
    klass = type(attn)

    def forward(self, hidden_states, position_embeddings, attention_mask, cache=None, **kwargs):
        return hidden_states * torch.nn.functional.sigmoid(hidden_states), None

    forward.__module__ = klass.__module__  # named as HF's, but its globals are this file's
    monkeypatch.setattr(klass, "forward", forward)
    before = {id(m): dict(m.__dict__) for m in qwen.modules()}
    with pytest.raises(NotImplementedError, match="output gate cannot be routed through rla.ops.attn_gate: no "
                                                  "function in its __wrapped__ chain"):
        rla.align(qwen, "vllm")
    assert all(m.__dict__.keys() == before[id(m)].keys() for m in qwen.modules())


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
