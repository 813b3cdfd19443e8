"""rla.align on Gemma 4's text model: every row equals the oracle written from docs/families.md bit
for bit (tests/gemma4_spec.py) on a model with both layer types, per-layer inputs, shared K/V and
keys as values, and on one with MoE layers; unalign restores HF's modules bit for bit; the report
says what is aligned and what is left as is; what cannot be aligned is refused by name."""

from __future__ import annotations

import pytest
import torch
from packaging.version import Version

import rla
from rla import profiles
from rla.alignment import compat
from align_spec import PROFILES, single_thread  # noqa: F401  (fixture)
from gemma4_spec import PLE_VARIANT, VARIANT, gemma4_points, spec_forward, tiny_gemma4
from profile_rows import DISTINCT  # each way of rounding once

pytestmark = pytest.mark.skipif(compat.TRANSFORMERS_VERSION < Version("5.24"),
                                reason="Gemma 4 is aligned on transformers >= 5.24 (refused below: test_align_families_refused)")


@pytest.fixture(scope="module")
def gemma4():
    return tiny_gemma4()


@pytest.fixture(scope="module")
def gemma4_moe():
    return tiny_gemma4(seed=1, layers=3, ple=False, kv_shared=0, moe=True)


def _ids(seq=20, batch=2):
    return torch.randint(0, 128, (batch, seq), generator=torch.Generator().manual_seed(3))


def test_variant_tables_are_rla_profiles():
    for name in PROFILES:
        for kind, table in (("gemma4", VARIANT), ("gemma4_ple", PLE_VARIANT)):
            assert profiles.get(name).variants.get(kind, {}) == table.get(name, {}), (name, kind)
            assert set(profiles.get(name).variant_evidence.get(kind, {})) == set(table.get(name, {}))


def test_the_tiny_model_has_what_the_oracle_covers(gemma4, gemma4_moe):
    cfg = gemma4.config
    assert set(cfg.layer_types) == {"sliding_attention", "full_attention"}
    assert cfg.rope_parameters["full_attention"]["rope_type"] == "proportional"
    assert {cfg.per_layer_config[t].head_dim for t in cfg.layer_types} == {16, 32}
    attns = [layer.self_attn for layer in gemma4.model.layers]
    assert any(a.is_kv_shared_layer for a in attns) and any(a.v_proj is None and not a.is_kv_shared_layer for a in attns)
    assert gemma4.model.hidden_size_per_layer_input and all(layer.enable_moe_block for layer in gemma4_moe.model.layers)
    assert len({float(layer.layer_scalar) for layer in gemma4.model.layers}) == len(attns)


@pytest.mark.parametrize("which", ["gemma4", "gemma4_moe"])
def test_oracle_under_hf_points_is_the_unaligned_model(which, request):
    model = request.getfixturevalue(which)
    ids = _ids()
    with torch.no_grad():
        assert torch.equal(spec_forward(model, ids, gemma4_points("hf")), model(ids).logits)


@pytest.mark.parametrize("which", ["gemma4", "gemma4_moe"])
@pytest.mark.parametrize("profile", DISTINCT)
def test_aligned_equals_the_row_bit_for_bit_and_unalign_restores(which, profile, request):
    model = request.getfixturevalue(which)
    ids = _ids()
    with torch.no_grad():
        before = model(ids).logits
        rla.align(model, profile)
        try:
            got = model(ids).logits
        finally:
            rla.unalign(model)
        want = spec_forward(model, ids, gemma4_points(profile))
        after = model(ids).logits
    assert torch.equal(got, want), f"{profile}: {(got == want).float().mean():.4f} of logits equal"
    assert torch.equal(after, before)
    if profile != "hf":  # the rows are not HF: the test can tell them apart
        assert not torch.equal(got, before)


@pytest.mark.parametrize("regions", [("rope",), ("swiglu",), ("rmsnorm",), ("rope", "rmsnorm")])
def test_one_region_at_a_time(gemma4, regions):
    ids = _ids(seq=12)
    for profile in ("vllm", "sglang"):
        with torch.no_grad(), rla.aligned(gemma4, profile, regions):
            got = gemma4(ids).logits
        with torch.no_grad():
            assert torch.equal(got, spec_forward(gemma4, ids, gemma4_points(profiles.resolve(profile).name, regions)))


