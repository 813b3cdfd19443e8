"""rla.align on DeepSeek-V3 (MLA attention, a dense first layer, then routed + shared experts): every row
equals the oracle bit for bit (tests/deepseek_v3_spec.py), with the interleaved and the half-split rotary,
with and without a q LoRA, with default RoPE and YaRN as the released config has it; each region alone
too; unalign restores HF's modules; the interleaved layout's forward and backward are the half-split
layout's with the weights' rows permuted; generate's decode steps against HF's latent cache follow the row;
torch.compile and gradient checkpointing change nothing; the report says what is left as is."""

from __future__ import annotations

import copy

import pytest
import torch
from packaging.version import Version

import rla
from rla.alignment import compat
from align_spec import SPEC, at_head_size, head_size_of, points, single_thread  # noqa: F401  (fixture)
from deepseek_v3_spec import CONFIGS, spec_forward, tiny_deepseek_v3
from profile_rows import DISTINCT  # each way of rounding once

pytestmark = pytest.mark.skipif(compat.TRANSFORMERS_VERSION < Version("5.24"),
                                reason="rla.align reads this family's 5.24 layout; older releases are refused "
                                       "(test_align_families_refused.py)")


@pytest.fixture(scope="module", params=list(CONFIGS))
def ds(request):
    return tiny_deepseek_v3(request.param)


def _ids(seq=12):
    return torch.randint(0, 128, (2, seq), generator=torch.Generator().manual_seed(4))


def test_oracle_under_hf_points_is_the_unaligned_model(ds):
    with torch.no_grad():
        assert torch.equal(spec_forward(ds, _ids(), SPEC["hf"]), ds(_ids()).logits)


@pytest.mark.parametrize("profile", DISTINCT)
def test_aligned_equals_the_row_bit_for_bit_and_unalign_restores(ds, profile):
    ids = _ids()
    with torch.no_grad():
        before = ds(ids).logits
        rla.align(ds, profile)
        try:
            got = ds(ids).logits
        finally:
            rla.unalign(ds)
        want = spec_forward(ds, ids, SPEC[profile])
        after = ds(ids).logits
    assert torch.equal(got, want), f"{profile}: {(got == want).float().mean():.4f} of logits equal"
    assert torch.equal(after, before)
    assert not any("_rla_patch" in m.__dict__ for m in ds.modules())
    if profile != "hf":
        assert not torch.equal(got, before)


@pytest.mark.parametrize("profile", ["vllm-0.33", "vllm-0.33-eager", "sglang-0.5.23"])
@pytest.mark.parametrize("region", ["rope", "rmsnorm"])
def test_each_region_alone_equals_the_row(ds, profile, region):
    """The rope half alone, the norms (the layers' and MLA's q_a/kv_a_layernorm) alone: each is the row's
    points in that region and HF's elsewhere, and changes the logits unless those points are HF's at
    this rope head (SGLang's at a rope head outside 64/128/256/512: bf16 cos/sin, per-op products)."""
    ids = _ids()
    with torch.no_grad():
        before = ds(ids).logits
        rla.align(ds, profile, regions=(region,))
        try:
            got = ds(ids).logits
        finally:
            rla.unalign(ds)
        pts = points(profile, (region,))
        want = spec_forward(ds, ids, pts)
    assert torch.equal(got, want)
    ran = at_head_size(pts, head_size_of(ds.config))
    hf_own = all(ran[k] == v for k, v in SPEC["hf"].items() if k != "rope_inv_freq")  # host is device on the CPU
    assert torch.equal(got, before) == hf_own


