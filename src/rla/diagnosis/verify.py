"""``verify``: an aligned training model against an engine twin, logits and layer by layer.

The twin (:class:`rla.engines.twin.VllmTwin`) and the training model share weights, GEMMs and
attention, so every difference between them is a rounding location or an arithmetic order. This
module runs both on the same tokens and measures:

- logits: the fraction of bit-equal elements, the max |difference|;
- the tokens a rollout would sample: for each position, a token drawn (seeded) from the twin's
  distribution (the engine is the rollout side) and ``delta = log pi_train - log mu_engine`` of
  it, summarised by :func:`rla.metrics.mismatch` (k1, k3, max |delta|, bitwise fraction);
- the mean full-distribution KL(twin || model) per position;
- per layer, the residual stream after each decoder layer (rounded to the model's dtype, as the
  engine holds it): fraction of bit-equal elements and max |difference|, so a mismatch is
  located at the first layer where it appears, not just detected.

Each model side is a callable ``ids, positions -> (logits, [stream per layer])``:
:func:`hf_side` wraps an HF model (aligned or not); the twin is one already.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from rla.metrics import mismatch

__all__ = ["SideResult", "VerifyResult", "compare", "hf_side", "aligned_side", "sample_tokens"]


@dataclass
class SideResult:
    """One training-side variant against the twin."""

    name: str
    logits_equal: float
    logits_max_abs: float
    k1: float
    k3: float
    max_abs_delta: float
    tokens_equal: float
    kl: float
    layers: list[dict] = field(default_factory=list)
    """Per layer: {"layer", "equal", "max_abs"} of the residual stream against the twin's."""

    def first_diverging_layer(self) -> int | None:
        for row in self.layers:
            if row["equal"] < 1.0:
                return row["layer"]
        return None


@dataclass
class VerifyResult:
    sides: list[SideResult]
    tokens: int
    meta: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {
            "meta": self.meta,
            "tokens": self.tokens,
            "sides": [vars(s) | {"first_diverging_layer": s.first_diverging_layer()} for s in self.sides],
        }


def hf_side(model):
    """``(ids, positions) -> (logits, streams)`` of an HF model: streams are each decoder layer's
    output rounded to the model's dtype (an aligned ``fp32_sum`` layer hands on the fp32 sum; the
    engine's stream is that sum rounded)."""

    def run(ids, positions):
        dtype = model.model.embed_tokens.weight.dtype
        outs = []
        hooks = [
            layer.register_forward_hook(lambda m, a, o: outs.append((o[0] if isinstance(o, tuple) else o).to(dtype)))
            for layer in model.model.layers
        ]
        try:
            with torch.no_grad():
                logits = model(input_ids=ids, position_ids=positions).logits
        finally:
            for h in hooks:
                h.remove()
        return logits, outs

    return run


def sample_tokens(logits: torch.Tensor, seed: int) -> torch.Tensor:
    """One token per position drawn from softmax(fp32 logits), as a rollout at temperature 1."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    probs = torch.softmax(logits.float().cpu(), dim=-1)
    flat = probs.reshape(-1, probs.shape[-1])
    return torch.multinomial(flat, 1, generator=g).view(probs.shape[:-1])


def _logprobs(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    lp = torch.log_softmax(logits.float(), dim=-1)
    return lp.gather(-1, tokens.to(lp.device)[..., None])[..., 0]


def compare(twin_out, sides: dict, ids, positions, seed: int = 0, meta: dict | None = None) -> VerifyResult:
    """Run every side on ``ids``/``positions`` and compare it with ``twin_out`` = (logits, streams)."""
    t_logits, t_streams = twin_out
    tokens = sample_tokens(t_logits, seed)
    mu = _logprobs(t_logits, tokens).cpu()
    t_logp_full = torch.log_softmax(t_logits.float(), dim=-1)
    results = []
    for name, run in sides.items():
        logits, streams = run(ids, positions)
        if len(streams) != len(t_streams):
            raise RuntimeError(f"{name}: {len(streams)} layer outputs against the twin's {len(t_streams)}")
        pi = _logprobs(logits, tokens).cpu()
        mask = torch.ones_like(pi, dtype=torch.bool)
        m = mismatch(pi, mu, mask)
        logp_full = torch.log_softmax(logits.float(), dim=-1)
        kl = float((t_logp_full.exp() * (t_logp_full - logp_full)).sum(-1).mean())
        layers = []
        for i, (a, b) in enumerate(zip(streams, t_streams)):
            a, b = a.reshape(b.shape), b
            layers.append({
                "layer": i,
                "equal": float((a == b).double().mean()),
                "max_abs": float((a.float() - b.float()).abs().max()),
            })
        results.append(SideResult(
            name=name,
            logits_equal=float((logits == t_logits).double().mean()),
            logits_max_abs=float((logits.float() - t_logits.float()).abs().max()),
            k1=m["mismatch/k1"],
            k3=m["mismatch/k3"],
            max_abs_delta=m["mismatch/abs/max"],
            tokens_equal=m["mismatch/bitwise/equal"],
            kl=kl,
            layers=layers,
        ))
    return VerifyResult(results, int(tokens.numel()), dict(meta or {}))


def aligned_side(model, profile, ops=None):
    """Like :func:`hf_side`, with ``model`` aligned to ``profile`` (with ``ops``, see
    :func:`rla.align`) for the run, and restored after."""
    from rla.alignment import aligned

    inner = hf_side(model)

    def run(ids, positions):
        with aligned(model, profile, ops=ops):
            return inner(ids, positions)

    return run
