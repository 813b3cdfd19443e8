"""``rla.ops.rms_norm(x, ..., variance_of=s)``: x normalised by the mean square of another tensor.

Forward: bit for bit an independent expression of the spec (``x * rsqrt(mean(s * s) + eps) * w`` with
the weight's rounding of ``norm_weight`` and the mean square in the row's order, vLLM's kernel order
from ``tests/spec.py`` under ``vllm_block``), and the plain norm bit for bit when ``s`` is ``x``.
Backward: autograd of the same expression in fp64, for ``x`` and ``s`` as independent inputs and for
a training step's ``x = RN(s)`` (straight-through, as ``.to`` differentiates).

The Triton kernels (``rla.ops._triton_norm_var``, CUDA's path):

- under the interpreter (CPU tensors): rstd is the plain norm kernel's of s in the same tree, the output
  the reference's normalisation of x by it, s = x the plain kernel; d_x the reference's expression, d_s
  within the order of its mean, d_w the plain backward's; the two doors and the fakes agree;
- compiled for sm_90 on the CPU: the reductions have the plain kernels' register layouts (so the
  ``unpinned`` order is theirs);
- on a GPU (``gpu``): forward against the reference for every combination of the points (bit for bit
  under ``vllm_block``) and the plain kernel bit for bit when s is x; gradients, a training step,
  ``opcheck``, a compiled graph."""

from __future__ import annotations

import textwrap

import pytest
import torch

import reduce_layouts
from interpreted_scripts import leaf, needs_cuda, needs_triton, run_script, tail
from reduce_layouts import reduces
from rla import ops, profiles
from saved_memory import saved_bytes
from spec import vllm_mean_square

BF16 = torch.bfloat16
ROWS = {"hf": profiles.get("hf"), "vllm-0.33": profiles.get("vllm-0.33"),
        "vllm-0.33-eager": profiles.get("vllm-0.33-eager")}  # per_op / fused weight, unpinned / vllm_block order


def _inputs(shape=(3, 5, 40), seed=0):
    g = torch.Generator().manual_seed(seed)
    s = torch.randn(shape, generator=g) * 3
    w = (1 + 0.3 * torch.randn(shape[-1], generator=g)).to(BF16)
    return s, s.to(BF16), w


