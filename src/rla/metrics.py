"""Train/inference mismatch metrics, exactly as ``docs/metrics.md`` defines them.

For every response token, ``delta = log pi - log mu``: pi is the training forward's probability of
the sampled token, mu the inference engine's. The metrics summarise ``delta`` per token, per
sequence and per bucket; ``names_as`` renames them to verl's, TRL's or OpenRLHF's dashboard keys, and
``collapse_signal`` watches per-step series for the pattern that precedes an RL collapse.

Numerics. Inputs are usually bf16/fp32 logprobs, but the statistics are computed in fp64: every
upcast is exact, and the quantities of interest are small differences (k3 is ~1e-5..1e-3, the
smallest nonzero deltas ~1e-7) averaged over up to millions of tokens. Anything exponentiated is
kept in log space until the end:

* ``k3 = mean(rho - 1 - delta)`` is a difference of nearly equal numbers for small delta (it is
  ~delta^2/2). ``exp(d) - 1 - d`` as written loses every digit below |d| ~ 1e-8, so it is computed
  as ``expm1(d) - d``, and for |d| < 1e-3 as its Taylor series (truncation < 1e-18 relative).
* ``prob_abs`` uses ``|mu * expm1(delta)|`` rather than ``|pi - mu|``: exact zero for delta == 0,
  full relative precision for tiny delta.
* Sequence sums ``S_i`` use ``math.fsum`` (correctly rounded): ``exp(2 S_i)`` turns an absolute
  error in ``S_i`` into a relative error in ``seq/chi2``.
* ``seq/chi2 = mean_i exp(2 S_i) - 1`` is computed as ``expm1(logsumexp(2 S) - log n)``, so nothing
  overflows on the way; the final value is ``inf`` only when it exceeds the float64 range (log of
  the mean > ~709.78), which a 100k-token sequence with |delta| = 50 genuinely does. The finite
  ``mismatch/seq/log_mean_rho2 = log(1 + seq/chi2)`` is reported alongside for that case.
* ``is/ess`` is scale invariant and computed fully in log space:
  ``log ESS = 2 logsumexp(delta) - log N - logsumexp(2 delta)``.

Missing keys instead of NaN. A statistic with nothing to average (an empty by_position or by_prob
bucket, Pearson with constant probabilities, drift with fewer than two distinct lengths) is left
out of the returned dict rather than reported as NaN; the caller sees the missing key.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

# Masked logprobs above this are rejected: the record format's rule (engines print -0.0 or tiny
# positive rounding), one constant for records and metrics.
from rla.errors import UserError
from rla.rollout.rollouts import POSITIVE_LOGPROB_TOL

__all__ = [
    "pad_rows",
    "k3_terms",
    "MetricsInputError",
    "mismatch",
    "mismatch_from_records",
    "names_as",
    "collapse_signal",
    "CollapseEvent",
    "PERCENTILE_METHOD",
    "POSITIVE_LOGPROB_TOL",
    "routing_mismatch",
    "vocab_kl",
]

#: Interpolation used for ``mismatch/abs/p*`` (``numpy.percentile(method=...)``).
PERCENTILE_METHOD = "linear"
_PERCENTILES = (("p50", 50.0), ("p95", 95.0), ("p99", 99.0), ("p999", 99.9))
_CLIP_EPS = (("0.2", 0.2), ("0.1", 0.1))
#: mu buckets: [0, 1e-3), [1e-3, 0.1), [0.1, 0.9], (0.9, 1].
_PROB_BUCKETS = ("lt1e-3", "1e-3..0.1", "0.1..0.9", "gt0.9")
_NAN_POLICIES = ("raise", "mask")


class MetricsInputError(ValueError, UserError):
    """The logprobs, mask or series handed to a metric are unusable; the message says why."""


# ----------------------------------------------------------------------------- input handling


def _as_float64(x: Any, name: str) -> np.ndarray:
    """A float tensor/array as fp64 NumPy (exact upcast); non-float dtypes are an error."""
    if hasattr(x, "detach"):  # torch.Tensor, without importing torch here
        if not x.is_floating_point():
            raise MetricsInputError(f"{name} must be a floating-point tensor, got dtype {x.dtype}")
        return x.detach().cpu().double().numpy()
    arr = np.asarray(x)
    if arr.dtype.kind != "f":
        raise MetricsInputError(f"{name} must be a floating-point array, got dtype {arr.dtype}")
    return arr.astype(np.float64)


def _as_mask(x: Any) -> np.ndarray:
    arr = x.detach().cpu().numpy() if hasattr(x, "detach") else np.asarray(x)
    if arr.dtype == bool:
        return arr
    if arr.dtype.kind not in "iuf" or not np.isin(arr, (0, 1)).all():
        raise MetricsInputError("mask must be bool or hold only 0 and 1")
    return arr.astype(bool)


def _check_logprobs(values: np.ndarray, mask: np.ndarray, name: str) -> None:
    bad = mask & ~np.isfinite(values)
    if bad.any():
        i, j = np.argwhere(bad)[0]
        raise MetricsInputError(
            f"{name} has {int(bad.sum())} non-finite value(s) (NaN/inf) on masked positions, "
            f"first at [{i}, {j}] = {values[i, j]}"
        )
    pos = mask & (values > POSITIVE_LOGPROB_TOL)
    if pos.any():
        i, j = np.argwhere(pos)[0]
        raise MetricsInputError(
            f"{name} has {int(pos.sum())} positive logprob(s) (> {POSITIVE_LOGPROB_TOL}) on masked "
            f"positions, first at [{i}, {j}] = {values[i, j]!r}; a log-probability is <= 0"
        )


def _logsumexp(x: np.ndarray) -> float:
    m = float(np.max(x))
    return m + math.log(float(np.sum(np.exp(x - m))))


def k3_terms(d: np.ndarray) -> np.ndarray:
    """rho - 1 - delta per token (the terms k3 averages), without cancellation (see module docstring)."""
    with np.errstate(over="ignore"):
        out = np.expm1(d) - d
    small = np.abs(d) < 1e-3
    s = d[small]
    out[small] = s * s * (1 / 2 + s * (1 / 6 + s * (1 / 24 + s * (1 / 120 + s / 720))))
    return out


# ----------------------------------------------------------------------------- the metrics


def mismatch(
    train_logprobs: Any,
    rollout_logprobs: Any,
    mask: Any,
    *,
    response_lengths: Any = None,
    nan_policy: str = "raise",
) -> dict[str, float]:
    """All docs/metrics.md metrics for one batch, as ``{"mismatch/...": float}``.

    Args:
        train_logprobs: ``[B, T]`` log pi of the sampled tokens (torch or NumPy, any float dtype).
        rollout_logprobs: ``[B, T]`` log mu from the inference engine, same layout.
        mask: ``[B, T]`` bool or 0/1; 1 marks response tokens. Unmasked positions are padding and
            may hold anything, NaN included; they are never read.
        response_lengths: optional ``[B]`` integer response lengths ``L_i``. By default ``L_i`` is
            the span of row i's masked tokens (first to last masked column; the count of masked
            tokens for the usual contiguous mask). Pass it when the mask has holes (e.g. tool
            output excluded in multi-turn) and positions should be measured against the full
            response; it must be at least that span.
        nan_policy: ``"raise"`` (default): a NaN logprob on a masked position is an error.
            ``"mask"``: a masked position where either logprob is NaN is left out of every
            statistic, for frameworks that mark tokens the engine could not score with NaN (TRL
            1.16 keeps them in ``sampling_per_token_logps``). The token still counts for the
            response's geometry (its span and ``by_position`` quarters), and
            ``mismatch/n_nan_masked`` says how many were left out. Infinities and positive
            logprobs stay errors under both policies: they are bad values, not "unscored".

    Token metrics average over all masked tokens. Sequence metrics (``seq/*``) use rows with at
    least one masked token; rows that are entirely masked out are excluded from them (and
    ``mismatch/n_seqs`` counts only the rows used). ``by_position/q{k}``: a masked token's position
    is its column offset from the row's first masked column, its bucket ``floor(4 * pos / L_i)``.
    ``by_prob``: buckets of mu = exp(rollout logprob), ``[0, 1e-3)``, ``[1e-3, 0.1)``,
    ``[0.1, 0.9]``, ``(0.9, 1]``. Percentiles use NumPy's ``linear`` interpolation. ``seq/std`` is
    the population std (ddof=0). ``drift_per_1k`` is the least-squares slope of ``S_i`` on ``L_i``
    times 1000. Keys for empty buckets or undefined statistics are omitted, never NaN. Extra keys
    beyond the spec: ``mismatch/n_tokens``, ``mismatch/n_seqs``, ``mismatch/seq/log_mean_rho2``,
    and with ``nan_policy="mask"`` ``mismatch/n_nan_masked``.

    Raises:
        MetricsInputError: shapes differ or are not 2-D, non-float logprobs, a mask that is not
            0/1 or selects no token (also after NaN masking), NaN (under ``nan_policy="raise"``),
            inf or positive (> 1e-6) logprobs on masked positions, an unknown ``nan_policy``.
    """
    if nan_policy not in _NAN_POLICIES:
        raise MetricsInputError(f"nan_policy must be one of {_NAN_POLICIES}, got {nan_policy!r}")
    train = _as_float64(train_logprobs, "train_logprobs")
    roll = _as_float64(rollout_logprobs, "rollout_logprobs")
    m = _as_mask(mask)
    if train.ndim != 2 or train.shape != roll.shape or train.shape != m.shape:
        raise MetricsInputError(
            "expected train_logprobs, rollout_logprobs and mask of one [B, T] shape, got "
            f"{train.shape}, {roll.shape} and {m.shape}"
        )
    if not m.any():
        raise MetricsInputError("mask selects no token: there is nothing to measure")
    geometry = m  # the response layout: spans and position quarters, NaN tokens included
    n_nan = 0
    if nan_policy == "mask":
        nan = m & (np.isnan(train) | np.isnan(roll))
        n_nan = int(nan.sum())
        m = m & ~nan
        if not m.any():
            raise MetricsInputError(
                f"every one of the {n_nan} masked token(s) has a NaN logprob: nothing is left to measure"
            )
    _check_logprobs(train, m, "train_logprobs")
    _check_logprobs(roll, m, "rollout_logprobs")

    delta_full = np.where(m, train, 0.0) - np.where(m, roll, 0.0)  # padding -> exactly 0
    d, lp_mu = delta_full[m], roll[m]
    n = d.size
    ad = np.abs(d)
    out: dict[str, float] = {"mismatch/n_tokens": float(n)}
    if nan_policy == "mask":
        out["mismatch/n_nan_masked"] = float(n_nan)

    # ---- token metrics
    out["mismatch/k1"] = float(np.mean(d))
    out["mismatch/abs/mean"] = float(np.mean(ad))
    out["mismatch/abs/max"] = float(np.max(ad))
    qs = np.percentile(ad, [q for _, q in _PERCENTILES], method=PERCENTILE_METHOD)
    for (key, _), v in zip(_PERCENTILES, qs):
        out[f"mismatch/abs/{key}"] = float(v)
    out["mismatch/k2"] = float(np.mean(d * d) / 2)
    out["mismatch/k3"] = float(np.mean(k3_terms(d)))
    mu = np.exp(lp_mu)
    with np.errstate(over="ignore"):
        prob_abs = np.abs(mu * np.expm1(d))
        out["mismatch/chi2_token"] = float(np.mean(np.expm1(2 * d)))
        rho = np.exp(d)
    out["mismatch/prob_abs/mean"] = float(np.mean(prob_abs))
    out["mismatch/prob_abs/max"] = float(np.max(prob_abs))
    pi = np.exp(train[m])
    a, b = pi - pi.mean(), mu - mu.mean()
    denom = math.sqrt(float(np.sum(a * a)) * float(np.sum(b * b)))
    if denom > 0:
        out["mismatch/prob_pearson"] = min(1.0, max(-1.0, float(np.sum(a * b)) / denom))
    log_ess = 2 * _logsumexp(d) - math.log(n) - _logsumexp(2 * d)
    out["mismatch/is/ess"] = min(1.0, math.exp(log_ess))
    for key, eps in _CLIP_EPS:
        out[f"mismatch/clip_leak/{key}"] = float(np.mean((rho < 1 - eps) | (rho > 1 + eps)))
    out["mismatch/bitwise/equal"] = float(np.mean(d == 0))
    out["mismatch/bitwise/diff_gt_1e-6"] = float(np.mean(ad > 1e-6))

    # ---- sequence metrics, over rows with at least one masked token
    rows = np.flatnonzero(m.any(axis=1))
    S = np.array([math.fsum(delta_full[i][m[i]]) for i in rows])
    out["mismatch/n_seqs"] = float(rows.size)
    out["mismatch/seq/log_ratio/mean"] = float(np.mean(S))
    out["mismatch/seq/log_ratio/std"] = float(np.std(S))
    out["mismatch/seq/log_ratio/min"] = float(np.min(S))
    out["mismatch/seq/log_ratio/max"] = float(np.max(S))
    log_mean_rho2 = _logsumexp(2 * S) - math.log(rows.size)
    out["mismatch/seq/log_mean_rho2"] = log_mean_rho2
    try:
        out["mismatch/seq/chi2"] = math.expm1(log_mean_rho2)
    except OverflowError:  # only when the value itself exceeds float64 (log > ~709.78)
        out["mismatch/seq/chi2"] = math.inf

    first = np.argmax(geometry, axis=1)
    span = m.shape[1] - np.argmax(geometry[:, ::-1], axis=1) - first
    lengths = span if response_lengths is None else _lengths(response_lengths, span, rows)
    L = lengths[rows].astype(np.float64)
    if rows.size >= 2 and np.ptp(L) > 0:
        x, y = L - L.mean(), S - S.mean()
        out["mismatch/seq/drift_per_1k"] = float(np.sum(x * y) / np.sum(x * x) * 1000)

    # ---- buckets
    pos = np.arange(m.shape[1])[None, :] - first[:, None]
    bucket = ((4 * pos) // np.maximum(lengths, 1)[:, None])[m]
    for q in range(4):
        sel = bucket == q
        if sel.any():
            out[f"mismatch/by_position/q{q + 1}"] = float(np.mean(ad[sel]))
    edges = [mu < 1e-3, (mu >= 1e-3) & (mu < 0.1), (mu >= 0.1) & (mu <= 0.9), mu > 0.9]
    for key, sel in zip(_PROB_BUCKETS, edges):
        if sel.any():
            out[f"mismatch/by_prob/{key}"] = float(np.mean(ad[sel]))
    return out


def _lengths(response_lengths: Any, span: np.ndarray, rows: np.ndarray) -> np.ndarray:
    arr = (
        response_lengths.detach().cpu().numpy()
        if hasattr(response_lengths, "detach")
        else np.asarray(response_lengths)
    )
    if arr.shape != span.shape or arr.dtype.kind not in "iu":
        raise MetricsInputError(
            f"response_lengths must be integers of shape {span.shape}, got {arr.dtype} {arr.shape}"
        )
    short = [int(i) for i in rows if arr[i] < span[i]]
    if short:
        i = short[0]
        raise MetricsInputError(
            f"response_lengths[{i}] = {int(arr[i])} is shorter than the {int(span[i])} columns "
            f"its masked tokens span ({len(short)} row(s) affected)"
        )
    return arr.astype(np.int64)


def mismatch_from_records(
    records: Sequence[Any], train_logprobs: Sequence[Any]
) -> dict[str, float]:
    """``mismatch`` for ``rla.rollout.rollouts.RolloutRecord`` objects and their training-side logprobs.

    ``train_logprobs[i]`` is a 1-D float array/tensor of length ``len(records[i].response_ids)``.
    Both sides are right-padded into ``[B, R_max]`` fp64 arrays; the response lengths are passed on.
    """
    if len(records) != len(train_logprobs):
        raise MetricsInputError(
            f"{len(records)} records but {len(train_logprobs)} train_logprobs rows"
        )
    if not records:
        raise MetricsInputError("no records: there is nothing to measure")
    lengths = np.array([len(r.response_ids) for r in records], dtype=np.int64)
    rows = []
    for i, (rec, row) in enumerate(zip(records, train_logprobs)):
        t = _as_float64(row, f"train_logprobs[{i}]")
        if t.ndim != 1 or t.size != lengths[i] or len(rec.logprobs) != lengths[i]:
            raise MetricsInputError(
                f"record {i}: {lengths[i]} response tokens, {len(rec.logprobs)} rollout logprobs, "
                f"train_logprobs of shape {t.shape}; all three must agree"
            )
        rows.append(t)
    train, mask = pad_rows(rows)
    roll, _ = pad_rows([rec.logprobs for rec in records])
    return mismatch(train, roll, mask, response_lengths=lengths)


def pad_rows(rows: Sequence[Any]) -> tuple[np.ndarray, np.ndarray]:
    """Right-pad variable-length 1-D rows into a [B, R_max] float64 array and its bool mask.

    The padded layout every ``mismatch`` caller needs (records, the trainer's log, diagnosis).
    """
    if not len(rows):
        raise MetricsInputError("no rows to pad")
    lengths = [len(r) for r in rows]
    out = np.zeros((len(rows), max(lengths)))
    mask = np.zeros(out.shape, dtype=bool)
    for i, (row, n) in enumerate(zip(rows, lengths)):
        out[i, :n] = np.asarray(row, dtype=np.float64)
        mask[i, :n] = True
    return out, mask


# ----------------------------------------------------------------------------- dashboard names

_RENAMES: dict[str, dict[str, tuple[str, float]]] = {
    "verl": {
        "mismatch/k1": ("rollout_corr/kl", -1.0),  # verl logs mean(log mu - log pi)
        "mismatch/k3": ("rollout_corr/k3_kl", 1.0),
        "mismatch/chi2_token": ("rollout_corr/chi2_token", 1.0),
        "mismatch/seq/chi2": ("rollout_corr/chi2_seq", 1.0),
        "mismatch/prob_abs/mean": ("training/rollout_probs_diff_mean", 1.0),
        "mismatch/prob_abs/max": ("training/rollout_probs_diff_max", 1.0),
        "mismatch/prob_pearson": ("training/rollout_actor_probs_pearson_corr", 1.0),
        "mismatch/is/ess": ("rollout_corr/rollout_is_eff_sample_size", 1.0),
    },
    "trl": {
        "mismatch/abs/mean": ("sampling/sampling_logp_difference/mean", 1.0),
        "mismatch/abs/max": ("sampling/sampling_logp_difference/max", 1.0),
    },
    # OpenRLHF 0.11.2 (models/loss.py): vllm_kl = masked_mean(rollout_log_probs - old_log_probs),
    # a token mean of log mu - log pi. Its status dict holds ``vllm_kl``; its loggers
    # (utils/logging_utils.py: wandb and tensorboard) prefix every key with ``train/`` themselves,
    # so the key handed to them is ``vllm_kl`` (``train/vllm_kl`` would show as ``train/train/vllm_kl``).
    "openrlhf": {
        "mismatch/k1": ("vllm_kl", -1.0),
    },
    # NeMo-RL (nemo_rl/algorithms/loss_functions.py, ClippedPGLossFn): gen_kl_error = token mean of
    # calculate_kl(generation, prev) with the default kl_type k3 = exp(delta) - 1 - delta; logged as
    # train/gen_kl_error. token_mult_prob_error (mean exp|delta|) has no rla key:
    # rla.diagnosis.health computes it.
    "nemo-rl": {
        "mismatch/k3": ("gen_kl_error", 1.0),
    },
}


def names_as(metrics: dict[str, float], style: str) -> dict[str, float]:
    """Rename ``mismatch/...`` keys to verl's (``style="verl"``), TRL's (``"trl"``), OpenRLHF's
    (``"openrlhf"``) or NeMo-RL's (``"nemo-rl"``) keys.

    Values follow the target's sign convention (verl's ``rollout_corr/kl`` and OpenRLHF's
    ``vllm_kl`` are ``-k1``; OpenRLHF's loggers add ``train/`` to the keys they are given, so the
    ``"openrlhf"`` keys are the status-dict keys, without that prefix); the formulas are
    docs/metrics.md's, so a framework whose own estimator differs (e.g. verl's ESS on truncated or
    sequence-level weights) can still log different numbers. Metrics without a
    counterpart, and keys outside ``mismatch/``, keep their names.
    """
    if style not in _RENAMES:
        raise ValueError(f"unknown style {style!r}; known styles: {', '.join(sorted(_RENAMES))}")
    table = _RENAMES[style]
    out: dict[str, float] = {}
    for key, value in metrics.items():
        new, sign = table.get(key, (key, 1.0))
        out[new] = sign * value
    return out


# ----------------------------------------------------------------------------- collapse signal


@dataclass(frozen=True)
class CollapseEvent:
    """One step at which the collapse signal fired.

    ``kinds`` holds machine-readable tags: ``"k3_spike"``, ``"grad_spike"``, ``"reward_falling"``,
    ``"nonfinite_k3"``, ``"nonfinite_grad_norm"``; ``message`` says the same with the numbers.
    """

    step: int
    kinds: tuple[str, ...]
    message: str


def collapse_signal(
    k3: Sequence[float],
    grad_norm: Sequence[float] | None,
    reward: Sequence[float],
    *,
    k3_factor: float = 10.0,
    grad_factor: float = 10.0,
    window: int = 5,
    reward_drop: float = 0.05,
) -> list[CollapseEvent]:
    """Steps where docs/metrics.md's collapse signal fires, in order; ``[]`` when it never does.

    With ``t`` the step index (position in the series):

    * k3 spike: ``k3[t] > k3_factor * k3[0]`` for ``t >= 1`` (a step-0 k3 of exactly 0, as on a
      bitwise-aligned stack, makes any positive k3 a spike).
    * grad spike: ``grad_norm[t] > grad_factor * median(grad_norm[0:t])`` for ``t >= 1``, the
      running median over the finite earlier values (skipped when ``grad_norm`` is None).
    * reward falling: ``rbar[t] < max(rbar[window-1 .. t]) - reward_drop``, where ``rbar[t]`` is
      the mean reward over the ``window`` steps ending at t. ``reward_drop`` is in reward units
      (the default suits rewards in [0, 1]); steps before ``window - 1`` are never "falling".

    An event is a spike together with falling reward. A non-finite k3 or grad norm is reported as
    an event on its own (training is already broken; there is nothing to wait for).

    Raises:
        MetricsInputError: series of different lengths, a non-finite ``k3[0]`` (no baseline), a
            non-finite reward, or ``window < 1``.
    """
    k3a = np.asarray(k3, dtype=np.float64)
    rw = np.asarray(reward, dtype=np.float64)
    gn = None if grad_norm is None else np.asarray(grad_norm, dtype=np.float64)
    lengths = {k3a.size, rw.size} | ({gn.size} if gn is not None else set())
    if len(lengths) != 1 or k3a.ndim != 1 or rw.ndim != 1 or (gn is not None and gn.ndim != 1):
        raise MetricsInputError("k3, grad_norm and reward must be 1-D series of one length")
    if window < 1:
        raise MetricsInputError(f"window must be >= 1, got {window}")
    if k3a.size == 0:
        return []
    if not math.isfinite(k3a[0]):
        raise MetricsInputError(f"k3[0] = {k3a[0]} is the baseline and must be finite")
    if not np.isfinite(rw).all():
        raise MetricsInputError(f"reward is not finite at step {int(np.argmin(np.isfinite(rw)))}")

    events: list[CollapseEvent] = []
    best = -math.inf
    for t in range(k3a.size):
        falling, rbar = False, math.nan
        if t >= window - 1:
            rbar = float(np.mean(rw[t - window + 1 : t + 1]))
            best = max(best, rbar)
            falling = rbar < best - reward_drop
        broken: list[tuple[str, str]] = []
        spikes: list[tuple[str, str]] = []
        if not math.isfinite(k3a[t]):
            broken.append(("nonfinite_k3", f"k3 = {k3a[t]}"))
        elif t >= 1 and k3a[t] > k3_factor * k3a[0]:
            spikes.append(("k3_spike", f"k3 {k3a[t]:.3g} > {k3_factor:g} x step-0 {k3a[0]:.3g}"))
        if gn is not None:
            prev = gn[:t][np.isfinite(gn[:t])]
            if not math.isfinite(gn[t]):
                broken.append(("nonfinite_grad_norm", f"grad_norm = {gn[t]}"))
            elif prev.size and gn[t] > grad_factor * float(np.median(prev)):
                med = float(np.median(prev))
                why = f"grad_norm {gn[t]:.3g} > {grad_factor:g} x running median {med:.3g}"
                spikes.append(("grad_spike", why))
        fired = list(broken)
        if spikes and falling:
            fired += spikes
            why = f"reward {rbar:.3g} (mean of {window}) < best {best:.3g} - {reward_drop:g}"
            fired.append(("reward_falling", why))
        if fired:
            events.append(
                CollapseEvent(
                    step=t,
                    kinds=tuple(k for k, _ in fired),
                    message="; ".join(w for _, w in fired),
                )
            )
    return events


def routing_mismatch(ids: Any, ref_ids: Any, weights: Any = None, ref_weights: Any = None,
                     mask: Any = None) -> dict[str, Any]:
    """How one stack's expert choice differs from another's (``docs/metrics.md``, routing).

    ``ids``/``ref_ids``: [layers, tokens, k] expert ids of the same tokens through the same MoE
    layers (e.g. ``rla.alignment.replay.capture_routes(model).ids()`` of the training side and of
    the engine side, or a record's ``routes``); ``weights``/``ref_weights`` the routing weights in
    the same slots (optional); ``mask`` [tokens] (bool) the tokens to count (default all).

    Returns, per layer (lists, layer order): ``routing/set_differs`` the fraction of tokens whose
    *set* of k experts differs; ``routing/order_differs`` whose slot order differs (set differences
    included: the order of the weighted sum is a rounding location too); and, over tokens whose
    set agrees, ``routing/weight_abs_max`` and ``routing/weight_abs_mean`` of |w - w_ref| matched
    by expert id (fp64). Scalars: ``routing/any_layer_set_differs`` the fraction of tokens whose set
    differs in at least one layer, and ``routing/set_differs_mean`` the mean over layers.
    """
    a = np.asarray(ids)
    b = np.asarray(ref_ids)
    if a.ndim != 3 or a.shape != b.shape or not np.issubdtype(a.dtype, np.integer) or not np.issubdtype(b.dtype, np.integer):
        raise MetricsInputError(
            f"routing_mismatch needs two integer arrays of the same shape [layers, tokens, k], got "
            f"{a.shape} {a.dtype} and {b.shape} {b.dtype}")
    m = np.ones(a.shape[1], dtype=bool) if mask is None else _as_mask(mask)
    if m.shape != (a.shape[1],):
        raise MetricsInputError(f"mask must have one entry per token ({a.shape[1]}), got shape {m.shape}")
    if not m.any():
        raise MetricsInputError("routing_mismatch: the mask selects no token")
    a, b = a[:, m], b[:, m]
    sa, sb = np.sort(a, axis=-1), np.sort(b, axis=-1)
    set_diff = (sa != sb).any(-1)  # [layers, tokens]
    order_diff = (a != b).any(-1)
    out: dict[str, Any] = {
        "routing/set_differs": set_diff.mean(1).tolist(),
        "routing/order_differs": order_diff.mean(1).tolist(),
        "routing/any_layer_set_differs": float(set_diff.any(0).mean()),
        "routing/set_differs_mean": float(set_diff.mean()),
    }
    if (weights is None) != (ref_weights is None):
        raise MetricsInputError("routing_mismatch: give both weights and ref_weights, or neither")
    if weights is not None:
        wa = _as_float64(weights, "weights")[:, m]
        wb = _as_float64(ref_weights, "ref_weights")[:, m]
        if wa.shape != a.shape or wb.shape != a.shape:
            raise MetricsInputError(f"weights must have the ids' shape {tuple(a.shape)} before the mask")
        wa = np.take_along_axis(wa, np.argsort(a, axis=-1), -1)  # matched by expert id
        wb = np.take_along_axis(wb, np.argsort(b, axis=-1), -1)
        err = np.abs(wa - wb).max(-1)  # [layers, tokens]
        same = ~set_diff
        out["routing/weight_abs_max"] = [float(err[i][same[i]].max()) if same[i].any() else None
                                         for i in range(err.shape[0])]
        out["routing/weight_abs_mean"] = [float(np.abs(wa - wb)[i][same[i]].mean()) if same[i].any() else None
                                          for i in range(err.shape[0])]
    return out


def vocab_kl(engine: Sequence[Any], trainer: Sequence[Any], trainer_tail: Any, complete: Any) -> dict[str, Any]:
    """KL(engine || trainer) over the vocabulary, per token, from the engine's listed distribution.

    Per token t: ``engine[t]`` the engine's logprobs of the tokens it listed (a record's
    ``top_logprobs``, :mod:`rla.rollout.top_logprobs`), ``trainer[t]`` the trainer's logprobs of
    the same tokens (same order), ``trainer_tail[t]`` the log of the trainer's probability of every
    token not listed (``-inf`` when there is none), ``complete[t]`` whether the list is the engine's
    whole distribution. All in fp64.

    - complete: ``sum_i q_i (log q_i - log p_i)``, the KL **exactly** (the unlisted tokens have
      q = 0 and contribute nothing, whatever p gives them).
    - top-k: the same sum plus ``r_q (log r_q - log r_p)``, with ``r_q = 1 - sum_i q_i`` the engine's
      mass outside the list and ``r_p`` the trainer's: the KL of the two distributions with the
      unlisted tokens merged into one outcome. By the log-sum inequality (merging outcomes never
      raises a KL) this is a **lower bound** on the KL over the vocabulary; it is exact when the
      engine's tail is proportional to the trainer's. An upper bound would need the engine's
      tail, which a top-k list does not hold.

    ``r_q`` is ``-expm1(logsumexp(log q))``, clipped at 0 (an engine's listed logprobs may sum to
    a hair over 1). A token where the engine puts mass the trainer gives none is ``inf``.
    Returns ``vocab_kl/per_token`` (list), ``vocab_kl/mean``, ``vocab_kl/max``, ``vocab_kl/tokens``
    and ``vocab_kl/kind``: ``"exact"`` when every token's list is complete, else ``"lower_bound"``
    (the mean of exact values and lower bounds is a lower bound).
    """
    n = len(engine)
    tail = _as_float64(trainer_tail, "trainer_tail").reshape(-1)
    full = np.asarray(complete, dtype=bool).reshape(-1)
    if n == 0 or len(trainer) != n or tail.shape != (n,) or full.shape != (n,):
        raise MetricsInputError(f"vocab_kl needs one entry per token in each input, got {n} engine, {len(trainer)} "
                                f"trainer, {tail.shape[0]} tail, {full.shape[0]} complete")
    out = np.empty(n, dtype=np.float64)
    for t in range(n):
        q = np.asarray(engine[t], dtype=np.float64)
        p = np.asarray(trainer[t], dtype=np.float64)
        if q.ndim != 1 or q.shape != p.shape or q.size == 0 or not np.isfinite(q).all() or np.isnan(p).any():
            raise MetricsInputError(f"vocab_kl: token {t}: the engine's and the trainer's logprobs must be equal-length "
                                    f"lists, the engine's finite, got {q.shape} and {p.shape}")
        with np.errstate(divide="ignore", invalid="ignore"):
            kl = float(np.sum(np.exp(q) * (q - p)))
            if not full[t]:
                r_q = max(0.0, -math.expm1(_logsumexp(q)))
                if r_q > 0:
                    kl += r_q * (math.log(r_q) - tail[t]) if tail[t] > -np.inf else math.inf
        out[t] = kl
    return {"vocab_kl/per_token": out.tolist(), "vocab_kl/mean": float(out.mean()), "vocab_kl/max": float(out.max()),
            "vocab_kl/tokens": n, "vocab_kl/kind": "exact" if full.all() else "lower_bound"}
