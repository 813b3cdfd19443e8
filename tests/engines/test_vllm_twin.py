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

from twin_side import twin_side
from align_spec import single_thread, tiny_config, tiny_model, tokens  # noqa: F401
from twin_default_cases import CASES, case_model as _model


def _flip(p, point):
    a, b = profiles.POINTS[point]
    return p.replace(name=f"{p.name}-{point}", **{point: b if getattr(p, point) == a else a})


@pytest.fixture(scope="module", params=list(CASES))
def twin_run(request, vllm_engine):
    """The case's model and the twin's output on it (built once per session: test_vllm_forward.py reads it too)."""
    from twin_default_cases import IDS, POSITIONS, default_twin

    return request.param, _model(request.param), IDS, POSITIONS, default_twin(request.param, vllm_engine)


def _side(model, profile, out, ids, positions):
    return twin_side(model, profile, out, ids, positions)


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
    # host == device on a CPU; and the norms' reduction order is an arithmetic order that rows of
    # 64 do not tell apart (tests/test_reduction.py pins it; the H200 twin measures it)
    points = [p for p in profiles.POINTS if p not in ("rope_inv_freq", "norm_reduction")]
    if case != "qwen3":
        points.remove("qk_norm_out")  # no q/k norms
    if case == "qwen3":  # fp32 tables under the q/k-norm -> RoPE chain: refused (no engine does it)
        points.remove("rope_cos_sin")
        with pytest.raises(NotImplementedError, match="qk_norm_out='fp32' with rope_cos_sin='fp32'"):
            rla.align(model, _flip(base, "rope_cos_sin"))
    for point in points:
        side = _side(model, _flip(base, point), out, ids, positions)
        assert side.logits_equal < 1.0, f"{case}: flipping {point} still equals the twin"


def test_native_ops_run_eagerly_are_hf_rounding_with_an_fp32_sum(vllm_engine):
    """Without Inductor the same native ops round after every bf16 op: the twin then equals the
    profile hf + fp32_sum (vLLM's native add+norm reads the fp32 sum) -- the compiler, not the
    op code, makes vLLM's default path 'fused'."""
    from rla.engines.vllm_twin import VllmTwin

    model = _model("qwen3")
    ids, positions = tokens(2, 16), torch.arange(16)[None].expand(2, 16)
    out = VllmTwin(model, vllm_engine, "native")(ids, positions)
    native = profiles.get("hf").replace(name="vllm-native-eager", norm_residual="fp32_sum")
    assert _side(model, native, out, ids, positions).logits_equal == 1.0
    assert _side(model, "vllm-0.33", out, ids, positions).logits_equal < 1.0


def test_twin_refuses_what_it_does_not_cover(vllm_engine):
    from rla.engines.vllm_twin import VllmTwin

    with pytest.raises(NotImplementedError, match="covers qwen2, qwen3, llama"):
        VllmTwin(tiny_model("mistral"), vllm_engine, "default")
    with pytest.raises(ValueError, match="mode must be one of"):
        VllmTwin(tiny_model("qwen2"), vllm_engine, "fast")
    twin = VllmTwin(tiny_model("qwen2"), vllm_engine, "native")
    with pytest.raises(ValueError, match="past the engine's cos/sin cache"):
        twin(tokens(1, 4), torch.tensor([[60, 61, 62, 64]]))


class NativeKernels:
    """vLLM's native (Python) region ops behind the compiled kernels' interface: the engine's own
    code, run eagerly on the CPU, standing in for its CUDA kernels (which the GPU tests run)."""

    def __init__(self, engine):
        self.engine = engine

    def rms_norm(self, x, w, eps):
        return self.engine.rms_norm_native(x, w, eps)

    def fused_add_rms_norm(self, x, r, w, eps):
        return self.engine.fused_add_rms_norm_native(x, r, w, eps)

    def silu_and_mul(self, x):
        return self.engine.silu_and_mul_native(x)

    def rotary_embedding(self, positions, q, k, head_size, cache, is_neox=True):
        return self.engine.rope_native(positions, q, k, head_size, cache, is_neox)


