"""The vLLM 0.33 engine twin of Gemma 3, Gemma 4, GLM-4 MoE and GPT-OSS on CPU (rla.engines.vllm_twin_families).

As for Qwen2/Qwen3/Llama (tests/engines/test_vllm_twin.py): the twin runs vLLM's own region code
(read from its wheel) in the layout of vLLM's model file, the GEMMs and HF's attention the same as
the training side. Two claims per family:

- ``native`` mode (vLLM's native ops run eagerly) equals ``rla.align`` under the row that says what
  those ops compute when nothing fuses them (every bf16 op rounds; the native add + norm reads the
  fp32 sum; Gemma's norm takes an fp32 ``1 + w`` and rounds once), bit for bit, logits and every
  layer: the layout, the caches and the ops are the engine's.
- ``default`` mode (Inductor on the CPU, pieces split at attention as vLLM compiles) equals what the
  compiled graph computes, bit for bit: ``rla.align(model, "vllm-0.33")`` where the row says it
  (GLM-4 MoE's dense layers), otherwise the family's oracle (``tests/*_spec.py``) with the chains
  the compiled graph adds, each shown to be needed, and every point that matters flipped breaks it.

What the default-mode twin found on the CPU, now in the rows' variants: Gemma 3's post-attention and
post-feed-forward norms hand the add after them their unrounded output (``post_norm_out``); GLM-4
MoE's ``shared + routed`` experts sum is read unrounded by the residual add (``moe_out``, the
moe_experts variant); GPT-OSS's fp32 YaRN cache, cast to bf16 inside the graph, is read unrounded by
RoPE (the ``rope_cos_sin='fp32'`` of the gpt_oss variant); Gemma 4's three post-norms do what Gemma 3's
do (the row's gemma4 ``post_norm_out='fp32'``), and four chains no row has: the per-layer inputs, the
per-layer-input add, the norms after a layer and after the embedding (``gemma4_spec.CHAINS``). The GPU run (lab/bench/engine_twin_h200.py) says whether Triton
does the same. Without CUDA the routed experts' activation (a CUDA kernel in every mode of the
engine) runs vLLM's native op eagerly, so the default-mode MoE rows here use ``swiglu='per_op'`` for
the routed experts: a stand-in, said by the twin's docstring.
"""

import pytest
import torch

import rla
from rla import profiles

from twin_side import twin_side
from align_spec import SPEC, Row, at_head_size, single_thread, tokens  # noqa: F401
from gemma_spec import gemma_points, spec_forward as gemma_forward, tiny_gemma3
from gemma4_spec import CHAIN_OF, gemma4_points, spec_forward as gemma4_forward, tiny_gemma4
from glm4_moe_spec import spec_forward as glm_forward, tiny_glm4_moe
from gpt_oss_spec import tiny_gpt_oss

IDS = tokens(2, 24)
POSITIONS = torch.arange(40, 64)[None].expand(2, 24)  # not starting at 0: the caches are indexed
#: Gemma 3's default-mode inputs start at position 0. Two arithmetic orders (not rounding locations)
#: separate Inductor's CPU code from the oracle's PyTorch ops, and at other positions of these inputs
#: each shows in a few elements: the GeGLU's fp32 gelu (Inductor's C++ tanh differs from ATen's in the
#: last bit of ~0.3% of values) and a norm's sum of squares (Inductor adds a row in 16- or 32-lane
#: partials with AVX-512, 8 or 16 with AVX2, chosen per kernel: the rows' ``norm_reduction='unpinned'``; located at positions 40.., where
#: one token's pre-feed-forward rstd moves by an ulp under either lane order). The caches' indexing at
#: other positions is checked bit for bit by the native-mode test (the same caches, at 40..).
GEMMA_POSITIONS = torch.arange(24)[None].expand(2, 24)


