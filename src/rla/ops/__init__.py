"""Training-side RoPE, SwiGLU and RMSNorm that round exactly where a chosen engine does.

``profile`` is a profile name (``"vllm"``) or a :class:`rla.profiles.RoundingProfile`. The
low-precision dtype is the input's (bf16 or fp16); on fp32 inputs nothing is rounded. All ops
are differentiable; ``carry_add`` and ``qk_norm_rope`` are the two chains across ops that a
compiled engine fuses (``residual_stream='fp32_carry'``, ``qk_norm_out='fp32'``), one kernel each. On CUDA they run the fused kernels of ``rla.ops.fused`` when Triton is
available; everywhere else the PyTorch reference of ``rla.ops.reference``, which is the oracle
the fused kernels are tested against. ``attn_gate`` (Qwen3.5's attention output gate, a variant point)
is PyTorch ops on every device (:mod:`rla.ops.gate`). ``launch_config()`` / ``set_launch_config(dict)`` read and
set the fused kernels' launch parameters (:mod:`rla.ops.launch`). The MoE router and the
weighted sum of experts (the router points of :mod:`rla.profiles.router`) are
:mod:`rla.ops.routing`: PyTorch ops only, the same code on CPU and CUDA.
"""

from __future__ import annotations

import torch

from rla.ops import gate as _gate
from rla.ops import reference
from rla.ops import variance_norm as _variance_norm
from rla.ops._checks import check_carry_add, check_norm, check_pair, check_residual_source, check_rope, check_variance_of
from rla.ops.launch import launch_config, set_launch_config
from rla.profiles import RoundingProfile, resolve

__all__ = ["rope", "swiglu", "geglu", "swiglu_oai", "rms_norm", "rms_norm_and_round", "add_rms_norm", "carry_add",
           "qk_norm_rope", "attn_gate", "backend", "launch_config", "set_launch_config"]


def backend(*tensors: torch.Tensor):
    """The implementation module that will run for these tensors (``fused`` or ``reference``)."""
    if any([t.is_cuda for t in tensors]):  # a list, not a generator: traced by Dynamo everywhere
        try:
            from rla.ops import fused
        except ImportError:  # the fused path is optional; the reference is always there
            return reference
        if fused.available(*tensors):
            return fused
    return reference


def rope(q, k, cos, sin, profile: str | RoundingProfile, unsqueeze_dim: int = 1, dtype: torch.dtype | None = None):
    """Rotary position embedding of ``q`` and ``k`` -> ``(q_out, k_out)``.

    Same call as HF's ``apply_rotary_pos_emb``, with fp32 ``cos``/``sin``: the profile decides
    whether they are rounded to the input dtype (``rope_cos_sin``) and whether the two products
    are rounded before the sum (``rope_apply``). ``cos``/``sin`` may also be half tables
    [..., D/2], the first half of HF's [..., D] (which repeats it), as vLLM caches them: the
    same numbers from a quarter of the bytes when already rounded to q's dtype.

    ``dtype`` is the stack's low-precision dtype (default q's): fp32 ``q``/``k`` with
    ``dtype=torch.bfloat16`` are unrounded q/k-norm outputs (``qk_norm_out='fp32'``), read as
    they are and rounded once at the output.
    """
    p = resolve(profile)
    check_rope(q, k, cos, sin, p, unsqueeze_dim, dtype)
    return backend(q, k).rope(q, k, cos, sin, p, unsqueeze_dim, dtype)


