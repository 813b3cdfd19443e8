"""``rla.align`` on every family and every built-in profile equals the docs/rounding.md oracle bit for bit."""

from __future__ import annotations

import sys

import pytest
import torch

import rla
from rla.alignment.families import FAMILIES as REGISTERED

from profile_rows import DISTINCT  # each way of rounding once
from align_spec import FAMILIES, PROFILES, SPEC, points, single_thread, spec_forward, tiny_model, tokens  # noqa: F401


@pytest.fixture(scope="module", params=FAMILIES)
def family_model(request):
    return request.param, tiny_model(request.param)


def test_every_supported_family_is_registered_and_tested():
    import moe_models

    # the newer families are tested in test_align_{gemma,gemma4,gpt_oss,qwen3_5,qwen3_5_moe,glm4_moe,deepseek_v3}.py; families
    # aligned in some regions only by test_align_router (none now: DeepSeek-V3's MLA is aligned too)
    newer = {"gemma3_text", "gemma4_text", "gpt_oss", "qwen3_5_text", "qwen3_5_moe_text", "glm4_moe", "deepseek_v3"}
    partial = {f for f, fam in REGISTERED.items() if fam.regions is not None} - newer
    assert set(REGISTERED) == set(FAMILIES) | newer | partial
    assert partial <= set(moe_models.FAMILIES)


def test_aligned_logits_equal_the_spec_for_every_profile(family_model):
    family, model = family_model
    ids = tokens()
    with torch.no_grad():
        unaligned = model(ids).logits
        outputs = {}
        for profile in DISTINCT:
            report = rla.align(model, profile)  # re-aligning replaces the previous profile
            assert report.profile.name == profile and report.family == family
            got = model(ids).logits
            assert torch.equal(got, spec_forward(model, ids, SPEC[profile])), profile
            outputs[profile] = got
        rla.unalign(model)
        assert torch.equal(model(ids).logits, unaligned)
    assert torch.equal(outputs["hf"], unaligned)
    # the oracle comparison is not vacuous: the engine profiles differ from HF here
    for profile in ("vllm-0.33", "sglang-0.5.23", "vllm-0.33-eager"):
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
        rope = {"rotary_emb": 1, "self_attn": n}
        if "qwen3" in family:  # vllm's q/k-norm -> RoPE chain runs as one op (rla.alignment.qk_chain)
            rope["fused q/k norm + RoPE"] = n
        assert report.counts["rope"] == rope
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
    assert rla.alignment_of(model).profile.name == "sglang-0.5.23"
    rla.unalign(model)
    assert "forward" not in attn.__dict__ and rla.alignment_of(model) is None


def test_aligned_context_restores_the_previous_alignment():
    model = tiny_model("llama")
    ids = tokens()
    rla.align(model, "vllm")
    with torch.no_grad():
        with rla.aligned(model, "sglang"):
            assert torch.equal(model(ids).logits, spec_forward(model, ids, SPEC["sglang"]))
        assert rla.alignment_of(model).profile.name == "vllm-0.33"
        assert torch.equal(model(ids).logits, spec_forward(model, ids, SPEC["vllm"]))
    rla.unalign(model)


def test_public_api_names():
    from rla import AlignmentReport, align, aligned, alignment_of, unalign

    import rla.alignment

    assert align is rla.align is rla.alignment.align and callable(align)
    assert rla.alignment.families.FAMILIES
    assert AlignmentReport.__name__ == "AlignmentReport" and callable(unalign) and callable(aligned)
    assert alignment_of is rla.alignment.alignment_of


