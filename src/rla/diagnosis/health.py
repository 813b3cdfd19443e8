"""The mismatch numbers users watch, under each framework's own names, against its own thresholds.

:func:`health` takes the training side's and the rollout's logprobs of the same tokens and returns
one :class:`Reading` per dashboard number: its framework, its key there, its value (computed as
that framework computes it, in fp64), the framework's threshold and where it is published, and a
verdict. The ratios are *raw*: ``rho = pi / mu`` per token before any truncation or masking
(TRL #5231: the logged ratios are the truncated ones, so their tails cannot show what was cut).

Definitions and thresholds, each read from the framework's own code:

- verl 0.9.1. ``rollout_corr/k3_kl`` = token mean of ``rho - 1 - log rho`` (``rollout_corr_helper.
  compute_offpolicy_metrics``); 0.01 is the default ``rs_threshold`` of its K3 rejection sampling
  (``verl/trainer/config/algorithm.py``, ``RolloutCorrectionConfig.bypass_ppo_clip_k3_rs``: "Max
  allowed K3 divergence"). ``rollout_corr/kl`` = ``mean(log mu - log pi)``, no threshold.
  Token IS: ``rollout_is_threshold`` defaults to 2.0 (same file): tokens with ``rho > 2`` are
  truncated, so the share above 2 is what that correction hides. ``training/
  rollout_probs_diff_mean`` = ``mean |pi - mu|`` (``verl/utils/debug/metrics.py``); verl's code
  publishes no threshold for it.
- TRL 1.16. ``sampling/sampling_logp_difference/{mean,max}`` = ``|log pi - log mu|``; the vLLM IS
  correction's default mode ``sequence_mask`` masks sequences whose ratio ``exp(sum delta)``
  exceeds ``vllm_importance_sampling_clip_max`` = 3.0 (``trl/trainer/grpo_config.py``).
- NeMo-RL. ``token_mult_prob_error`` = token mean of ``exp(|log pi - log mu|)``; ``gen_kl_error`` =
  token mean of ``rho - 1 - log rho`` with the default ``kl_type`` k3 (``nemo_rl/algorithms/
  loss_functions.py``, ``ClippedPGLossFn``). Its nightly test suites require
  ``median(train/token_mult_prob_error) < 1.1`` and ``mean(train/gen_kl_error) < 0.01``
  (``tests/test_suites/llm/*.sh``, ``check_metrics.py``).
- Everyone's PPO clip: the share of tokens outside ``[0.9, 1.1]`` (``mismatch/clip_leak/0.1``),
  what verl #6280 reports as 5-10% in bf16 from micro-batching alone; no framework publishes a
  threshold for it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

import rla.metrics as M

__all__ = ["Reading", "health", "THRESHOLDS"]

#: (framework, key) -> (threshold, "above" or "below" is bad, where it is published)
THRESHOLDS = {
    ("verl", "rollout_corr/k3_kl"): (0.01, "above", "verl/trainer/config/algorithm.py: K3 rejection-sampling "
                                     "rs_threshold default"),
    ("verl", "rollout_corr/share_rho_above_is_threshold"): (0.0, "above", "verl/trainer/config/algorithm.py: "
                                                           "rollout_is_threshold default 2.0 (tokens above are truncated)"),
    ("trl", "sequence_ratio_max"): (3.0, "above", "trl/trainer/grpo_config.py: vllm_importance_sampling_clip_max "
                                    "default 3.0 (sequence_mask)"),
    ("nemo-rl", "token_mult_prob_error"): (1.1, "above", "NeMo-RL tests/test_suites: median(train/token_mult_prob_error) < 1.1"),
    ("nemo-rl", "gen_kl_error"): (0.01, "above", "NeMo-RL tests/test_suites: mean(train/gen_kl_error) < 0.01"),
}


@dataclass(frozen=True)
class Reading:
    framework: str
    key: str
    value: float
    threshold: float | None
    source: str
    verdict: str
    """``"ok"``, ``"over"`` (past the framework's threshold) or ``"no threshold"``."""


def health(train_rows, rollout_rows) -> list[Reading]:
    """Readings of the mismatch between ``train_rows`` (log pi) and ``rollout_rows`` (log mu), one
    row of per-token logprobs per sequence."""
    t, mask = M.pad_rows([np.asarray(r, dtype=np.float64) for r in train_rows])
    r, _ = M.pad_rows([np.asarray(x, dtype=np.float64) for x in rollout_rows])
    m = M.mismatch(t, r, mask)
    d = (t - r)[mask]
    with np.errstate(over="ignore"):
        rho = np.exp(d)
        seq = np.exp([math.fsum((t[i] - r[i])[mask[i]]) for i in range(len(t)) if mask[i].any()])
    values = {
        ("rla", "raw_ratio/max"): float(rho.max()),
        ("rla", "raw_ratio/min"): float(rho.min()),
        ("rla", "raw_ratio/p999"): float(np.percentile(rho, 99.9, method=M.PERCENTILE_METHOD)),
        ("rla", "share_outside_0.9_1.1"): m["mismatch/clip_leak/0.1"],
        ("verl", "rollout_corr/k3_kl"): m["mismatch/k3"],
        ("verl", "rollout_corr/kl"): -m["mismatch/k1"],
        ("verl", "rollout_corr/share_rho_above_is_threshold"): float(np.mean(rho > 2.0)),
        ("verl", "training/rollout_probs_diff_mean"): m["mismatch/prob_abs/mean"],
        ("verl", "training/rollout_probs_diff_max"): m["mismatch/prob_abs/max"],
        ("trl", "sampling/sampling_logp_difference/mean"): m["mismatch/abs/mean"],
        ("trl", "sampling/sampling_logp_difference/max"): m["mismatch/abs/max"],
        ("trl", "sequence_ratio_max"): float(np.max(seq)),
        ("nemo-rl", "token_mult_prob_error"): float(np.mean(np.exp(np.abs(d)))),
        ("nemo-rl", "gen_kl_error"): m["mismatch/k3"],
        ("openrlhf", "vllm_kl"): -m["mismatch/k1"],
    }
    out = []
    for (fw, key), value in values.items():
        if (fw, key) in THRESHOLDS:
            thr, bad, src = THRESHOLDS[(fw, key)]
            over = value > thr if bad == "above" else value < thr
            out.append(Reading(fw, key, value, thr, src, "over" if over else "ok"))
        else:
            out.append(Reading(fw, key, value, None, "", "no threshold"))
    return out