def qk_norm_rope(
    q, k, q_weight, k_weight, eps, cos, sin, profile: str | RoundingProfile, unsqueeze_dim: int = 1,
    dtype: torch.dtype | None = None,
):
    """RoPE(RMSNorm(q)), RoPE(RMSNorm(k)) as one op: Qwen3's per-head q/k norms and the rotary
    embedding under ``qk_norm_out='fp32'`` -> ``(q_out, k_out)`` in the stack dtype.

    ``q``/``k`` are the raw projections (any layout :func:`rope` takes: HF's [B, H, S, D] view,
    slices of a fused qkv, [B, S, H, D] with ``unsqueeze_dim=2``); ``q_weight``/``k_weight`` the
    norms' weights; ``eps`` a float or a (q_eps, k_eps) pair; ``cos``/``sin`` as for :func:`rope`;
    ``dtype`` the stack dtype (default q's). The numbers are those of ``rms_norm(...,
    out_dtype=torch.float32)`` followed by ``rope(..., dtype=dtype)``, bit for bit, forward and
    backward, in the profile's ``norm_reduction`` order: the norm's output reaches the rotation
    unrounded and the rotation rounds once, as vLLM's compiled graph does.

    What fusing buys: on CUDA one Triton kernel forward and one backward, the fp32 q/k between
    the norm and the rotation never exists in memory (the two-op chain writes and reads it, 8
    bytes per element, and keeps nothing of it for backward either). Saved for backward: the raw
    q/k (their storage; the chain's norms save them too) and one fp32 rstd per (token, head) row.
    The CPU path composes the two reference ops.
    """
    p = resolve(profile)
    check_rope(q, k, cos, sin, p, unsqueeze_dim, dtype)
    lp = q.dtype if dtype is None else dtype
    if q.dtype != lp:
        raise TypeError(f"qk_norm_rope takes the raw q/k in the stack dtype {lp}, got {q.dtype}")
    q_eps, k_eps = (eps, eps) if isinstance(eps, (int, float)) else tuple(eps)
    check_norm(q, None, q_weight, q_eps, lp)
    check_norm(k, None, k_weight, k_eps, lp)
    return backend(q, k, q_weight, k_weight).qk_norm_rope(
        q, k, q_weight, k_weight, (float(q_eps), float(k_eps)), cos, sin, p, unsqueeze_dim, lp
    )


def swiglu(gate, up, profile: str | RoundingProfile):
    """silu(gate) * up, rounded where ``profile.swiglu`` says."""
    p = resolve(profile)
    check_pair(gate, up, ("gate", "up"))
    return backend(gate, up).swiglu(gate, up, p)


def attn_gate(attn, gate, profile: str | RoundingProfile):
    """attn * sigmoid(gate), the gated attention's output gate (Qwen3.5), rounded where
    ``profile.attn_gate`` says: ``per_op`` = RN(attn * RN(sigmoid(g))) (HF's two ops), ``fused`` =
    RN(attn * sigmoid(g)) in fp32, one rounding. ``profile.attn_gate`` is a variant point: pass the
    row's ``qwen3_5`` variant (``profile.variant("qwen3_5")``), which sets it. The same PyTorch ops on
    every device (:mod:`rla.ops.gate`, its backward as the reference ops')."""
    p = resolve(profile)
    check_pair(attn, gate, ("attn", "gate"))
    return _gate.attn_gate(attn, gate, p.attn_gate == "per_op")


def geglu(gate, up, profile: str | RoundingProfile):
    """gelu_tanh(gate) * up (Gemma's gated MLP, ``gelu_pytorch_tanh``), rounded where
    ``profile.swiglu`` says: the gated product's point, the same for either activation
    (``per_op`` = the activation rounded before the product, ``fused`` = one rounding).

    On CUDA rla's fused kernel (``rla.ops._triton_geglu``: one read of gate/up, one write,
    forward and backward), the PyTorch reference elsewhere.
    """
    p = resolve(profile)
    check_pair(gate, up, ("gate", "up"))
    return backend(gate, up).geglu(gate, up, p)


def swiglu_oai(gate, up, alpha: float, limit: float, profile: str | RoundingProfile):
    """GPT-OSS's clamped SwiGLU, (clamp(up, -limit, limit) + 1) * g * sigmoid(alpha * g) with
    g = clamp(gate, max=limit), rounded where ``profile.swiglu`` says: ``per_op`` is HF's op
    sequence on bf16 tensors (each of its five arithmetic ops rounded), ``fused`` one rounding of the
    fp32 chain ``profile.oai_glu`` orders (a ``gpt_oss`` variant point: via the sigmoid, or one division).
    ``gate``/``up`` may be the strided halves of an interleaved gate_up (``x[..., ::2]``,
    ``x[..., 1::2]``; the fused kernel copies them contiguous). On CUDA rla's fused kernel
    (``rla.ops._triton_swiglu_oai``), the PyTorch reference elsewhere."""
    p = resolve(profile)
    check_pair(gate, up, ("gate", "up"))
    for name, v in (("alpha", alpha), ("limit", limit)):
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not v > 0 or v == float("inf"):
            raise ValueError(f"swiglu_oai: {name} must be a finite positive number, got {v!r}")
    return backend(gate, up).swiglu_oai(gate, up, alpha, limit, p)