def _native_row(variants=True):
    """vLLM's native ops run eagerly: HF's per-op rounding, except that the native add + norm
    normalises the fp32 sum (``vllm/ir/ops/layernorm.py``). With ``variants``, the zero-centred
    variant (Gemma's norm: fp32 weight, one rounding); without, GPT-OSS's plain norm rounds twice
    (``x.to(bf16) * w``), not once as HF's GPT-OSS norm (the hf row's gpt_oss variant)."""
    extra = {} if variants else {"variants": {}, "variant_evidence": {}}
    return profiles.get("hf").replace(name="vllm-native-eager", norm_residual="fp32_sum", **extra)


def _side(model, profile, out, ids=IDS, positions=POSITIONS):
    return twin_side(model, profile, out, ids, positions)


def _exact(side):
    return side.logits_equal == 1.0 and all(row["equal"] == 1.0 for row in side.layers)


def _flip(p, point):
    a, b = profiles.POINTS[point]
    return p.replace(name=f"{p.name}-{point}", **{point: b if getattr(p, point) == a else a})


def _equal(out, logits, streams):
    return (torch.equal(out.logits, logits.reshape(out.logits.shape).to(out.logits.dtype))
            and all(torch.equal(a, b.reshape(a.shape)) for a, b in zip(out.layers, streams)))


def _twin(model, engine, mode, positions=POSITIONS):
    from rla.engines.vllm_twin_families import build_twin

    return build_twin(model, engine, mode)(IDS, positions)


# -- Gemma 3 ---------------------------------------------------------------------------------------


def test_gemma3_native_twin_is_the_native_row(vllm_engine):
    model = tiny_gemma3()
    out = _twin(model, vllm_engine, "native")
    assert _exact(_side(model, _native_row(), out))
    assert _side(model, None, out).logits_equal < 0.5  # not vacuous: HF's Gemma rounds the adds


@pytest.fixture(scope="module")
def gemma_default(vllm_engine):
    model = tiny_gemma3()
    return model, _twin(model, vllm_engine, "default", GEMMA_POSITIONS)


def _gemma_oracle(model, pts, chain=None):
    streams = []
    with torch.no_grad():
        logits = gemma_forward(model, IDS, pts, positions=GEMMA_POSITIONS, post_norm_fp32=chain, streams=streams)
    return logits, streams


def test_gemma3_default_twin_keeps_the_post_norm_outputs_fp32_into_the_adds(gemma_default):
    """vLLM's compiled Gemma 3 layer (Inductor on the CPU) is the vllm-0.33 row's points under the
    zero-centred variant, whose ``post_norm_out='fp32'`` this measures: the post-attention and
    post-feed-forward norms' outputs reach the add after them unrounded. The oracle with that value
    and ``rla.align(model, "vllm-0.33")`` equal the twin bit for bit, logits and every layer; with
    ``round`` both differ from the first layer on."""
    model, out = gemma_default
    pts = gemma_points("vllm-0.33")
    assert pts["post_norm_out"] == "fp32"
    assert _equal(out, *_gemma_oracle(model, pts))
    assert _exact(_side(model, "vllm-0.33", out, positions=GEMMA_POSITIONS))
    logits, streams = _gemma_oracle(model, pts, chain=False)
    assert not torch.equal(out.logits, logits.reshape(out.logits.shape))
    assert not torch.equal(out.layers[0], streams[0].reshape(out.layers[0].shape))
    rounded = profiles.get("vllm-0.33").replace_variant("zero_centred_norm", name="vllm-0.33-post-norm-round",
                                                        post_norm_out="round")
    aligned = _side(model, rounded, out, positions=GEMMA_POSITIONS)
    assert aligned.logits_equal < 1.0 and aligned.first_diverging_layer() == 0
    assert torch.equal(logits, gemma_forward(model, IDS, {**pts, "post_norm_out": "round"}, positions=GEMMA_POSITIONS))


def test_gemma3_default_twin_needs_every_point_that_matters(gemma_default):
    model, out = gemma_default
    pts = gemma_points("vllm-0.33")
    # host == device on a CPU; rows of 64 do not tell the norms' reduction orders apart
    for point in ("rope_cos_sin", "rope_apply", "swiglu", "norm_weight", "norm_residual", "residual_stream",
                  "qk_norm_out"):
        a, b = profiles.POINTS[point]
        flipped = Row({**pts, point: b if pts[point] == a else a}, pts.fused_head_sizes)
        assert not torch.equal(out.logits, _gemma_oracle(model, flipped)[0].reshape(out.logits.shape)), point


