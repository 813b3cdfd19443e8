"""Router region: an MoE block's routing and weighted sum of experts through ``rla.ops.routing``.

The region patches each MoE block's ``forward`` (per instance, reversibly): the gate GEMM, the
scores, the top-k, the routing weights, each chosen expert's output and their weighted sum, every
step rounded where the profile's :class:`rla.profiles.RouterPoints` says. The experts' weights,
the gate's weight and bias stay on HF's modules (their gradients land there), the expert MLP's
activation goes through ``experts._apply_gate`` (so the ``swiglu`` region, which overrides it,
still applies), and the shared experts (Qwen2-MoE's gated ``shared_expert``, DeepSeek-V3's
``shared_experts``) are called as HF calls them. The block no longer calls ``experts.forward``
(HF's eager loop or a ``grouped_mm`` kernel): the weighted sum is the profile's, not the kernel's.

A profile without router points (``router=None``: the ``hf`` row, a file from ``rla calibrate``)
keeps HF's own values, which depend on the family, on transformers' version and on
``config._experts_implementation``; :func:`hf_router_points` reads them off the module (a probe of
the gate on two zero tokens for the dtypes). The aligned forward with those points reproduces HF's
module bit for bit (tested), which is what lets routing replay and route capture run through one
forward on an unaligned model too (``rla.alignment.replay``).

The block calls its ``gate`` as a module, whose ``forward`` is patched too (:func:`_gate_forward`): it
is the aligned router, returning ``(logits, weights, ids)`` as HF's router returns them, so hooks on the
gate fire with the aligned router's values. HF's output capture hooks the gate (``_can_record_outputs``'
``router_logits``, ``OutputRecorder(<Router>, index=0)``), so ``output_router_logits=True`` records the
logits the aligned forward routed by -- the gate GEMM under the profile's ``logits`` point, in its dtype
(HF's own under HF's points), differentiable into ``gate.weight`` -- and HF's
``load_balancing_loss_func`` gives the aux loss of the routes actually taken. (HF's own logits would
need a second gate GEMM and could pick other experts than the forward did.) Hooks on ``experts`` no
longer fire while the region is aligned: the block does not call ``experts.forward``.
"""

from __future__ import annotations

import types
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from rla.alignment.families import Family, class_named
from rla.alignment.moe_out import FP32_OUT
from rla.alignment.moe_out import note as note_fp32
from rla.alignment.patch import install, patch_of, uninstall
from rla.ops import routing
from rla.profiles import RoundingProfile, RouterPoints

__all__ = ["hf_router_points", "moe_blocks", "align_routers", "align_router_region", "patch_block", "unpatch_block",
           "state_of", "RouterState", "STATE_ATTR"]

#: The instance attribute of a patched block holding its :class:`RouterState`.
STATE_ATTR = "_rla_router"


@dataclass
class RouterState:
    """What a patched block's forward reads: its points, and the replay/capture slots."""

    points: RouterPoints
    family: Family
    layer: int
    """The block's index among the model's MoE blocks (0-based), the replay record's layer axis."""
    replay: object = None
    """While replaying (``rla.alignment.replay``): a callable ``(n_tokens) -> (ids, weights | None)``."""
    capture: list | None = None
    """While capturing: the list each forward appends ``(ids, weights)`` to (detached, on the forward's
    device: a copy to the host here would wait for the GPU once per block and forward; the
    reader moves them, :meth:`rla.alignment.replay.RouteCapture.ids`)."""
    fp32_out: bool = False
    """``moe_out='fp32'`` (``rla.alignment.moe_out``): the block returns ``routed + shared`` in fp32 for the
    layer's add, the routed sum's ``routed_scale='output'`` scale applied in fp32 too."""


def moe_blocks(body: torch.nn.Module, family: Family) -> list[torch.nn.Module]:
    """The model's MoE blocks (``layer.mlp`` of the family's MoE class), in layer order."""
    return [layer.mlp for layer in body.layers
            if class_named(getattr(layer, "mlp", None), family.cls("moe")) is not None]


