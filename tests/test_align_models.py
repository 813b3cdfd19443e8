"""``rla.align`` on every family and every built-in profile equals the ROUNDING.md oracle bit for bit."""

from __future__ import annotations

import sys

import pytest
import torch

import rla
from rla.align.families import FAMILIES as REGISTERED

try:
    from test_align_spec import FAMILIES, PROFILES, SPEC, points, single_thread, spec_forward, tiny_model, tokens  # noqa: F401
except ImportError:  # tests collected as a package
    from tests.test_align_spec import FAMILIES, PROFILES, SPEC, points, single_thread, spec_forward, tiny_model, tokens  # noqa: F401


@pytest.fixture(scope="module", params=FAMILIES)
def family_model(request):
    return request.param, tiny_model(request.param)


def test_every_supported_family_is_registered_and_tested():
    assert set(REGISTERED) == set(FAMILIES)


def test_aligned_logits_equal_the_spec_for_every_profile(family_model):
    family, model = family_model
    ids = tokens()
    with torch.no_grad():
        unaligned = model(ids).logits
        outputs = {}
        for profile in PROFILES:
            report = rla.align(model, profile)  # re-aligning replaces the previous profile
            assert report.profile.name == profile and report.family == family
            got = model(ids).logits
            assert torch.equal(got, spec_forward(model, ids, SPEC[profile])), profile
            outputs[profile] = got
        rla.unalign(model)
        assert torch.equal(model(ids).logits, unaligned)
    assert torch.equal(outputs["hf"], unaligned)
    # the oracle comparison is not vacuous: the engine profiles differ from HF here
    for profile in ("vllm", "sglang", "vllm-eager"):
        assert not torch.equal(outputs[profile], unaligned), profile


@pytest.mark.parametrize("regions", [("rope",), ("swiglu",), ("rmsnorm",), ("rope", "rmsnorm")])
def test_a_subset_of_regions_keeps_hf_rounding_elsewhere(family_model, regions):
    family, model = family_model
    ids = tokens(seed=1)
    with torch.no_grad(), rla.aligned(model, "sglang", regions=regions) as report:
        assert report.regions == regions
        assert set(report.counts) == set(regions)
        assert torch.equal(model(ids).logits, spec_forward(model, ids, points("sglang", regions)))


def test_report_counts(family_model):
    family, model = family_model
    report = rla.align(model, "vllm")
    try:
        n = model.config.num_hidden_layers
        assert report.counts["rope"] == {"rotary_emb": 1, "self_attn": n}
        assert report.counts["rmsnorm"]["decoder layers"] == n
        assert report.counts["rmsnorm"]["RMSNorm"] == 2 * n + 1
        assert report.counts["rmsnorm"].get("q_norm/k_norm", 0) == (2 * n if "qwen3" in family else 0)
        swiglu = report.counts["swiglu"]
        if family == "qwen2_moe":  # layer 1 is dense (mlp_only_layers)
            assert swiglu == {"mlp": 1, "experts": 1, "shared_expert": 1}
        elif family in ("qwen3_moe", "mixtral"):
            assert swiglu == {"mlp": 0, "experts": n}
        else:
            assert swiglu == {"mlp": n}
        text = str(report)
        assert "vllm" in text and family in text and "fp32_sum" in text
    finally:
        rla.unalign(model)


def test_alignment_is_per_instance_and_leaves_classes_and_globals_alone():
    a, b, c = (tiny_model("qwen3", seed=s) for s in (0, 0, 0))
    ids = tokens()
    modeling = sys.modules[type(a.model.layers[0].self_attn).__module__]
    before = {
        "rope_fn": modeling.apply_rotary_pos_emb,
        "classes": {k: k.__dict__["forward"] for k in {type(m) for m in a.modules()} if "forward" in k.__dict__},
    }
    with torch.no_grad():
        plain = c(ids).logits
        rla.align(a, "vllm")
        rla.align(b, "sglang")
        assert torch.equal(c(ids).logits, plain)  # the unaligned instance is untouched
        assert torch.equal(a(ids).logits, spec_forward(a, ids, SPEC["vllm"]))
        assert torch.equal(b(ids).logits, spec_forward(b, ids, SPEC["sglang"]))
    assert modeling.apply_rotary_pos_emb is before["rope_fn"]
    for klass, forward in before["classes"].items():
        assert klass.__dict__["forward"] is forward, klass
    assert not any("_rla_patch" in m.__dict__ for m in c.modules())
    for m in (a, b):
        rla.unalign(m)
        assert not any("_rla_patch" in x.__dict__ or "forward" in x.__dict__ for x in m.modules())
    assert rla.unalign(a) is None  # unaligning twice is harmless


def test_realigning_never_wraps_twice():
    model = tiny_model("qwen2")
    attn = model.model.layers[0].self_attn
    rla.align(model, "vllm")
    rla.align(model, "sglang")
    # the patch remembers the class forward (no instance forward before), not the vllm one
    assert attn.__dict__["_rla_patch"].saved_attrs["forward"] is not attn.forward
    assert not callable(attn.__dict__["_rla_patch"].saved_attrs["forward"])
    assert rla.align.current(model).profile.name == "sglang"
    rla.unalign(model)
    assert "forward" not in attn.__dict__ and rla.align.current(model) is None


def test_aligned_context_restores_the_previous_alignment():
    model = tiny_model("llama")
    ids = tokens()
    rla.align(model, "vllm")
    with torch.no_grad():
        with rla.aligned(model, "sglang"):
            assert torch.equal(model(ids).logits, spec_forward(model, ids, SPEC["sglang"]))
        assert rla.align.current(model).profile.name == "vllm"
        assert torch.equal(model(ids).logits, spec_forward(model, ids, SPEC["vllm"]))
    rla.unalign(model)


def test_public_api_names():
    from rla import AlignmentReport, align, aligned, unalign

    assert align is rla.align and callable(align)
    assert rla.align.align is not None and rla.align.families.FAMILIES  # also a package
    assert AlignmentReport.__name__ == "AlignmentReport" and callable(unalign) and callable(aligned)