def _check_offset(weight_offset) -> float:
    if not isinstance(weight_offset, (int, float)) or isinstance(weight_offset, bool) or weight_offset not in (0, 1):
        raise ValueError(f"weight_offset must be 0.0 (x * w) or 1.0 (x * (1 + w), a zero-centred norm), "
                         f"got {weight_offset!r}")
    return float(weight_offset)


def rms_norm(
    x, weight, eps: float, profile: str | RoundingProfile, dtype: torch.dtype | None = None,
    out_dtype: torch.dtype | None = None, after_add: bool = False, weight_offset: float = 0.0, variance_of=None,
):
    """RMSNorm over the last dim; an fp32 ``weight`` is first rounded to the low-precision dtype.

    ``dtype`` is the stack's low-precision dtype and defaults to ``x.dtype``. Passing an fp32
    ``x`` with ``dtype=torch.bfloat16`` reads ``x`` as the fp32 residual sum of a fused add + norm
    (the ``fp32_sum`` point across a decoder-layer boundary) and returns a bf16 result.
    ``out_dtype=torch.float32`` returns the norm unrounded (a q/k norm feeding RoPE under
    ``qk_norm_out='fp32'``). ``after_add=True`` says ``x`` is a residual sum that the engine
    normalises inside its fused add + norm kernel (every decoder layer's input norm but the
    first, the final norm); it matters only under ``norm_reduction='vllm_block'``, whose add + norm
    kernel adds the squares in another order than its plain norm (``rla.ops.reduction``).
    ``weight_offset=1.0`` is a zero-centred norm (Gemma, Qwen3.5): x * rstd * (1 + w), with
    1 + w formed in fp32 from the engine's copy of w, as every stack forms it; it runs the
    PyTorch reference on every device (no fused kernel takes the offset yet).
    ``variance_of``: an fp32 tensor of x's shape whose mean square gives rstd while ``x`` is
    normalised, ``x * rsqrt(mean(s**2) + eps) * w`` (a compiled graph's norm whose reduction reads
    the fp32 value ``s`` that ``x = RN(s)`` was stored from: the ``stream_variance`` /
    ``embed_variance`` variant points; :mod:`rla.ops.variance_norm` states it and its backward):
    on CUDA rla's Triton kernel (``rla.ops._triton_norm_var``, the norm kernels' reductions over
    ``s``), the PyTorch reference elsewhere. Not with ``weight_offset``.
    """
    p = resolve(profile)
    check_norm(x, None, weight, eps, dtype)
    if out_dtype not in (None, torch.float32) and out_dtype != (dtype or x.dtype):
        raise TypeError(f"out_dtype must be None (the stack dtype) or torch.float32, got {out_dtype}")
    if variance_of is not None:
        check_variance_of(x, variance_of)
        if _check_offset(weight_offset):
            raise NotImplementedError("rms_norm: variance_of with weight_offset=1.0 (a zero-centred norm) is not "
                                      "implemented")
        impl = backend(x, variance_of, weight)
        fn = _variance_norm.rms_norm_variance_of if impl is reference else impl.rms_norm_variance_of
        return fn(x, variance_of, weight, eps, p, dtype, out_dtype, bool(after_add))
    if _check_offset(weight_offset):
        return reference.rms_norm(x, weight, eps, p, dtype, out_dtype, bool(after_add), 1.0)
    return backend(x, weight).rms_norm(x, weight, eps, p, dtype, out_dtype, bool(after_add))


