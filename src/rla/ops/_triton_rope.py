"""RoPE in Triton: q and k of one token in one program, one launch for both.

Layout. q and k come as [B, H, S, D] (HF's ``view(B, S, H, D).transpose(1, 2)``, so a token's
heads are contiguous in memory) or [B, S, H, D] (``head_axis=2``), with any strides whose last one
is 1; each output is allocated with its input's strides, so one (batch, head, position) stride
triple addresses both. cos/sin are [B or 1, S or 1, D], read through strides where a broadcast
axis has stride 0 (no ``expand`` on the host), or [B or 1, S or 1, D/2]: the first half only, which
the rotate-half convention repeats (``HALF_TABLE``; a quarter of the fp32 table's bytes in bf16).
Program ``b * S + s`` reads the cos/sin row once and rotates every head of q and k at that token
(``TOKENS`` tokens per program). Bytes: q and k read and written once, cos/sin read once per token.

Numerics (docs/rounding.md, ``rope.cos_sin`` and ``rope.apply``), with x1, x2 the halves of a head and
rot(x) = cat(-x2, x1):
  out1 = x1*c1 - x2*s1,  out2 = x2*c2 + x1*s2            (fused: one rounding at the store)
  out1 = RN(x1*c1) - RN(x2*s1), out2 = RN(x2*c2) + RN(x1*s2)  (per_op)
``a + (-b)`` and ``a - b`` are the same IEEE operation and RN is odd-symmetric, so these equal the
reference's ``x*c + rot(x)*s`` bit for bit; compiled without FMA contraction. The backward is
grad = g*c + rotT(g*s) with rotT(y) = cat(y2, -y1):
  dx1 = g1*c1 + g2*s2,   dx2 = g2*c2 - g1*s1.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from rla.ops._triton_common import LAUNCH_OPTS, cdiv, lp_kind, next_pow2, to_lp
from rla.ops._layout import output_like

NUM_WARPS = 4
#: Tokens per program (rows of the [TOKENS, heads, head_dim / 2] blocks one program rotates).
TOKENS = 1


@triton.jit
def _rotate_heads(
    x_ptr, o_ptr, base, tm, sh, c1, c2, s1, s2,
    H: tl.constexpr, H_P: tl.constexpr, HALF: tl.constexpr, HALF_P: tl.constexpr,
    PER_OP: tl.constexpr, BACKWARD: tl.constexpr, LP: tl.constexpr,
):
    """Rotate every head of TOKENS tokens: ``base`` [TOKENS] offsets of each token's first head,
    ``tm`` [TOKENS] which tokens exist, c1..s2 [TOKENS, HALF_P] fp32."""
    h = tl.arange(0, H_P)[None, :, None]
    d = tl.arange(0, HALF_P)[None, None, :]
    mask = tm[:, None, None] & (h < H) & (d < HALF)
    off = base[:, None, None] + h * sh + d
    x1 = tl.load(x_ptr + off, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(x_ptr + off + HALF, mask=mask, other=0.0).to(tl.float32)
    c1 = c1[:, None, :]
    c2 = c2[:, None, :]
    s1 = s1[:, None, :]
    s2 = s2[:, None, :]
    if BACKWARD:
        o1 = x1 * c1 + x2 * s2
        o2 = x2 * c2 - x1 * s1
    elif PER_OP:
        o1 = to_lp(x1 * c1, LP) - to_lp(x2 * s1, LP)
        o2 = to_lp(x2 * c2, LP) + to_lp(x1 * s2, LP)
    else:
        o1 = x1 * c1 - x2 * s1
        o2 = x2 * c2 + x1 * s2
    tl.store(o_ptr + off, o1.to(o_ptr.dtype.element_ty), mask=mask)
    tl.store(o_ptr + off + HALF, o2.to(o_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _rope_kernel(
    q_ptr, k_ptr, cos_ptr, sin_ptr, oq_ptr, ok_ptr, S, NT,
    sqb, sqh, sqs, skb, skh, sks, scb, scs,
    HQ: tl.constexpr, HK: tl.constexpr, HQ_P: tl.constexpr, HK_P: tl.constexpr,
    HALF: tl.constexpr, HALF_P: tl.constexpr,
    ROUND_CS: tl.constexpr, PER_OP: tl.constexpr, BACKWARD: tl.constexpr, TOKENS: tl.constexpr,
    HALF_TABLE: tl.constexpr, LP: tl.constexpr,
):
    tok = tl.program_id(0).to(tl.int64) * TOKENS + tl.arange(0, TOKENS)
    tm = tok < NT
    b = tok // S
    s = tok % S
    d = tl.arange(0, HALF_P)[None, :]
    dm = tm[:, None] & (d < HALF)
    off = (b * scb + s * scs)[:, None] + d
    c1 = tl.load(cos_ptr + off, mask=dm, other=0.0).to(tl.float32)
    s1 = tl.load(sin_ptr + off, mask=dm, other=0.0).to(tl.float32)
    if ROUND_CS:
        c1 = to_lp(c1, LP)
        s1 = to_lp(s1, LP)
    if HALF_TABLE:
        c2 = c1
        s2 = s1
    else:
        c2 = tl.load(cos_ptr + off + HALF, mask=dm, other=0.0).to(tl.float32)
        s2 = tl.load(sin_ptr + off + HALF, mask=dm, other=0.0).to(tl.float32)
        if ROUND_CS:
            c2 = to_lp(c2, LP)
            s2 = to_lp(s2, LP)
    _rotate_heads(q_ptr, oq_ptr, b * sqb + s * sqs, tm, sqh,
                  c1, c2, s1, s2, HQ, HQ_P, HALF, HALF_P, PER_OP, BACKWARD, LP)
    _rotate_heads(k_ptr, ok_ptr, b * skb + s * sks, tm, skh,
                  c1, c2, s1, s2, HK, HK_P, HALF, HALF_P, PER_OP, BACKWARD, LP)


def _with_output(x: torch.Tensor, dtype=None) -> tuple[torch.Tensor, torch.Tensor]:
    """(x, out) with the same strides: x itself when it already has ``output_like``'s layout,
    else a copy of x in it; out in ``dtype`` (default x's)."""
    out = output_like(x, dtype)
    if x.stride() != out.stride():
        x = torch.empty_like(out, dtype=x.dtype).copy_(x)
    return x, out


def _table_strides(t: torch.Tensor, B: int, S: int) -> tuple[int, int]:
    """Batch and position strides of a cos/sin table [B or 1, S or 1, D or D/2] read as [B, S, .]."""
    sb, ss, _ = t.stride()
    return (sb if B > 1 and t.shape[0] > 1 else 0), (ss if S > 1 and t.shape[1] > 1 else 0)


def launch(q, k, cos, sin, round_cos_sin: bool, per_op: bool, backward: bool, head_axis: int = 1, out_dtype=None):
    """Rotate q and k ([B, H, S, D] with ``head_axis=1``, [B, S, H, D] with 2) with cos/sin
    [B or 1, S or 1, D or D/2]; new outputs in the inputs' layout, in ``out_dtype`` (default the
    inputs'): fp32 q/k with a bf16 output is the unrounded q/k-norm output of the
    ``qk_norm_out='fp32'`` chain, rounded once at this store (the tables and per_op products round
    to the output's dtype, the stack's).

    Host time decides this op's eager speed (the kernel is ~70 us at 16K tokens of a 7B model),
    so the launch passes one set of strides per q/k and its output and one for cos and sin."""
    lp = q.dtype if backward else (out_dtype or q.dtype)  # the stack dtype: the tables round to it
    q, oq = _with_output(q, out_dtype)
    k, ok = _with_output(k, out_dtype)
    if cos.stride(-1) != 1 or sin.stride() != cos.stride():
        cos, sin = cos.contiguous(), sin.contiguous()
    seq_axis = 3 - head_axis
    shape, qs, ks = q.shape, q.stride(), k.stride()
    B, HQ, S, D = shape[0], shape[head_axis], shape[seq_axis], shape[3]
    HK = k.shape[head_axis]
    if B * S == 0 or D == 0:
        return oq, ok
    half = D // 2
    scb, scs = _table_strides(cos, B, S)
    _rope_kernel[(cdiv(B * S, TOKENS),)](
        q, k, cos, sin, oq, ok, S, B * S,
        qs[0], qs[head_axis], qs[seq_axis], ks[0], ks[head_axis], ks[seq_axis], scb, scs,
        HQ=HQ, HK=HK, HQ_P=next_pow2(max(HQ, 1)), HK_P=next_pow2(max(HK, 1)),
        HALF=half, HALF_P=next_pow2(half),
        ROUND_CS=round_cos_sin, PER_OP=per_op, BACKWARD=backward, TOKENS=TOKENS,
        HALF_TABLE=cos.shape[-1] != D, LP=lp_kind(lp),
        num_warps=NUM_WARPS, **LAUNCH_OPTS,
    )
    return oq, ok