def _experts_implementation(block) -> str:
    impl = getattr(getattr(block.experts, "config", None), "_experts_implementation", None)
    return "eager" if impl is None else impl


def hf_router_points(block: torch.nn.Module, family: Family) -> RouterPoints:
    """HF's own values for this block: what its unpatched ``gate`` and ``experts`` compute."""
    impl = _experts_implementation(block)
    if impl not in ("eager", "grouped_mm", "batched_mm"):
        raise NotImplementedError(
            f"rla.align 'router' region: experts_implementation={impl!r}; HF's values are known for "
            "'eager', 'grouped_mm' and 'batched_mm'. Set model.set_experts_implementation('eager') first"
        )
    w = block.gate.weight
    lp = w.dtype if w.dtype in (torch.bfloat16, torch.float16) else torch.bfloat16
    with torch.no_grad():
        # the module's forward, not its __call__: a probe, not a forward its hooks should see
        logits, weights, _ = block.gate.forward(torch.zeros(2, w.shape[1], dtype=lp, device=w.device))
    weights_fp32 = weights.dtype == torch.float32
    eager = impl == "eager"
    return RouterPoints(
        logits="fp32" if logits.dtype == torch.float32 else "lp",
        softmax="torch",
        renorm="torch",  # w / w.sum(-1), torch.sum's order
        sigmoid="torch",  # DeepSeek-V3: router_logits.sigmoid()
        sigmoid_renorm="torch",  # DeepSeek-V3: w /= (w.sum(-1) + 1e-20)
        ties="torch",
        weights="fp32" if weights_fp32 else "lp",
        expert_out="lp",
        # eager: each term .to(lp) before index_add_; grouped/batched: w * y in the weights' dtype
        weighted_term="lp" if eager or not weights_fp32 else "fp32",
        combine="lp_expert_order" if eager else "fp32_slot_order",
        routed_scale="weights",
    )


def _gate_forward(self, hidden_states: torch.Tensor):
    """The patched gate (``self``: the block's router module): ``(logits, weights, ids)`` of the aligned
    router on ``hidden_states`` [T, H] (HF's routers return the same three; hooks, HF's output capture
    among them, see these)."""
    return _route(self, hidden_states, self.__dict__[STATE_ATTR])


def _route(gate, x, state: RouterState):
    """(logits, weights, ids): the router's, or the recorded ids (and weights) while replaying. Capture
    and replay see the fp32 weights before the routed scale and the cast (``finish_weights``)."""
    points = state.points
    recorded_ids, recorded_w = (None, None) if state.replay is None else state.replay(x.shape[0], x.device)
    logits = routing.router_logits(x, gate.weight, points)
    scale = None
    if state.family.router == "sigmoid_grouped":
        scale = gate.routed_scaling_factor
        weights, ids = routing.sigmoid_grouped_route(
            logits, gate.e_score_correction_bias, gate.top_k, gate.num_group, gate.topk_group,
            gate.norm_topk_prob, scale, points, x.dtype, ids=recorded_ids, finish=False)
    else:
        renormalize = getattr(gate, "norm_topk_prob", True)  # Mixtral's router always renormalises
        weights, ids = routing.softmax_route(logits, gate.top_k, renormalize, points, x.dtype, ids=recorded_ids,
                                             finish=False)
    if recorded_w is not None:  # the recorded values, the router's gradient (straight through)
        weights = recorded_w.float() + (weights - weights.detach())
    if state.capture is not None:
        state.capture.append((ids.detach(), weights.detach().float()))
    return logits, routing.finish_weights(weights, points, x.dtype, scale), ids