def test_gemma3_twin_applies_the_final_softcap_and_the_embedding_normalizer(vllm_engine):
    """``final_logit_softcapping`` (``LogitsProcessor``: /cap, tanh, *cap on the bf16 logits) and the
    bf16 ``normalizer``: the native twin with a softcap is HF's softcap of the twin's own logits
    without it, and equals the aligned native row with it."""
    from rla.engines.vllm_twin_families import build_twin

    model = tiny_gemma3()
    plain = build_twin(model, vllm_engine, "native")(IDS, POSITIONS)
    model.config.final_logit_softcapping = 3.0
    capped = build_twin(model, vllm_engine, "native")(IDS, POSITIONS)
    assert torch.equal(capped.logits, torch.tanh(plain.logits / 3.0) * 3.0)
    assert _exact(_side(model, _native_row(), capped))
    wide = tiny_gemma3(hidden_size=96)  # sqrt(96) is not a bf16 number: the buffer is rounded as HF's scale
    normalizer = build_twin(wide, vllm_engine, "native").normalizer
    hf_scale = wide.model.embed_tokens.embed_scale.to(torch.bfloat16)
    assert normalizer.dtype == torch.bfloat16 and torch.equal(normalizer, hf_scale) and float(normalizer) != 96 ** 0.5


# -- Gemma 4 ---------------------------------------------------------------------------------------


def _gemma4(**overrides):
    """The tiny Gemma 4 (both layer types and head sizes, per-layer inputs, keys as values, random norm
    weights and layer scalars, a final softcap) without K/V sharing, at hidden 96, where sqrt(hidden) and
    hidden**-0.5 are not bf16 numbers, so the scaled embedding and the per-layer projection's scale round;
    HF's per-layer-input scales set to the engine's bf16 numbers (docs/families.md, "Gemma 4 scale
    constants": HF's Python floats are no rounding point)."""
    model = tiny_gemma4(kv_shared=0, hidden_size=96, **overrides)
    bf16_scales(model)
    return model


def bf16_scales(model):
    body = model.model
    body.per_layer_input_scale = float(torch.tensor(2 ** -0.5).to(torch.bfloat16))
    body.per_layer_model_projection_scale = float(torch.tensor(model.config.hidden_size ** -0.5).to(torch.bfloat16))


def _gemma4_native_row():
    """vLLM's native ops run eagerly on Gemma 4: every op rounds, and its plain ``RMSNorm`` rounds
    ``x * rstd`` before the weight (``x.to(weight.dtype) * weight``, ``per_op``), where HF's Gemma 4
    norm rounds once (the hf row's gemma4 variant): the hf row without its variants."""
    return profiles.get("hf").replace(name="vllm-native-eager-gemma4", variants={}, variant_evidence={})


def test_gemma4_native_twin_is_the_native_row(vllm_engine):
    """Layout, caches (default and proportional RoPE at two head sizes), the per-layer inputs and the bf16
    scale constants are the engine's: the native twin equals the native row bit for bit, logits and every
    layer; with HF's Python-float scales it does not."""
    model = _gemma4()
    out = _twin(model, vllm_engine, "native")
    assert _exact(_side(model, _gemma4_native_row(), out))
    assert _side(model, None, out).logits_equal < 0.5  # not vacuous: HF's norm rounds once
    body = model.model
    body.per_layer_input_scale, body.per_layer_model_projection_scale = 2 ** -0.5, model.config.hidden_size ** -0.5
    assert _side(model, _gemma4_native_row(), out).first_diverging_layer() == 0


#: The chains vLLM's compiled Gemma 4 graph adds to the vllm-0.33 row's points on the CPU (gemma4_spec.CHAINS).
GEMMA4_CHAINS = ("ple_fp32", "ple_add_rounded", "stream_variance_fp32", "embed_variance_fp32")


