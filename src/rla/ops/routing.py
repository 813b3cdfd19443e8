"""The MoE router and the weighted sum of experts, rounding where :class:`rla.profiles.RouterPoints` says.

The reference of the router points (``rla.profiles.router``), forward and backward: every step is
a differentiable PyTorch op (the top-k's indices are not differentiable, the routing weights are,
through the softmax or sigmoid and the renormalisation), so the gradient of the loss reaches the
gate weight the way the rounded forward computed it. The same code runs on CUDA; there is no fused
kernel (the router is a few small ops per token, the expert GEMMs dominate).

Three functions, in the order an MoE block calls them:

- :func:`router_logits` -- the gate GEMM, its output lp or fp32 (``logits``).
- :func:`softmax_route` / :func:`sigmoid_grouped_route` -- scores (``softmax`` / ``sigmoid``),
  top-k (``ties``), renormalisation (``renorm`` / ``sigmoid_renorm``), the weights' dtype
  (``weights``) and, for DeepSeek-V3, ``routed_scale='weights'``.
- :func:`combine` -- the k weighted expert outputs summed per token (``expert_out``,
  ``weighted_term``, ``combine``, ``routed_scale``), from a ``[tokens, k, hidden]`` tensor of
  expert outputs (lp outputs or fp32 accumulators) that the caller computes.

Exactness: every step written here is one IEEE operation in the order written, on every device,
except what a point's value leaves to the running kernel: ``softmax='divide'``'s denominator and
``renorm='torch'``'s sum (``torch.sum``), and the GEMMs. Where a sum's order is pinned it is written
as a loop of adds, never as ``torch.sum``: ``torch.sum`` over a short last dim sums in order on
CPU but not on CUDA, whose reduction kernel gives a row of 3 values to 2 threads (the block width
is the largest power of two <= 3), so the k = 3 weights sum as (w0 + w2) + w1 there. That was why
the routing weights on CUDA differed from the rows' definition (slot order, (w0 + w1) + w2) in the
last fp32 bit while the expert ids, read before the renormalisation, were equal.

``softmax='reciprocal'`` is vLLM's ``topk_softmax`` kernel (``topkGating`` in ``_moe_C``), read
from its SASS: one thread group per row, each thread holding ``vpt`` logits (vectors of
``elts_per_ldg`` columns, ``threads_per_row`` vectors apart), e = expf(l - max), each thread's
values summed in order from 0, the threads' sums combined by an xor butterfly, then
e * RN(1 / sum) (:func:`topk_softmax_layout` says the split for an expert count and logits dtype;
:func:`kernel_row_sum` sums that way). ``torch.exp`` and the kernel's ``expf`` are the same
libdevice function (no fast-math): the CUDA probe, ``lab/bench/router_probe_h200.py``, holds this
reference to the kernel. For expert counts the fused kernel is not instantiated for, vLLM falls
back to a block-wide softmax (cub's block reduction) whose order is not modelled: the denominator
there is ``torch.sum``'s, unpinned.

``sigmoid='tanh_half'`` and ``sigmoid_renorm='warp_fp64'`` are vLLM's ``grouped_topk`` kernel for
DeepSeek-V3 (``grouped_topk_fused_small_expert_count_kernel`` in ``_moe_C``, read from its sm_90
SASS and vLLM's ``csrc/moe/grouped_topk_kernels.cu``): scores 0.5 + 0.5 * tanhf(x / 2) in fp32
(:func:`sigmoid_scores`); the correction bias added in fp32 to the score for the choice only; the
group score the fp32 sum of the group's two best biased scores; the k weights the unbiased scores,
summed by the warp's xor butterfly and divided in fp64 (:func:`warp_sum`, :func:`renorm_weights`).
``torch.tanh`` is the device's: on CUDA torch's kernel calls ``tanhf`` as vLLM's does (the
kernel's is libdevice's, no fast-math: MUFU.EX2 + MUFU.RCP above |y| = 0.6, an odd polynomial
below; that the two builds' ``tanhf`` give the same bits is what the GPU probe checks), on CPU
torch's own vectorised tanh, which can differ from CUDA's ``tanhf`` (and from the correctly rounded
tanh) in the last bit, so the CPU value is the definition with the CPU's tanh. :func:`grouped_topk_small_kernel` says for which shapes vLLM runs that
kernel; for the others it runs ``grouped_topk_fused_kernel``, which keeps the scores in the logits'
dtype and divides in fp32, and which no value here models.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from rla.profiles.router import RouterPoints

__all__ = ["router_logits", "softmax_scores", "sigmoid_scores", "select_topk", "softmax_route", "sigmoid_grouped_route",
           "finish_weights", "combine", "renorm_weights", "warp_sum", "topk_softmax_layout", "kernel_row_sum",
           "grouped_topk_small_kernel"]

#: The expert counts vLLM's fused ``topkGating`` kernel is instantiated for, and the most bytes
#: each thread loads at once (read from the kernel names in vLLM 0.26's ``_moe_C``): powers of two
#: up to 512 with 16-byte loads, five multiples of 64 with 4-byte loads.
TOPK_SOFTMAX_FUSED: dict[int, int] = {**{2 ** i: 16 for i in range(10)}, **{e: 4 for e in (192, 320, 384, 448, 576)}}


def topk_softmax_layout(num_experts: int, itemsize: int) -> tuple[int, int, int] | None:
    """``(vpt, elts_per_ldg, threads_per_row)`` of vLLM's fused top-k softmax for ``num_experts``
    logits of ``itemsize`` bytes, or None where vLLM runs its unfused fallback. Thread t of a row
    holds columns ``elts_per_ldg * (t + j * threads_per_row) + i`` for load j and lane i, in that
    order (its ``vpt`` values)."""
    max_bytes = TOPK_SOFTMAX_FUSED.get(num_experts)
    if max_bytes is None:
        return None
    elts = min(max_bytes, itemsize * num_experts) // itemsize
    vpt = max(1, num_experts // (elts * 32)) * elts
    return vpt, elts, num_experts // vpt


def kernel_row_sum(e: torch.Tensor, layout: tuple[int, int, int]) -> torch.Tensor:
    """``[T, 1]``: the sum of ``e [T, E]`` over its last dim as the fused kernel of ``layout`` adds
    it (each thread's values in order from 0, then the butterfly ``s[t] += s[t ^ m]`` for
    m = threads_per_row / 2 ... 1). Every add is one fp32 add of the same operands on any device."""
    vpt, elts, tpr = layout
    v = e.reshape(e.shape[0], vpt // elts, tpr, elts)
    acc = torch.zeros(e.shape[0], tpr, dtype=e.dtype, device=e.device)
    for j in range(vpt // elts):
        for i in range(elts):
            acc = acc + v[:, j, :, i]
    lanes = torch.arange(tpr, device=e.device)
    m = tpr // 2
    while m:
        acc = acc + acc[:, lanes ^ m]
        m //= 2
    return acc[:, :1]


def grouped_topk_small_kernel(num_experts: int, n_group: int, topk_group: int, k: int) -> bool:
    """Whether vLLM's ``grouped_topk`` runs ``grouped_topk_fused_small_expert_count_kernel`` (the
    kernel ``tanh_half`` and ``warp_fp64`` model) for this shape: one group of at most 512 experts
    with k <= 8 or k = 22, or groups of at most 32 experts, 256 in all, at most 4 groups kept and
    128 candidates, k <= 8 (the dispatch in vLLM's ``grouped_topk_kernels.cu``; the instantiations
    in 0.26's ``_moe_C``: 128, 256 grouped, 384, 512 experts, 512 at k = 22). DeepSeek-V3 (256 in 8
    groups, 4 kept, k = 8) and the tests' tiny model (8 in 2, 1 kept, k = 3) qualify."""
    if n_group == 1 and topk_group == 1:
        return num_experts <= 512 and (k <= 8 or k == 22)
    per = num_experts // n_group
    return (n_group > 1 and num_experts <= 256 and per <= 32 and per * topk_group <= 128 and k <= 8
            and topk_group <= 4)


