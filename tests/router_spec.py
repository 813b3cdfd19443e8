"""The router points written out from their definitions (``rla.profiles.router``), independently
of ``rla.ops.routing`` and ``rla.alignment.router``: the oracle the router tests hold them to.

Per token and per slot with plain loops over Python lists of experts (ties broken by sorting
``(-score, id)`` keys), the expert MLPs evaluated per expert on that expert's tokens in ascending
token order (the grouping any MoE implementation uses, so the GEMMs see the same rows), and every
rounding written as ``.to(lp)``.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

# vLLM's fused top-k softmax (``topkGating`` in ``_moe_C``): the expert counts it is built for and
# the widest load per thread, in bytes (powers of two to 512: 16 bytes; five multiples of 64: 4)
_FUSED = {**{2 ** i: 16 for i in range(10)}, 192: 4, 320: 4, 384: 4, 448: 4, 576: 4}


def kernel_sum(row: list[float], itemsize: int) -> np.float32 | None:
    """One row's softmax denominator as vLLM's fused kernel adds it, written out per thread with
    numpy float32 scalars: thread t loads vectors of ``n`` columns starting at n * (t + j * T), sums
    its values in load order from 0, then each thread adds its xor-partner's sum for partner
    distance T/2, ..., 1; thread 0's value. None where the kernel is not built for this count."""
    e = len(row)
    if e not in _FUSED:
        return None
    n = min(_FUSED[e], itemsize * e) // itemsize  # columns per load
    per_thread = max(1, e // (n * 32)) * n
    threads = e // per_thread
    sums = []
    for t in range(threads):
        acc = np.float32(0)
        for j in range(per_thread // n):
            for i in range(n):
                acc = np.float32(acc + np.float32(row[n * (t + j * threads) + i]))
        sums.append(acc)
    d = threads // 2
    while d:
        sums = [np.float32(sums[t] + sums[t ^ d]) for t in range(threads)]
        d //= 2
    return sums[0]


def warp_butterfly(w: torch.Tensor) -> torch.Tensor:
    """One token's k weights summed as one warp's cg::reduce adds them: lane j holds slot j, the
    other lanes 0, and every lane adds its xor-partner's value at distance 16, 8, 4, 2, 1; lane 0's
    value (0-d fp32 tensors, so the gradient flows as the definition's does)."""
    lanes = [w[j] for j in range(w.shape[0])] + [torch.zeros((), dtype=w.dtype, device=w.device)] * (32 - w.shape[0])
    d = 16
    while d:
        lanes = [lanes[i] + lanes[i ^ d] for i in range(32)]
        d //= 2
    return lanes[0]


def sigmoid(logits: torch.Tensor, how: str) -> torch.Tensor:
    """fp32 sigmoid scores: torch's, or half of (1 + tanh(x / 2)) in fp32 with the device's tanh."""
    if how == "torch":
        return logits.sigmoid()
    return torch.tanh(logits / 2) * 0.5 + 0.5  # x / 2 and t * 0.5 exact: one rounding, at the add


def renorm(w: torch.Tensor, how: str, eps: float | None) -> torch.Tensor:
    """One token's k weights over their sum: torch.sum's order, or slot order then a division or
    a multiply by the rounded reciprocal, or the warp's butterfly then an fp64 division rounded to
    fp32 (eps added in fp64)."""
    if how == "warp_fp64":
        s = warp_butterfly(w).double() + (0.0 if eps is None else eps)
        return torch.stack([(w[j].double() / s).float() for j in range(w.shape[0])])
    if how == "torch":
        s = w.sum()
    else:
        s = w[0]
        for j in range(1, w.shape[0]):
            s = s + w[j]
    if eps is not None:
        s = s + eps
    return w * (1.0 / s) if how == "reciprocal" else w / s


def _rank(scores_row: list[float], k: int, ties: str, torch_ids: list[int]) -> list[int]:
    if ties == "lowest_index":
        return [e for _, e in sorted((-s, e) for e, s in enumerate(scores_row))[:k]]
    return torch_ids  # 'torch': whatever torch.topk returned, as the model calls it


def route(block, x: torch.Tensor, points, family_router: str, raw: bool = False):
    """(ids [T, k] long, weights [T, k]) of ``block``'s router on lp input ``x`` [T, H]; ``raw``:
    the fp32 weights before the routed scale and the cast (what capture and replay see)."""
    gate, lp = block.gate, x.dtype
    k = gate.top_k
    logits = F.linear(x, gate.weight.to(lp)).float() if points.logits == "lp" else F.linear(x.float(), gate.weight.float())
    if family_router == "softmax":
        if points.softmax == "torch":
            scores = torch.softmax(logits, dim=-1)
        else:
            e = torch.exp(logits - logits.max(dim=-1, keepdim=True).values)
            z = e.sum(dim=-1, keepdim=True)
            if points.softmax == "divide":
                scores = e / z
            else:  # the kernel's order where it is fused (torch.sum elsewhere), then e * (1 / z)
                size = lp.itemsize if points.logits == "lp" else 4
                per_row = [kernel_sum(r, size) for r in e.tolist()]
                if per_row[0] is not None:
                    z = torch.tensor([[float(v)] for v in per_row], dtype=torch.float32, device=e.device)
                scores = e * (1.0 / z)
        torch_ids = torch.topk(scores, k, dim=-1).indices
        choice = scores
    else:
        scores = sigmoid(logits, points.sigmoid)
        choice = scores + gate.e_score_correction_bias.float()
        g, tg = gate.num_group, gate.topk_group
        per = choice.shape[1] // g
        torch_ids = None
    ids, weights = [], []
    for t in range(x.shape[0]):
        if family_router == "softmax":
            row = _rank(choice[t].tolist(), k, points.ties, torch_ids[t].tolist())
        else:
            c = choice[t]
            gsc = [sorted(c[i * per:(i + 1) * per].tolist(), reverse=True) for i in range(g)]
            gsum = torch.tensor([a[0] + a[1] for a in gsc], dtype=torch.float32)  # fp32 pair sum
            if points.ties == "lowest_index":
                groups = [i for _, i in sorted((-v, i) for i, v in enumerate(gsum.tolist()))[:tg]]
            else:
                groups = torch.topk(gsum, tg, sorted=False).indices.tolist()
            masked = torch.full_like(c, float("-inf"))
            for i in groups:
                masked[i * per:(i + 1) * per] = c[i * per:(i + 1) * per]
            if points.ties == "lowest_index":
                row = _rank(masked.tolist(), k, "lowest_index", [])
            else:
                row = torch.topk(masked, k, sorted=False).indices.tolist()
        w = scores[t, row]
        renormalize = getattr(gate, "norm_topk_prob", True)
        if renormalize:
            w = (renorm(w, points.renorm, None) if family_router == "softmax"
                 else renorm(w, points.sigmoid_renorm, 1e-20))
        if raw:
            weights.append(w)
            ids.append(row)
            continue
        if family_router != "softmax" and points.routed_scale == "weights":
            w = w * gate.routed_scaling_factor
        ids.append(row)
        weights.append(w.to(lp) if points.weights == "lp" else w)
    return torch.tensor(ids), torch.stack(weights)


def _dense(mlp, x: torch.Tensor, act) -> torch.Tensor:
    """A dense gated MLP (a shared expert) with ``act(gate, up)`` for its gated product."""
    return F.linear(act(F.linear(x, mlp.gate_proj.weight), F.linear(x, mlp.up_proj.weight)), mlp.down_proj.weight)


def block_output(block, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor, points, family_router: str,
                 shared: str | None, act=None, shared_act=None, fp32_out: bool = False):
    """The block's output [T, H] from the routes, written from the spec. ``act(gate, up)``: the lp
    gated product of every expert, routed and shared (default: the model's own, ``act_fn(gate) * up``
    on lp tensors, and its shared experts called as modules); ``shared_act``: the shared experts'
    where it differs from the routed ones' (a row's ``moe_experts`` variant). ``fp32_out``
    (``moe_out='fp32'``, a block with shared experts): the routed sum's ``routed_scale='output'`` product
    and its add to the shared experts' lp output stay fp32, the value the residual add reads."""
    shared_act = act if shared_act is None else shared_act
    experts, lp = block.experts, x.dtype
    t, k = ids.shape
    y = {}  # (token, expert) -> lp output or fp32 accumulator
    for e in range(experts.num_experts):
        toks = [i for i in range(t) if e in ids[i].tolist()]
        if not toks:
            continue
        gate_up = F.linear(x[toks], experts.gate_up_proj[e])
        g, u = gate_up.chunk(2, dim=-1)
        h = experts.act_fn(g) * u if act is None else act(g, u)
        out = F.linear(h.float(), experts.down_proj[e].float()) if points.expert_out == "fp32" else F.linear(h, experts.down_proj[e])
        for r, i in enumerate(toks):
            y[(i, e)] = out[r]
    rows = []
    scale = getattr(block.gate, "routed_scaling_factor", None) if family_router != "softmax" else None
    for i in range(t):
        slots = ids[i].tolist()
        terms = []
        for j, e in enumerate(slots):
            term = y[(i, e)].float() * weights[i, j].float()
            terms.append(term.to(lp) if points.weighted_term == "lp" else term)
        if points.combine == "lp_expert_order":
            order = sorted(range(k), key=lambda j: slots[j])
        else:
            order = list(range(k))
        if points.combine == "fp32_slot_order":
            acc = terms[0].float()
            for j in order[1:]:
                acc = acc + terms[j].float()
            if scale is not None and points.routed_scale == "combine":
                acc = acc * torch.tensor(scale, dtype=torch.float32)
            out = acc.to(lp)
        else:
            out = torch.zeros(x.shape[1], dtype=lp, device=x.device)
            for j in order:
                out = (out.float() + terms[j].float()).to(lp)
        if scale is not None and points.routed_scale == "output":
            out = out.float() * torch.tensor(scale, dtype=torch.float32)
            out = out if fp32_out and shared is not None else out.to(lp)
        rows.append(out)
    out = torch.stack(rows)
    if shared is not None:
        mlp = getattr(block, shared)
        dense = mlp(x) if shared_act is None else _dense(mlp, x, shared_act)
        add = F.sigmoid(block.shared_expert_gate(x)) * dense if shared == "shared_expert" else dense
        out = out.float() + add.float() if fp32_out else out + add
    return out
