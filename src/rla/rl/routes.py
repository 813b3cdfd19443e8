"""MoE routes in the GRPO trainer: the engine's routes into the training forward, and compared with it.

An MoE model's rollouts always record routes (:class:`rla.rollout.sampler.Sampler`'s
``record_routes``, so the sampler takes the dynamic KV cache), and the sampler's engine copy aligns
the router region too: the rollouts route and sum the experts as the rollout profile's router
points say (vLLM's fused-MoE path), not as HF's module does.

Two things happen on the training side, per micro-batch (:func:`micro_batch_routing`):

- **replay** (``routing_replay`` ``experts`` or ``weights``): the forward runs under
  :func:`rla.replay_routes` with the recorded routes laid out as the micro-batch is (right-padded
  rows, :func:`rla.rl.forward.make_micro_batch`). Padding positions get experts ``0 .. k-1``; they
  follow every real token of their row, and attention is causal, so they change no logprob. A
  record's routes stop one token short of its end (the engine never fed the last sampled token);
  that position reuses the one before, as :func:`rla.routes_from_records` does, and it predicts
  nothing either.
- **capture** (the step's first forward, before any update): what the training forward routed,
  matched to the record token by token over each record's routed tokens (prompt and response but
  the last), for :func:`rla.metrics.routing_mismatch` (``routing/*`` in the step's log line).
  With replay the set and order agree by construction; the capture checks that it did.
  Capturing never changes the forward: a model whose MoE blocks rla patched (the ``router``
  region, or a replay) records through :func:`rla.capture_routes`, one whose blocks are HF's own
  (the ``bf16`` and three-region arms) through a forward hook on each block's ``gate``, which
  returns HF's ids and weights (the weights there are HF's, cast to the model's dtype, so that
  arm's ``routing/weight_abs_*`` include the cast; the rollouts' are fp32 before it).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import numpy as np
import torch

__all__ = ["RouteStats", "micro_batch_routes", "micro_batch_routing", "routing_record"]


@dataclass
class RouteStats:
    """One sequence's routes through the training forward and the engine's: [tokens, layers, k]."""

    train_ids: np.ndarray
    train_weights: np.ndarray
    roll_ids: np.ndarray
    roll_weights: np.ndarray | None


def micro_batch_routes(routes: list[dict], prompt_lens: list[int], response_lens: list[int], longest: int,
                       with_weights: bool):
    """``experts`` [rows, longest, layers, k] (and ``weights``, fp32) for right-padded rows."""
    from rla.alignment.replay import RoutesMissingError

    for i, r in enumerate(routes):
        if r is None:
            raise RoutesMissingError(f"micro-batch row {i} has no routes: routing replay needs the sampler's "
                                     "record_routes (an MoE model's rollouts carry them)")
        if with_weights and r.get("weights") is None:
            raise RoutesMissingError(f"micro-batch row {i} has routes without weights: replay the experts only")
    layers, k = len(routes[0]["experts"][0]), len(routes[0]["experts"][0][0])
    experts = torch.arange(k).expand(len(routes), longest, layers, k).clone()
    weights = torch.full((len(routes), longest, layers, k), 1.0 / k) if with_weights else None
    for row, (r, p, n) in enumerate(zip(routes, prompt_lens, response_lens)):
        total = p + n
        e = torch.tensor(r["experts"], dtype=torch.long)
        if e.shape[1:] != (layers, k):
            raise RoutesMissingError(f"micro-batch row {row}: routes of {tuple(e.shape[1:])} (layers, k), row 0 "
                                     f"{(layers, k)}")
        if e.shape[0] not in (total, total - 1):
            raise RoutesMissingError(f"micro-batch row {row}: {e.shape[0]} routed tokens for {total} tokens")
        if e.shape[0] == total - 1:
            e = torch.cat([e, e[-1:]])
        experts[row, :total] = e
        if with_weights:
            w = torch.tensor(r["weights"], dtype=torch.float32)
            weights[row, :total] = torch.cat([w, w[-1:]]) if w.shape[0] == total - 1 else w
    return experts, weights


@contextlib.contextmanager
def micro_batch_routing(model, mode: str, routes: list[dict], prompt_lens: list[int], response_lens: list[int],
                        longest: int, capture: bool):
    """Replay (``mode`` ``experts``/``weights``; ``none``: the model's own routing) and/or capture
    around one micro-batch's forward; yields a list that holds one :class:`RouteStats` per row
    after the block when ``capture`` (else stays empty)."""
    from rla.alignment import capture_routes, replay_routes

    out: list[RouteStats] = []
    with contextlib.ExitStack() as stack:
        if mode != "none":
            experts, weights = micro_batch_routes(routes, prompt_lens, response_lens, longest, mode == "weights")
            stack.enter_context(replay_routes(model, experts, weights))
        cap = None
        if capture:
            cap = stack.enter_context(capture_routes(model) if _patched(model) else _gate_capture(model))
        yield out
    if cap is None:
        return
    ids, w = cap.ids(), cap.weights().float()  # [layers, rows * longest, k]
    layers, _, k = ids.shape
    ids = ids.reshape(layers, len(routes), longest, k).permute(1, 2, 0, 3).numpy()
    w = w.reshape(layers, len(routes), longest, k).permute(1, 2, 0, 3).numpy()
    for row, (r, p, n) in enumerate(zip(routes, prompt_lens, response_lens)):
        if r is None:
            continue
        roll = np.asarray(r["experts"], dtype=np.int64)
        t = roll.shape[0]
        roll_w = None if r.get("weights") is None else np.asarray(r["weights"], dtype=np.float64)
        out.append(RouteStats(ids[row, :t], w[row, :t].astype(np.float64), roll, roll_w))


def _blocks(model) -> list[torch.nn.Module]:
    return [layer.mlp for layer in model.get_decoder().layers if hasattr(getattr(layer, "mlp", None), "gate")]


def _patched(model) -> bool:
    from rla.alignment.router import state_of

    return any(state_of(b) is not None for b in _blocks(model))


@contextlib.contextmanager
def _gate_capture(model):
    """HF's own MoE blocks: each gate's (ids, weights), from a forward hook; a ``RouteCapture``."""
    from rla.alignment.replay import RouteCapture

    cap = RouteCapture()
    handles = []

    def hook(forwards):
        def record(module, args, output):
            if not (isinstance(output, tuple) and len(output) == 3):
                raise NotImplementedError(f"{type(module).__name__} does not return (logits, weights, ids) as HF's "
                                          "Qwen-MoE routers do; capture its routes with the router region aligned")
            _, weights, ids = output
            forwards.append((ids.detach().cpu(), weights.detach().float().cpu()))
        return record

    try:
        for block in _blocks(model):
            cap.per_layer.append([])
            handles.append(block.gate.register_forward_hook(hook(cap.per_layer[-1])))
        yield cap
    finally:
        for h in handles:
            h.remove()


def routing_record(stats: list[RouteStats]) -> dict:
    """The step's ``routing/*`` fields (:func:`rla.metrics.routing_mismatch`, training vs engine,
    over every routed token of the step's records); {} when nothing was captured."""
    from rla.metrics import routing_mismatch

    if not stats:
        return {}
    train = np.concatenate([s.train_ids for s in stats]).transpose(1, 0, 2)
    roll = np.concatenate([s.roll_ids for s in stats]).transpose(1, 0, 2)
    have_w = all(s.roll_weights is not None for s in stats)
    weights = np.concatenate([s.train_weights for s in stats]).transpose(1, 0, 2) if have_w else None
    ref_w = np.concatenate([s.roll_weights for s in stats]).transpose(1, 0, 2) if have_w else None
    return routing_mismatch(train, roll, weights, ref_w)
