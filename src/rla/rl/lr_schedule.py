"""The learning-rate schedule shared by RL training (``rla train``) and the SFT warm start.

Linear warm-up over ``warmup`` steps (step ``s`` gets ``(s + 1) / warmup``, so the first step
already trains), then either a constant factor of 1 or a cosine decay from 1 down to
``min_ratio`` at step ``steps`` (held there past it). The factor multiplies the base lr through
``torch.optim.lr_scheduler.LambdaLR``; one function so both trainers decay the same way.
"""

from __future__ import annotations

import math

__all__ = ["lr_factor", "SCHEDULES"]

SCHEDULES = ("constant", "cosine")


def lr_factor(step: int, *, steps: int, warmup: int, schedule: str = "cosine", min_ratio: float = 0.1) -> float:
    """The lr multiplier at ``step`` (0-based) of a ``steps``-step run."""
    if step < warmup:
        return (step + 1) / warmup
    if schedule == "constant":
        return 1.0
    if schedule != "cosine":
        raise ValueError(f"lr schedule must be one of {SCHEDULES}, got {schedule!r}")
    progress = min(1.0, (step - warmup) / max(1, steps - warmup))
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))