def _spec(x, s, w, eps, p, out=None):
    u = s.float()
    if p.norm_reduction == "vllm_block":
        mean_square = vllm_mean_square(u, u.numel() // u.shape[-1], False).reshape(*u.shape[:-1], 1)
    else:
        mean_square = (u * u).mean(-1, keepdim=True)
    n = x.float() * torch.rsqrt(mean_square + eps)
    wf = w.float()
    y = wf * n.to(BF16).float() if p.norm_weight == "per_op" else n * wf
    return y.to(out or BF16)


@pytest.mark.parametrize("name", list(ROWS))
@pytest.mark.parametrize("out", [None, torch.float32])
def test_forward_is_the_spec_and_the_plain_norm_when_s_is_x(name, out):
    p = ROWS[name]
    s, x, w = _inputs()
    got = ops.rms_norm(x, w, 1e-6, p, out_dtype=out, variance_of=s)
    want = _spec(x, s, w, 1e-6, p, out)
    assert got.dtype == (out or BF16) and torch.equal(got, want)
    assert not torch.equal(got, ops.rms_norm(x, w, 1e-6, p, out_dtype=out))  # s is not x: rstd moves
    assert torch.equal(ops.rms_norm(x, w, 1e-6, p, out_dtype=out, variance_of=x.float()),
                       ops.rms_norm(x, w, 1e-6, p, out_dtype=out))
    assert torch.equal(ops.rms_norm(s, w, 1e-6, p, dtype=BF16, variance_of=s), ops.rms_norm(s, w, 1e-6, p, dtype=BF16))


def _fp64(x, s, w, eps):
    return x * torch.rsqrt((s * s).mean(-1, keepdim=True) + eps) * w


@pytest.mark.parametrize("name", ["hf", "vllm-0.33"])
def test_backward_is_the_fp64_expressions_gradient_for_both_inputs(name):
    """fp32 inputs (nothing rounds): d_x, d_s, d_w against autograd of the fp64 expression. Tolerance: the
    op's backward is a few fp32 ops and a mean over 40 terms (relative error ~1e-6), fp64's exact."""
    p = ROWS[name]
    s, _, w = _inputs(seed=1)
    x = s + 0.01 * torch.randn(s.shape, generator=torch.Generator().manual_seed(2))  # another tensor than s
    w = w.float()
    g = torch.randn(s.shape, generator=torch.Generator().manual_seed(3))
    x, s, w = (t.clone().requires_grad_() for t in (x, s, w))
    (ops.rms_norm(x, w, 1e-6, p, variance_of=s) * g).sum().backward()
    x64, s64, w64 = (t.detach().double().requires_grad_() for t in (x, s, w))
    (_fp64(x64, s64, w64, 1e-6) * g.double()).sum().backward()
    for name_, a, b in (("x", x, x64), ("s", s, s64), ("w", w, w64)):
        assert a.grad.dtype == torch.float32 and b.grad.abs().max() > 0, name_
        torch.testing.assert_close(a.grad.double(), b.grad, rtol=1e-5, atol=1e-6, msg=name_)


def test_a_training_steps_gradient_through_x_rounded_from_s():
    """x = RN(s) in the graph (``s.to(bf16)``, whose derivative autograd takes as the identity): s's
    gradient is d_x + d_s, d_x rounded once to bf16 (x's dtype) before autograd adds it, against fp64
    autograd of the expression with x = RN(s) an input of its own. Tolerance: an ulp of bf16 of d_x
    (the op rounds its fp32 d_x, the oracle its fp64 one: they may round apart), fp32's 1e-5 elsewhere."""
    p = ROWS["vllm-0.33"]
    s, _, w = _inputs(seed=4)
    g = torch.randn(s.shape, generator=torch.Generator().manual_seed(5))
    s = s.clone().requires_grad_()
    (ops.rms_norm(s.to(BF16), w, 1e-6, p, variance_of=s).float() * g).sum().backward()
    s64 = s.detach().double().requires_grad_()
    x64 = s.detach().to(BF16).double().requires_grad_()
    # the bf16 output's gradient is g rounded to bf16 (autograd of .float())
    (_fp64(x64, s64, w.double(), 1e-6) * g.to(BF16).double()).sum().backward()
    want = x64.grad.to(BF16).double() + s64.grad
    bound = 2 ** -8 * x64.grad.abs() + 1e-5 * (x64.grad.abs() + s64.grad.abs()) + 1e-7
    assert ((s.grad.double() - want).abs() <= bound).all()
    assert (s64.grad.abs() > 2 ** -6 * x64.grad.abs()).any()  # d_s is no rounding error of d_x
    plain = s.detach().clone().requires_grad_()  # not the plain norm's gradient: the centring term reads x
    (ops.rms_norm(plain, w, 1e-6, p, dtype=BF16).float() * g).sum().backward()
    assert not torch.equal(plain.grad, s.grad)


def test_bad_input_is_named():
    s, x, w = _inputs()
    p = ROWS["hf"]
    with pytest.raises(TypeError, match="variance_of must be fp32"):
        ops.rms_norm(x, w, 1e-6, p, variance_of=s.to(BF16))
    with pytest.raises(ValueError, match="x and variance_of must have the same shape"):
        ops.rms_norm(x, w, 1e-6, p, variance_of=s[:, :2])
    with pytest.raises(ValueError, match="^x and variance_of must be on one device, got cpu, meta$"):
        ops.rms_norm(x, w, 1e-6, p, variance_of=torch.zeros_like(s, device="meta"))
    with pytest.raises(NotImplementedError, match="variance_of with weight_offset"):
        ops.rms_norm(x, w, 1e-6, p, weight_offset=1.0, variance_of=s)


# ------------------------------------------------------------------ the Triton kernels under the interpreter

SCRIPT = textwrap.dedent('''
    import interpreter_compat
    interpreter_compat.round_bf16_casts()  # fp32 -> bf16 to nearest, as the compiled cvt.rn (the reference's too)
    from rla import profiles
    from rla.ops import _triton_norm, fused, variance_norm
    from rla.ops.reference import _engine_weight, _norm_fwd

    BF16, F32 = torch.bfloat16, torch.float32
    n = 0
    for rows, hidden, lp, xdt, wdt, per_op, reduction, after_add, out, seed in (
            (6, 64, BF16, BF16, BF16, False, "unpinned", False, BF16, 0),
            (7, 48, BF16, BF16, F32, True, "vllm_block", True, F32, 1),
            (5, 40, BF16, BF16, BF16, True, "vllm_block", False, BF16, 2),
            (3, 96, torch.float16, torch.float16, F32, False, "unpinned", False, F32, 3),
            (9, 128, BF16, F32, BF16, False, "vllm_block", True, BF16, 4)):  # an fp32 x in a bf16 stack
        g = torch.Generator().manual_seed(seed)
        s = torch.randn(rows, hidden, generator=g) * 3
        x = (s + 0.1 * torch.randn(rows, hidden, generator=g)).to(xdt)  # not RN(s): the inputs are told apart
        w = (1 + 0.2 * torch.randn(hidden, generator=g)).to(wdt)
        dy = torch.randn(rows, hidden, generator=g).to(out)
        flags = dict(eps=1e-6, per_op=per_op, lp=lp, out_dtype=out, reduction=reduction, after_add=after_add)
        y, rstd = fused._rms_norm_variance_of_fwd(x, s, w, **flags)
        # rstd reads s: the plain kernel's of s (an fp32 input in the lp stack), in the same tree;
        # y is the reference's normalisation of x by it
        assert same(rstd, fused._rms_norm_fwd(s, w, **flags)[1]), seed
        assert same(y, _norm_fwd(x.float(), rstd[:, None], _engine_weight(w, lp), lp, per_op, out)), seed
        assert not same(rstd, fused._rms_norm_fwd(x, w, **flags)[1]), seed
        # s = x: the plain kernel, both outputs
        for a, b in zip(fused._rms_norm_variance_of_fwd(x, x.float(), w, **flags), fused._rms_norm_fwd(x, w, **flags)):
            assert same(a, b), seed
        # backward: d_x the reference's expression (elementwise), d_s its expression up to the order of the
        # mean (64-ish fp32 terms: a few fp32 ulps of the mean's largest term), d_w the plain backward's sum of
        # dy * (x * rstd) with the same rstd, bit for bit
        dx, ds, dw = fused._rms_norm_variance_of_bwd(dy, x, s, w, rstd, True, True, True, lp)
        r, gw = rstd[:, None], dy.float() * _engine_weight(w, lp)
        assert same(dx, (r * gw).to(xdt)), seed
        c = (gw * (x.float() * r)).double().mean(-1, keepdim=True)
        want = (-r * (s * r)).double() * c
        bound = (r * s.abs() * r).double() * (gw * x.float() * r).abs().double().mean(-1, keepdim=True) * 2 ** -20
        assert ds.dtype == F32 and ((ds.double() - want).abs() <= bound + 2 ** -22 * want.abs()).all(), seed
        assert ds.abs().max() > 0 and c.abs().min() > 0
        assert same(dw, _triton_norm.backward(dy, None, x, None, w, rstd, True, lp)[1]), seed
        only_ds = fused._rms_norm_variance_of_bwd(dy, x, s, w, rstd, False, True, False, lp)
        assert [t.numel() for t in only_ds] == [0, ds.numel(), 0] and same(only_ds[1], ds), seed
        n += 1

    # the two doors (custom op and Function), a training step's x = RN(s): outputs and every gradient
    # bit for bit, the fakes the real outputs' shapes and strides; the public function reads the profile
    op = fused._RMS_NORM_VARIANCE_OF
    g = torch.Generator().manual_seed(9)
    s0, w0 = torch.randn(4, 2, 64, generator=g) * 2, (1 + 0.2 * torch.randn(64, generator=g)).to(BF16)
    dy0 = torch.randn(4, 2, 64, generator=g).to(BF16)
    args = (1e-6, True, BF16, BF16, "vllm_block", True)
    results = []
    for door in (op.custom_op, op.function.apply):
        s, w = s0.clone().requires_grad_(True), w0.clone().requires_grad_(True)
        out = door(s.to(BF16), s, w, *args)
        y = out[0] if isinstance(out, tuple) else out
        y.backward(dy0)
        results.append((y.detach(), s.grad, w.grad))
    for a, b in zip(*results):
        assert same(a, b)
    real = op.spec.forward.launch(s0.to(BF16), s0, w0, *args)
    fake = op.spec.forward.fake(s0.to(BF16), s0, w0, *args)
    assert [(t.shape, t.dtype, t.stride()) for t in real] == [(t.shape, t.dtype, t.stride()) for t in fake]
    p = profiles.get("vllm-0.33-eager").replace(name="t", norm_weight="per_op")  # the doors' flags
    sg = s0.clone().requires_grad_(True)
    public = fused.rms_norm_variance_of(sg.to(BF16), sg, w0, 1e-6, p, after_add=True)
    assert type(public.grad_fn).__name__ == "_RMSNormVarianceOfFnBackward" and same(public.detach(), results[0][0])
    ref = variance_norm.rms_norm_variance_of(s0.to(BF16), s0, w0, 1e-6, p, after_add=True)
    assert (public.detach().float() - ref.float()).abs().max() <= 2 ** -6 * ref.float().abs().max()  # rsqrt is 1/sqrt here
    print("ok", n + 1)
''')


@needs_triton
def test_kernels_under_the_interpreter():
    """The Triton kernels' logic on CPU tensors (the interpreter: numpy arithmetic, so the orders of
    Triton's own sums are numpy's; the GPU tests below hold the compiled kernels to the reference)."""
    run = run_script(SCRIPT)
    assert run.returncode == 0 and run.stdout.startswith("ok 6"), tail(run)


# ------------------------------------------------------------------ the compiled reductions' layouts (CPU, sm_90)

_I32 = "i32"


def _plain_fwd(x, block, rows, warps):
    from rla.ops import _triton_norm as N

    sig = dict(x_ptr=x, r_ptr=x, w_ptr="*bf16", y_ptr="*fp32", res_ptr="*fp32", rstd_ptr="*fp32", M=_I32, N=_I32,
               inv_n="fp32", eps="fp32", sx=_I32, sr=_I32)
    return reduces(N._norm_fwd_kernel, sig, dict(HAS_RES=False, FP32_SUM=False, PER_OP=False, ROUND_W=False, LP=1,
                                                 ROWS=rows, BLOCK=block, EV=N.EVICT, STORE_RES=False),
                   [k for k in sig if k.endswith("_ptr")] + ["N", "sx", "sr"], warps)


def _var_fwd(x, block, rows, warps):
    from rla.ops import _triton_norm as N
    from rla.ops import _triton_norm_var as V

    sig = dict(x_ptr=x, s_ptr="*fp32", w_ptr="*bf16", y_ptr="*fp32", rstd_ptr="*fp32", M=_I32, N=_I32, inv_n="fp32",
               eps="fp32", sx=_I32, ss=_I32)
    return reduces(V._var_fwd_kernel, sig, dict(TREE=False, PER_OP=False, ROUND_W=False, LP=1, ROWS=rows, BLOCK=block,
                                                EV=N.EVICT, THREADS=1, LANES=32, VEC=1, ROUNDS=1, PAIRWISE=False),
                   [k for k in sig if k.endswith("_ptr")] + ["N", "sx", "ss"], warps)


def _var_bwd(block, rows, warps):
    from rla.ops import _triton_norm as N
    from rla.ops import _triton_norm_var as V

    sig = dict(dy_ptr="*fp32", x_ptr="*bf16", s_ptr="*fp32", w_ptr="*bf16", rstd_ptr="*fp32", dx_ptr="*bf16",
               ds_ptr="*fp32", dw_ptr="*fp32", M=_I32, N=_I32, inv_n="fp32", rows_per_program=_I32, sdy=_I32, sx=_I32,
               ss=_I32)
    return reduces(V._var_bwd_kernel, sig, dict(NEED_DX=True, NEED_DS=True, NEED_DW=True, ROUND_W=False, LP=1,
                                                ROWS=rows, BLOCK=block, EV=N.EVICT, STAGES=N.BWD_STAGES),
                   [k for k in sig if k.endswith("_ptr")] + ["N", "sdy", "sx", "ss"], warps)


@needs_triton
def test_unpinned_sums_take_the_plain_kernels_layouts():
    """Under ``unpinned`` the order of a ``tl.sum`` is its operand's register layout: the kernel's
    reduction of s must have the plain norm kernel's layout for the x it normalises, or s = x.float()
    would give another rstd. Compiled for sm_90 here (no GPU): at 3584 columns with an fp32 output the
    plain kernel's layout depends on x's dtype (8 elements per thread from a bf16 x, 4 from an fp32
    one), and the kernel, which also loads the fp32 s, takes x's. The backward's two sums (the centring
    mean, d_weight's) have the plain backward's layouts at the narrow tile (two rows of 128)."""
    from rla.ops import _triton_norm as N

    block, rows = 4096, N.FWD_ROWS
    warps = N._fwd_warps(block * rows)
    bf16, f32 = _plain_fwd("*bf16", block, rows, warps), _plain_fwd("*fp32", block, rows, warps)
    assert bf16 != f32  # the test tells the two apart
    assert _var_fwd("*bf16", block, rows, warps) == bf16
    assert _var_fwd("*fp32", block, rows, warps) == f32
    bwd_rows, bwd_warps, _ = N.backward_tile(4096, 128)
    assert bwd_rows > 1
    assert _var_bwd(128, bwd_rows, bwd_warps) == reduce_layouts.norm_bwd(128, bwd_rows, bwd_warps)


# ------------------------------------------------------------------ on the GPU: the compiled kernels

GPU_SHAPES = [(4096, 2560), (37, 1000), (1, 1536)]  # Gemma 4 E4B's hidden; an odd width; a one-row call


def _points(weight, reduction):
    return profiles.get("vllm-0.33").replace(name="t", norm_weight=weight, norm_reduction=reduction)


def _ulps(a, b):
    """|a - b| in units in the last place (bit patterns on a monotonic integer line)."""
    def line(t):
        i = t.contiguous().view(torch.int16 if t.element_size() == 2 else torch.int32).long()
        return torch.where(i < 0, -(i & (0x7FFF if t.element_size() == 2 else 0x7FFFFFFF)), i)
    assert a.dtype == b.dtype and a.shape == b.shape
    return (line(a) - line(b)).abs()


def _gpu_inputs(rows, hidden, dtype, wdtype, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    s = torch.randn(rows, hidden, device="cuda", generator=g) * 3
    w = (1 + 0.2 * torch.randn(hidden, device="cuda", generator=g)).to(wdtype)
    dy = torch.randn(rows, hidden, device="cuda", generator=g)
    return s, s.to(dtype), w, dy


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("weight", ["per_op", "fused"])
@pytest.mark.parametrize("reduction", ["unpinned", "vllm_block"])
@pytest.mark.parametrize("after_add", [False, True])
@pytest.mark.parametrize("out", [None, torch.float32])
@pytest.mark.parametrize("dtype,wdtype", [(BF16, BF16), (BF16, torch.float32), (torch.float16, torch.float32)])
def test_kernel_forward_is_the_reference_and_the_plain_kernel_gpu(weight, reduction, after_add, out, dtype, wdtype):
    """``vllm_block``: the reference bit for bit. ``unpinned``: the plain Triton norm's tolerance against
    the reference (Triton's tree, an fp32 ulp of rstd in some rows: one lp ulp of the output, two under
    per_op, >= 99.9 % equal; an fp32 output within 2**-20, but for per_op's rare flips of RN(x * rstd)).
    With s = x.float() (x lp) or s = x (x fp32 in the lp stack): the plain Triton norm bit for bit,
    under either order."""
    from rla.ops import fused, variance_norm

    p = _points(weight, reduction)
    for seed, (rows, hidden) in enumerate(GPU_SHAPES):
        s, x, w, _ = _gpu_inputs(rows, hidden, dtype, wdtype, seed)
        what = f"{weight} {reduction} after_add={after_add} {out} {dtype} {wdtype} {rows}x{hidden}"
        assert ops.backend(x, s, w) is fused
        got = ops.rms_norm(x, w, 1e-6, p, out_dtype=out, after_add=after_add, variance_of=s)
        want = variance_norm.rms_norm_variance_of(x, s, w, 1e-6, p, None, out, after_add)
        d = _ulps(got, want)
        if reduction == "vllm_block":
            assert not d.any(), f"{what}: {int((d > 0).sum())} of {d.numel()} differ"
        elif out is None:
            assert d.max() <= (2 if weight == "per_op" else 1) and (d == 0).double().mean() >= 0.999, what
        elif weight == "fused":
            assert torch.allclose(got, want, rtol=2 ** -20, atol=0), what
        else:  # and where RN(x * rstd) flipped (an lp ulp of the intermediate, scaled by w): 0.1 % at most
            off = (got - want).abs()
            assert (off <= 2 ** -20 * want.abs()).double().mean() >= 0.999, what
            assert (off <= 2 * torch.finfo(dtype).eps * want.abs()).all(), what
        plain = ops.rms_norm(x, w, 1e-6, p, out_dtype=out, after_add=after_add)
        assert seed or not torch.equal(got, plain), what  # s is not x: rstd moves (in some of 4096 rows)
        assert torch.equal(ops.rms_norm(x, w, 1e-6, p, out_dtype=out, after_add=after_add, variance_of=x.float()),
                           plain), what
        assert torch.equal(ops.rms_norm(s, w, 1e-6, p, dtype=dtype, out_dtype=out, after_add=after_add,
                                        variance_of=s),
                           ops.rms_norm(s, w, 1e-6, p, dtype=dtype, out_dtype=out, after_add=after_add)), what


def _grads(fn, x, s, w, dy):
    x, s, w = (t.detach().clone().requires_grad_(True) for t in (x, s, w))
    y = fn(x, s, w)
    y.backward(dy.to(y.dtype))
    return y.detach(), x.grad, s.grad, w.grad, type(y.grad_fn).__name__


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("weight", ["per_op", "fused"])
@pytest.mark.parametrize("reduction", ["unpinned", "vllm_block"])
@pytest.mark.parametrize("wdtype", [BF16, torch.float32])
def test_kernel_gradients_gpu(weight, reduction, wdtype):
    """d_x = RN(rstd * dy * w) is elementwise: the reference's bits under ``vllm_block`` (the same rstd),
    within one lp ulp under ``unpinned``. d_s and d_w add in Triton's order, not PyTorch's: no further
    from autograd of the fp64 expression than the reference's (10 % of its error, plus 1e-6 of the largest
    gradient for the order of fp32 sums), as every norm kernel's gradients (test_fused_gpu.py). d_w is
    the plain norm backward's sum of dy * (x * rstd) with the same rstd, bit for bit (its grid, its tile)."""
    from rla.ops import _triton_norm, fused, variance_norm

    p = _points(weight, reduction)
    for seed, (rows, hidden) in enumerate(GPU_SHAPES[:2] + [(4096, 128)]):  # the narrow backward tile too
        s, x, w, dy = _gpu_inputs(rows, hidden, BF16, wdtype, seed + 10)
        noise = torch.randn(s.shape, device="cuda", generator=torch.Generator(device="cuda").manual_seed(seed))
        x = (s + 0.1 * noise).to(BF16)  # independent of s: d_x and d_s are told apart
        mine = _grads(lambda a, b, c: ops.rms_norm(a, c, 1e-6, p, variance_of=b), x, s, w, dy)
        ref = _grads(lambda a, b, c: variance_norm.rms_norm_variance_of(a, b, c, 1e-6, p), x, s, w, dy)
        assert mine[4] == "_RMSNormVarianceOfFnBackward" and ref[4] == "_RMSNormVarianceOfBackward"
        what = f"{weight} {reduction} {wdtype} {rows}x{hidden}"
        d = _ulps(mine[1], ref[1])
        assert (d.max() == 0) if reduction == "vllm_block" else (d.max() <= 1 and (d == 0).double().mean() >= 0.999), what
        x64, s64 = x.double().requires_grad_(True), s.double().requires_grad_(True)
        w64 = (w.to(BF16) if wdtype == torch.float32 else w).double().requires_grad_(True)
        (_fp64(x64, s64, w64, 1e-6) * dy.to(BF16).double()).sum().backward()
        for i, oracle in ((2, s64.grad), (3, w64.grad)):
            scale = oracle.abs().max()
            m_err, r_err = (mine[i].double() - oracle).abs(), (ref[i].double() - oracle).abs()
            assert m_err.mean() <= 1.1 * r_err.mean() + 1e-6 * scale, (what, i, m_err.mean(), r_err.mean())
            assert m_err.max() <= 1.1 * r_err.max() + 1e-6 * scale, (what, i, m_err.max(), r_err.max())
        _, rstd = fused._rms_norm_variance_of_fwd(x, s, w, 1e-6, weight == "per_op", BF16, BF16, reduction, False)
        _, dw_plain = _triton_norm.backward(dy.to(BF16), None, x, None, w.contiguous(), rstd, True, BF16)
        assert torch.equal(mine[3], dw_plain), what


@pytest.mark.gpu
@needs_cuda
def test_a_training_step_through_x_rounded_from_s_gpu():
    """x = RN(s) in the graph (the aligned Gemma 4's stream norm): s's gradient d_x + d_s, and the
    weight's, against the reference's, under ``vllm_block`` (d_x bit for bit, so the difference is
    d_s's order: fp32 ulps of its scale); kept for backward: what the reference keeps."""
    from rla.ops import variance_norm

    p = profiles.get("vllm-0.33-eager")
    s, _, w, dy = _gpu_inputs(2048, 2560, BF16, BF16, 21)
    outs = []
    for fn in (lambda a, c: ops.rms_norm(a.to(BF16), c, 1e-6, p, dtype=BF16, variance_of=a),
               lambda a, c: variance_norm.rms_norm_variance_of(a.to(BF16), a, c, 1e-6, p)):
        a, c = s.clone().requires_grad_(True), w.clone().requires_grad_(True)
        y = fn(a, c)
        y.backward(dy.to(BF16))
        outs.append((y.detach(), a.grad, c.grad))
    (y, gs, gw), (ry, rgs, rgw) = outs
    x, s_leaf, w_leaf = s.to(BF16).requires_grad_(True), s.clone().requires_grad_(True), w.clone().requires_grad_(True)
    kept = saved_bytes(lambda a, b, c: ops.rms_norm(a, c, 1e-6, p, variance_of=b), (x, s_leaf, w_leaf))
    assert kept == 4 * s.shape[0]  # beyond x, s and the weight: one fp32 rstd per row
    assert torch.equal(y, ry)
    torch.testing.assert_close(gs, rgs, rtol=2 ** -16, atol=2 ** -20 * rgs.abs().max().item())
    # bf16 d_w: each one rounding of fp32 sums over 2048 rows in two orders (apart by ~1e-4 at most; more
    # than one bf16 ulp of a column whose sum cancels to near 0, hence the floor)
    torch.testing.assert_close(gw.float(), rgw.float(), rtol=2 ** -7, atol=2 ** -12 * rgw.abs().max().item())


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("per_op,reduction,out,after_add",
                         [(False, "unpinned", BF16, False), (True, "vllm_block", torch.float32, True),
                          (False, "vllm_block", BF16, False)])
def test_opcheck_gpu(per_op, reduction, out, after_add):
    from rla.ops import fused

    s, x, w, dy = _gpu_inputs(16, 96, BF16, torch.float32, 3)
    torch.library.opcheck(torch.ops.rla.rms_norm_variance_of.default,
                          (leaf(x), leaf(s), leaf(w), 1e-6, per_op, BF16, out, reduction, after_add))
    _, rstd = fused._rms_norm_variance_of_fwd(x, s, w, 1e-6, per_op, BF16, out, reduction, after_add)
    torch.library.opcheck(torch.ops.rla.rms_norm_variance_of_backward.default,
                          (dy.to(out), x, s, w, rstd, True, False, True, BF16))


@pytest.mark.gpu
@needs_cuda
def test_compiled_graph_holds_the_custom_op_and_equals_eager_gpu():
    p = profiles.get("vllm-0.33")
    s, _, w, dy = _gpu_inputs(300, 1536, BF16, BF16, 5)

    def step(a, c):
        return ops.rms_norm(a.to(BF16), c, 1e-6, p, dtype=BF16, variance_of=a)

    targets = []

    def recording(gm, example_inputs):
        from torch._dynamo.backends.debugging import aot_eager

        targets.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return aot_eager(gm, example_inputs)

    runs = []
    for fn in (step, torch.compile(step, backend=recording, fullgraph=True)):
        a, c = s.clone().requires_grad_(True), w.clone().requires_grad_(True)
        y = fn(a, c)
        y.backward(dy.to(BF16))
        runs.append((y.detach(), a.grad, c.grad))
    assert "rla.rms_norm_variance_of.default" in targets, targets
    for u, v in zip(*runs):
        assert torch.equal(u, v)
