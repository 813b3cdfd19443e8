"""``rla experiment``: arms x seeds as ``rla train`` subprocesses, resumed by the next call, with
summary.json / summary.md / plots written from the logs."""

import json
import os
import time
from pathlib import Path

import pytest

from rla.cli import main
from rla.rl import checkpoint as ckpt
from rla.rl.experiment import load_grid
from rla.rl.runlog import read_log

from repo_root import ROOT
from toy_runs import HERE, write_grid

def test_grid_runs_resumes_and_summarises(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(HERE), str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")]))
    out = tmp_path / "exp"
    grid = write_grid(tmp_path / "grid.yaml", steps=2)
    t0 = time.monotonic()
    assert main(["experiment", str(grid), "--out", str(out), "--parallel", "2"]) == 0
    first = time.monotonic() - t0  # start-up and 2 steps of each run, on this machine under its load now
    runs = sorted(p.name for p in (out / "runs").iterdir())
    assert runs == ["micro__bf16__s0", "micro__rope__s0"]
    assert [len(read_log(out / "runs" / r / "log.jsonl")) for r in runs] == [2, 2]

    # more steps in the grid: the next call continues each run from its last checkpoint, and its
    # time limit stops them (checkpointed after the current step) long before the last step; an idle
    # machine runs ~16 micro steps a second (200 steps were once done within a 12 s limit). The limit
    # is 12 s or 3x the first call, whichever is longer: on a loaded 2-core machine the start-up alone
    # took longer than 12 s, and the runs were stopped before their first new step
    write_grid(grid, steps=100_000)
    limit = max(12.0, 3 * first)
    assert main(["experiment", str(grid), "--out", str(out), "--parallel", "2", "--time-limit", f"{limit:.0f}"]) == 0
    text = capsys.readouterr().out
    assert "2 to run" in text and "time limit: stopping 2 run(s)" in text and "0/2 runs finished" in text
    for r in runs:
        log = read_log(out / "runs" / r / "log.jsonl")
        assert 2 < len(log) < 100_000 and [rec["step"] for rec in log] == list(range(len(log)))
        assert "resumed from" in (out / "runs" / r / "train.out").read_text()
        # stopped cleanly: the last checkpoint is the last logged step, nothing to redo
        assert ckpt.latest(out / "runs" / r / "checkpoints").name == f"step_{len(log):06d}"
        assert json.loads((out / "runs" / r / "summary.json").read_text())["finished"] is False
    # back to 3 steps: every run is past it, so nothing runs; the summary is rewritten
    write_grid(grid, steps=3)
    assert main(["experiment", str(grid), "--out", str(out)]) == 0
    assert "0 to run" in capsys.readouterr().out

    summary = json.loads((out / "summary.json").read_text())
    arms = {a["arm"]: a for a in summary["arms"]}
    assert set(arms) == {"bf16", "rope"} and all(a["seeds_finished"] == 1 for a in arms.values())
    for a in arms.values():
        assert a["step0_k3"]["n"] == 1 and a["step0_k3"]["mean"] >= 0 and a["final_reward"]["mean"] is not None
    md = (out / "summary.md").read_text()
    assert "| bf16 |" in md and "| rope |" in md and "step-0 k3" in md
    # the runs' own environment (from their summary.json), not only the summarizing machine's
    import torch

    assert [e["torch"] for e in summary["run_environments"]] == [torch.__version__]
    assert f"Runs: GPU: none (CPU) · torch {torch.__version__}" in md
    assert (out / "plots" / "micro.png").stat().st_size > 10_000

    assert main(["experiment", str(grid), "--out", str(out), "--summarize-only"]) == 0


def test_grid_errors_name_the_problem(tmp_path):
    bad = tmp_path / "g.yaml"
    bad.write_text("base: {}\narms: {a: {train_precison: bf16}}\n")
    with pytest.raises(ValueError, match="did you mean train_precision"):
        load_grid(bad)
    bad.write_text("base: {}\narms: {}\n")
    with pytest.raises(ValueError, match="arms must be a non-empty mapping"):
        load_grid(bad)
    bad.write_text("base: {}\narms: {x: {}}\nseeds: [0]\nmodels: {m: {}}\n")
    specs = load_grid(bad).runs(tmp_path / "o")
    assert [s.name for s in specs] == ["m__x__s0"] and specs[0].config.init == str(tmp_path / "o" / "init" / "m")


def test_resumed_runs_take_the_free_slots_first(tmp_path):
    """A grid resumed after some runs died starts the runs with the most checkpointed steps first;
    runs without a checkpoint keep the grid's order behind them."""
    from rla.rl.experiment import resume_first

    steps = {"a": None, "b": 12, "c": None, "d": 30, "e": 12}
    todo = []
    for name, step in steps.items():
        d = tmp_path / name
        if step is not None:
            (d / "checkpoints" / f"step_{step}").mkdir(parents=True)
            (d / "checkpoints" / f"step_{step}" / "state.json").write_text("{}")
            (d / "checkpoints" / "step_99").mkdir()  # incomplete (no state.json): not progress
        todo.append((name, d, None))
    assert [n for n, _, _ in resume_first(todo)] == ["d", "b", "e", "a", "c"]
