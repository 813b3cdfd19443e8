"""The vLLM 0.33 engine twin of Qwen3.5 dense (``rla.engines.vllm_twin_qwen3_5``) on CPU, on a tiny model (a
linear-attention layer, a full-attention one, a linear one; head 32, 8 rotated dims) at positions 40..63.

The twin runs vLLM's own region code in the layout of ``models/qwen3_5.py`` / ``qwen3_next.py``, HF's Gated
DeltaNet modules and HF's attention function (the same on both sides). Two q/k paths (tests/qwen3_5_twin_case.py):

- ``kernel``, what vLLM runs on CUDA in both modes: its Triton ``fused_qk_rmsnorm_rope_gate`` from the wheel,
  here under Triton's interpreter in a subprocess (its fp32 -> bf16 cast made round-to-nearest, as compiled).
  Native mode (every other op eager) is ``rla.align(model, "vllm-0.33-eager")`` bit for bit, logits and every
  layer: the eager row's ``qwen3_5`` variant is exactly what the eager engine computes on Qwen3.5 (its norms are
  ``GemmaRMSNorm.forward_native`` in every mode, its MLP activation rounds per op natively as the CUDA kernel
  does, its q/k path is this kernel, its output gate HF's two PyTorch ops: ``attn_gate='per_op'``). Default
  mode (Inductor compiling the pieces between mixers, the kernel opaque) is ``rla.align(model, "vllm-0.33")``
  bit for bit, logits and every layer: Inductor fuses the output gate ``attn * sigmoid(gate)`` into one
  kernel, rounded once, the row's ``qwen3_5`` variant's ``attn_gate='fused'``. The oracle under the row's
  points equals the twin too, and every point flipped breaks it (``attn_gate`` too: with HF's gate the two
  agree on the first, linear-attention, layer and part at the first full-attention layer, as rla did while it
  left the gate as HF computes it).
- ``modules``, vLLM's path without the kernel (off CUDA): native mode is the native row bit for bit; default
  mode is the oracle under the base row's q/k chain (``qk_norm_out='fp32'``, Qwen3's compiled norm -> RoPE)
  with the row's gate, rounded once.

The MoE twin (``rla.engines.vllm_twin_qwen3_5_moe``) on the tiny MoE model runs in the kernel case's subprocess too.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import textwrap

import pytest

from interpreted_env import interpreter_env
from qwen3_5_twin_case import FLIPPED, run

SCRIPT = textwrap.dedent('''
    import json, sys
    import interpreter_compat
    interpreter_compat.fix_scalar_index()
    interpreter_compat.round_bf16_casts()
    from qwen3_5_twin_case import run
    print(json.dumps({"dense": run(sys.argv[1], "kernel"), "moe": run(sys.argv[1], "kernel", moe=True)}))
''')


def _exact(side):
    return side["logits"] == 1.0 and all(x == 1.0 for x in side["layers"])


@pytest.fixture(scope="module")
def kernel_cases(vllm_wheel):
    """The dense model's case and the MoE model's (Qwen3_5MoeTwin), one interpreter subprocess for both."""
    if importlib.util.find_spec("triton") is None:
        pytest.skip("needs Triton (its interpreter runs vLLM's q/k kernel on a CPU)")
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(vllm_wheel)], env=interpreter_env(), capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def kernel_case(kernel_cases):
    return kernel_cases["dense"]


def test_native_twin_with_the_kernel_is_the_eager_row(kernel_case):
    sides = kernel_case["native"]["sides"]
    assert _exact(sides["vllm-0.33-eager"])
    assert sides["native-row"]["logits"] < 0.6 and sides["native-row"]["layers"][0] == 1.0  # the kernel's RoPE
    assert sides["hf"]["logits"] < 0.5  # not vacuous


def test_default_twin_with_the_kernel_is_the_row(kernel_case):
    case = kernel_case["default"]
    assert _exact(case["sides"]["vllm-0.33"])  # rla.align(model, "vllm-0.33"): its gate rounded once
    assert _exact(case["oracle"]["row"])
    hf_gate = case["oracle"]["hf-gate"]  # HF's gate, two roundings: parts at the full attention
    assert hf_gate["layers"][0] == 1.0 and hf_gate["layers"][1] < 0.8 and hf_gate["logits"] < 0.6
    assert case["sides"]["vllm-0.33-eager"]["logits"] < 0.6  # not vacuous: the eager row is not the default mode
    for point in FLIPPED:
        assert case["oracle"]["flipped"][point] < 1.0, point


def test_twin_without_the_kernel(vllm_wheel):
    case = run(vllm_wheel, "modules")
    assert _exact(case["native"]["sides"]["native-row"])
    assert case["native"]["sides"]["hf"]["logits"] < 0.5
    default = case["default"]
    assert _exact(default["oracle"]["row"]) and not _exact(default["oracle"]["hf-gate"])
    assert default["sides"]["vllm-0.33"]["layers"][0] == 1.0 and default["sides"]["vllm-0.33"]["logits"] < 0.6
    # norm_reduction: on this path the CUDA block order (vllm_block) changes no output of these rows of 64 and 32
    # (on the kernel path's it does)
    for point in set(FLIPPED) - {"norm_reduction"}:
        assert default["oracle"]["flipped"][point] < 1.0, point


def test_moe_twin_with_the_kernel_is_the_rows(kernel_cases):
    """Qwen3.5 MoE (rla.engines.vllm_twin_qwen3_5_moe): the dense layers' pieces with the MoE block an opaque op
    (HF's router and expert GEMMs, vLLM's activations, the shared expert and its sigmoid gate inside the op,
    ``shared + routed`` in the piece). Native mode is the eager row bit for bit; default mode is the default row,
    whose moe_experts variant reads ``shared + routed`` unrounded (``moe_out='fp32'``), bit for bit, logits and
    every layer, and with that sum rounded the row differs from the first layer on; so does the oracle
    (tests/qwen3_5_spec.py's MoE block), equal to the twin with the row's points and not with the sum rounded."""
    native, default = kernel_cases["moe"]["native"]["sides"], kernel_cases["moe"]["default"]["sides"]
    oracle = kernel_cases["moe"]["default"]["oracle"]
    assert _exact(oracle["row"]) and oracle["sum-round"]["layers"][0] < 1.0 and oracle["sum-round"]["logits"] < 0.6
    assert _exact(native["vllm-0.33-eager"])
    assert native["hf"]["logits"] < 0.5 and default["hf"]["logits"] < 0.5  # not vacuous
    assert _exact(default["vllm-0.33"])
    assert default["moe-out-round"]["logits"] < 0.6 and default["moe-out-round"]["layers"][0] < 1.0
    assert default["vllm-0.33-eager"]["logits"] < 0.6


def test_the_twin_refuses_what_it_does_not_lay_out(vllm_engine, monkeypatch):
    from qwen3_5_spec import tiny_qwen3_5
    from rla.engines.vllm_twin import VllmTwin
    from rla.engines.vllm_twin_families import TWINS, build_twin
    from rla.engines.vllm_twin_qwen3_5 import Qwen3_5Twin

    assert TWINS["qwen3_5_text"] is Qwen3_5Twin
    with pytest.raises(NotImplementedError, match="GPT-OSS and Qwen3.5: rla.engines.vllm_twin_families"):
        VllmTwin(tiny_qwen3_5(), vllm_engine, "native")
    with pytest.raises(ValueError, match="qk must be one of"):
        build_twin(tiny_qwen3_5(), vllm_engine, "native", qk="fused")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(RuntimeError, match="on a CPU it runs under Triton's interpreter only"):
        build_twin(tiny_qwen3_5(), vllm_engine, "native")
    model = tiny_qwen3_5()
    model.config.hidden_act = "gelu"
    with pytest.raises(NotImplementedError, match="hidden_act='silu' only"):
        build_twin(model, vllm_engine, "native", qk="modules")
    model = tiny_qwen3_5()
    model.config.layer_scale = True
    with pytest.raises(NotImplementedError, match="layer_scale"):
        build_twin(model, vllm_engine, "native", qk="modules")
    from qwen3_5_spec import tiny_qwen3_5_moe
    from rla.engines.vllm_twin_qwen3_5_moe import Qwen3_5MoeTwin

    assert TWINS["qwen3_5_moe_text"] is Qwen3_5MoeTwin
    model = tiny_qwen3_5_moe()
    model.config.norm_topk_prob = False
    with pytest.raises(NotImplementedError, match="norm_topk_prob=False"):
        build_twin(model, vllm_engine, "native", qk="modules")


def test_default_twin_at_hidden_384_adds_the_norms_squares_in_inductors_order(vllm_engine):
    """At hidden 384 a second difference shows, an arithmetic order and not a rounding location: Inductor's
    norm kernels sum a row's squares in another order than PyTorch's eager mean (the rows' ``norm_reduction``
    is ``unpinned``), which moves an rstd by an ulp in some rows and, rarely, a norm's bf16 output; the Gated
    DeltaNet's recurrence then carries one such flip to later tokens. The oracle under the row's points (its gate
    rounded once) with every norm's mean of squares from a compiled ``(v * v).mean(-1)`` equals the twin bit for
    bit (without the kernel: the oracle's q/k norms cannot take the interpreted ``tl.sum``'s order); with
    PyTorch's mean it differs from the first layer on, with HF's gate from the first full-attention layer on.

    The compiled mean reads a bf16 tensor (a zero added to ``v``) as the twin's norm kernels read their bf16
    inputs, so Inductor gives it their lanes on any CPU: a kernel that loads bf16 sums a row in two vectors'
    lanes (32 fp32 partials with AVX-512, 16 with AVX2), one that loads fp32 only in one vector's (16, 8). The
    fp32-only ``(v * v).mean`` equalled the twin with AVX-512's lanes by luck, and with AVX2's it differed in
    the logits and two layers (checked under ``ATEN_CPU_CAPABILITY=avx2``: tests/cpu_orders.py)."""
    import torch

    from qwen3_5_spec import qwen3_5_points, spec_forward, tiny_qwen3_5
    from rla.engines.vllm_twin_families import build_twin

    model = tiny_qwen3_5(hidden_size=384, intermediate_size=1152)
    ids = torch.randint(0, model.config.vocab_size, (1, 128), generator=torch.Generator().manual_seed(1))
    positions = torch.arange(128)[None]
    out = build_twin(model, vllm_engine, "default", qk="modules")(ids, positions)
    pts = qwen3_5_points("vllm-0.33")
    assert pts.attention["attn_gate"] == "fused"
    pts.attention = {"attn_gate": "fused"}  # without the kernel: the base row's q/k chain; the row's gate
    def squares(v, zero):  # v + 0 is v: the bf16 zero makes the kernel load bf16, as the twin's norms do
        u = v + zero.float()
        return (u * u).mean(-1, keepdim=True)

    compiled = torch.compile(squares, dynamic=False)

    def inductor(v):
        return compiled(v, torch.zeros(v.shape, dtype=torch.bfloat16))

    def layers_equal(gate="fused", **kw):
        pts.attention["attn_gate"] = gate
        streams = []
        with torch.no_grad():
            logits = spec_forward(model, ids, pts, positions=positions, streams=streams, **kw)
        return [bool(torch.equal(a, b.reshape(a.shape))) for a, b in zip([out.logits, *out.layers],
                                                                         [logits.to(out.logits.dtype), *streams])]

    assert all(layers_equal(mean_square=inductor))
    assert layers_equal() == [False] * 4
    assert layers_equal("per_op", mean_square=inductor) == [False, True, False, False]
