"""One writer per run folder, children that die with ``rla experiment``, and a full disk during a
checkpoint: nothing lost, nothing mixed (issue 38, item 3).

- two ``rla train`` on one out_dir: one runs, the other is refused naming the first;
- ``kill -9`` of ``rla experiment``: its ``rla train`` children stop too, and the next call
  resumes them to the same runs an uninterrupted grid gives; an orphan that survived anyway is
  stopped by the next call, a foreign writer refused;
- a file-size limit (``RLIMIT_FSIZE``, what a full disk looks like to ``write``) during a
  checkpoint: a clear error, the previous checkpoint intact, and the resume is bit-identical.
"""

import json
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from rla.rl import checkpoint as ckpt
from rla.rl.runlock import EXPERIMENT_ENV, LOCK_NAME, RunLock, RunLockedError, end_orphans, is_held, owner
from rla.rl.runlog import read_log
from rla.rl.trainer import Trainer, train

from repo_root import ROOT
from toy_runs import assert_same_run, toy_config

HERE = Path(__file__).resolve().parent
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(HERE), str(ROOT / "tests"),
                                                    os.environ.get("PYTHONPATH", "")])}


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    out = tmp_path_factory.mktemp("reference")
    train(toy_config(out), log=None)
    return out


def _wait(cond, timeout=60.0, every=0.05):
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            return False
        time.sleep(every)
    return True