def test_output_hidden_states_show_the_fp32_sums():
    model = tiny_model("qwen3")
    ids = tokens()
    with torch.no_grad():
        plain = model(ids, output_hidden_states=True).hidden_states
        rla.align(model, "vllm")
        states = model(ids, output_hidden_states=True).hidden_states
        rla.align(model, "vllm-eager")  # rounded_sum: the lp residual stream, as HF
        rounded = model(ids, output_hidden_states=True).hidden_states
    rla.unalign(model)
    assert [h.dtype for h in states] == [torch.bfloat16, torch.float32, torch.bfloat16]  # embeds, sum, final
    assert all(h.dtype == torch.bfloat16 for h in rounded) and len(rounded) == len(plain)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_layers_last_add_leaves_the_mlp_output_alone(dtype):
    """Under fp32_sum the layer hands on x + r in fp32; when the MLP's output is already fp32
    (an fp32 model) the add must not write into it (a hook, or an MoE block, may hold it)."""
    model = tiny_model("qwen2", dtype=dtype)
    rla.align(model, "vllm")
    seen = []
    handle = model.model.layers[0].mlp.register_forward_hook(lambda m, i, o: seen.append((o, o.clone())))
    with torch.no_grad():
        model(tokens())
    handle.remove()
    rla.unalign(model)
    out, copy = seen[0]
    assert torch.equal(out, copy)


def test_an_mlp_returning_router_logits_keeps_its_tuple():
    """transformers 5.x MoE blocks return a tensor; an mlp that returns (out, router_logits), as
    older releases did, keeps returning the extra outputs through the aligned layer."""
    model = tiny_model("qwen2")
    rla.align(model, "vllm")
    layer = model.model.layers[0]
    mlp_forward = layer.mlp.forward
    x = torch.randn(1, 4, 64).to(torch.bfloat16)
    pos = torch.arange(4)[None]
    kwargs = dict(attention_mask=None, position_ids=pos, position_embeddings=model.model.rotary_emb(x, pos))
    with torch.no_grad():
        expected = layer(x, **kwargs)
        layer.mlp.forward = lambda h: (mlp_forward(h), "router logits")
        out = layer(x, **kwargs)
    layer.mlp.forward = mlp_forward
    rla.unalign(model)
    assert isinstance(out, tuple) and out[1] == "router logits" and torch.equal(out[0], expected)


def test_report_renders_with_rich():
    from rich.console import Console

    model = tiny_model("mixtral", dtype=torch.float32).to(torch.bfloat16)
    report = rla.align(model, "sglang", regions=("rope", "rmsnorm"))
    rla.unalign(model)
    console = Console(record=True, width=200)
    console.print(report)
    text = console.export_text()
    assert "sglang" in text and "not aligned" in text and "bf16 inv_freq" in text
    assert report.to_dict()["points"]["rope_cos_sin"] == "fp32"
    assert report.modules("rope") == 1 + model.config.num_hidden_layers and report.modules("swiglu") == 0


def test_import_rla_stays_light():
    import subprocess
    import sys as _sys
    from pathlib import Path

    src = str(Path(rla.__file__).parents[1])
    code = "import sys, rla; assert 'torch' not in sys.modules and 'transformers' not in sys.modules"
    subprocess.run([_sys.executable, "-c", code], check=True, env={"PYTHONPATH": src})


def test_deepcopy_of_an_aligned_model_is_an_independent_aligned_model():
    import copy

    model = tiny_model("qwen3")
    ids = tokens()
    with torch.no_grad():
        plain = model(ids).logits
        rla.align(model, "vllm")
        aligned_logits = model(ids).logits
        clone = copy.deepcopy(model)
        assert torch.equal(clone(ids).logits, aligned_logits)
        rla.unalign(clone)
        assert torch.equal(clone(ids).logits, plain)
        assert torch.equal(model(ids).logits, aligned_logits)
    rla.unalign(model)


def test_accelerate_hooks_stay_around_the_aligned_forward():
    hooks = pytest.importorskip("accelerate.hooks")

    class Count(hooks.ModelHook):
        calls = 0

        def pre_forward(self, module, *args, **kwargs):
            Count.calls += 1
            return args, kwargs

    model = tiny_model("llama")
    ids = tokens()
    layer = model.model.layers[0]
    hooks.add_hook_to_module(layer, Count())
    hooked_forward = layer.forward
    with torch.no_grad():
        rla.align(model, "vllm")
        assert layer.forward is hooked_forward
        assert torch.equal(model(ids).logits, spec_forward(model, ids, SPEC["vllm"]))
        assert Count.calls == 1
        rla.unalign(model)
        assert layer.forward is hooked_forward and layer._old_forward.__func__ is type(layer).forward
    hooks.remove_hook_from_module(layer)