def _expert_slices(ids: torch.Tensor, num_experts: int) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """``(tok, pos, bounds)``: the ``[T, k]`` slots sorted by expert, and where each expert's run starts.

    Expert e's slots are ``tok[bounds[e]:bounds[e + 1]]``, ``pos[...]``, in the order
    ``torch.where(one_hot(ids).permute(2, 1, 0)[e])`` lists them (ascending slot, then token: a
    stable sort of the ids laid out ``[k, T]``), so each expert's GEMM sees the same rows in the same
    order as HF's eager loop gives it. ``bounds`` (``num_experts + 2`` entries; id ``num_experts`` is
    the sentinel HF's loop skips) comes to the host in one ``tolist``: one host sync per MoE block,
    where asking which experts were hit (``nonzero``), each expert's tokens (``torch.where``) and
    indexing by 0-d tensors (``item``) waited ~4 times per expert."""
    t = ids.shape[0]
    flat = ids.t().reshape(-1)  # index pos * T + tok
    values, order = torch.sort(flat, stable=True)
    edges = torch.arange(num_experts + 2, device=ids.device, dtype=values.dtype)
    if values.numel() == 0:
        return order, order, [0] * (num_experts + 2)
    host = torch.cat([torch.searchsorted(values, edges), values[:1], values[-1:]]).tolist()  # the one sync
    bounds, first, last = host[:-2], host[-2], host[-1]
    if first < 0 or last > num_experts:  # as F.one_hot(ids, num_experts + 1) refused them
        raise RuntimeError(f"expert ids must lie in [0, {num_experts}], got {first if first < 0 else last}")
    return order % t, order // t, bounds


def _expert_outputs(experts, x, ids, points: RouterPoints) -> torch.Tensor:
    """``[T, k, hidden]``: each chosen expert's output for its tokens, in slot order; lp outputs
    (``expert_out='lp'``) or the down projection's fp32 GEMM of the same lp values (``'fp32'``).
    The experts run in id order, each on its tokens in HF's eager loop's order (:func:`_expert_slices`)."""
    t, k = ids.shape
    fp32 = points.expert_out == "fp32"
    out = x.new_zeros(t, k, x.shape[-1], dtype=torch.float32 if fp32 else x.dtype)
    with torch.no_grad():
        tok_all, pos_all, bounds = _expert_slices(ids, experts.num_experts)
    for e in range(experts.num_experts):
        lo, hi = bounds[e], bounds[e + 1]
        if lo == hi:
            continue
        tok, pos = tok_all[lo:hi], pos_all[lo:hi]
        h = experts._apply_gate(F.linear(x[tok], experts.gate_up_proj[e]))
        down = experts.down_proj[e]
        out[tok, pos] = F.linear(h.float(), down.float()) if fp32 else F.linear(h, down)
    return out


def _block_forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
    """The MoE block of the family, routed and summed per the block's :class:`RouterState`."""
    state: RouterState = self.__dict__[STATE_ATTR]
    shape = hidden_states.shape
    x = hidden_states.reshape(-1, shape[-1])
    jitter = getattr(self, "jitter_noise", 0)
    if self.training and jitter and jitter > 0:  # Mixtral's training-time jitter, as HF applies it
        x = x * torch.empty_like(x).uniform_(1.0 - jitter, 1.0 + jitter)
    _, weights, ids = self.gate(x)  # the patched gate (_gate_forward): its hooks see the aligned router
    outputs = _expert_outputs(self.experts, x, ids, state.points)
    scale = getattr(self.gate, "routed_scaling_factor", None) if state.family.router == "sigmoid_grouped" else None
    if state.fp32_out:  # moe_out='fp32': the op's lp sum, its output scale and the shared add in the add's fp32
        late = scale is not None and state.points.routed_scale == "output"
        out = routing.combine(outputs, weights, ids, state.points, x.dtype, scale=None if late else scale).float()
        if late:
            out = out * torch.tensor(scale, dtype=torch.float32)
    else:
        out = routing.combine(outputs, weights, ids, state.points, x.dtype, scale=scale)
    name = state.family.shared_expert
    if name == "shared_expert":  # Qwen2-MoE: a sigmoid-gated dense expert
        shared = self.shared_expert(x)
        out = out + F.sigmoid(self.shared_expert_gate(x)) * shared
    elif name is not None:  # DeepSeek-V3: dense shared experts added
        out = out + getattr(self, name)(x)
    return out.reshape(shape)