def warp_sum(w: torch.Tensor) -> torch.Tensor:
    """``[T, 1]``: the sum of ``w [T, k]`` (k <= 32) as one warp's ``cg::reduce(plus<float>)`` adds
    it: lane j holds slot j, lanes k..31 hold 0, then ``s[l] += s[l ^ m]`` for m = 16, 8, 4, 2, 1
    (every add fp32; adding a lane's 0 is exact, so at k = 3 this is (w0 + w2) + w1)."""
    t, k = w.shape
    if k > 32:
        raise ValueError(f"warp_sum: k={k} weights do not fit one warp's 32 lanes")
    acc = torch.cat([w, w.new_zeros(t, 32 - k)], dim=1) if k < 32 else w
    lanes = torch.arange(32, device=w.device)
    m = 16
    while m:
        acc = acc + acc[:, lanes ^ m]
        m //= 2
    return acc[:, :1]


def renorm_weights(w: torch.Tensor, renorm: str, eps: float | None = None) -> torch.Tensor:
    """The k chosen weights ``w [T, k]`` divided by their sum s (``renorm`` / ``sigmoid_renorm``):
    ``torch`` = w / w.sum(-1) (``torch.sum``'s order, the running kernel's); ``divide`` = w / s and
    ``reciprocal`` = w * RN(1 / s) with s added in slot order; ``eps`` (DeepSeek-V3's 1e-20) is
    added to s first, in fp32. ``warp_fp64``: s = :func:`warp_sum`, then
    RN(double(w) / (double(s) + eps)), the division in fp64 rounded once to fp32 (vLLM's
    ``grouped_topk``; the fp64 quotient of two fp32 values rounds to the correctly rounded fp32
    quotient, so this is ``divide`` with the warp's order of the sum). The gradient flows through
    every form (the casts are differentiable)."""
    if renorm == "warp_fp64":
        s = warp_sum(w).double()
        if eps is not None:
            s = s + eps
        return (w.double() / s).float()
    if renorm == "torch":
        s = w.sum(dim=-1, keepdim=True)
    elif renorm in ("divide", "reciprocal"):
        s = w[:, :1]
        for j in range(1, w.shape[1]):
            s = s + w[:, j:j + 1]
    else:
        raise ValueError(f"renorm={renorm!r} is not one of ('torch', 'divide', 'reciprocal', 'warp_fp64')")
    if eps is not None:
        s = s + eps
    return w * (1.0 / s) if renorm == "reciprocal" else w / s


