"""A row's points that depend on the head size (``RoundingProfile.conditions``): SGLang 0.5.23's
RoPE is fp32 and fused at head sizes 64/128/256/512 and bf16 per-op at any other.

The aligned logits are compared with ``align_spec.spec_forward`` under points written out here
(not read from the row), the rule itself with SGLang's own source in its wheel."""

from __future__ import annotations

import re
import zipfile

import pytest
import torch

import rla
from align_spec import POINTS, SPEC, single_thread, spec_forward, tiny_model, tokens  # noqa: F401 (fixture)
from rla import profiles
from rla.profiles import PointCondition, PointEvidence

#: SGLang 0.5.23's row as written in docs/rounding.md, and its RoPE at a head size its fused
#: kernel does not take: a bf16 cache, each product rounded.
SGLANG = dict(zip(POINTS, ("fp32", "fused", "device", "fused", "fused", "fp32_sum", "rounded", "round", "unpinned",
                            "lp")))
SGLANG_OTHER_HEADS = {**SGLANG, "rope_cos_sin": "round", "rope_apply": "per_op"}


def _model(head_dim: int):
    return tiny_model("qwen3", head_dim=head_dim, num_hidden_layers=1)


@pytest.mark.parametrize("head_dim,want", [(32, SGLANG_OTHER_HEADS), (64, SGLANG), (128, SGLANG)])
def test_sglang_rope_follows_the_head_size(head_dim, want):
    model = _model(head_dim)
    ids = tokens(seq=24)
    with torch.no_grad():
        report = rla.align(model, "sglang")
        got = model(ids).logits
        assert torch.equal(got, spec_forward(model, ids, want))
        other = SGLANG if want is SGLANG_OTHER_HEADS else SGLANG_OTHER_HEADS
        assert not torch.equal(got, spec_forward(model, ids, other))  # the rule is visible in the logits
    assert report.profile is profiles.get("sglang-0.5.23")  # the row asked for; ran(): what it is here
    if head_dim == 32:
        assert report.head_size == 32 and report.ran().name == "sglang-0.5.23@head_size=32"
        assert report.to_dict()["head_size_points"] == SGLANG_OTHER_HEADS
        assert any("head size 32" in n for n in report.notes) and "cos/sin round, apply per_op" in str(report)
        with torch.no_grad(), rla.aligned(model, "vllm"):  # re-applied on leaving: at the same head size
            pass
        with torch.no_grad():
            assert torch.equal(model(ids).logits, got)
    else:
        assert report.head_size is None and report.ran() is report.profile
        assert not any("head size" in n for n in report.notes)
    rla.unalign(model)


def test_the_rule_is_sglangs_own(sglang_wheel):
    """The row's head sizes are the ones SGLang 0.5.23's RotaryEmbedding sends to its fused kernel;
    the others get a cache cast to the query dtype and the bf16 kernel of pos_enc.cuh."""
    with zipfile.ZipFile(sglang_wheel) as z:
        base = z.read("sglang/srt/layers/rotary_embedding/base.py").decode()
        kernel = z.read("sglang/kernels/jit/csrc/elementwise/pos_enc.cuh").decode()
    sizes = re.search(r"not \(_is_cuda\) or self\.head_size not in \[([\d, ]+)\]", base)
    assert sizes is not None
    (cond,) = profiles.get("sglang-0.5.23").conditions
    assert cond.when == {"head_size_not_in": tuple(int(h) for h in sizes.group(1).split(","))}
    fallback = base[base.index("def forward_cuda"):]
    fallback = fallback[fallback.index("else:"):]
    assert re.search(r"self\.cos_sin_cache = self\.cos_sin_cache\.to\(\s*query\.device, dtype=query\.dtype", fallback)
    assert "arr[x_index] = x * cos - y * sin;" in kernel and "launch_kernel<nv_bfloat16, IS_NEOX>" in kernel
    assert cond.points == {"rope_cos_sin": "round", "rope_apply": "per_op"}