def test_the_oracle_sees_the_per_layer_input_variant(gemma4):
    """sglang's gemma4_ple variant (per_op) differs from its row's fused GeGLU: with the oracle told
    otherwise the aligned model no longer matches, so the variant is what the alignment runs."""
    ids = _ids(seq=12)
    with torch.no_grad(), rla.aligned(gemma4, "sglang", ("swiglu",)):
        got = gemma4(ids).logits
    wrong = gemma4_points("sglang-0.5.23", ("swiglu",))
    wrong["ple_swiglu"] = "fused"
    with torch.no_grad():
        assert not torch.equal(got, spec_forward(gemma4, ids, wrong))


def test_unalign_restores_every_module_and_backward_runs(gemma4):
    state = {id(m): dict(m.__dict__) for m in gemma4.modules()}
    rla.align(gemma4, "vllm")
    ids = _ids(seq=10)
    loss = gemma4(ids).logits.float().logsumexp(-1).mean()
    loss.backward()
    grads = {n: p.grad for n, p in gemma4.named_parameters()}
    gemma4.zero_grad(set_to_none=True)
    rla.unalign(gemma4)
    shared = ("k_proj", "v_proj", "k_norm")  # the layers reading another layer's K/V have none of their own
    assert all(g is not None and torch.isfinite(g).all() for n, g in grads.items()
               if "embed" not in n and not any(s in n for s in shared))
    for m in gemma4.modules():
        assert dict(m.__dict__).keys() == state[id(m)].keys(), type(m).__name__
        assert all(m.__dict__[k] is v for k, v in state[id(m)].items() if k not in ("_parameters", "_buffers", "_modules"))


def test_gradient_checkpointing_gives_the_same_gradients():
    gemma4 = tiny_gemma4()  # its own: enabling checkpointing leaves a hook on the embeddings that cannot pickle
    ids = _ids(seq=10)

    def grads(checkpointing: bool):
        gemma4.train()
        if checkpointing:
            gemma4.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        try:
            with rla.aligned(gemma4, "vllm"):
                gemma4(ids).logits.float().logsumexp(-1).mean().backward()
        finally:
            gemma4.gradient_checkpointing_disable()
            gemma4.eval()
        out = {n: p.grad.clone() for n, p in gemma4.named_parameters() if p.grad is not None}
        gemma4.zero_grad(set_to_none=True)
        return out

    plain, checkpointed = grads(False), grads(True)
    assert plain.keys() == checkpointed.keys() and all(torch.equal(plain[n], checkpointed[n]) for n in plain)


def test_report_says_what_is_aligned_and_left(gemma4, gemma4_moe):
    report = rla.align(gemma4, "sglang")
    rla.unalign(gemma4)
    assert report.family == "gemma4_text" and report.variant == "gemma4"
    # 5 layers x 5 norms + the final norm + the per-layer projection's norm; q_norm in every layer, k_norm and
    # v_norm in the 3 that compute their own K/V
    assert report.counts["rmsnorm"] == {"decoder layers": 5, "RMSNorm": 27, "q_norm/k_norm": 8, "v_norm": 3}
    assert report.counts["swiglu"] == {"GeGLU mlp (gelu tanh)": 5, "per-layer-input gate": 5}
    text = str(report)
    assert "gate gelu_tanh(g) * p follows 'sglang-0.5.23@head_size=16/gemma4_ple': {'swiglu': 'per_op'}" in text
    assert "left as is: attention" in text and "per-layer-input scales" in text and "gemma_rmsnorm_residual_scalar" in text
    assert "MoE block" not in text
    hf = str(rla.align(gemma4, "hf"))
    rla.unalign(gemma4)
    assert "'hf/gemma4'" in hf and "'norm_weight': 'fused'" in hf
    moe = rla.align(gemma4_moe, "vllm")
    rla.unalign(gemma4_moe)
    assert moe.counts["rmsnorm"]["RMSNorm"] == 3 * 7 + 1 and "left as is: the MoE block's router" in str(moe)