def router_logits(x: torch.Tensor, weight: torch.Tensor, points: RouterPoints) -> torch.Tensor:
    """The gate GEMM. ``lp``: ``F.linear`` in ``x``'s dtype (the GEMM's lp output, the weight rounded to
    lp first); ``fp32``: the fp32 GEMM of the same lp values (HF DeepSeek-V3's router upcasts both)."""
    if points.logits == "lp":
        return F.linear(x, weight.to(x.dtype))
    return F.linear(x.float(), weight.float())


def softmax_scores(logits: torch.Tensor, softmax: str) -> torch.Tensor:
    """fp32 probabilities over the last dim: ``torch.softmax`` (HF), ``divide`` = e / sum(e)
    (``torch.sum``), or ``reciprocal`` = e * RN(1 / z), z = e summed as vLLM's fused kernel for this
    expert count and ``logits``' dtype adds it (:func:`kernel_row_sum`; ``torch.sum`` where vLLM
    runs its unfused fallback), with e = exp(l - max(l)) in fp32."""
    if softmax == "torch":
        return torch.softmax(logits, dim=-1, dtype=torch.float32)
    lf = logits.float()
    e = torch.exp(lf - lf.max(dim=-1, keepdim=True).values.detach())
    if softmax == "divide":
        return e / e.sum(dim=-1, keepdim=True)
    if softmax == "reciprocal":
        layout = topk_softmax_layout(logits.shape[-1], logits.element_size())
        z = e.sum(dim=-1, keepdim=True) if layout is None else kernel_row_sum(e, layout)
        return e * (1.0 / z)
    raise ValueError(f"softmax={softmax!r} is not one of ('torch', 'divide', 'reciprocal')")


