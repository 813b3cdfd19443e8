"""Routing replay and route capture: the training forward's experts from a record, or into one.

``replay_routes(model, experts, weights=None)`` makes every MoE block of ``model`` route each token
to the recorded experts (``experts`` [batch, seq, moe_layers, k], the layout of
:func:`routes_from_records`) instead of its own top-k, as R3 does: the routing weights are then the
router's own probabilities gathered at the recorded ids (renormalised as the router does), so the
gradient still reaches the gate through them. With ``weights`` the forward uses the recorded
values, and the gradient still flows through the router's probabilities (straight through:
``w_recorded + (w - w.detach())``). ``capture_routes(model)`` records what a forward chose.

Both run through the router region's forward (``rla.alignment.router``): on a model aligned with
the ``router`` region, with that profile's points; otherwise with HF's own values, patched in for
the duration of the block (bit for bit HF's MoE blocks) and removed after. A replay covers one
input shape: every forward inside the block must see ``batch * seq`` tokens (a training forward,
its gradient-checkpointing recompute); ``generate`` is not a replayed forward.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import torch

from rla.alignment import core, moe_out
from rla.alignment.router import moe_blocks, patch_block, state_of, unpatch_block

__all__ = ["replay_routes", "capture_routes", "routes_from_records", "RouteCapture", "RoutesMissingError",
           "moe_layers", "moe_decoder_layers"]


def moe_layers(model) -> int:
    """How many MoE blocks ``model`` has (0: a dense model, or a family without one)."""
    return len(moe_decoder_layers(model))


def moe_decoder_layers(model) -> list[int]:
    """The decoder-layer indices of ``model``'s MoE blocks, in order (a dense first layer, as
    DeepSeek-V3's ``first_k_dense_replace``, is not one): the layers an engine's per-layer routes
    are read at (``rla.engines.vllm_live.routes_of``)."""
    family, body = core._find(model)
    if not family.moe:
        return []
    blocks = {id(b) for b in moe_blocks(body, family)}
    return [i for i, layer in enumerate(body.layers) if id(getattr(layer, "mlp", None)) in blocks]


class RoutesMissingError(ValueError):
    """A record to replay carries no routes, or routes of another model's shape."""


@contextlib.contextmanager
def _states(model):
    family, body = core._find(model)
    blocks = moe_blocks(body, family)
    if not blocks:
        raise ValueError(f"{type(model).__name__} has no MoE block: there are no routes to replay or capture")
    states, added = [], []
    try:
        for i, block in enumerate(blocks):
            state = state_of(block)
            if state is None:
                fp32 = moe_out.unpatch(block)  # moe_out='fp32' without the router region: the routed forward's sum
                added.append((block, fp32))
                state = patch_block(block, family, None, i, fp32_out=fp32)
            states.append(state)
        yield states
    finally:
        for state in states:
            state.replay = None
            state.capture = None
        for block, fp32 in added:
            unpatch_block(block)
            if fp32:
                moe_out.patch(block, family)


@dataclass
class RouteCapture:
    """What the forwards inside :func:`capture_routes` chose, per MoE layer and forward.

    ``per_layer[layer][forward]`` is ``(ids, weights)`` on the device the forward ran on (one copy to
    the host per read, not one per block and forward); :meth:`ids` and :meth:`weights` return CPU
    tensors."""

    per_layer: list[list[tuple[torch.Tensor, torch.Tensor]]] = field(default_factory=list)

    def ids(self) -> torch.Tensor:
        """[moe_layers, tokens, k] (long, CPU): the experts of every token of every captured forward."""
        return torch.stack([torch.cat([ids for ids, _ in forwards]) for forwards in self.per_layer]).cpu()

    def weights(self) -> torch.Tensor:
        """[moe_layers, tokens, k] (fp32, CPU): the routing weights, in slot order."""
        return torch.stack([torch.cat([w for _, w in forwards]) for forwards in self.per_layer]).cpu()


@contextlib.contextmanager
def capture_routes(model):
    """``with capture_routes(model) as cap: model(ids)``; then ``cap.ids()`` [layers, B*S, k]."""
    cap = RouteCapture()
    with _states(model) as states:
        for state in states:
            state.capture = []
            cap.per_layer.append(state.capture)
        yield cap