#: The default-mode Gemma 4's weights. A norm's sum of squares is in Inductor's lane order on the twin's side and
#: in PyTorch's eager one on the oracle's and rla's (``norm_reduction='unpinned'``), both as wide as the CPU's
#: vector unit: seed 1 is one where the two orders give the same bits with AVX-512's lanes and with AVX2's (checked
#: under ``ATEN_CPU_CAPABILITY=avx2``, which Inductor follows: tests/cpu_orders.py); at seed 0 the twin and the
#: oracle part from the third layer's output on in one token with AVX2's (so do seeds 5, 6, 7 of 0..8).
GEMMA4_SEED = 1


@pytest.fixture(scope="module")
def gemma4_default(vllm_engine):
    model = _gemma4(seed=GEMMA4_SEED)
    return model, _twin(model, vllm_engine, "default", GEMMA_POSITIONS)


def _gemma4_oracle(model, pts, chains=GEMMA4_CHAINS):
    streams = []
    with torch.no_grad():
        logits = gemma4_forward(model, IDS, pts, positions=GEMMA_POSITIONS, streams=streams, chains=chains)
    return logits, streams


def test_gemma4_default_twin_is_the_row_with_four_chains(gemma4_default):
    """vLLM's compiled Gemma 4 (Inductor on the CPU) is the vllm-0.33 row's points under its gemma4 variant,
    ``post_norm_out='fp32'`` included (measured here: with ``round`` the first layer differs), plus what
    no point says, each needed:

    - ``ple_fp32``: the per-layer inputs ``(norm(G * ps) + E * es) * s`` are one fp32 chain rounded once
      (HF and the aligned model round each op);
    - ``ple_add_rounded``: the per-layer-input add reads RN(s), the tensor the gate's GEMM reads, not the
      fp32 sum the aligned layer carries there under ``fp32_carry`` (the MLP's add does carry it);
    - ``stream_variance_fp32`` / ``embed_variance_fp32``: a norm reading the layer's output (the next input
      norm, the final norm) or the scaled embedding takes its mean square from the unrounded value and
      normalises the rounded one (the aligned layer's ``fp32_sum`` normalises the fp32 value).

    The oracle with them equals the twin bit for bit; so does ``rla.align(model, "vllm-0.33")``, whose
    gemma4 variant now says them (``ple_inputs``, ``ple_add``, ``stream_variance``, ``embed_variance``:
    gemma4_spec.CHAIN_OF); the row with those four at HF's values is the oracle without them, which differs
    from the twin from the first layer on.

    The weights are ``GEMMA4_SEED``'s, one where Inductor's and PyTorch's sums of squares agree with AVX-512's
    and AVX2's lanes alike, so the test runs, with all of its bit-for-bit claims, on either CPU."""
    model, out = gemma4_default
    pts = gemma4_points("vllm-0.33")
    assert pts["post_norm_out"] == "fp32"
    assert _equal(out, *_gemma4_oracle(model, pts))
    for chain in GEMMA4_CHAINS:
        assert not _equal(out, *_gemma4_oracle(model, pts, tuple(c for c in GEMMA4_CHAINS if c != chain))), chain
    rounded = _gemma4_oracle(model, Row({**pts, "post_norm_out": "round"}, pts.fused_head_sizes))
    assert not torch.equal(out.layers[0], rounded[1][0].reshape(out.layers[0].shape))
    from rla.engines.vllm_twin import TwinOutput

    assert _exact(_side(model, "vllm-0.33", out, positions=GEMMA_POSITIONS))  # the row: rla.align is the twin
    hf_body = {p: first for p, (first, _) in CHAIN_OF.items()}
    without = profiles.get("vllm-0.33").replace_variant("gemma4", name="vllm-0.33-without-the-chains", **hf_body)
    plain = TwinOutput(*_gemma4_oracle(model, pts, chains=()))
    plain = TwinOutput(plain.logits.reshape(out.logits.shape).to(out.logits.dtype), plain.layers)
    assert _exact(_side(model, without, plain, positions=GEMMA_POSITIONS))  # the row without the chains
    aligned = _side(model, without, out, positions=GEMMA_POSITIONS)
    assert aligned.logits_equal < 0.5 and aligned.first_diverging_layer() == 0


