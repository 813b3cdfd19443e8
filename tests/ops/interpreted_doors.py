"""Run by test_fused_doors.py in a subprocess under ``TRITON_INTERPRET=1`` (the Triton kernels on CPU
tensors, through numpy): both doors of every fused op on the same inputs, bit for bit.

For each of the ten ops and a few flag settings: the generated custom op (through the dispatcher,
its ``register_autograd`` backward calling the backward kernel's custom op) and the generated
``autograd.Function`` (launchers called directly) must return the same outputs (values, dtypes,
strides) and the same gradients of every input (and ``None`` for the same inputs); the public
function in eager mode must be the Function door; each forward kernel's fake must give the real
outputs' shapes, dtypes and strides (``doors``). ``opcheck``: ``torch.library.opcheck`` on one
case of every custom op, forward and backward kernels (schema, fake, autograd registration, AOT
dispatch). ``compile``: a block of all seven public functions (add_rms_norm also with a ``residual_source`` and
without its residual output; rms_norm_and_round) under
``torch.compile(fullgraph=True, backend="aot_eager")`` (no graph break in the generated call; the
graph holds the ten custom ops)
equals eager, outputs and gradients. Prints ``ok <checks>`` at the end.
"""

from __future__ import annotations

import sys

import interpreter_compat
import torch

from rla import profiles
from rla.ops import fused

interpreter_compat.fix_scalar_index()  # Triton 3.6 with NumPy >= 2.4 (interpreter_compat.py)
LP = torch.bfloat16


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _rope_case(layout, seed, out_fp32=False):
    g = _gen(seed)
    B, S, HQ, HK, D = 2, 5, 4, 2, 32
    q, k = torch.randn(B, S, HQ, D, generator=g) * 3, torch.randn(B, S, HK, D, generator=g) * 3
    if layout == "hf":
        q, k, axis = q.to(LP).transpose(1, 2), k.to(LP).transpose(1, 2), 1
    else:
        q, k, axis = q.to(LP), k.to(LP), 2
    if out_fp32:
        q, k = q.float(), k.float()
    emb = torch.outer(torch.arange(S, dtype=torch.float32) + 7 * seed, torch.rand(D, generator=g))
    return q, k, emb.cos()[None], emb.sin()[None], axis


def _norm_case(seed, wdtype=LP, rows=6, n=64):
    g = _gen(seed)
    x = (torch.randn(rows, n, generator=g) * 2).to(LP)
    r = (torch.randn(rows, n, generator=g) * 2).to(LP)
    w = (torch.rand(n, generator=g) + 0.5).to(wdtype)
    return x, r, w


def _below_half(t):
    """fp32 values whose bits below bf16's are under half a bf16 ulp: RN(t) = the truncation the
    interpreter's fp32 -> bf16 cast does, so RN(t) in a kernel is torch's t.to(bf16) here too."""
    low = torch.randint(1, 0x8000, t.shape, generator=_gen(99), dtype=torch.int32)
    return ((t.view(torch.int32) & -0x10000) | low).view(torch.float32)