def _source(experts: torch.Tensor, weights: torch.Tensor | None, layer: int):
    ids = experts[:, :, layer].reshape(-1, experts.shape[-1])
    w = None if weights is None else weights[:, :, layer].reshape(-1, weights.shape[-1])

    def replay(n_tokens: int, device):
        if n_tokens != ids.shape[0]:
            raise RoutesMissingError(
                f"routing replay: the forward has {n_tokens} tokens, the recorded routes {ids.shape[0]} "
                f"(batch * seq of experts {tuple(experts.shape)}); replay one forward of the recorded batch"
            )
        return ids.to(device), None if w is None else w.to(device)

    return replay


@contextlib.contextmanager
def replay_routes(model, experts: torch.Tensor, weights: torch.Tensor | None = None):
    """Route every MoE block to ``experts`` [batch, seq, moe_layers, k] (module docstring)."""
    if not isinstance(experts, torch.Tensor) or experts.ndim != 4 or experts.dtype not in (torch.int64, torch.int32):
        raise RoutesMissingError(
            f"routing replay needs experts as an integer tensor [batch, seq, moe_layers, k], got "
            f"{getattr(experts, 'shape', type(experts).__name__)}"
        )
    if weights is not None and (not isinstance(weights, torch.Tensor) or weights.shape != experts.shape):
        raise RoutesMissingError(f"routing replay: weights must have the experts' shape {tuple(experts.shape)}")
    with _states(model) as states:
        if experts.shape[2] != len(states):
            raise RoutesMissingError(f"routing replay: the routes have {experts.shape[2]} MoE layers, the model "
                                     f"{len(states)}")
        for state in states:
            gate_k = getattr(getattr(model, "config", None), "num_experts_per_tok", experts.shape[-1])
            if experts.shape[-1] != gate_k:
                raise RoutesMissingError(f"routing replay: the routes have k={experts.shape[-1]}, the model "
                                         f"num_experts_per_tok={gate_k}")
            state.replay = _source(experts, weights, state.layer)
        yield


def routes_from_records(records, with_weights: bool = False):
    """``experts`` (and ``weights``) [B, P+R, moe_layers, k] in :func:`rla.rollout.to_padded`'s layout.

    Each record's ``routes`` covers its prompt and response tokens (or all but the last response
    token, which the engine never fed through its forward: that position reuses the one before,
    and affects no recorded logprob, the attention being causal). Padding positions get the
    experts 0..k-1 (their outputs are masked out of attention). A record without routes is a
    :class:`RoutesMissingError` naming it."""
    import torch as _torch

    if not records:
        raise ValueError("routes_from_records needs at least one record")
    shapes = []
    for i, rec in enumerate(records):
        r = getattr(rec, "routes", None)
        if r is None:
            raise RoutesMissingError(
                f"record {i} has no routes: routing replay needs the engine's routed experts per token "
                "(vLLM: LLM(..., enable_return_routed_experts=True), CompletionOutput.routed_experts; "
                "see docs/rollouts.md)"
            )
        if with_weights and r.get("weights") is None:
            raise RoutesMissingError(f"record {i} has routes without weights; replay the experts only")
        shapes.append((len(r["experts"][0]), len(r["experts"][0][0])))
    if len(set(shapes)) != 1:
        raise RoutesMissingError(f"the records' routes have different (moe_layers, k): {sorted(set(shapes))}")
    layers, k = shapes[0]
    P = max(len(r.prompt_ids) for r in records)
    R = max(len(r.response_ids) for r in records)
    experts = _torch.arange(k).expand(len(records), P + R, layers, k).clone()
    weights = _torch.full((len(records), P + R, layers, k), 1.0 / k) if with_weights else None
    for i, rec in enumerate(records):
        p, n = len(rec.prompt_ids), len(rec.prompt_ids) + len(rec.response_ids)
        e = _torch.tensor(rec.routes["experts"], dtype=_torch.long)
        if e.shape[0] == n - 1:
            e = _torch.cat([e, e[-1:]])
        experts[i, P - p: P - p + n] = e
        if with_weights:
            w = _torch.tensor(rec.routes["weights"], dtype=_torch.float32)
            if w.shape[0] == n - 1:
                w = _torch.cat([w, w[-1:]])
            weights[i, P - p: P - p + n] = w
    return (experts, weights) if with_weights else experts