def test_gemma4_default_twin_needs_every_point_that_matters(gemma4_default):
    model, out = gemma4_default
    pts = gemma4_points("vllm-0.33")
    values = {**profiles.POINTS, "post_norm_out": ("round", "fp32"), "ple_swiglu": profiles.POINTS["swiglu"]}
    for point in ("rope_apply", "swiglu", "ple_swiglu", "norm_weight", "norm_residual", "residual_stream",
                  "qk_norm_out", "post_norm_out"):
        a, b = values[point]
        flipped = Row({**pts, point: b if pts[point] == a else a}, pts.fused_head_sizes)
        assert not torch.equal(out.logits, _gemma4_oracle(model, flipped)[0].reshape(out.logits.shape)), point


def test_gemma4_twin_refuses_what_it_does_not_lay_out(vllm_engine):
    from rla.engines.vllm_twin_families import build_twin

    with pytest.raises(NotImplementedError, match="dense layers only: this config has MoE layers"):
        build_twin(tiny_gemma4(kv_shared=0, moe=True), vllm_engine, "native")
    with pytest.raises(NotImplementedError, match="does not lay out K/V sharing: num_kv_shared_layers=2"):
        build_twin(tiny_gemma4(kv_shared=2), vllm_engine, "native")
    with pytest.raises(NotImplementedError, match="gelu_pytorch_tanh"):
        build_twin(tiny_gemma4(kv_shared=0, hidden_activation="gelu"), vllm_engine, "native")
    twin = build_twin(_gemma4(), vllm_engine, "native")  # the engine's bf16 constants, not HF's floats
    assert float(twin.ple["input_scale"]) == 0.70703125 != 2 ** -0.5
    assert twin.ple["proj_scale"].dtype == twin.normalizer.dtype == torch.bfloat16
    assert float(twin.normalizer) == float(torch.tensor(96 ** 0.5).to(torch.bfloat16))


# -- GLM-4 MoE -------------------------------------------------------------------------------------


def test_glm4_moe_native_twin_is_the_native_row(vllm_engine):
    model = tiny_glm4_moe(dense_layers=1)  # a dense layer, then routed experts + a shared expert
    out = _twin(model, vllm_engine, "native")
    assert _exact(_side(model, _native_row(), out))
    assert _side(model, None, out).logits_equal < 0.5


def test_glm4_moe_default_twin_of_dense_layers_is_the_row_bit_for_bit(vllm_engine):
    """The dense GLM-4 layer (partial rotary, q/k norms, QKV bias) compiled as vLLM compiles it is
    the vllm-0.33 row, and every point that matters is needed."""
    model = tiny_glm4_moe(dense_layers=2)
    out = _twin(model, vllm_engine, "default")
    assert _exact(_side(model, "vllm-0.33", out))
    assert _side(model, None, out).logits_equal < 0.5
    base = profiles.get("vllm-0.33")
    with pytest.raises(NotImplementedError, match="qk_norm_out='fp32' with rope_cos_sin='fp32'"):
        rla.align(model, _flip(base, "rope_cos_sin"))
    for point in ("rope_apply", "swiglu", "norm_weight", "norm_residual", "residual_stream", "qk_norm_out"):
        assert _side(model, _flip(base, point), out).logits_equal < 1.0, point