def sigmoid_scores(logits: torch.Tensor, sigmoid: str) -> torch.Tensor:
    """fp32 scores of the fp32 logits: ``torch`` = ``sigmoid()`` as HF calls it; ``tanh_half`` =
    0.5 + 0.5 * tanh(x / 2) in fp32 (vLLM's ``sigmoid_accurate``: x / 2 and 0.5 * t are exact, the
    kernel's FFMA and these two ops round once alike), with the device's ``torch.tanh`` (module
    docstring: CPU and CUDA may differ in its last bit)."""
    lf = logits.float()
    if sigmoid == "torch":
        return lf.sigmoid()
    if sigmoid == "tanh_half":
        return 0.5 + 0.5 * torch.tanh(lf * 0.5)
    raise ValueError(f"sigmoid={sigmoid!r} is not one of ('torch', 'tanh_half')")


def select_topk(scores: torch.Tensor, k: int, ties: str, sorted: bool = True) -> torch.Tensor:
    """The ids of the ``k`` largest scores per row. ``torch``: ``torch.topk`` (called with ``sorted``
    as the model calls it); ``lowest_index``: descending score, equal scores in ascending id (a
    stable sort), as the engines' kernels break ties."""
    if ties == "torch":
        return torch.topk(scores, k, dim=-1, sorted=sorted).indices
    if ties == "lowest_index":
        return torch.sort(scores.detach(), dim=-1, descending=True, stable=True).indices[..., :k]
    raise ValueError(f"ties={ties!r} is not one of ('torch', 'lowest_index')")


def finish_weights(w: torch.Tensor, points: RouterPoints, lp: torch.dtype, scale: float | None = None) -> torch.Tensor:
    """The last steps of the routing weights: times ``scale`` in fp32 when ``routed_scale='weights'``
    (a router with a ``routed_scaling_factor``; None: none), then lp or fp32 (``weights``). Routing
    replay and capture read the fp32 weights before these steps (the engines' own weights carry
    no scale where ``routed_scale`` is ``output`` or ``combine``)."""
    if scale is not None and points.routed_scale == "weights":
        w = w * scale
    return w.to(lp) if points.weights == "lp" else w


def _given(ids: torch.Tensor, k: int, t: int) -> torch.Tensor:
    if ids.shape != (t, k) or ids.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"recorded expert ids must be an integer tensor of shape ({t}, {k}), got "
                         f"{tuple(ids.shape)} {ids.dtype}")
    return ids.long()


