"""``verify``: an aligned training model against an engine twin, logits and layer by layer.

The twin (:class:`rla.engines.vllm_twin.VllmTwin`) and the training model share weights, GEMMs and
attention, so every difference between them is a rounding location or an arithmetic order. This
module runs both on the same tokens and measures:

- logits: the fraction of bit-equal elements, the max |difference|;
- the tokens a rollout would sample: for each position, a token drawn (seeded) from the twin's
  distribution (the engine is the rollout side) and ``delta = log pi_train - log mu_engine`` of
  it, summarised by :func:`rla.metrics.mismatch` (k1, k3, max |delta|, bitwise fraction);
- the mean full-distribution KL(twin || model) per position;
  (logprobs, softmax and KL are computed a bounded number of positions at a time; the two sides'
  logits are held whole, since they are compared element by element)
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


COMPARE_BYTES = 256 << 20
"""Memory for the fp32 temporaries of one step of :func:`compare` (positions x vocab x 4 bytes x 8)."""


def _rows(vocab: int, rows: int | None) -> int:
    if rows is not None:
        if rows < 1:
            raise ValueError(f"rows must be positive, got {rows}")
        return rows
    return max(1, COMPARE_BYTES // (vocab * 4 * 8))


def sample_tokens(logits: torch.Tensor, seed: int, rows: int | None = None) -> torch.Tensor:
    """One token per position drawn from softmax(fp32 logits), as a rollout at temperature 1.

    Positions are drawn ``rows`` at a time (default: what fits :data:`COMPARE_BYTES`) from one
    generator, in order: the same tokens as one draw over all positions (CPU multinomial draws
    row by row), without an fp32 copy of every position's distribution."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    flat = logits.reshape(-1, logits.shape[-1])
    step = _rows(flat.shape[-1], rows)
    out = [torch.multinomial(torch.softmax(flat[s : s + step].float().cpu(), dim=-1), 1, generator=g)
           for s in range(0, flat.shape[0], step)]
    return torch.cat(out).view(logits.shape[:-1])


def _logprobs(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    lp = torch.log_softmax(logits.float(), dim=-1)
    return lp.gather(-1, tokens.to(lp.device)[..., None])[..., 0]


def _logit_stats(logits, t_logits, tokens, rows):
    """Per-position stats of one side against the twin, ``rows`` positions at a time (bounded fp32
    temporaries): (log pi of the tokens, bit-equal logits, max |d logit|, KL(twin || side) summed)."""
    v = t_logits.shape[-1]
    a, b, tok = logits.reshape(-1, v), t_logits.reshape(-1, v), tokens.reshape(-1)
    pi, equal, max_abs, kl = [], 0, 0.0, 0.0
    for s in range(0, a.shape[0], rows):
        x, y, t = a[s : s + rows], b[s : s + rows], tok[s : s + rows]
        lp, tlp = torch.log_softmax(x.float(), dim=-1), torch.log_softmax(y.float(), dim=-1)
        pi.append(lp.gather(-1, t.to(lp.device)[:, None])[:, 0].cpu())
        equal += int((x == y).sum())
        max_abs = max(max_abs, float((x.float() - y.float()).abs().max()))
        kl += float((tlp.exp() * (tlp - lp)).sum(-1).double().sum())
        del lp, tlp
    return torch.cat(pi).view(tokens.shape), equal / a.numel(), max_abs, kl / a.shape[0]


def compare(twin_out, sides: dict, ids, positions, seed: int = 0, meta: dict | None = None, *,
            rows: int | None = None, progress=None) -> VerifyResult:
    """Run every side on ``ids``/``positions`` and compare it with ``twin_out`` = (logits, streams).

    The logits of the twin and of one side are held whole (they are compared element by element);
    everything computed from them (softmax, logprobs, KL) runs ``rows`` positions at a time.
    ``progress``: optional callable(done, total), called after each side."""
    t_logits, t_streams = twin_out
    step = _rows(t_logits.shape[-1], rows)
    tokens = sample_tokens(t_logits, seed, step)
    mu = torch.cat([_logprobs(t_logits.reshape(-1, t_logits.shape[-1])[s : s + step], tokens.reshape(-1)[s : s + step]).cpu()
                    for s in range(0, tokens.numel(), step)]).view(tokens.shape)
    results = []
    for n, (name, run) in enumerate(sides.items()):
        logits, streams = run(ids, positions)
        if len(streams) != len(t_streams):
            raise RuntimeError(f"{name}: {len(streams)} layer outputs against the twin's {len(t_streams)}")
        pi, logits_equal, logits_max_abs, kl = _logit_stats(logits, t_logits, tokens, step)
        mask = torch.ones_like(pi, dtype=torch.bool)
        m = mismatch(pi, mu, mask)
        layers = []
        for i, (a, b) in enumerate(zip(streams, t_streams)):
            a, b = a.reshape(b.shape), b
            layers.append({
                "layer": i,
                "equal": float((a == b).double().mean()),
                "max_abs": float((a.float() - b.float()).abs().max()),
            })
        del logits, streams
        results.append(SideResult(
            name=name,
            logits_equal=logits_equal,
            logits_max_abs=logits_max_abs,
            k1=m["mismatch/k1"],
            k3=m["mismatch/k3"],
            max_abs_delta=m["mismatch/abs/max"],
            tokens_equal=m["mismatch/bitwise/equal"],
            kl=kl,
            layers=layers,
        ))
        if progress is not None:
            progress(n + 1, len(sides))
    return VerifyResult(results, int(tokens.numel()), dict(meta or {}))


def aligned_side(model, profile, ops=None):
    """Like :func:`hf_side`, with ``model`` aligned to ``profile`` (with ``ops``, see
    :func:`rla.align`) for the run, and restored after."""
    from rla.alignment import aligned

    inner = hf_side(model)

    def run(ids, positions):
        with aligned(model, profile, ops=ops):
            if callable(getattr(ops, "make_forward", None)):  # an engine-backed body forward
                from rla.engines.vllm_forward import recording_streams

                with recording_streams(model.model) as streams, torch.no_grad():
                    logits = model(input_ids=ids, position_ids=positions).logits
                return logits, streams
            return inner(ids, positions)

    return run