@pytest.mark.parametrize("qk_norm", [True, False], ids=["qk_norm", "no_qk_norm"])
def test_glm4_moe_default_twin_reads_the_experts_sum_unrounded(vllm_engine, qk_norm):
    """With MoE layers the compiled graph adds the shared and routed experts' outputs (outside the
    opaque MoE op, ``MoERunner.forward``) inside the next residual add: the oracle with that sum
    unrounded equals the twin bit for bit, with it rounded it does not; the routed experts'
    activation is the native op run eagerly (``per_op``, the row's moe_experts variant), the shared
    expert's compiled (``fused``). ``rla.align(model, "vllm-0.33")``, whose moe_experts variant has
    ``moe_out='fp32'``, equals the twin bit for bit, logits and every layer; the row with that point
    rounded (the row before it had the point) does not, from the first layer on. (With a dense layer
    before them, ``dense_layers=1``, ~1% of the first layer's stream differs at these inputs from the
    oracle and the aligned row alike, which agree with each other: a difference of the compiled dense
    layer, not of this point, not located yet.)"""
    model = tiny_glm4_moe(qk_norm=qk_norm, dense_layers=0)
    out = _twin(model, vllm_engine, "default")
    pts = at_head_size(Row(dict(SPEC["vllm-0.33"]), SPEC["vllm-0.33"].fused_head_sizes), 32)
    experts = {**pts, "swiglu": "per_op"}

    def oracle(**kw):
        streams = []
        with torch.no_grad():
            return glm_forward(model, IDS, pts, positions=POSITIONS, expert_pts=experts, streams=streams, **kw), streams

    assert _equal(out, *oracle(moe_sum_fp32=True))
    assert not torch.equal(out.logits, oracle(moe_sum_fp32=False)[0].reshape(out.logits.shape))
    row = profiles.get("vllm-0.33")
    assert row.variant("moe_experts").moe_out == "fp32"  # the row's moe_experts variant, which this measures
    assert _exact(_side(model, "vllm-0.33", out))
    rounded = row.replace_variant("moe_experts", name="vllm-0.33-moe-out-round", moe_out="round")
    before = _side(model, rounded, out)
    assert before.logits_equal < 1.0 and before.first_diverging_layer() == 0


# -- GPT-OSS ---------------------------------------------------------------------------------------


def test_gpt_oss_native_twin_is_the_native_row(vllm_engine):
    model = tiny_gpt_oss()
    out = _twin(model, vllm_engine, "native")
    assert _exact(_side(model, _native_row(variants=False), out))
    assert _side(model, None, out).logits_equal < 0.5


def test_gpt_oss_default_twin_reads_the_fp32_yarn_cache_unrounded(vllm_engine):
    """``get_rope(..., dtype=torch.float32)``: the cache's cast to bf16 happens in the compiled graph,
    which drops it, so RoPE reads fp32 cos/sin: the twin is vllm-0.33 with ``rope_cos_sin='fp32'``
    (and, on the CPU, the routed experts' activation run eagerly: ``swiglu='per_op'``), bit for
    bit; the row as it stands is not, and every other point that matters is needed."""
    model = tiny_gpt_oss()
    out = _twin(model, vllm_engine, "default")
    row = profiles.get("vllm-0.33").replace(name="vllm-0.33-cpu-twin", swiglu="per_op")
    assert row.variant("gpt_oss").rope_cos_sin == "fp32"  # the row's gpt_oss variant, which this measures
    assert _exact(_side(model, row, out))
    assert _exact(_side(model, row.replace(rope_cos_sin="fp32", variants={}, variant_evidence={}), out))
    rounded = row.replace_variant("gpt_oss", name="vllm-0.33-rope-round", rope_cos_sin="round")
    assert _side(model, rounded, out).logits_equal < 1.0
    for point in ("rope_apply", "swiglu", "norm_weight", "norm_residual", "residual_stream"):
        assert _side(model, _flip(row.replace(rope_cos_sin="fp32", variants={}, variant_evidence={}), point), out).logits_equal < 1.0, point


def test_family_twins_refuse_what_vllm_computes_otherwise(vllm_engine):
    from rla.engines.vllm_twin import VllmTwin
    from rla.engines.vllm_twin_families import build_twin

    with pytest.raises(NotImplementedError, match="Gemma 3, Gemma 4, GLM-4 MoE, GPT-OSS and Qwen3.5: rla.engines.vllm_twin_families"):
        VllmTwin(tiny_gemma3(), vllm_engine, "native")
    with pytest.raises(NotImplementedError, match="the vLLM twin covers qwen2, qwen3, llama, gemma3_text, gemma4_text"):
        build_twin(torch.nn.Linear(2, 2), vllm_engine, "native")
    model = tiny_gpt_oss()
    model.config.layer_types = ["full_attention", "sliding_attention"]
    with pytest.raises(NotImplementedError, match="even layers the sliding window"):
        build_twin(model, vllm_engine, "native")
    model = tiny_gpt_oss()
    for layer in model.model.layers:
        layer.mlp.experts.limit = 5.0
    with pytest.raises(NotImplementedError, match="alpha=1.702, limit=7.0"):
        build_twin(model, vllm_engine, "native")
    model = tiny_gemma3()
    model.config.hidden_activation = "gelu"
    with pytest.raises(NotImplementedError, match="gelu_pytorch_tanh"):
        build_twin(model, vllm_engine, "native")
    with pytest.raises(ValueError, match="past the engine's cos/sin cache"):
        build_twin(tiny_gemma3(), vllm_engine, "native")(tokens(1, 4), torch.tensor([[252, 253, 254, 256]]))