def test_the_lock_names_its_owner_and_is_dropped_when_it_dies(tmp_path):
    with RunLock(tmp_path) as lock:
        with pytest.raises(RunLockedError, match=rf"being written by another process: pid {os.getpid()} on host"):
            RunLock(tmp_path)
        assert owner(tmp_path)["pid"] == os.getpid() and is_held(tmp_path)
    assert not is_held(tmp_path) and owner(tmp_path) == {}  # released: an empty file, never deleted
    code = (f"from rla.rl.runlock import RunLock; RunLock({str(tmp_path)!r}); import time; print('held', flush=True); "
            "time.sleep(60)")
    p = subprocess.Popen([sys.executable, "-c", code], env=ENV, stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "held"
        with pytest.raises(RunLockedError, match=rf"pid {p.pid} on host .*\(kill {p.pid}\)"):
            RunLock(tmp_path)
    finally:
        p.kill()
        p.wait()
    said = []
    RunLock(tmp_path, say=said.append).release()  # kill -9 dropped the flock: taken over, and said so
    assert said and f"taking over the lock of pid {p.pid}" in said[0]
    (tmp_path / LOCK_NAME).write_text(json.dumps({"pid": 1, "host": "another-host", "started": "earlier"}))
    with pytest.raises(RunLockedError, match="another host.*--take-over"):
        RunLock(tmp_path)
    RunLock(tmp_path, take_over=True).release()


@pytest.mark.slow
def test_two_writers_on_one_run_folder_one_is_refused_and_the_other_is_untouched(reference, tmp_path):
    out = tmp_path / "run"
    cfg = toy_config(out)
    (tmp_path / "run.yaml").write_text(cfg.to_yaml())
    cmd = [sys.executable, "-m", "rla.cli", "train", str(tmp_path / "run.yaml"), "--resume"]
    procs = [subprocess.Popen(cmd, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for _ in range(2)]
    outs = [p.communicate(timeout=300)[0].decode(errors="replace") for p in procs]
    codes = sorted(p.returncode for p in procs)
    assert codes == [0, 2], outs
    winner, loser = (0, 1) if procs[0].returncode == 0 else (1, 0)
    assert f"is being written by another process: pid {procs[winner].pid} on host" in outs[loser].replace("\n", "")
    assert_same_run(reference, out)  # the writer that ran is exactly an undisturbed run
    assert not list((out / "checkpoints").glob(".tmp_*"))
    # and in one process: a second Trainer on a folder a first one holds
    first = Trainer(toy_config(tmp_path / "b"), log=None)
    try:
        with pytest.raises(RunLockedError, match=f"pid {os.getpid()}"):
            Trainer(toy_config(tmp_path / "b"), log=None)
    finally:
        first.close()
    assert not is_held(tmp_path / "b")


def test_temporary_checkpoint_names_are_a_writers_own(tmp_path):
    a, b = ckpt.tmp_dir(tmp_path, 1, "aaaa"), ckpt.tmp_dir(tmp_path, 1, "bbbb")
    assert a != b and a.name.startswith(".tmp_step_000001.")
    w = {"w": torch.ones(2)}
    ckpt.write_rng(tmp_path, 1, 0, {"x": 1}, {"t": torch.zeros(1)}, tag="aaaa")
    b.mkdir()
    (b / "half.bin").write_bytes(b"another writer's half-written file")
    ckpt.save(tmp_path, 1, model=w, optimizer_state={}, state={"step": 1}, tag="aaaa")
    assert [s for s, _ in ckpt.list_checkpoints(tmp_path)] == [1]
    assert (tmp_path / "step_000001" / "rng_rank0.json").is_file()


def _experiment_grid(path: Path, steps: int) -> Path:
    path.write_text(f"""
base: {{arch: qwen2, size: micro, init: random, task: "toy_runs:ToyTask", difficulty: 1, prompts_per_step: 2,
        group_size: 4, max_new_tokens: 8, device: cpu, lr: 3.0e-3, checkpoint_every: 1, steps: {steps}}}
models: {{micro: {{}}}}
arms: {{bf16: {{train_precision: bf16}}}}
seeds: [0, 1]
""")
    return path


@pytest.mark.slow
def test_kill_9_of_experiment_stops_its_runs_and_the_resume_finishes_them_unmixed(tmp_path, monkeypatch):
    from rla.cli import main
    from rla.rl.config import load_config

    steps = 30  # long enough that a fast CPU is still mid-run when the kill lands (10 finished first on one)
    grid = _experiment_grid(tmp_path / "grid.yaml", steps=steps)
    out = tmp_path / "exp"
    proc = subprocess.Popen([sys.executable, "-m", "rla.cli", "experiment", str(grid), "--out", str(out),
                             "--parallel", "2"], env=ENV, stdout=subprocess.DEVNULL,
                            stderr=subprocess.STDOUT, start_new_session=True)
    runs = [out / "runs" / f"micro__bf16__s{s}" for s in (0, 1)]
    seen = {}  # each run's pid, read from its lock as soon as the lock names it (a finished run's lock is empty)

    def started():
        for r in runs:
            if "pid" in (info := owner(r) or {}):
                seen.setdefault(r, info["pid"])
        return len(seen) == len(runs) and all(len(read_log(r / "log.jsonl")) >= 2 for r in runs)

    try:
        assert _wait(started, 240), "runs never started"
        pids = [seen[r] for r in runs]
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        # the children got SIGTERM from the kernel when their parent died: they stop after their step
        assert _wait(lambda: not any(is_held(r) for r in runs), 60), [owner(r) for r in runs]
        for pid in pids:
            assert _wait(lambda: not Path(f"/proc/{pid}").exists() or
                         Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z", 10), pid
        stopped = [len(read_log(r / "log.jsonl")) for r in runs]
        assert all(n < steps for n in stopped), stopped  # stopped mid-run, not finished
    finally:
        with_pid = [owner(r) or {} for r in runs]
        for info in with_pid:  # never leave a process behind, whatever failed above
            if "pid" in info and Path(f"/proc/{info['pid']}").exists():
                os.kill(info["pid"], signal.SIGKILL)
    # the resume, in this process: continues both from their checkpoints and finishes them
    monkeypatch.setenv("PYTHONPATH", ENV["PYTHONPATH"])
    assert main(["experiment", str(grid), "--out", str(out), "--parallel", "2"]) == 0
    for r in runs:
        log = read_log(r / "log.jsonl")
        assert [x["step"] for x in log] == list(range(steps))
    # nothing mixed: the killed-and-resumed run is the run that was never interrupted
    ref = tmp_path / "ref"
    train(load_config(str(runs[1] / "run.yaml"), [f"out_dir={ref}"]), log=None)
    assert_same_run(ref, runs[1])


def test_a_resume_stops_an_orphan_of_an_earlier_experiment_and_refuses_a_foreign_writer(tmp_path):
    exp = tmp_path / "exp"
    run = exp / "runs" / "a"
    code = (f"import signal, sys, time\nfrom rla.rl.runlock import RunLock\nlock = RunLock({str(run)!r})\n"
            "signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))\nprint('held', flush=True)\ntime.sleep(120)\n")
    dead_experiment = {EXPERIMENT_ENV: f"{exp.resolve()}:999999999"}
    orphan = subprocess.Popen([sys.executable, "-c", code], env={**ENV, **dead_experiment},
                              stdout=subprocess.PIPE, text=True)
    try:
        assert orphan.stdout.readline().strip() == "held"
        said = []
        with RunLock(exp, what="experiment folder"):
            end_orphans([run], exp, grace_s=20, say=said.append)
        assert orphan.wait(timeout=5) == 0  # stopped with SIGTERM (it checkpoints and exits)
        assert not is_held(run) and f"pid {orphan.pid}" in said[0] and "stopping it" in said[0]
    finally:
        orphan.kill()
        orphan.wait()
    foreign = subprocess.Popen([sys.executable, "-c", code], env=ENV, stdout=subprocess.PIPE, text=True)
    try:
        assert foreign.stdout.readline().strip() == "held"
        with pytest.raises(RunLockedError, match=f"did not start .*pid {foreign.pid}"):
            end_orphans([run], exp, grace_s=1)
        assert foreign.poll() is None  # left alone
    finally:
        foreign.kill()
        foreign.wait()


def _limit_file_size(limit: int):
    def pre():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG, as ENOSPC would
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return pre


@pytest.mark.slow
def test_a_full_disk_during_a_checkpoint_loses_nothing_and_the_resume_is_bitwise_identical(reference, tmp_path):
    out = tmp_path / "run"
    cfg = toy_config(out)
    path = tmp_path / "run.yaml"
    path.write_text(cfg.to_yaml())
    cmd = [sys.executable, "-m", "rla.cli", "train", str(path)]
    train(cfg, until_step=2, log=None)  # the first checkpoint, in process: only the resume needs its own limit
    before = ckpt.latest(out / "checkpoints")
    assert before.name == "step_000002"
    files = {f.name: f.read_bytes() for f in before.iterdir()}
    limit = (before / "model.safetensors").stat().st_size // 2  # the log fits, a checkpoint does not
    p = subprocess.run(cmd + ["--resume"], env=ENV, capture_output=True, text=True, preexec_fn=_limit_file_size(limit))
    err = (p.stdout + p.stderr).replace("\n", "")
    assert p.returncode == 2, err
    assert "could not write the checkpoint of step 4" in err and "step_000002, is intact" in err
    assert "Traceback" not in err
    assert [s for s, _ in ckpt.list_checkpoints(out / "checkpoints")] == [2]
    assert {f.name: f.read_bytes() for f in before.iterdir()} == files  # byte for byte
    assert not list((out / "checkpoints").glob(".tmp_*"))  # the partial files are gone
    assert not is_held(out)
    assert train(cfg, resume=True, log=None)["finished"]  # in process: a third interpreter costs ~10 s
    assert_same_run(reference, out)
