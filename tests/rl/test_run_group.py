"""Several runs in one process (``rla.rl.run_group``, ``rla experiment --runs-per-process``): each
run is the same run, bit for bit, as on its own; a failing run does not stop the others; a stop
checkpoints every run."""

import json
import os
import signal
import threading
from pathlib import Path

import pytest
import torch

from rla.cli import main
from rla.rl import checkpoint as ckpt
from rla.rl.run_group import run_group
from rla.rl.runlog import read_log
from rla.rl.trainer import train

from repo_root import ROOT
from toy_runs import HERE, assert_same_run, toy_config, write_grid


def _write(cfg, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(cfg.to_yaml())
    return path


def test_a_run_in_a_group_is_the_run_alone_bit_for_bit(uninterrupted, tmp_path):  # noqa: F811
    ref, _ = uninterrupted
    a = _write(toy_config(tmp_path / "a"), tmp_path / "a.yaml")
    b = _write(toy_config(tmp_path / "b", seed=1, train_precision="aligned"), tmp_path / "b.yaml")
    said = []
    status = run_group([a, b], say=said.append)
    assert status == {str(tmp_path / "a"): "finished", str(tmp_path / "b"): "finished"}
    assert_same_run(ref, tmp_path / "a")  # the other thread's run changed nothing of this one
    alone = tmp_path / "b_alone"
    run_group([_write(toy_config(alone, seed=1, train_precision="aligned"), tmp_path / "b2.yaml")], say=said.append)
    assert_same_run(alone, tmp_path / "b")
    assert "step 0 done in the group's serial first pass" in (tmp_path / "a" / "train.out").read_text()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU (CUDA streams, graph capture in threads)")
def test_on_the_gpu_three_runs_in_threads_equal_each_run_alone(tmp_path):
    """Each thread on its own CUDA stream, the sampler's CUDA graph captured per run: every run's log
    and final weights equal the same run trained alone (rla.rl.trainer.train, default stream)."""
    from lab.dose.knob import DoseOps  # a study's plug (ops=): the third run's regions round further

    kinds = [dict(seed=0), dict(seed=1, train_precision="aligned"), dict(seed=2, train_precision="aligned")]
    plugs = [None, None, DoseOps(3)]
    paths = [_write(toy_config(tmp_path / f"g{i}", device="cuda", steps=4, **kw), tmp_path / f"g{i}.yaml")
             for i, kw in enumerate(kinds)]
    assert set(run_group(paths, say=lambda *_: None, ops_for=lambda p: plugs[paths.index(p)]).values()) == {"finished"}
    for i, kw in enumerate(kinds):
        train(toy_config(tmp_path / f"alone{i}", device="cuda", steps=4, **kw), log=None, ops=plugs[i])
        assert_same_run(tmp_path / f"alone{i}", tmp_path / f"g{i}")


def test_a_failing_run_leaves_the_others_running(tmp_path):
    good = _write(toy_config(tmp_path / "good", steps=2), tmp_path / "good.yaml")
    (tmp_path / "empty_warm_start").mkdir()  # a folder, so the config is valid; no model in it, so the run fails
    bad = _write(toy_config(tmp_path / "bad", init=str(tmp_path / "empty_warm_start")), tmp_path / "bad.yaml")
    said = []
    status = run_group([bad, good], say=said.append)
    assert status == {str(tmp_path / "bad"): "failed", str(tmp_path / "good"): "finished"}
    assert len(read_log(tmp_path / "good" / "log.jsonl")) == 2
    out = (tmp_path / "bad" / "train.out").read_text()
    assert "failed to start" in out and "Traceback" in out and "empty_warm_start" in out
    assert f"{tmp_path / 'bad'}: failed" in said
    # two runs writing into one folder would overwrite each other: refused before anything runs
    with pytest.raises(ValueError, match="same folder"):
        run_group([good, good])


def test_a_stop_checkpoints_every_run_of_the_group(tmp_path):
    paths = [_write(toy_config(tmp_path / n, steps=100_000, checkpoint_every=1000), tmp_path / f"{n}.yaml")
             for n in ("x", "y")]
    timer = threading.Timer(6.0, os.kill, (os.getpid(), signal.SIGTERM))  # as an outer `timeout` would
    timer.start()
    try:
        status = run_group(paths, say=lambda *_: None)
    finally:
        timer.cancel()
    assert set(status.values()) == {"stopped"}
    for n in ("x", "y"):
        log = read_log(tmp_path / n / "log.jsonl")
        assert 1 <= len(log) < 100_000
        # stopped cleanly: the last checkpoint is the last logged step, and the summary says so
        assert ckpt.latest(tmp_path / n / "checkpoints").name == f"step_{len(log):06d}"
        assert json.loads((tmp_path / n / "summary.json").read_text())["finished"] is False


def test_experiment_groups_runs_per_process_and_resumes(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(HERE), str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")]))
    grid = write_grid(tmp_path / "grid.yaml", steps=2)
    one, grouped = tmp_path / "one", tmp_path / "grouped"
    assert main(["experiment", str(grid), "--out", str(one), "--parallel", "2"]) == 0  # one run per process
    capsys.readouterr()
    assert main(["experiment", str(grid), "--out", str(grouped), "--runs-per-process", "2"]) == 0
    assert "1 process(es) of up to 2 runs at a time" in capsys.readouterr().out
    assert (grouped / "logs" / "group__micro__bf16__s0.out").is_file()
    for r in ("micro__bf16__s0", "micro__rope__s0"):
        assert_same_run(one / "runs" / r, grouped / "runs" / r)
    write_grid(grid, steps=3)  # one step more: the group resumes both runs from their checkpoints
    assert main(["experiment", str(grid), "--out", str(grouped), "--runs-per-process", "2"]) == 0
    for r in ("micro__bf16__s0", "micro__rope__s0"):
        assert len(read_log(grouped / "runs" / r / "log.jsonl")) == 3
        assert "resumed from" in (grouped / "runs" / r / "train.out").read_text()
    assert main(["experiment", str(grid), "--out", str(grouped), "--runs-per-process", "0"]) == 2
    assert "--runs-per-process must be >= 1, got 0" in capsys.readouterr().err