def test_gemma_oracle_embedding_chain_reads_the_unrounded_product():
    """The oracle's ``embed_fp32`` (a side of the GPU run, lab/bench/twin_families.py): the first norm
    reads the embedding times the bf16 scale unrounded. At hidden 64 the scale is 8 and the product
    exact, so it changes nothing (why the CPU twin cannot tell); at hidden 96 it does."""
    pts = gemma_points("vllm-0.33")
    for hidden, same in ((64, True), (96, False)):
        model = tiny_gemma3(hidden_size=hidden)
        with torch.no_grad():
            plain = gemma_forward(model, IDS, pts)
            chain = gemma_forward(model, IDS, pts, embed_fp32=True)
        assert torch.equal(plain, chain) is same, hidden


def test_rla_verify_names_the_family_chain_the_row_lacks(vllm_wheel, tmp_path, capsys):
    """`rla verify` builds the family's twin (rla.engines.vllm_twin_families.build_twin) and, where the
    aligned side differs in default mode, names the chain the row lacks for that family: on Gemma 3
    under a row whose zero_centred_norm variant rounds the post-norms' outputs, not under vllm-0.33
    (which has the chain); on Gemma 4 not under vllm-0.33, which now has its four chains, and under the row
    with those four points at HF's values."""
    from rla.cli import main

    folder = tmp_path / "gemma"
    tiny_gemma3().save_pretrained(str(folder))
    args = ["verify", "--model", str(folder), "--wheel", vllm_wheel, "--device", "cpu", "--tokens", "24", "--batch", "2"]
    assert main(args) == 0
    text = capsys.readouterr().out.replace("\n", " ")
    assert "aligned vllm-0.33" in text and "unrounded into the adds" not in text
    rounded = profiles.get("vllm-0.33").replace_variant("zero_centred_norm", name="vllm-0.33-post-norm-round",
                                                        post_norm_out="round")
    row = tmp_path / "rounded.json"
    row.write_text(__import__("json").dumps(profiles.to_dict(rounded)))
    assert main(args + ["--profile", str(row)]) == 0
    text = capsys.readouterr().out.replace("\n", " ")
    assert "post-feed-forward norms' outputs unrounded into the adds (post_norm_out='fp32')" in text
    assert main(args + ["--mode", "native"]) == 0
    assert "unrounded into the adds" not in capsys.readouterr().out.replace("\n", " ")
    folder = tmp_path / "gemma4"  # Gemma 4: per-layer head sizes (rla verify reads each layer's)
    _gemma4().save_pretrained(str(folder))
    args[2] = str(folder)
    assert main(args) == 0
    text = capsys.readouterr().out.replace("\n", " ")
    # the row says the chains; what is left at these tokens is the reduction order (norm_reduction='unpinned')
    assert "aligned vllm-0.33" in text and "default-mode twin also computes" not in text
    without = profiles.get("vllm-0.33").replace_variant("gemma4", name="vllm-0.33-without-the-chains",
                                                         **{p: first for p, (first, _) in CHAIN_OF.items()})
    row = tmp_path / "without.json"
    row.write_text(__import__("json").dumps(profiles.to_dict(without)))
    assert main(args + ["--profile", str(row)]) == 0
    text = capsys.readouterr().out.replace("\n", " ")
    assert "On gemma4_text the default-mode twin also computes" in text and "ple_inputs='fused'" in text