def rms_norm_and_round(
    x, weight, eps: float, profile: str | RoundingProfile, dtype: torch.dtype | None = None, after_add: bool = False,
    weight_offset: float = 0.0,
):
    """RMSNorm of ``x`` and ``x`` rounded to the stack dtype -> ``(normed, rounded)``, one op.

    ``normed`` is :func:`rms_norm` ``(x, weight, eps, profile, dtype, after_add=after_add,
    weight_offset=weight_offset)`` bit for bit (the same kernel forward, the same reduction), and
    ``rounded`` is ``x.to(dtype)`` (a copy when ``x`` is already in it). What it is for: a decoder
    layer's input norm under ``norm_residual='fp32_sum'`` reads the previous layer's fp32 sum s,
    and the layer's residual is RN(s). As two ops that is a cast kernel (4 bytes read, 2 written
    per element) beside the norm's read of s, and in backward a cast of RN(s)'s gradient up to
    fp32 (2 read, 4 written) plus autograd's add of it to the norm's gradient (8 read, 4 written).
    Here one kernel reads s once and writes both outputs; the backward is the norm's backward
    kernel with d_rounded as its residual gradient: d_x = d_norm + d_rounded, added in fp32 and
    rounded once to x's dtype, which for an fp32 x is the fp32 add autograd does for the two ops,
    bit for bit. Saved for backward: what :func:`rms_norm` keeps (x, the weight, one fp32 rstd
    per row); ``rounded`` is not kept. ``weight_offset=1.0`` runs the PyTorch reference on every
    device, as :func:`rms_norm` does.
    """
    p = resolve(profile)
    check_norm(x, None, weight, eps, dtype)
    if _check_offset(weight_offset):
        return reference.rms_norm_and_round(x, weight, eps, p, dtype, bool(after_add), 1.0)
    return backend(x, weight).rms_norm_and_round(x, weight, eps, p, dtype, bool(after_add))


def add_rms_norm(x, residual, weight, eps: float, profile: str | RoundingProfile, weight_offset: float = 0.0,
                 residual_source: torch.Tensor | None = None, new_residual: bool = True):
    """Residual add + RMSNorm -> ``(normed, new_residual)``; ``normed`` alone when
    ``new_residual=False``.

    ``new_residual`` is RN(x + residual) under every profile; the norm reads that rounded sum or
    the fp32 sum, as ``profile.norm_residual`` says. ``weight_offset`` as for :func:`rms_norm`.

    ``residual_source``: an fp32 tensor that ``residual`` is the rounding of (``residual =
    residual_source.to(residual.dtype)``; not checked, which would read both again). Under
    ``fp32_sum`` the backward needs the fp32 sum x + r and rebuilds it from what is kept: with a
    source it keeps the source instead of ``residual`` and reads it as RN(source), which is
    ``residual`` bit for bit, so every output and gradient is the same; the source gets no
    gradient (it reaches it through ``residual``). It saves memory when something else keeps the
    source anyway: in an aligned decoder layer it is the previous layer's fp32 sum, kept by the
    input norm that reads it, and ``residual`` (2 bytes per element) is then kept by nothing.
    Ignored under ``rounded_sum``, which keeps the rounded sum it returns. Saved-tensor hooks that
    copy each saved tensor (``torch.autograd.graph.save_on_cpu``) copy the source once per op that
    keeps it: 4 bytes per element moved where r cost 2.

    ``new_residual=False``: for a caller that never reads RN(x + residual) (an aligned layer under
    ``residual_stream='fp32_carry'``, whose MLP add rebuilds x + r from x and r). Under
    ``fp32_sum`` it is then not written (2 bytes per element, and its buffer, less); ``normed``
    and every gradient are the same bits. Under ``rounded_sum`` the norm reads RN(x + r) and
    backward keeps it, so it is formed as before and only not returned.
    """
    p = resolve(profile)
    check_norm(x, residual, weight, eps)
    if residual_source is not None:
        check_residual_source(residual, residual_source)
    if _check_offset(weight_offset):
        return reference.add_rms_norm(x, residual, weight, eps, p, 1.0, residual_source, bool(new_residual))
    return backend(x, residual, weight).add_rms_norm(x, residual, weight, eps, p, residual_source=residual_source,
                                                     new_residual=bool(new_residual))


def carry_add(x, residual, m, out_dtype: torch.dtype | None = None):
    """(x + residual) + m in fp32, rounded once to ``out_dtype`` (default x's dtype).

    The MLP's residual add under ``residual_stream='fp32_carry'``: it reads the attention's
    unrounded sum x + residual (an engine's compiler recomputes it in the consumer kernel) instead
    of RN(x + residual). One fused kernel on CUDA reads the three tensors once; no fp32 copy of
    x + residual is kept across the MLP. ``out_dtype=torch.float32`` keeps the sum for a next norm
    that reads the fp32 sum (``norm_residual='fp32_sum'``).
    """
    check_carry_add(x, residual, m)
    return backend(x, residual, m).carry_add(x, residual, m, out_dtype or x.dtype)
