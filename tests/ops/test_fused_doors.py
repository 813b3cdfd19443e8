"""The two doors of every fused op, generated from one description (``rla.ops._op_spec``), on a CPU.

- Under Triton's interpreter (the real kernels on CPU tensors; skipped without Triton): for each of
  the ten ops (``add_rms_norm_of_source``, ``rms_norm_and_round`` and the two ``*_normed`` among
  them) and several flag settings, the custom op
  (dispatcher + ``register_autograd``) and the ``autograd.Function`` give the same outputs and
  gradients bit for bit, and the fakes the real outputs' shapes, dtypes and strides;
  ``torch.compile(fullgraph=True)`` of the seven public functions holds the custom ops and equals
  eager; ``opcheck`` passes on every custom op (``interpreted_doors.py``, one subprocess each
  because the interpreter is chosen at import).
- Without Triton: the registered schemas are the ones the GPU opcheck cases and compiled graphs
  call; the generated Functions keep the class names profiles show; a description whose launcher,
  fake or save rule does not take its parameters is refused when built; named flags are bound or
  refused; and a pure-PyTorch op built with the same machinery has two identical doors, eager and
  compiled.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from typing import Optional

import pytest
import torch
from torch import Tensor

import interpreter_compat
from rla.ops import fused
from rla.ops._op_spec import Kernel, Op, OpSpec

OPS = {"rope": fused._ROPE, "swiglu": fused._SWIGLU, "rms_norm": fused._RMS_NORM,
       "add_rms_norm": fused._ADD_RMS_NORM, "carry_add": fused._CARRY_ADD, "qk_norm_rope": fused._QK_NORM_ROPE,
       "add_rms_norm_of_source": fused._ADD_RMS_NORM_OF_SOURCE, "rms_norm_and_round": fused._RMS_NORM_AND_ROUND,
       "add_rms_norm_normed": fused._ADD_RMS_NORM_NORMED,
       "add_rms_norm_of_source_normed": fused._ADD_RMS_NORM_OF_SOURCE_NORMED}

needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs Triton (its interpreter)")


def _interpreted(*checks: str) -> str:
    env = interpreter_compat.subprocess_env()
    script = Path(__file__).with_name("interpreted_doors.py")
    run = subprocess.run([sys.executable, str(script), *checks], env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0 and run.stdout.startswith("ok "), run.stdout[-2000:] + run.stderr[-4000:]
    return run.stdout


@needs_triton
def test_both_doors_bit_identical_for_every_op_under_the_interpreter():
    assert _interpreted("doors") == "ok 21\n"  # 21 cases over the ten ops


@needs_triton
def test_compiled_block_of_the_six_ops_is_one_graph_of_custom_ops_equal_to_eager():
    assert _interpreted("compile") == "ok 21\n"  # 14 outputs and 7 gradients


@needs_triton
@pytest.mark.slow
def test_opcheck_of_every_custom_op_under_the_interpreter():
    assert _interpreted("opcheck") == "ok 15\n"  # ten forward kernels, five backward kernels


# The schemas the GPU opcheck cases (test_fused_gpu.py) call positionally and compiled graphs hold.
SCHEMAS = {
    "rope": "(Tensor q, Tensor k, Tensor cos, Tensor sin, bool round_cos_sin, bool per_op, SymInt head_axis, "
            "ScalarType out_dtype) -> (Tensor, Tensor)",
    "rope_backward": "(Tensor gq, Tensor gk, Tensor cos, Tensor sin, bool round_cos_sin, SymInt head_axis, "
                     "ScalarType out_dtype) -> (Tensor, Tensor)",
    "swiglu": "(Tensor gate, Tensor up, bool per_op) -> Tensor",
    "swiglu_backward": "(Tensor dy, Tensor gate, Tensor up) -> (Tensor, Tensor)",
    "geglu": "(Tensor gate, Tensor up, bool per_op) -> Tensor",
    "geglu_backward": "(Tensor dy, Tensor gate, Tensor up) -> (Tensor, Tensor)",
    "swiglu_oai": "(Tensor gate, Tensor up, float alpha, float limit, bool per_op, bool quotient) -> Tensor",
    "swiglu_oai_backward": "(Tensor dy, Tensor gate, Tensor up, float alpha, float limit) -> (Tensor, Tensor)",
    "rms_norm": "(Tensor x, Tensor weight, float eps, bool per_op, ScalarType lp, ScalarType out_dtype, "
                "str reduction, bool after_add) -> (Tensor, Tensor)",
    "add_rms_norm": "(Tensor x, Tensor residual, Tensor weight, float eps, bool per_op, bool fp32_sum, "
                    "str reduction) -> (Tensor, Tensor, Tensor)",
    "add_rms_norm_of_source": "(Tensor x, Tensor residual, Tensor source, Tensor weight, float eps, bool per_op, "
                              "str reduction) -> (Tensor, Tensor, Tensor)",
    "add_rms_norm_normed": "(Tensor x, Tensor residual, Tensor weight, float eps, bool per_op, str reduction) "
                           "-> (Tensor, Tensor)",
    "add_rms_norm_of_source_normed": "(Tensor x, Tensor residual, Tensor source, Tensor weight, float eps, "
                                     "bool per_op, str reduction) -> (Tensor, Tensor)",
    "rms_norm_and_round": "(Tensor x, Tensor weight, float eps, bool per_op, ScalarType lp, str reduction, "
                          "bool after_add) -> (Tensor, Tensor, Tensor)",
    "rms_norm_backward_of_source": "(Tensor dy, Tensor? dresidual, Tensor a, Tensor source, Tensor weight, "
                                   "Tensor rstd, bool need_dw, ScalarType lp) -> (Tensor, Tensor)",
    "rms_norm_backward": "(Tensor dy, Tensor? dresidual, Tensor a, Tensor? b, Tensor weight, Tensor rstd, "
                         "bool need_dw, ScalarType lp) -> (Tensor, Tensor)",
    "rms_norm_variance_of": "(Tensor x, Tensor s, Tensor weight, float eps, bool per_op, ScalarType lp, "
                            "ScalarType out_dtype, str reduction, bool after_add) -> (Tensor, Tensor)",
    "rms_norm_variance_of_backward": "(Tensor dy, Tensor x, Tensor s, Tensor weight, Tensor rstd, bool need_dx, "
                                     "bool need_ds, bool need_dw, ScalarType lp) -> (Tensor, Tensor, Tensor)",
    "carry_add": "(Tensor x, Tensor residual, Tensor m, ScalarType out_dtype) -> Tensor",
    "qk_norm_rope": "(Tensor q, Tensor k, Tensor q_weight, Tensor k_weight, float q_eps, float k_eps, Tensor cos, "
                    "Tensor sin, bool round_cos_sin, bool per_op_rope, bool per_op_norm, str reduction, "
                    "SymInt head_axis) -> (Tensor, Tensor, Tensor, Tensor)",
    "qk_norm_rope_backward": "(Tensor gq, Tensor gk, Tensor q, Tensor k, Tensor q_weight, Tensor k_weight, "
                             "Tensor cos, Tensor sin, Tensor rstd_q, Tensor rstd_k, bool round_cos_sin, "
                             "SymInt head_axis, bool need_dwq, bool need_dwk) -> (Tensor, Tensor, Tensor, Tensor)",
}


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_registered_schemas(name):
    assert str(getattr(torch.ops.rla, name).default._schema) == f"rla::{name}{SCHEMAS[name]}"


def test_each_op_has_both_doors_under_its_old_names():
    names = {"rope": "_RopeFn", "swiglu": "_SwiGLUFn", "rms_norm": "_RMSNormFn", "add_rms_norm": "_AddRMSNormFn",
             "carry_add": "_CarryAddFn", "qk_norm_rope": "_QkNormRopeFn",
             "add_rms_norm_of_source": "_AddRMSNormOfSourceFn",
             "rms_norm_and_round": "_RMSNormAndRoundFn", "add_rms_norm_normed": "_AddRMSNormNormedFn",
             "add_rms_norm_of_source_normed": "_AddRMSNormOfSourceNormedFn"}
    for name, op in OPS.items():
        assert op.name == name and op.custom_op is op.spec.forward.op
        assert issubclass(op.function, torch.autograd.Function) and op.function.__name__ == names[name]
        assert op.spec.forward.schema() == SCHEMAS[name]
    # one backward kernel serves both norms
    assert fused._RMS_NORM.spec.backward is fused._ADD_RMS_NORM.spec.backward
    assert fused._RMS_NORM_AND_ROUND.spec.backward is fused._ADD_RMS_NORM_NORMED.spec.backward is fused._NORM_BWD
    assert fused._ADD_RMS_NORM_OF_SOURCE_NORMED.spec.backward is fused._ADD_RMS_NORM_OF_SOURCE.spec.backward


def test_named_flags_are_bound_or_refused():
    gate = up = torch.ones(2, 8, dtype=torch.bfloat16)
    with pytest.raises(TypeError, match="per_op"):
        fused._SWIGLU(gate, up)  # a flag missing
    with pytest.raises(TypeError, match="per_op"):
        fused._SWIGLU(gate, up, per_op=True, interleaved=False)  # one the op does not have
    with pytest.raises(KeyError, match="per_op"):
        fused._SWIGLU(gate, up, perop=True)  # misspelled


def test_descriptions_are_checked_when_built():
    params = dict(x=Tensor, alpha=float)
    ok = lambda x, alpha: None  # noqa: E731 -- only the signature is read
    with pytest.raises(TypeError, match="fake"):
        Kernel("t_check", params, 1, ok, lambda x: None)  # a flag the fake does not take
    with pytest.raises(TypeError, match="launcher"):
        Kernel("t_check", params, 1, lambda alpha, x: None, ok)  # the order is the schema's
    with pytest.raises(TypeError, match="type"):
        Kernel("t_check", dict(x=Tensor, alpha=complex), 1, ok, ok)
    kernel = Kernel("t_check", params, 2, ok, ok)  # not registered: ``op`` is made on first use
    with pytest.raises(TypeError, match="save rule"):
        OpSpec(kernel, 1, lambda ctx, outputs, x: None, ok, None, "_T")
    with pytest.raises(ValueError, match="returns"):
        OpSpec(kernel, 3, lambda ctx, outputs, x, alpha: None, ok, None, "_T")
    assert not hasattr(torch.ops.rla, "t_check")


# ----------------------------------------------------- the machinery on a pure-PyTorch op (no Triton)


def _scale_fwd(x, w, alpha, square):
    """y = (x * w) * alpha, squared when ``square``; aux = the fp32 row sum of x (backward only)."""
    y = (x * w) * alpha
    return (y * y if square else y), x.float().sum(-1)


def _scale_fwd_fake(x, w, alpha, square):
    return x.new_empty(x.shape), x.new_empty(x.shape[:-1], dtype=torch.float32)


def _scale_bwd(dy, x, w, aux, alpha, square, need_dw):
    assert torch.equal(aux, x.float().sum(-1)), "the saved output that is not returned did not arrive"
    t = (x * w) * alpha
    d = dy * 2 * t if square else dy
    return d * w * alpha, ((d * x * alpha).sum(0) if need_dw else w.new_empty(0))


def _scale_bwd_fake(dy, x, w, aux, alpha, square, need_dw):
    return x.new_empty(x.shape), w.new_empty(w.shape if need_dw else (0,))


def _scale_save(ctx, outputs, x, w, alpha, square):
    ctx.save_for_backward(x, w, outputs[1])
    ctx.alpha, ctx.square = alpha, square


def _scale_grad(ctx, backward, dy):
    x, w, aux = ctx.saved_tensors
    need_dw = ctx.needs_input_grad[1]
    dx, dw = backward(dy, x, w, aux, ctx.alpha, ctx.square, need_dw)
    return dx, (dw if need_dw else None)


_TOY: list = []


def toy() -> Op:
    """``rla::t_scale``, built once per process (a custom op cannot be registered twice)."""
    if not _TOY:
        bwd = Kernel("t_scale_backward", dict(dy=Tensor, x=Tensor, w=Tensor, aux=Tensor, alpha=float, square=bool,
                                              need_dw=bool), 2, _scale_bwd, _scale_bwd_fake)
        fwd = Kernel("t_scale", dict(x=Tensor, w=Tensor, alpha=float, square=bool), 2, _scale_fwd, _scale_fwd_fake)
        _TOY.append(Op(OpSpec(fwd, 1, _scale_save, _scale_grad, bwd, "_ScaleFn")))
    return _TOY[0]


def _toy_run(call, need_dw, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(4, 16, generator=g).requires_grad_(True)
    w = torch.randn(16, generator=g).requires_grad_(need_dw)
    y = call(x, w)
    dy = torch.randn(y.shape, generator=g)
    y.backward(dy)
    return y.detach(), x.grad, w.grad, (x.detach(), w.detach(), dy), type(y.grad_fn).__name__


@pytest.mark.parametrize("square", [False, True])
@pytest.mark.parametrize("need_dw", [True, False])
def test_generated_doors_of_a_pytorch_op_are_identical(square, need_dw):
    op = toy()
    custom = _toy_run(lambda x, w: op.custom_op(x, w, 0.75, square)[0], need_dw)
    function = _toy_run(lambda x, w: op.function.apply(x, w, 0.75, square), need_dw)
    eager = _toy_run(lambda x, w: op(x, w, alpha=0.75, square=square), need_dw)
    x, w, dy = custom[3]
    t = (x * w) * 0.75
    want = (t * t if square else t), (dy * 2 * t if square else dy) * w * 0.75
    assert torch.equal(custom[0], want[0]) and torch.equal(custom[1], want[1])  # not an empty or constant result
    for other in (function, eager):
        for a, b in zip(custom[:3], other[:3]):
            assert (a is None and b is None) or torch.equal(a, b)
    assert (custom[2] is None) == (not need_dw)
    assert function[4] == eager[4] == "_ScaleFnBackward" != custom[4]  # eager calls take the Function


def test_compiled_pytorch_op_takes_the_custom_op_and_equals_eager():
    op = toy()
    nodes = []

    def recording(gm, example_inputs):
        from torch._dynamo.backends.debugging import aot_eager

        nodes.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return aot_eager(gm, example_inputs)

    compiled = torch.compile(lambda x, w: op(x, w, alpha=0.5, square=True), backend=recording, fullgraph=True)
    got, want = _toy_run(compiled, True), _toy_run(lambda x, w: op(x, w, alpha=0.5, square=True), True)
    # one opaque node (the Function door traced inline would put aten's muls in the graph)
    assert [n for n in nodes if "getitem" not in n] == ["rla.t_scale.default"], nodes
    for a, b in zip(got[:3], want[:3]):
        assert torch.equal(a, b)


def test_optional_tensor_parameters_reach_the_schema():
    k = Kernel("t_opt", dict(a=Tensor, b=Optional[Tensor]), 1, lambda a, b: None, lambda a, b: None)
    assert k.schema() == "(Tensor a, Tensor? b) -> Tensor"