def cases():
    """(op, positional tensors, named flags, indices of the tensors that get a gradient)."""
    out = []
    for layout, rc, per_op, f32, s in (("hf", True, False, False, 0), ("bshd", False, True, False, 1),
                                       ("hf", True, False, True, 2)):
        q, k, cos, sin, axis = _rope_case(layout, s, f32)
        out.append((fused._ROPE, (q, k, cos, sin), dict(round_cos_sin=rc, per_op=per_op, head_axis=axis,
                                                        out_dtype=LP), (0, 1)))
    for per_op, s in ((False, 3), (True, 4)):
        gate, up, _ = _norm_case(s)
        out.append((fused._SWIGLU, (gate * 4, up), dict(per_op=per_op), (0, 1)))
    for per_op, wdt, reduction, out_dtype, grads, s in ((False, LP, "unpinned", LP, (0, 1), 5),
                                                        (True, torch.float32, "vllm_block", LP, (0, 1), 6),
                                                        (False, LP, "unpinned", torch.float32, (0,), 7)):
        x, _, w = _norm_case(s, wdt)
        out.append((fused._RMS_NORM, (x, w), dict(eps=1e-6, per_op=per_op, lp=LP, out_dtype=out_dtype,
                                                  reduction=reduction, after_add=reduction == "vllm_block"), grads))
    for per_op, fp32_sum, reduction, grads, s in ((False, False, "unpinned", (0, 1, 2), 8),
                                                  (True, True, "vllm_block", (0, 1, 2), 9),
                                                  (False, True, "unpinned", (0, 1), 10)):
        x, r, w = _norm_case(s)
        out.append((fused._ADD_RMS_NORM, (x, r, w), dict(eps=1e-6, per_op=per_op, fp32_sum=fp32_sum,
                                                         reduction=reduction), grads))
    for per_op, reduction, wdt, grads, s in ((False, "unpinned", LP, (0, 1, 3), 15),
                                             (True, "vllm_block", torch.float32, (0, 1), 16)):
        x, _, w = _norm_case(s, wdt)
        src = _below_half(torch.randn(x.shape, generator=_gen(s + 200)) * 3)
        out.append((fused._ADD_RMS_NORM_OF_SOURCE, (x, src.to(LP), src, w),
                    dict(eps=1e-6, per_op=per_op, reduction=reduction), grads))
    for per_op, reduction, wdt, after_add, grads, s in ((False, "unpinned", LP, True, (0, 1), 17),
                                                        (True, "vllm_block", torch.float32, False, (0,), 18)):
        x, _, w = _norm_case(s, wdt)
        out.append((fused._RMS_NORM_AND_ROUND, (x.float() * 3, w),
                    dict(eps=1e-6, per_op=per_op, lp=LP, reduction=reduction, after_add=after_add), grads))
    x, r, w = _norm_case(19)
    out.append((fused._ADD_RMS_NORM_NORMED, (x, r, w), dict(eps=1e-6, per_op=False, reduction="unpinned"), (0, 1, 2)))
    src = _below_half(torch.randn(x.shape, generator=_gen(219)) * 3)
    out.append((fused._ADD_RMS_NORM_OF_SOURCE_NORMED, (x, src.to(LP), src, w),
                dict(eps=1e-6, per_op=True, reduction="vllm_block"), (0, 1, 3)))
    for out_dtype, s in ((LP, 11), (torch.float32, 12)):
        x, r, _ = _norm_case(s)
        m, _, _ = _norm_case(s + 100)
        out.append((fused._CARRY_ADD, (x.float(), r, m), dict(out_dtype=out_dtype), (0, 1, 2)))
    for layout, per_op_norm, reduction, grads, s in (("hf", False, "unpinned", (0, 1, 2, 3), 13),
                                                     ("bshd", True, "vllm_block", (0, 1, 3), 14)):
        q, k, cos, sin, axis = _rope_case(layout, s)
        g = _gen(s)
        wq, wk = ((torch.rand(q.shape[-1], generator=g) + 0.5).to(LP) for _ in range(2))
        out.append((fused._QK_NORM_ROPE, (q, k, wq, wk),
                    dict(q_eps=1e-6, k_eps=1e-5, cos=cos.to(LP), sin=sin.to(LP), round_cos_sin=True,
                         per_op_rope=per_op_norm, per_op_norm=per_op_norm, reduction=reduction, head_axis=axis), grads))
    return out


def _same(a, b, what):
    if a is None or b is None:
        assert a is None and b is None, (what, "one door gave None", a is None, b is None)
        return
    assert (a.shape, a.dtype, a.stride()) == (b.shape, b.dtype, b.stride()), (what, a.shape, b.shape, a.stride(),
                                                                               b.stride(), a.dtype, b.dtype)
    assert torch.equal(a, b), (what, "values differ")


def _run(door, tensors, flags, grads, seed):
    """Outputs (a tuple) and the input gradients of one door, for fixed output gradients."""
    leaves = [t.detach().clone().requires_grad_(i in grads) for i, t in enumerate(tensors)]
    out = door(*leaves, **flags)
    out = out if isinstance(out, tuple) else (out,)
    g = _gen(100 + seed)
    ups = [torch.randn(o.shape, generator=g).to(o.dtype) for o in out]
    torch.autograd.backward(out, ups)
    return [o.detach() for o in out], [t.grad for t in leaves]


def _custom_op_door(op):
    """The first door as a caller would meet it under torch.compile: the custom op, outputs picked."""

    def call(*tensors, **flags):
        args = (*tensors, *[flags[n] for n in op.names[len(tensors):]])
        out = op.custom_op(*args)
        out = out if isinstance(out, tuple) else (out,)
        return out[: op.spec.returns]

    return call


def _function_door(op):
    def call(*tensors, **flags):
        return op.function.apply(*tensors, *[flags[n] for n in op.names[len(tensors):]])

    return call


def check_doors():
    n = 0
    for i, (op, tensors, flags, grads) in enumerate(cases()):
        what = f"{op.name} case {i}"
        a_out, a_grad = _run(_custom_op_door(op), tensors, flags, grads, i)
        b_out, b_grad = _run(_function_door(op), tensors, flags, grads, i)
        c_out, c_grad = _run(op, tensors, flags, grads, i)  # eager: the Function door
        assert len(a_out) == len(b_out) == len(c_out) == op.spec.returns, what
        for j, (a, b, c) in enumerate(zip(a_out, b_out, c_out)):
            _same(a, b, f"{what} output {j}")
            _same(a, c, f"{what} output {j} (op call)")
        for j, (a, b, c) in enumerate(zip(a_grad, b_grad, c_grad)):
            _same(a, b, f"{what} grad {j}")
            _same(a, c, f"{what} grad {j} (op call)")
            assert (a is not None) == (j in grads), (what, j, "gradient where none was asked, or none where asked")
        args = (*tensors, *[flags[nm] for nm in op.names[len(tensors):]])
        real = op.spec.forward.launch(*args)
        fake = op.spec.forward.fake(*args)
        for j, (r, f) in enumerate(zip(*((x,) if isinstance(x, torch.Tensor) else x for x in (real, fake)))):
            assert (r.shape, r.dtype, r.stride()) == (f.shape, f.dtype, f.stride()), (what, "fake output", j)
        n += 1
    return n


