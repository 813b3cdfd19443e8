"""Timing and result files shared by the benchmarks (the environment stamp is :mod:`rla.environment`).

Timing follows the usual rules for memory-bound kernels: CUDA events around the timed region
only, the L2 cache (60 MB on an H200) flushed before every repetition by writing a 256 MB
buffer, warm-up runs first (Triton and Inductor compile there), median of the repetitions.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any, Callable

import torch

_FLUSH: dict[torch.device, torch.Tensor] = {}


def flush_l2(device: torch.device) -> None:
    buf = _FLUSH.get(device)
    if buf is None:
        buf = _FLUSH[device] = torch.empty(256 * 2**20, dtype=torch.int8, device=device)
    buf.zero_()


def time_reps_ms(
    fn: Callable[[Any], Any],
    setup: Callable[[], Any] = lambda: None,
    *,
    warmup: int = 3,
    reps: int = 20,
    device: torch.device | None = None,
) -> list[float]:
    """Milliseconds of each timed ``fn(setup())``; ``setup`` (untimed) prepares each repetition.
    The warm-up flushes too, so the flush buffer's allocation is not in the first timed rep."""
    device = device or torch.device("cuda")
    for _ in range(warmup):
        state = setup()
        flush_l2(device)
        fn(state)
    torch.cuda.synchronize(device)
    times = []
    for _ in range(reps):
        state = setup()
        flush_l2(device)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn(state)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
        del state
    return times


def time_ms(
    fn: Callable[[Any], Any],
    setup: Callable[[], Any] = lambda: None,
    *,
    warmup: int = 3,
    reps: int = 20,
    device: torch.device | None = None,
) -> float:
    """Median milliseconds of ``fn(setup())`` (:func:`time_reps_ms`)."""
    return statistics.median(time_reps_ms(fn, setup, warmup=warmup, reps=reps, device=device))


def copy_bandwidth_gbs(device: torch.device, nbytes: int = 2 * 2**30, reps: int = 20) -> float:
    """Device-to-device copy rate in GB/s, counting bytes read plus bytes written."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=device).random_(0, 255)
    dst = torch.empty_like(src)
    ms = time_ms(lambda _: dst.copy_(src), reps=reps, device=device)
    del src, dst
    torch.cuda.empty_cache()
    return 2 * nbytes / (ms * 1e-3) / 1e9


def write_results(out_dir: str | Path, stem: str, payload: dict, markdown: str) -> tuple[Path, Path]:
    """Write ``<stem>.json`` and ``<stem>.md`` under ``out_dir``; returns both paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    jp, mp = out / f"{stem}.json", out / f"{stem}.md"
    jp.write_text(json.dumps(payload, indent=2, default=str) + "\n")
    mp.write_text(markdown)
    return jp, mp