def check_router(block: torch.nn.Module, family: Family) -> None:
    """Refuse a block whose router the aligned forward would not compute as the model does."""
    gate = getattr(block, "gate", None)
    needed = ("weight", "top_k") + (("e_score_correction_bias", "num_group", "topk_group", "norm_topk_prob",
                                      "routed_scaling_factor") if family.router == "sigmoid_grouped" else ())
    missing = [n for n in needed if not hasattr(gate, n)]
    if missing:
        raise NotImplementedError(
            f"rla.align 'router' region: {type(block).__name__}.gate lacks {missing}; this transformers "
            "release lays out the router differently from what rla.alignment.router reads"
        )
    if getattr(gate, "bias", None) is not None and isinstance(gate.bias, torch.Tensor):
        raise NotImplementedError(f"rla.align 'router' region: {type(block).__name__}.gate has a bias")


def patch_block(block: torch.nn.Module, family: Family, points: RouterPoints | None, layer: int,
                fp32_out: bool = False) -> RouterState:
    """Install the routed forward on one block (``points`` None: HF's own values; ``fp32_out``: it hands
    the layer's add the fp32 ``routed + shared``, ``moe_out='fp32'``)."""
    check_router(block, family)
    fp32_out = fp32_out and family.shared_expert is not None
    state = RouterState(hf_router_points(block, family) if points is None else points, family, layer,
                        fp32_out=fp32_out)
    attrs = {"forward": types.MethodType(_block_forward, block), STATE_ATTR: state}
    if fp32_out:
        attrs[FP32_OUT] = True
    install(block, "moe", attrs)
    try:
        install(block.gate, "router", {"forward": types.MethodType(_gate_forward, block.gate), STATE_ATTR: state})
    except BaseException:
        uninstall(block)
        raise
    return state


def unpatch_block(block: torch.nn.Module) -> None:
    """Undo :func:`patch_block` (the block and its gate)."""
    uninstall(block.gate)
    uninstall(block)


def align_routers(blocks: list[torch.nn.Module], family: Family, profile: RoundingProfile,
                  fp32_out: bool = False) -> int:
    """Patch each MoE block's forward; returns how many blocks use HF's own values (no router points)."""
    for i, block in enumerate(blocks):
        patch_block(block, family, profile.router, i, fp32_out)
    return len(blocks) if profile.router is None else 0


def align_router_region(blocks: list[torch.nn.Module], family: Family, profile: RoundingProfile, report,
                        fp32_out: bool = False) -> None:
    """The router region of an alignment: patch ``blocks`` and say so in ``report`` (its counts, and a
    note when ``profile`` has no router points, so the blocks keep HF's own values). ``fp32_out``: the
    blocks hand the layer's add their fp32 sum (``moe_out='fp32'``, the rmsnorm region aligned too)."""
    own = align_routers(blocks, family, profile, fp32_out)
    report.counts["router"] = {"MoE blocks": len(blocks)}
    if fp32_out and family.shared_expert is not None:
        note_fp32(report, len(blocks))
    if own:
        report.notes.append(
            f"profile {profile.name!r} has no router points: the router region keeps HF's own values "
            "(rla.alignment.router.hf_router_points), bit for bit HF's MoE blocks"
        )


def state_of(block: torch.nn.Module) -> RouterState | None:
    """The block's :class:`RouterState` when the router region (or replay/capture) patched it."""
    return block.__dict__.get(STATE_ATTR) if patch_of(block) is not None else None