def check_opcheck():
    """opcheck on the first case of each op: forward kernels with gradients, backward kernels on
    the arguments its grad rule passes them (recorded from one Function-door backward)."""
    seen, n = set(), 0
    for op, tensors, flags, grads in cases():
        if op.name in seen:
            continue
        seen.add(op.name)
        leaves = [t.detach().clone().requires_grad_(i in grads) for i, t in enumerate(tensors)]
        args = (*leaves, *[flags[nm] for nm in op.names[len(tensors):]])
        torch.library.opcheck(op.custom_op, args)
        n += 1
        bwd = op.spec.backward
        if bwd is None or bwd.name in seen:
            continue
        seen.add(bwd.name)
        recorded = []
        launch = bwd.launch
        spec_grad = op.spec.grad

        def recording(*a):
            recorded.append(a)
            return launch(*a)

        class Ctx:  # the saved state of one forward, as the Function door keeps it
            def save_for_backward(self, *t):
                self.saved_tensors = t

        ctx = Ctx()
        ctx.needs_input_grad = tuple(i in grads for i in range(len(args)))
        outs = op.spec.forward.launch(*[a.detach() if isinstance(a, torch.Tensor) else a for a in args])
        outs = outs if isinstance(outs, tuple) else (outs,)
        op.spec.save(ctx, outs, *args)
        spec_grad(ctx, recording, *[torch.ones_like(o) for o in outs[: op.spec.returns]])
        torch.library.opcheck(bwd.op, tuple(a.detach() if isinstance(a, torch.Tensor) else a for a in recorded[0]))
        n += 1
    return n


def check_compile():
    prof = profiles.get("vllm-0.33")
    q, k, cos, sin, _ = _rope_case("hf", 20)
    x, r, w = _norm_case(21)
    wq = (torch.rand(q.shape[-1], generator=_gen(22)) + 0.5).to(LP)
    src = _below_half(torch.randn(x.shape, generator=_gen(23)) * 3)

    def block(q, k, x, r, w, wq, s):
        qo, ko = fused.rope(q, k, cos, sin, prof)
        y, res = fused.add_rms_norm(x, r, w, 1e-6, prof)
        y2, _ = fused.add_rms_norm(y, s.to(LP), w, 1e-6, prof, residual_source=s)  # s: needs grad, as in a layer
        qn, kn = fused.qk_norm_rope(q, k, wq, wq, 1e-6, cos.to(LP), sin.to(LP), prof)
        hs, rs = fused.rms_norm_and_round(s, w, 1e-6, prof, dtype=LP, after_add=True)  # a layer's input norm
        y3 = fused.add_rms_norm(y, rs, w, 1e-6, prof, residual_source=s, new_residual=False)
        y4 = fused.add_rms_norm(x, r, w, 1e-6, prof, new_residual=False)
        return (qo, ko, y, res, fused.swiglu(y, res, prof), fused.rms_norm(res, w, 1e-6, prof),
                fused.carry_add(y, res, x, LP), qn, kn, y2, hs, rs, y3, y4)

    def run(f):
        leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, x, r, w, wq, src)]
        outs = f(*leaves)
        torch.autograd.backward(outs, [torch.ones_like(o) for o in outs])
        return [*outs, *(t.grad for t in leaves)]

    targets = []

    def recording(gm, example_inputs):
        targets.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        from torch._dynamo.backends.debugging import aot_eager

        return aot_eager(gm, example_inputs)

    eager = run(block)
    compiled = run(torch.compile(block, backend=recording, fullgraph=True))
    for i, (a, b) in enumerate(zip(eager, compiled)):
        _same(a, b, f"compiled block, output / gradient {i}")
    for name in ("rope", "add_rms_norm", "qk_norm_rope", "swiglu", "rms_norm", "carry_add", "add_rms_norm_of_source",
                 "rms_norm_and_round", "add_rms_norm_normed", "add_rms_norm_of_source_normed"):
        assert f"rla.{name}.default" in targets, (name, "not a custom op node in the graph", targets)
    return len(eager)


if __name__ == "__main__":
    checks = {"doors": check_doors, "opcheck": check_opcheck, "compile": check_compile}
    print("ok", sum(checks[name]() for name in sys.argv[1:]))
