"""The one learning-rate schedule (``rla.rl.lr_schedule.lr_factor``) used by ``rla train`` and SFT.

Values at the warm-up and decay edges are pinned against the schedule written out independently
(closed forms at the points where cos is exact: 0, pi/2, pi), and both trainers are checked to
hand the optimizer exactly these factors.
"""

from __future__ import annotations

import math

import pytest
import torch

from rla.rl.lr_schedule import lr_factor


def test_warmup_is_linear_and_starts_above_zero():
    # step s of a 4-step warm-up trains at (s + 1) / 4 of the lr: 0.25, 0.5, 0.75, then 1 at the first decay step
    assert [lr_factor(s, steps=12, warmup=4) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert [lr_factor(s, steps=12, warmup=4, schedule="constant") for s in range(4)] == [0.25, 0.5, 0.75, 1.0]


@pytest.mark.parametrize("min_ratio", [0.1, 0.0, 0.5])
def test_cosine_edges(min_ratio):
    steps, warmup = 12, 4  # decay over 8 steps: step 4 -> 1, step 8 -> halfway, step 12 -> min_ratio
    f = lambda s: lr_factor(s, steps=steps, warmup=warmup, min_ratio=min_ratio)  # noqa: E731
    assert f(warmup) == 1.0
    assert f(8) == pytest.approx(min_ratio + (1 - min_ratio) / 2, abs=1e-15)  # cos(pi/2) = 0 up to 6e-17
    assert f(steps) == min_ratio
    assert f(steps + 5) == min_ratio  # held at the floor past the last step
    # strictly decreasing inside the decay, and between the floor and the peak
    vals = [f(s) for s in range(warmup, steps + 1)]
    assert all(a > b for a, b in zip(vals, vals[1:]))
    # one interior point against the textbook formula, 1/4 of the way: (1 + cos(pi/4)) / 2
    assert f(6) == pytest.approx(min_ratio + (1 - min_ratio) * (1 + math.sqrt(0.5)) / 2, rel=1e-15)


def test_constant_and_no_warmup():
    assert lr_factor(0, steps=5, warmup=0, schedule="constant") == 1.0
    assert lr_factor(99, steps=5, warmup=0, schedule="constant") == 1.0
    assert lr_factor(0, steps=5, warmup=0) == 1.0
    with pytest.raises(ValueError, match="cosine"):
        lr_factor(3, steps=5, warmup=0, schedule="linear")


def test_trainer_default_cosine_floor_is_ten_percent():
    # the RL config's documented cosine decays "to 10% of lr at the last step"
    assert lr_factor(10, steps=10, warmup=2, schedule="cosine") == pytest.approx(0.1, abs=1e-15)


def test_lambda_lr_applies_the_factors():
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=2.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, steps=6, warmup=2))
    seen = []
    for _ in range(8):
        seen.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert seen == [2.0 * lr_factor(s, steps=6, warmup=2) for s in range(8)]
    assert seen[:2] == [1.0, 2.0] and seen[-1] == pytest.approx(0.2)


def test_changing_steps_on_resume_under_a_cosine_schedule_is_refused(tmp_path):
    from toy_runs import toy_config

    from rla.rl.trainer import train

    cfg = toy_config(tmp_path, steps=2, lr_schedule="cosine", checkpoint_every=2)
    train(cfg, log=None)
    with pytest.raises(ValueError, match=r"steps 2 -> 4 under lr_schedule: cosine"):
        train(cfg.replace(steps=4), resume=True, log=None)
    constant = toy_config(tmp_path / "c", steps=2, checkpoint_every=2)
    train(constant, log=None)
    assert train(constant.replace(steps=3), resume=True, log=None)["finished"]  # constant: steps may change