def test_engine_backed_ops_forward_is_the_engines_and_backward_is_rlas(vllm_engine):
    """EngineOps: each op's forward is the engine function's output bit for bit (rotary through
    the kernel's positions/cache interface from the aligned rotary's tables), and its gradient is
    rla.ops' exact gradient of the same profile."""
    from rla import ops
    from rla.engines.backed import EngineOps

    prof = profiles.get("hf").replace(name="vllm-native", rope_inv_freq="device")
    backed = EngineOps(NativeKernels(vllm_engine), prof, "vLLM native ops")
    g = torch.Generator().manual_seed(0)
    bf = torch.bfloat16
    x, r = torch.randn(3, 5, 64, generator=g).to(bf), torch.randn(3, 5, 64, generator=g).to(bf)
    w = (1 + 0.2 * torch.randn(64, generator=g)).to(bf)
    q, k = torch.randn(3, 4, 5, 16, generator=g).to(bf), torch.randn(3, 2, 5, 16, generator=g).to(bf)
    inv = 1.0 / (10000 ** (torch.arange(0, 16, 2).float() / 16))
    ang = torch.arange(5).float()[None, :, None] * inv
    cos, sin = ang.cos().expand(3, 5, 8), ang.sin().expand(3, 5, 8)
    cache = torch.cat((cos[0], sin[0]), -1).to(bf)
    eng = vllm_engine
    cases = {
        "rms_norm": (lambda m, a, b: m.rms_norm(a, b, 1e-6, prof), (x, w), lambda a, b: eng.rms_norm_native(a, b, 1e-6)),
        "add_rms_norm": (lambda m, a, b, c: m.add_rms_norm(a, b, c, 1e-6, prof), (x, r, w),
                         lambda a, b, c: eng.fused_add_rms_norm_native(a, b, c, 1e-6)),
        "rms_norm_of_sum": (lambda m, a, b: (m.rms_norm_of_sum if m is backed else m.rms_norm)(a, b, 1e-6, prof), (x, w),
                            lambda a, b: eng.fused_add_rms_norm_native(torch.zeros_like(a), a, b, 1e-6)[0]),
        "swiglu": (lambda m, a, b: m.swiglu(a, b, prof), (x, r), lambda a, b: eng.silu_and_mul_native(torch.cat((a, b), -1))),
        "rope": (lambda m, a, b: m.rope(a, b, cos, sin, prof), (q, k),
                 lambda a, b: tuple(t.view(3, 5, -1, 16).transpose(1, 2) for t in eng.rope_native(
                     torch.arange(5).repeat(3), a.transpose(1, 2).reshape(15, -1), b.transpose(1, 2).reshape(15, -1), 16, cache))),
    }
    for name, (call, inputs, engine_fn) in cases.items():
        want = engine_fn(*inputs)
        got = call(backed, *inputs)
        for a, b in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
            assert torch.equal(a, b), name
        leaves = [t.clone().requires_grad_() for t in inputs]
        outs = call(backed, *leaves)
        outs = outs if isinstance(outs, tuple) else (outs,)
        grads = [torch.randn(o.shape, generator=g).to(bf) for o in outs]
        mine = torch.autograd.grad(outs, leaves, grads)
        leaves2 = [t.clone().requires_grad_() for t in inputs]
        outs2 = call(ops, *leaves2)
        theirs = torch.autograd.grad(outs2 if isinstance(outs2, tuple) else (outs2,), leaves2, grads)
        for a, b in zip(mine, theirs):
            assert torch.equal(a, b), name


def test_engine_backed_ops_refuse_other_profiles(vllm_engine):
    from rla.engines.backed import EngineOps

    backed = EngineOps(NativeKernels(vllm_engine), profiles.get("vllm-eager"), "vLLM native ops")
    model = _model("qwen2")
    with pytest.raises(ValueError, match="rounds like 'vllm-0.33-eager', not 'vllm-0.33'"):
        rla.align(model, "vllm-0.33", ops=backed)
    fp32_sum = EngineOps(NativeKernels(vllm_engine), profiles.get("vllm-0.33"), "vLLM native ops")
    with pytest.raises(ValueError, match="need a rounded_sum profile"):
        rla.align(model, "vllm-0.33", ops=fp32_sum)


def test_reference_ops_through_align_keep_the_qk_chain(vllm_engine):
    """ops=rla.ops.reference (any op implementation) under qk_norm_out='fp32': RoPE still rounds
    its output to the stack dtype (found on the H200: the reference side handed fp32 q/k on)."""
    from rla.ops import reference

    model = _model("qwen3")
    ids = tokens(2, 8)
    rla.align(model, "vllm-0.33")
    want = model(ids).logits
    rla.align(model, "vllm-0.33", ops=reference)
    got = model(ids).logits
    rla.unalign(model)
    assert got.dtype == want.dtype and torch.equal(got, want)