def softmax_route(logits: torch.Tensor, k: int, renormalize: bool, points: RouterPoints,
                  lp: torch.dtype, ids: torch.Tensor | None = None,
                  finish: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax top-k routing (Qwen2/Qwen3-MoE, Mixtral): ``(weights [T, k], ids [T, k])``.

    The weights are the fp32 probabilities at the chosen ids, renormalised when ``renormalize``
    (``norm_topk_prob``; Mixtral always) as ``points.renorm`` says, then ``lp`` or fp32. Given
    ``ids`` (routing replay) replace the top-k: the weights are then the router's probabilities
    gathered at those ids, so the gradient still flows through the router (R3). ``finish=False``
    returns the fp32 weights before :func:`finish_weights`."""
    probs = softmax_scores(logits, points.softmax)
    ids = select_topk(probs, k, points.ties) if ids is None else _given(ids, k, probs.shape[0])
    w = probs.gather(-1, ids)
    if renormalize:
        w = renorm_weights(w, points.renorm)
    return (finish_weights(w, points, lp) if finish else w), ids


def sigmoid_grouped_route(logits: torch.Tensor, bias: torch.Tensor, k: int, n_group: int, topk_group: int,
                          renormalize: bool, scale: float, points: RouterPoints,
                          lp: torch.dtype, ids: torch.Tensor | None = None,
                          finish: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """DeepSeek-V3's sigmoid router with a correction bias and grouped top-k: ``(weights, ids)``.

    scores = sigmoid(fp32 logits) (``sigmoid``); the choice reads scores + bias (fp32): the
    ``topk_group`` groups with the largest sum of their two best biased scores, then the k best
    biased scores inside them; the weights are the *unbiased* scores at those ids, renormalised
    (``sigmoid_renorm``) by (sum + 1e-20) as HF and the kernels do, times ``scale`` when
    ``routed_scale='weights'`` (else :func:`combine` applies it). Given
    ``ids`` (replay) replace the grouped choice; ``finish=False`` returns the fp32 weights before
    :func:`finish_weights` (unscaled)."""
    scores = sigmoid_scores(logits, points.sigmoid)
    if ids is not None:
        ids = _given(ids, k, scores.shape[0])
        w = _sigmoid_weights(scores, ids, renormalize, points.sigmoid_renorm)
        return (finish_weights(w, points, lp, scale) if finish else w), ids
    choice = scores + bias.float()
    t, e = choice.shape
    grouped = choice.detach().view(t, n_group, e // n_group)
    group_scores = grouped.topk(2, dim=-1).values.sum(dim=-1)
    group_idx = select_topk(group_scores, topk_group, points.ties, sorted=False)
    group_mask = torch.zeros_like(group_scores).scatter_(1, group_idx, 1.0)
    score_mask = group_mask.unsqueeze(-1).expand(t, n_group, e // n_group).reshape(t, e)
    masked = choice.detach().masked_fill(~score_mask.bool(), float("-inf"))
    ids = select_topk(masked, k, points.ties, sorted=False)
    w = _sigmoid_weights(scores, ids, renormalize, points.sigmoid_renorm)
    return (finish_weights(w, points, lp, scale) if finish else w), ids


def _sigmoid_weights(scores, ids, renorm_topk, renorm):
    w = scores.gather(1, ids)
    return renorm_weights(w, renorm, eps=1e-20) if renorm_topk else w


def combine(outputs: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, points: RouterPoints,
            lp: torch.dtype, scale: float | None = None) -> torch.Tensor:
    """The weighted sum of the k expert outputs per token: ``[T, hidden]`` in ``lp``.

    ``outputs`` is ``[T, k, hidden]`` in slot order: each expert's lp output (``expert_out='lp'``)
    or its fp32 accumulator (``'fp32'``). The term is w * y in fp32 (exact inputs), rounded to lp
    when ``weighted_term='lp'``; the terms are summed by ``combine`` (lp adds in expert-id or slot
    order, or one fp32 sum in slot order rounded once). ``scale`` is ``routed_scaling_factor``
    where it was not folded into the weights (``routed_scale`` ``output`` or ``combine``)."""
    term = outputs.float() * weights.float().unsqueeze(-1)
    if points.weighted_term == "lp":
        term = term.to(lp)
    k = term.shape[1]
    scaled = scale is not None and points.routed_scale != "weights"
    if points.combine == "fp32_slot_order":
        acc = term[:, 0].float()
        for j in range(1, k):
            acc = acc + term[:, j].float()
        if scaled and points.routed_scale == "combine":
            acc = acc * torch.tensor(scale, dtype=torch.float32)
            scaled = False
        out = acc.to(lp)
    else:
        if points.combine == "lp_expert_order":
            order = ids.argsort(dim=-1)
            term = term.gather(1, order.unsqueeze(-1).expand_as(term))
        out = torch.zeros(term.shape[0], term.shape[2], dtype=lp, device=term.device)
        for j in range(k):
            out = (out.float() + term[:, j].float()).to(lp)
    if scaled:  # routed_scale='output': the lp output times s, rounded (an lp tensor times a scalar)
        out = (out.float() * torch.tensor(scale, dtype=torch.float32)).to(lp)
    return out
