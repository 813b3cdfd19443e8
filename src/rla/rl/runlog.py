"""Per-step JSONL logs (flushed and fsync'ed every step), optional TensorBoard, run summaries.

``log.jsonl`` holds one JSON object per RL step: ``step`` (0-based), the docs/metrics.md mismatch
metrics of the training forward *before the step's first update* against the rollout logprobs
(``mismatch/...``), reward, entropy, grad norm, clip fraction, response length, learning rate,
the collapse signal (``collapse/...``), and wall-clock / memory figures under ``time/`` and
``memory/``. Everything outside ``time/`` and ``memory/`` is a deterministic function of the
config: a resumed run writes the same lines as an uninterrupted one (``DETERMINISTIC``).
"""

from __future__ import annotations

import gzip
import json
import math
import os
from pathlib import Path
from typing import Any

import numpy as np

from rla.atomic import atomic_file
from rla.metrics import pad_rows
from rla.progress import Progress as _Bar

__all__ = ["RunLog", "read_log", "deterministic_part", "summarize", "collapse_fields", "padded", "TrainingBar",
           "NONDETERMINISTIC_PREFIXES"]

#: Keys under these prefixes differ between two runs of one config (clocks, memory).
NONDETERMINISTIC_PREFIXES = ("time/", "memory/")


def deterministic_part(record: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in record.items() if not k.startswith(NONDETERMINISTIC_PREFIXES)}


def _clean(v):
    """JSON has no NaN/inf: write them as strings a reader turns back into floats."""
    if isinstance(v, float) and not math.isfinite(v):
        return repr(v)
    return v


def _unclean(v):
    if isinstance(v, str) and v in ("nan", "inf", "-inf"):
        return float(v)
    return v


def read_log(path: str | Path) -> list[dict[str, Any]]:
    """Records of a ``log.jsonl``; a torn last line (a kill mid-write) is dropped.

    A committed experiment may keep its logs gzipped: ``log.jsonl.gz`` is read when ``log.jsonl``
    is absent.
    """
    path = Path(path)
    gz = path.with_name(path.name + ".gz")
    if path.is_file():
        text = path.read_text()
    elif gz.is_file():
        text = gzip.decompress(gz.read_bytes()).decode()
    else:
        return []
    out = []
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            if i == len(lines) - 1:
                break
            raise ValueError(f"{path}:{i + 1}: not valid JSON") from None
        out.append({k: _unclean(v) for k, v in rec.items()})
    return out


class RunLog:
    """Appends step records to ``log.jsonl`` (and TensorBoard), durable after every step."""

    def __init__(self, out_dir: str | Path, *, start_step: int = 0, tensorboard: bool = False):
        self.path = Path(out_dir) / "log.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        kept = [r for r in read_log(self.path) if r["step"] < start_step]
        self.history = kept
        # rewrite atomically without the lines of steps that will run again
        with atomic_file(self.path) as f:
            for r in kept:
                f.write(json.dumps({k: _clean(v) for k, v in r.items()}) + "\n")
        self._f = open(self.path, "a")
        self._tb = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError as e:
                raise ValueError(f"tensorboard=true needs the tensorboard package ({e}); pip install tensorboard") from None
            self._tb = SummaryWriter(str(Path(out_dir) / "tb"), purge_step=start_step)

    def write(self, record: dict[str, Any]) -> None:
        self._f.write(json.dumps({k: _clean(v) for k, v in record.items()}) + "\n")
        self._f.flush()
        os.fsync(self._f.fileno())
        self.history.append(record)
        if self._tb is not None:
            for k, v in record.items():
                if isinstance(v, (int, float)) and not isinstance(v, bool) and k != "step":
                    self._tb.add_scalar(k, v, record["step"])
            self._tb.flush()

    def close(self) -> None:
        self._f.close()
        if self._tb is not None:
            self._tb.close()


def _mean(xs):
    xs = [x for x in xs if isinstance(x, (int, float)) and math.isfinite(x)]
    return sum(xs) / len(xs) if xs else None


