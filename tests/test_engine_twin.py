"""The vLLM 0.33 engine twin on CPU: vLLM's own native region code (read from its wheel) under
Inductor's CPU backend, compiled in pieces split at attention as vLLM compiles a model.

The claim checked: ``rla.align(model, "vllm-0.33")`` makes an HF model's logits and every
layer's residual stream equal the twin's bit for bit, HF eager does not, and changing any one
rounding point that matters on the model breaks the equality (so no point is right by accident).
``rope_inv_freq`` cannot be told apart here: on a CPU-only machine host and device are the same.
"""

import pytest
import torch

import rla
from rla import profiles
from rla.diagnosis.verify import compare, hf_side

try:
    from test_align_spec import single_thread, tiny_config, tiny_model, tokens  # noqa: F401
except ImportError:
    from tests.test_align_spec import single_thread, tiny_config, tiny_model, tokens  # noqa: F401

LLAMA3 = dict(
    max_position_embeddings=256,
    rope_parameters=dict(rope_type="llama3", rope_theta=500000.0, factor=8.0, low_freq_factor=1.0,
                         high_freq_factor=4.0, original_max_position_embeddings=64),
)
CASES = {"qwen2": {}, "qwen3": {}, "llama3": LLAMA3}


def _model(case):
    family = "llama" if case == "llama3" else case
    return tiny_model(family, config=tiny_config(family, **CASES[case]))


def _flip(p, point):
    a, b = profiles.POINTS[point]
    return p.replace(name=f"{p.name}-{point}", **{point: b if getattr(p, point) == a else a})


@pytest.fixture(scope="module", params=list(CASES))
def twin_run(request, vllm_engine):
    from rla.engines.twin import VllmTwin

    model = _model(request.param)
    ids = tokens(2, 24)
    positions = torch.arange(40, 64)[None].expand(2, 24)  # not starting at 0: the cache is indexed
    out = VllmTwin(model, vllm_engine, "default")(ids, positions)
    return request.param, model, ids, positions, out


def _side(model, profile, out, ids, positions):
    if profile is not None:
        rla.align(model, profile)
    try:
        return compare((out.logits, out.layers), {"side": hf_side(model)}, ids, positions).sides[0]
    finally:
        if profile is not None:
            rla.unalign(model)


def test_aligned_model_equals_the_compiled_twin_bit_for_bit(twin_run):
    case, model, ids, positions, out = twin_run
    aligned = _side(model, "vllm-0.33", out, ids, positions)
    assert aligned.logits_equal == 1.0 and aligned.k3 == 0.0 and aligned.kl == 0.0
    assert [row["equal"] for row in aligned.layers] == [1.0] * len(out.layers)
    hf = _side(model, None, out, ids, positions)
    assert hf.logits_equal < 0.5 and hf.k3 > 0  # not vacuous: HF eager rounds elsewhere
    assert hf.first_diverging_layer() == 0


def test_every_point_that_matters_is_needed(twin_run):
    case, model, ids, positions, out = twin_run
    base = profiles.get("vllm-0.33")
    points = [p for p in profiles.POINTS if p != "rope_inv_freq"]  # host == device on a CPU
    if case != "qwen3":
        points.remove("qk_norm_out")  # no q/k norms
    for point in points:
        side = _side(model, _flip(base, point), out, ids, positions)
        assert side.logits_equal < 1.0, f"{case}: flipping {point} still equals the twin"


def test_native_ops_run_eagerly_are_hf_rounding_with_an_fp32_sum(vllm_engine):
    """Without Inductor the same native ops round after every bf16 op: the twin then equals the
    profile hf + fp32_sum (vLLM's native add+norm reads the fp32 sum) -- the compiler, not the
    op code, makes vLLM's default path 'fused'."""
    from rla.engines.twin import VllmTwin

    model = _model("qwen3")
    ids, positions = tokens(2, 16), torch.arange(16)[None].expand(2, 16)
    out = VllmTwin(model, vllm_engine, "native")(ids, positions)
    native = profiles.get("hf").replace(name="vllm-native-eager", norm_residual="fp32_sum")
    assert _side(model, native, out, ids, positions).logits_equal == 1.0
    assert _side(model, "vllm-0.33", out, ids, positions).logits_equal < 1.0


def test_twin_refuses_what_it_does_not_cover(vllm_engine):
    from rla.engines.twin import VllmTwin

    with pytest.raises(NotImplementedError, match="covers qwen2, qwen3, llama"):
        VllmTwin(tiny_model("mistral"), vllm_engine, "default")
    with pytest.raises(ValueError, match="mode must be one of"):
        VllmTwin(tiny_model("qwen2"), vllm_engine, "fast")
    twin = VllmTwin(tiny_model("qwen2"), vllm_engine, "native")
    with pytest.raises(ValueError, match="past the engine's cos/sin cache"):
        twin(tokens(1, 4), torch.tensor([[60, 61, 62, 64]]))