def _permuted_halves_twin(model):
    """A copy of an interleaved-rotary ``model`` with ``rope_interleave=False`` whose q_b_proj and
    kv_a_proj_with_mqa rows of the rope half are permuted (evens first, then odds): HF's interleaved
    rotary of the original is then the half-split rotary of the copy, value for value."""
    cfg = model.config
    nope, rope, rank = cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.kv_lora_rank
    perm = torch.cat([torch.arange(0, rope, 2), torch.arange(1, rope, 2)])
    head = nope + rope
    q_rows = torch.cat([torch.cat([torch.arange(h * head, h * head + nope), h * head + nope + perm])
                        for h in range(cfg.num_attention_heads)])
    kv_rows = torch.cat([torch.arange(rank), rank + perm])
    twin = copy.deepcopy(model)
    twin.config.rope_interleave = False
    with torch.no_grad():
        for layer, other in zip(model.model.layers, twin.model.layers):
            other.self_attn.q_b_proj.weight.copy_(layer.self_attn.q_b_proj.weight[q_rows])
            other.self_attn.kv_a_proj_with_mqa.weight.copy_(layer.self_attn.kv_a_proj_with_mqa.weight[kv_rows])
    return twin, {"q_b_proj.weight": q_rows, "kv_a_proj_with_mqa.weight": kv_rows}


@pytest.mark.parametrize("profile", DISTINCT)
def test_interleaved_rotary_is_the_half_split_one_of_permuted_weights_forward_and_backward(profile):
    """The interleaved layout (de-interleave, then the rotate-half op) against the half-split layout
    of a model whose rope rows are permuted: the same logits and every gradient the same, bit for bit
    (the permuted weights' gradients permuted)."""
    model = tiny_deepseek_v3("interleaved")
    twin, rows = _permuted_halves_twin(model)
    ids = _ids()
    results = []
    for m in (model, twin):
        m.zero_grad(set_to_none=True)
        rla.align(m, profile)
        logits = m(ids).logits
        (logits.float() * torch.linspace(-1, 1, logits.shape[-1])).sum().backward()
        rla.unalign(m)
        results.append((logits.detach(), {n: p.grad for n, p in m.named_parameters()}))
    (logits, grads), (twin_logits, twin_grads) = results
    assert torch.equal(logits, twin_logits)
    for name, g in grads.items():
        index = next((r for suffix, r in rows.items() if name.endswith(suffix)), None)
        assert g is not None and g.abs().sum() > 0, name
        assert torch.equal(g if index is None else g[index], twin_grads[name]), name


def test_all_four_regions_and_the_report():
    model = tiny_deepseek_v3("yarn_released")
    ids = _ids()
    with torch.no_grad():
        before = model(ids).logits
        report = rla.align(model, "vllm", regions=("rope", "swiglu", "rmsnorm", "router"))
        model(ids)
        rla.unalign(model)
        assert torch.equal(model(ids).logits, before)
    assert report.counts["rope"] == {"rotary_emb": 1, "MLA self_attn (rope half)": 2}
    assert report.counts["swiglu"] == {"mlp": 1, "experts": 1, "shared_expert": 1}
    assert report.counts["rmsnorm"] == {"decoder layers": 2, "RMSNorm": 5, "q_a/kv_a_layernorm (MLA)": 4,
                                        "MoE blocks (fp32 shared + routed)": 1}  # vllm's moe_out='fp32'
    assert report.moe_out == "fp32"
    assert report.counts["router"] == {"MoE blocks": 1}
    text = str(report)
    assert "left as is: MLA's attention kernel and its softmax scale" in text
    assert "not in the rows: vLLM's DeepSeek yarn rotary (DeepseekScalingRotaryEmbedding)" in text
    assert "rope_interleave=False" not in text


def test_report_without_q_lora_and_with_half_split_rotary():
    model = tiny_deepseek_v3("halves_no_q_lora")
    report = rla.align(model, "vllm")
    rla.unalign(model)
    assert report.counts["rmsnorm"]["q_a/kv_a_layernorm (MLA)"] == 2  # kv_a_layernorm only: no q LoRA
    assert any(n.startswith("rope_interleave=False: the rope half is rotated by halves") for n in report.notes)
    assert not any("DeepseekScalingRotaryEmbedding" in n for n in report.notes)  # default RoPE


