"""The trainer's plug (``Trainer(cfg, ops=...)``): how a study's knob enters the training forward.

A plug that only delegates to ``rla.ops`` is called for every aligned region and leaves the run
bit for bit as it was; a plug that changes a region's output moves the training forward (step-0
k3) and leaves the rollouts (the reward) alone; a plug on an arm with nothing aligned is refused.
"""

from __future__ import annotations

from collections import Counter

import pytest

from rla import ops as rla_ops
from rla.rl.runlog import deterministic_part, read_log
from rla.rl.trainer import train

from toy_runs import toy_config


class Recording:
    """``rla.ops``' four region ops, counted; ``bump`` scales SwiGLU's output (a changed region)."""

    def __init__(self, bump: float = 0.0):
        self.calls, self.bump = Counter(), bump

    def rope(self, q, k, cos, sin, profile, unsqueeze_dim: int = 1, dtype=None):
        self.calls["rope"] += 1
        return rla_ops.rope(q, k, cos, sin, profile, unsqueeze_dim=unsqueeze_dim, dtype=dtype)

    def swiglu(self, gate, up, profile):
        self.calls["swiglu"] += 1
        out = rla_ops.swiglu(gate, up, profile)
        return out * (1 + self.bump) if self.bump else out

    def rms_norm(self, x, weight, eps, profile, dtype=None, out_dtype=None):
        self.calls["rms_norm"] += 1
        return rla_ops.rms_norm(x, weight, eps, profile, dtype=dtype, out_dtype=out_dtype)

    def add_rms_norm(self, x, residual, weight, eps, profile):
        self.calls["add_rms_norm"] += 1
        return rla_ops.add_rms_norm(x, residual, weight, eps, profile)


def _run(out, ops=None):
    train(toy_config(out, train_precision="aligned", steps=2), log=None, ops=ops)
    return read_log(out / "log.jsonl")


def test_a_delegating_plug_is_called_and_changes_nothing(tmp_path):
    plug = Recording()
    plugged, plain = _run(tmp_path / "plugged", plug), _run(tmp_path / "plain")
    assert plug.calls["rope"] > 0 and plug.calls["swiglu"] > 0
    assert plug.calls["rms_norm"] + plug.calls["add_rms_norm"] > 0
    assert [deterministic_part(r) for r in plugged] == [deterministic_part(r) for r in plain]


def test_a_changing_plug_moves_the_training_forward_not_the_rollouts(tmp_path):
    bumped, plain = _run(tmp_path / "bumped", Recording(bump=2.0**-3)), _run(tmp_path / "plain")
    assert bumped[0]["reward/mean"] == plain[0]["reward/mean"]  # same weights, same rollouts at step 0
    assert bumped[0]["mismatch/k3"] > 10 * plain[0]["mismatch/k3"]


def test_a_plug_needs_the_aligned_arm(tmp_path):
    with pytest.raises(ValueError, match="ops= replaces the aligned regions' ops and needs precision='aligned'"):
        train(toy_config(tmp_path / "x", train_precision="bf16", steps=1), log=None, ops=Recording())


def test_run_group_passes_each_run_its_plug(tmp_path):
    """``run_group(paths, ops_for=...)`` (a study's grid job): the plugged run equals that run trained
    alone with the same plug; the unplugged run beside it gets none."""
    from rla.rl.run_group import run_group

    paths = []
    for name, precision in (("plain", "bf16"), ("bumped", "aligned")):
        path = tmp_path / f"{name}.yaml"
        path.write_text(toy_config(tmp_path / name, train_precision=precision, steps=2).to_yaml())
        paths.append(path)
    plugs = {paths[1]: Recording(bump=2.0**-3)}
    status = run_group(paths, say=lambda *_: None, ops_for=lambda p: plugs.get(p))
    assert set(status.values()) == {"finished"}
    assert plugs[paths[1]].calls["swiglu"] > 0
    alone = _run(tmp_path / "alone", Recording(bump=2.0**-3))
    grouped = read_log(tmp_path / "bumped" / "log.jsonl")
    assert [deterministic_part(r) for r in grouped] == [deterministic_part(r) for r in alone]
