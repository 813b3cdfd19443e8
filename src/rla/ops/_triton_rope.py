"""RoPE in Triton: q and k of one token in one program, one launch for both.

Layout. The launcher passes q [B, Hq, S, D] and k [B, Hkv, S, D] with any strides whose last one
is 1 (HF hands over ``view(B, S, H, D).transpose(1, 2)``, so a token's heads are contiguous in
memory), and cos/sin as [B, S, D] (a batch stride of 0 broadcasts one table over the batch).
Program ``b * S + s`` reads the cos/sin row once and rotates every head of q and k at that token.
Bytes: q and k read and written once, cos/sin read once per token.

Numerics (ROUNDING.md, ``rope.cos_sin`` and ``rope.apply``), with x1, x2 the halves of a head and
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

from rla.ops._triton_common import LAUNCH_OPTS

NUM_WARPS = 4


@triton.jit
def _rotate_heads(
    x_ptr, o_ptr, x_base, o_base, sxh, soh, c1, c2, s1, s2,
    H: tl.constexpr, H_P: tl.constexpr, HALF: tl.constexpr, HALF_P: tl.constexpr,
    PER_OP: tl.constexpr, BACKWARD: tl.constexpr,
):
    lp: tl.constexpr = o_ptr.dtype.element_ty
    h = tl.arange(0, H_P)[:, None]
    d = tl.arange(0, HALF_P)[None, :]
    mask = (h < H) & (d < HALF)
    xp = x_ptr + x_base + h * sxh + d
    op = o_ptr + o_base + h * soh + d
    x1 = tl.load(xp, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(xp + HALF, mask=mask, other=0.0).to(tl.float32)
    c1 = c1[None, :]
    c2 = c2[None, :]
    s1 = s1[None, :]
    s2 = s2[None, :]
    if BACKWARD:
        o1 = x1 * c1 + x2 * s2
        o2 = x2 * c2 - x1 * s1
    elif PER_OP:
        o1 = (x1 * c1).to(lp).to(tl.float32) - (x2 * s1).to(lp).to(tl.float32)
        o2 = (x2 * c2).to(lp).to(tl.float32) + (x1 * s2).to(lp).to(tl.float32)
    else:
        o1 = x1 * c1 - x2 * s1
        o2 = x2 * c2 + x1 * s2
    tl.store(op, o1.to(lp), mask=mask)
    tl.store(op + HALF, o2.to(lp), mask=mask)


@triton.jit
def _rope_kernel(
    q_ptr, k_ptr, cos_ptr, sin_ptr, oq_ptr, ok_ptr, S,
    sqb, sqh, sqs, skb, skh, sks,
    soqb, soqh, soqs, sokb, sokh, soks,
    scb, scs, ssb, sss,
    HQ: tl.constexpr, HK: tl.constexpr, HQ_P: tl.constexpr, HK_P: tl.constexpr,
    HALF: tl.constexpr, HALF_P: tl.constexpr,
    ROUND_CS: tl.constexpr, PER_OP: tl.constexpr, BACKWARD: tl.constexpr,
):
    pid = tl.program_id(0).to(tl.int64)
    b = pid // S
    s = pid % S
    lp: tl.constexpr = oq_ptr.dtype.element_ty
    d = tl.arange(0, HALF_P)
    dm = d < HALF
    cp = cos_ptr + b * scb + s * scs + d
    sp = sin_ptr + b * ssb + s * sss + d
    c1 = tl.load(cp, mask=dm, other=0.0).to(tl.float32)
    c2 = tl.load(cp + HALF, mask=dm, other=0.0).to(tl.float32)
    s1 = tl.load(sp, mask=dm, other=0.0).to(tl.float32)
    s2 = tl.load(sp + HALF, mask=dm, other=0.0).to(tl.float32)
    if ROUND_CS:
        c1 = c1.to(lp).to(tl.float32)
        c2 = c2.to(lp).to(tl.float32)
        s1 = s1.to(lp).to(tl.float32)
        s2 = s2.to(lp).to(tl.float32)
    _rotate_heads(q_ptr, oq_ptr, b * sqb + s * sqs, b * soqb + s * soqs, sqh, soqh,
                  c1, c2, s1, s2, HQ, HQ_P, HALF, HALF_P, PER_OP, BACKWARD)
    _rotate_heads(k_ptr, ok_ptr, b * skb + s * sks, b * sokb + s * soks, skh, sokh,
                  c1, c2, s1, s2, HK, HK_P, HALF, HALF_P, PER_OP, BACKWARD)


def _last_dim_unit(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


def launch(q, k, cos, sin, round_cos_sin: bool, per_op: bool, backward: bool):
    """Rotate q [B, Hq, S, D] and k [B, Hkv, S, D] with cos/sin [B, S, D]; new outputs with the
    inputs' layout (``empty_like``)."""
    q, k, cos, sin = (_last_dim_unit(t) for t in (q, k, cos, sin))
    oq, ok = torch.empty_like(q), torch.empty_like(k)
    B, HQ, S, D = q.shape
    HK = k.shape[1]
    if B * S == 0 or D == 0:
        return oq, ok
    half = D // 2
    _rope_kernel[(B * S,)](
        q, k, cos, sin, oq, ok, S,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        oq.stride(0), oq.stride(1), oq.stride(2), ok.stride(0), ok.stride(1), ok.stride(2),
        cos.stride(0), cos.stride(1), sin.stride(0), sin.stride(1),
        HQ=HQ, HK=HK, HQ_P=triton.next_power_of_2(max(HQ, 1)), HK_P=triton.next_power_of_2(max(HK, 1)),
        HALF=half, HALF_P=triton.next_power_of_2(half),
        ROUND_CS=round_cos_sin, PER_OP=per_op, BACKWARD=backward,
        num_warps=NUM_WARPS, **LAUNCH_OPTS,
    )
    return oq, ok