def test_rla_verify_cli_on_the_bundled_model(vllm_wheel, tmp_path, capsys):
    """`rla verify` end to end on the CPU: the twin (default mode, Inductor's C++ backend) against
    HF and the aligned bundled model, per layer, into a JSON file; bad arguments are refused first."""
    import json

    from rla.cli import main
    from rla.models import bundled_path

    out = tmp_path / "verify.json"
    args = ["verify", "--model", str(bundled_path()), "--wheel", vllm_wheel, "--device", "cpu",
            "--tokens", "24", "--batch", "1", "--json", str(out)]
    assert main(args) == 0
    text = capsys.readouterr().out
    assert "aligned profile: vllm-0.33" in text and "fraction bit-equal" in text
    result = json.loads(out.read_text())
    hf, aligned = result["sides"]
    assert hf["name"].startswith("hf") and aligned["name"] == "aligned vllm-0.33"
    assert aligned["k3"] < hf["k3"] and len(aligned["layers"]) == 6
    # one run for the engine-forward side's JSON and its --expect-exact verdict (the side asked about): the
    # same command twice would build and compile the same twin twice
    assert main(args[:-2] + ["--tokens", "256", "--engine-forward", "--expect-exact", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "the norms' reduction order" in text  # the bundled model at 256 tokens: rla's kernels miss
    assert "exact: 'aligned vllm-0.33, engine's code' equals the twin bit for bit" in text
    hf, aligned, engine = json.loads(out.read_text())["sides"]
    assert aligned["logits_equal"] < 1.0 and engine["name"] == "aligned vllm-0.33, engine's code"
    assert engine["logits_equal"] == 1.0 and all(r["equal"] == 1.0 for r in engine["layers"])
    assert main(args[:-2] + ["--tokens", "256", "--expect-exact"]) == 1  # judges the aligned side, and says so
    assert "not exact: 'aligned vllm-0.33' differs from the twin" in capsys.readouterr().out
    assert main(args[:-2] + ["--tokens", "0"]) == 2
    assert "--tokens must be at least 1" in capsys.readouterr().err
    assert main(args[:-2] + ["--mode", "eager"]) == 2
    assert "needs --device cuda" in capsys.readouterr().err


def test_many_twins_in_one_process_stay_compiled(vllm_engine):
    """Dynamo keeps at most 8 compiled graphs per code object and past that runs the function
    eagerly, which for a twin would silently be other rounding (the native ops unfused). Each
    twin compiles its pieces on code objects of its own, so the ninth model in a process (a test
    session, a benchmark over many shapes) still gets the compiled twin, bit-equal to rla.align."""
    from rla.engines.vllm_twin import VllmTwin

    # one model past Dynamo's limit (the ninth at 8), each its own graphs (embedding shape): on shared code
    # objects the last would run eagerly
    for vocab in range(128, 128 + (torch._dynamo.config.recompile_limit + 1) * 8, 8):
        model = tiny_model("qwen2", config=tiny_config("qwen2", vocab_size=vocab, num_hidden_layers=1))
        ids, positions = tokens(1, 12, vocab=vocab), torch.arange(12)[None]
        out = VllmTwin(model, vllm_engine, "default")(ids, positions)
        assert _side(model, "vllm-0.33", out, ids, positions).logits_equal == 1.0, vocab


def test_merged_gemms_compute_each_projection_from_its_rows_of_one_gemm(vllm_engine):
    """``merged_gemms``: q/k/v and gate/up from one GEMM over the concatenated weights (vLLM's
    QKVParallelLinear / MergedColumnParallelLinear). Each output column is a dot product over the
    same row of the same weights, so the split outputs equal the per-projection GEMMs wherever the
    BLAS kernel does not change with the output width, and the layer's streams stay within bf16
    noise of the unmerged twin everywhere; a split in the wrong order or at the wrong sizes moves
    them by O(1)."""
    from rla.engines.vllm_twin import VllmTwin

    model = _model("qwen3")  # q/k norms after the split, QKV of different widths (GQA)
    ids = tokens(2, 24)
    plain = VllmTwin(model, vllm_engine, "native")(ids)
    merged_twin = VllmTwin(model, vllm_engine, "native", merged_gemms=True)
    w = merged_twin.layers[0]
    assert torch.equal(w["wqkv"], torch.cat((w["wq"], w["wk"], w["wv"])))
    assert torch.equal(w["wgu"], torch.cat((w["wg"], w["wu"])))
    merged = merged_twin(ids)
    for a, b in zip(plain.layers, merged.layers):
        scale = a.float().abs().amax()
        assert (a.float() - b.float()).abs().amax() <= 0.05 * scale
    assert (plain.logits.float() - merged.logits.float()).abs().amax() <= 0.05 * plain.logits.float().abs().amax()


def test_inductor_options_belong_to_the_compiled_mode(vllm_engine):
    from rla.engines.vllm_twin import VllmTwin

    with pytest.raises(ValueError, match="compiled default mode"):
        VllmTwin(_model("qwen2"), vllm_engine, "native", inductor_options={"combo_kernels": True})