def summarize(records: list[dict[str, Any]], window: int = 5) -> dict[str, Any]:
    """One run's summary from its log: step-0 mismatch, mismatch over training, rewards, collapse.

    ``reward_first`` / ``final_reward``: mean reward over the first / last ``window`` steps;
    ``best_reward``: the best mean over ``window`` consecutive steps. ``step0``: the first step's mismatch metrics (the
    training forward before any update against the rollouts of the initial weights).
    """
    if not records:
        return {"steps": 0}
    first = records[0]
    rewards = [r.get("reward/mean", float("nan")) for r in records]
    # means over full windows only (a run shorter than the window: over what there is)
    w = min(window, len(rewards))
    smooth = [_mean(rewards[i - w + 1 : i + 1]) for i in range(w - 1, len(rewards))]
    events = [
        {"step": r["step"], "kinds": r.get("collapse/kinds", [])} for r in records if r.get("collapse/fired")
    ]
    series = lambda key: [r.get(key) for r in records]  # noqa: E731
    return {
        "steps": len(records),
        "last_step": records[-1]["step"],
        "step0": {
            "k3": first.get("mismatch/k3"),
            "abs_mean": first.get("mismatch/abs/mean"),
            "clip_leak_0.2": first.get("mismatch/clip_leak/0.2"),
            "bitwise_equal": first.get("mismatch/bitwise/equal"),
            # MoE runs (rla.rl.routes): per layer, and the layer mean / any-layer fractions
            "routing_set_differs": first.get("routing/set_differs"),
            "routing_set_differs_mean": first.get("routing/set_differs_mean"),
            "routing_any_layer_set_differs": first.get("routing/any_layer_set_differs"),
            "routing_weight_abs_max": first.get("routing/weight_abs_max"),
        },
        "mismatch_mean": {
            "k3": _mean(series("mismatch/k3")),
            "abs_mean": _mean(series("mismatch/abs/mean")),
            "clip_leak_0.2": _mean(series("mismatch/clip_leak/0.2")),
            "routing_set_differs_mean": _mean(series("routing/set_differs_mean")),
            "routing_any_layer_set_differs": _mean(series("routing/any_layer_set_differs")),
        },
        "mismatch_last": {
            "k3": records[-1].get("mismatch/k3"),
            "abs_mean": records[-1].get("mismatch/abs/mean"),
        },
        "reward_first": smooth[0],
        "final_reward": _mean(rewards[-window:]),
        "best_reward": max((s for s in smooth if s is not None), default=None),
        "collapse_events": events,
        "first_collapse_step": events[0]["step"] if events else None,
        "wall_time_s": records[-1].get("time/elapsed_s"),
        "peak_memory_mb": max((r.get("memory/peak_mb") or 0 for r in records), default=None),
    }


def collapse_fields(history: list[dict[str, Any]], cfg) -> dict[str, Any]:
    """docs/metrics.md's collapse signal for the last record of ``history`` (the current step).

    ``rla.metrics.collapse_signal`` over the run's k3, grad-norm and reward series; the signal is
    reported on the step it fires. Grad norms of steps whose updates were all skipped (fp16
    overflow) repeat the last value rather than counting as a non-finite grad norm.
    """
    from rla.metrics import collapse_signal

    k3 = [h.get("mismatch/k3", float("nan")) for h in history]
    fired = []
    if k3 and math.isfinite(k3[0]):
        gn = _fill_forward([h.get("train/grad_norm", float("nan")) for h in history])
        rw = [h["reward/mean"] for h in history]
        events = collapse_signal(k3, gn, rw, k3_factor=cfg.collapse_k3_factor, grad_factor=cfg.collapse_grad_factor,
                                 window=cfg.collapse_window, reward_drop=cfg.collapse_reward_drop)
        fired = [e for e in events if e.step == len(history) - 1]
    out: dict[str, Any] = {"collapse/fired": bool(fired), "collapse/kinds": sorted({k for e in fired for k in e.kinds})}
    if fired:
        out["collapse/message"] = "; ".join(e.message for e in fired)
    return out


def padded(train: list[np.ndarray], rollout: list[np.ndarray]):
    """Right-padded [B, R] arrays, mask and lengths for ``rla.metrics.mismatch``."""
    a, m = pad_rows(train)
    b, _ = pad_rows(rollout)
    return a, b, m, m.sum(axis=1)


def _fill_forward(xs: list[float]) -> list[float]:
    """Grad norms of steps whose updates were all skipped (fp16 overflow) take the last value."""
    out, last = [], None
    for x in xs:
        if x is None or not math.isfinite(x):
            x = last if last is not None else 0.0
        out.append(x)
        last = x
    return out


class TrainingBar:
    """The training bar (``rla.progress.Progress``) over steps with the latest reward and k3."""

    def __init__(self, enabled: bool, start: int, end: int):
        self.bar = _Bar(enabled, "[bold]train[/]", eta=True, info=True)
        self.task = self.bar.add("train", total=end, completed=start, info="")

    def update(self, step: int, rec: dict) -> None:
        if self.bar.enabled:
            info = f"reward {rec['reward/mean']:.3f}  k3 {rec.get('mismatch/k3', float('nan')):.2e}"
            if rec.get("collapse/fired"):
                info += "  [red]collapse signal[/]"
            self.bar.update(self.task, completed=step, info=info)

    def close(self) -> None:
        self.bar.close()