def test_rows_without_conditions_hold_at_every_head_size():
    for name in profiles.names():
        p = profiles.get(name)
        assert p.at_head_size(32) is p or name == "sglang-0.5.23"
    assert profiles.get("sglang").at_head_size(256) is profiles.get("sglang")
    with pytest.raises(ValueError, match="head_size must be an integer >= 1"):
        profiles.get("sglang").at_head_size(0)


def _row(conditions):
    d = profiles.to_dict(profiles.get("sglang-0.5.23"))
    d["conditions"] = conditions
    return d


_EV = {"evidence": "source", "matched": None, "note": "read"}


@pytest.mark.parametrize("conditions,message", [
    ({"when": {}}, "must be a list"),
    ([{"when": {"head_size_not_in": [64]}, "points": {"rope_cos_sin": "round"}}], "exactly 'when', 'points'"),
    ([{"when": {"rotary_dim_in": [64]}, "points": {"rope_cos_sin": "round"}, "evidence": {"rope_cos_sin": _EV}}],
     "one of \\['head_size_in', 'head_size_not_in'\\]"),
    ([{"when": {"head_size_in": []}, "points": {"rope_cos_sin": "round"}, "evidence": {"rope_cos_sin": _EV}}],
     "non-empty list of integers"),
    ([{"when": {"head_size_in": [64, "128"]}, "points": {"rope_cos_sin": "round"}, "evidence": {"rope_cos_sin": _EV}}],
     "non-empty list of integers"),
    ([{"when": {"head_size_in": [64]}, "points": {"rope_cos_sin": "bf16"}, "evidence": {"rope_cos_sin": _EV}}],
     "rope_cos_sin='bf16'"),
    ([{"when": {"head_size_in": [64]}, "points": {"rope_cos_sin": "round"}, "evidence": {}}], "needs its evidence"),
    ([{"when": {"head_size_in": [64]}, "points": {"rope_cos_sin": "round"}, "evidence": {"rope_cos_sin": _EV}},
      {"when": {"head_size_in": [32]}, "points": {"rope_cos_sin": "round"}, "evidence": {"rope_cos_sin": _EV}}],
     "both set 'rope_cos_sin'"),
])
def test_malformed_conditions_are_refused_on_load(conditions, message):
    with pytest.raises(ValueError, match=message):
        profiles.from_dict(_row(conditions), "row.json")


def test_head_size_in_and_round_trip():
    ev = PointEvidence("source", None, "read")
    c = PointCondition({"head_size_in": [96]}, {"swiglu": "per_op"}, {"swiglu": ev})
    p = profiles.get("rla").replace(name="custom", conditions=(c,))
    assert p.at_head_size(96).swiglu == "per_op" and p.at_head_size(64) is p
    back = profiles.from_dict(profiles.to_dict(p), "custom.json")
    assert back.conditions == (c,) and back.at_head_size(96).points() == p.at_head_size(96).points()


def test_the_reports_variant_points_are_the_ones_that_ran_at_the_head_size():
    """A family with a variant at a head size the row's rule changes: the report's ``variant_points`` are the row
    at the model's head size with the variant over it (what :meth:`ran` applies), not the row's own."""
    from gemma_spec import tiny_gemma3

    model = tiny_gemma3()
    report = rla.align(model, "sglang-0.5.23")
    try:
        head = model.config.head_dim
        assert head not in (64, 128, 256, 512), head  # the rule's other branch: a bf16 cache, per-op products
        d = report.to_dict()
        assert d["variant_points"] == {**report.ran().points(), "post_norm_out": "round"}  # and the kind's own point
        assert d["variant_points"]["rope_cos_sin"] == "round" and d["variant_points"]["rope_apply"] == "per_op"
        assert d["variant_points"]["norm_weight"] == profiles.get("sglang-0.5.23").variant("zero_centred_norm").points()["norm_weight"]
    finally:
        rla.unalign(model)