def test_a_cast_model_gets_fp32_frequencies_back():
    model = tiny_gemma4(layers=3, kv_shared=0).to(torch.bfloat16)  # model.to rounds the rotary buffers
    report = rla.align(model, "hf")
    rla.unalign(model)
    assert [h.name for h in report.hazards] == ["bf16 inv_freq"]
    assert "full_attention_inv_freq" in report.hazards[0].detail


def test_refusals_name_the_problem(gemma4):
    with pytest.raises(NotImplementedError, match="engine-backed ops cover the Llama-shaped"):
        rla.align(gemma4, "vllm", ops=rla.ops)
    with pytest.raises(NotImplementedError, match=r"gemma4_text supports the regions .*not \('router',\)"):
        rla.align(gemma4, "vllm", regions=("rope", "swiglu", "rmsnorm", "router"))
    gemma4.config.hidden_activation = "gelu"
    try:
        with pytest.raises(ValueError, match="hidden_activation is 'gelu'"):
            rla.align(gemma4, "vllm")
    finally:
        gemma4.config.hidden_activation = "gelu_pytorch_tanh"
    rp = gemma4.config.rope_parameters["full_attention"]
    rp["factor"] = 2.0
    try:
        with pytest.raises(NotImplementedError, match="proportional with factor 2.0.*gemma4_rope.py"):
            rla.align(gemma4, "vllm")
    finally:
        del rp["factor"]
    assert rla.alignment_of(gemma4) is None
    assert not any("_rla_patch" in m.__dict__ for m in gemma4.modules())


def test_a_row_whose_points_differ_between_the_two_head_sizes_is_refused():
    """SGLang keeps its fp32 cos/sin cache at head size 64 and rounds it at 32: one model, two rows."""
    model = tiny_gemma4(layers=3, kv_shared=0, head_dim=64, global_head_dim=32)
    with pytest.raises(NotImplementedError, match=r"rounds otherwise at Gemma 4's head sizes \[32, 64\]"):
        rla.align(model, "sglang")
    assert not any("_rla_patch" in m.__dict__ for m in model.modules())
    rla.align(model, "vllm")  # no head-size conditions: aligned
    rla.unalign(model)


def test_deepcopy_and_pickle_keep_the_alignment(gemma4):
    import copy
    import io

    ids = _ids(seq=10)
    rla.align(gemma4, "vllm")
    try:
        with torch.no_grad():
            want = gemma4(ids).logits
        copied = copy.deepcopy(gemma4)
        buf = io.BytesIO()
        torch.save(gemma4, buf)
        buf.seek(0)
        loaded = torch.load(buf, weights_only=False)
    finally:
        rla.unalign(gemma4)
    with torch.no_grad():
        assert torch.equal(copied(ids).logits, want) and torch.equal(loaded(ids).logits, want)
    assert rla.alignment_of(loaded).profile.name == "vllm-0.33"
    rla.unalign(loaded)
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, gemma4(ids).logits)


@pytest.mark.parametrize("which", ["gemma4", "gemma4_moe"])
@pytest.mark.parametrize("name", ["vllm-0.33", "vllm-0.33-eager"])
def test_post_norm_out_is_the_oracle_and_visible_in_the_logits(which, name, request):
    """The gemma4 variant's post_norm_out flipped (round for vllm-0.33, fp32 for the eager row): the
    aligned model is the oracle with that value bit for bit, and not the row's own logits; with
    per-layer inputs (gemma4) the post-per-layer-input norm takes part, in MoE layers the block's two
    inner post-norms stay rounded."""
    model = request.getfixturevalue(which)
    ids = _ids()
    row = profiles.get(name)
    other = "round" if row.variant("gemma4").post_norm_out == "fp32" else "fp32"
    flipped = row.replace_variant("gemma4", name=f"{name}-post-norm-{other}", post_norm_out=other)
    pts = gemma4_points(name)
    pts["post_norm_out"] = other
    with torch.no_grad():
        with rla.aligned(model, name):
            own = model(ids).logits
        with rla.aligned(model, flipped):
            got = model(ids).logits
        assert torch.equal(got, spec_forward(model, ids, pts))
    assert not torch.equal(got, own)