def test_a_rounded_inv_freq_is_recomputed_from_the_config():
    model = tiny_deepseek_v3("yarn_released")
    rotary = model.model.rotary_emb
    for name in ("inv_freq", "original_inv_freq"):
        rotary._buffers[name] = rotary._buffers[name].to(torch.bfloat16)
    ids = _ids()
    with torch.no_grad():
        report = rla.align(model, "vllm-0.33")
        got = model(ids).logits
        rla.unalign(model)
    assert [h.name for h in report.hazards] == ["bf16 inv_freq"]
    assert rotary.inv_freq.dtype == torch.bfloat16  # unalign restores the buffer the model had
    with torch.no_grad():  # the oracle's frequencies come from the config (HF's YaRN init), as the engines'
        assert torch.equal(got, spec_forward(model, ids, SPEC["vllm-0.33"]))


def test_engine_backed_ops_are_refused_for_mla_before_anything_changes():
    from rla import ops

    model = tiny_deepseek_v3("interleaved")
    before = {id(m): dict(m.__dict__) for m in model.modules()}
    with pytest.raises(NotImplementedError, match="engine-backed ops cover the Llama-shaped attention, not MLA"):
        rla.align(model, "vllm", ops=ops)
    assert all(m.__dict__.keys() == before[id(m)].keys() for m in model.modules())


def test_rope_region_compiled_equals_eager():
    """The attention forward rebuilt with both of rla's apply functions traces under torch.compile
    (AOT eager): the same logits and gradients as the eager aligned model. A dense model (the MoE
    expert loop breaks the graph on its own)."""
    model = tiny_deepseek_v3("interleaved", first_k_dense_replace=2).train()
    rla.align(model, "vllm", regions=("rope",))
    ids = _ids(16)
    runs = []
    for compiled in (False, True):
        run = torch.compile(model, backend="aot_eager", fullgraph=True) if compiled else model
        model.zero_grad(set_to_none=True)
        out = run(ids, labels=ids)
        out.loss.backward()
        torch._dynamo.reset()
        runs.append((out.logits.detach(), [p.grad.clone() for p in model.parameters()]))
    (logits, grads), (c_logits, c_grads) = runs
    assert torch.equal(c_logits, logits)
    assert all(torch.equal(c, g) for c, g in zip(c_grads, grads))


@pytest.mark.parametrize("name", ["interleaved", "yarn_attention_factor_halves"])
def test_decode_steps_against_the_latent_cache_follow_the_row(name):
    """``model.generate``'s steps on the aligned model: the prefill and each one-token step against HF's
    cache of the latents (the normed kv_nope, the rotated k_rot) equal the oracle run with its own cache
    of them, bit for bit, and the tokens are those of the uncached forward."""
    model = tiny_deepseek_v3(name)
    prompt = _ids(8)
    rla.align(model, "vllm-0.33")
    try:
        with torch.no_grad():
            out = model.generate(prompt, max_new_tokens=4, do_sample=False, output_logits=True,
                                 return_dict_in_generate=True)
            uncached = model.generate(prompt, max_new_tokens=4, do_sample=False, use_cache=False)
    finally:
        rla.unalign(model)
    assert torch.equal(out.sequences, uncached)

    def steps(pts):
        cache: dict = {}
        with torch.no_grad():
            logits = [spec_forward(model, prompt, pts, cache=cache)[:, -1]]
            for t in range(prompt.shape[1], out.sequences.shape[1] - 1):
                logits.append(spec_forward(model, out.sequences[:, t:t + 1], pts, cache=cache)[:, -1])
        return logits

    got = [g.to(torch.bfloat16) for g in out.logits]
    assert all(torch.equal(g, w) for g, w in zip(got, steps(SPEC["vllm-0.33"])))
    assert not any(torch.equal(g, w) for g, w in zip(got, steps(SPEC["hf"])))


def test_gradient_checkpointing_gives_the_same_gradients():
    model = tiny_deepseek_v3("yarn_released").train()
    rla.align(model, "vllm", regions=("rope", "swiglu", "rmsnorm", "router"))
    ids = _ids()

    def grads():
        model.zero_grad(set_to_none=True)
        model(ids, labels=ids).loss.backward()
        return [p.grad.clone() for p in model.parameters()]

    plain = grads()
    model.gradient_checkpointing_enable()
    try:
        checkpointed = grads()
    finally:
        model.gradient_checkpointing_disable()
        rla.unalign(model)
    assert all(torch.equal(a, b) for a, b in zip(plain, checkpointed))
