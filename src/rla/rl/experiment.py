"""``rla experiment GRID --out DIR``: models x arms x seeds as resumable ``rla train`` processes.

The grid format is ``rla.rl.grid``; the scheduler that runs processes with a deadline is
``rla.rl.scheduler``; the summary is ``rla.rl.experiment_summary``. This module puts them
together.

Every run is its own ``rla train DIR/runs/<model>__<arm>__s<seed>/config.yaml --resume``
subprocess, ``--parallel`` of them at once (several small models share one GPU that way), so an
arm that crashes or is killed does not take the others with it. Runs whose ``summary.json`` says
``finished`` are skipped; the others resume from their last checkpoint. ``--time-limit`` sends
SIGTERM to the runs still going at the deadline; each checkpoints after its current step and
exits, and the next call continues them: that is how an experiment fits calls of a few minutes.
A SIGTERM to ``rla experiment`` itself (an outer ``timeout``) stops the runs the same way; runs
that have not exited ``--grace`` seconds later are killed and resume from their last checkpoint.
A ``kill -9`` of ``rla experiment`` stops them too (each gets SIGTERM when its parent dies), and
one ``rla experiment`` writes a folder at a time (``DIR/.rla-lock``; ``rla.rl.runlock``); a call
that finds a run still written by a process an earlier call started stops it first, and refuses
a run folder written by anything else.
Checkpoints (fp32 weights + AdamW state, ~12 bytes a parameter) stay in DIR: continuing in a later
call needs DIR on that machine (or carried to it), not just the logs.

With ``init: sft`` in the base config, each model's supervised warm start runs once
(``DIR/init/<model>``) and every arm and seed of that model starts from it.

At the end (and with ``--summarize-only``) ``DIR/summary.json``, ``DIR/summary.md`` and
``DIR/plots/<model>.png`` are written from the runs' logs.

A study that plugs its own knob into the trainer (``Trainer(cfg, ops=...)``) runs its grid through
``run_grid(..., plug=MODULE)``: each job is then ``python -m MODULE RUN.yaml [RUN.yaml ...]``, the
study's own entry point, which builds its ``ops`` and runs the runs (the dose study:
``lab.dose.run``); the scheduling, warm starts, resume and summary stay these.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import yaml

from rla.progress import Progress
from rla.rl.experiment_summary import summarize_grid
from rla.rl.grid import Grid, RunSpec, is_finished, load_grid, matches_only
from rla.rl.runlock import EXPERIMENT_ENV, RunLock, end_orphans
from rla.rl.scheduler import Job, run_jobs

__all__ = ["Grid", "RunSpec", "load_grid", "make_warm_starts", "run_grid", "summarize", "summarize_grid"]


def _steps_done(run_dir: Path) -> int:
    try:
        with open(run_dir / "log.jsonl", "rb") as f:
            return sum(1 for line in f if line.endswith(b"\n"))
    except OSError:
        return 0



def run_grid(grid: Grid, out: str | Path, *, parallel: int = 1, time_limit_s: float | None = None,
             gpus: list[str] | None = None, only: str | None = None, say=print, show_progress: bool = True,
             grace_s: float = 30.0, runs_per_process: int = 1, plug: str | None = None) -> dict:
    """Warm starts, then every unfinished run; then ``summarize_grid``. Returns the summary.

    ``runs_per_process`` > 1 puts up to that many runs of one GPU into one process, a thread each
    (``rla.rl.run_group``); ``parallel`` counts processes. ``plug``: a module run as ``python -m
    plug RUN.yaml [RUN.yaml ...]`` for each job instead of ``rla train`` / ``rla.rl.run_group`` (a
    study's entry point that passes its knob to the trainer as ``ops=``; it must resume each run).
    """
    if runs_per_process < 1:
        raise ValueError(f"runs_per_process must be >= 1, got {runs_per_process}")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    with RunLock(out, what="experiment folder", say=say):  # one rla experiment per folder
        return _run_grid(grid, out, parallel=parallel, time_limit_s=time_limit_s, gpus=gpus, only=only, say=say,
                         show_progress=show_progress, grace_s=grace_s, plug=plug,
                         runs_per_process=runs_per_process)


def _run_grid(grid: Grid, out: Path, *, parallel, time_limit_s, gpus, only, say, show_progress, grace_s,
              plug, runs_per_process) -> dict:
    deadline = time.monotonic() + time_limit_s if time_limit_s else None
    specs = grid.runs(out)
    if only:
        specs = [s for s in specs if matches_only(s.name, only)]
    (out / "grid.yaml").write_text(yaml.safe_dump(
        {"base": grid.base, "models": grid.models, "arms": grid.arms, "seeds": grid.seeds}, sort_keys=False))

    # 0. runs an earlier call left writing (it was killed before it could stop them): ended, or refused
    end_orphans([Path(s.config.out_dir) for s in specs], out, grace_s=grace_s, say=say)
    env = {EXPERIMENT_ENV: f"{out.resolve()}:{os.getpid()}"}

    # 1. one warm start per model that needs it
    make_warm_starts(specs, out, parallel=parallel, deadline=deadline, gpus=gpus, say=say, grace_s=grace_s, env=env)

    # 2. the runs
    todo = []
    for i, s in enumerate(specs):
        run_dir = Path(s.config.out_dir)
        if is_finished(run_dir, s.config.steps):
            continue
        if not Path(s.config.init).exists() and s.config.init not in ("bundled", "random"):
            say(f"[yellow]{s.name}: its warm start {s.config.init} is missing (failed or out of time); skipped[/]")
            continue
        run_dir.mkdir(parents=True, exist_ok=True)
        # the grid's config for this run; the trainer keeps what it ran as config.yaml and refuses
        # to resume under a changed one
        (run_dir / "run.yaml").write_text(s.config.to_yaml())
        todo.append((s.name, run_dir, gpus[i % len(gpus)] if gpus else None))
    todo = resume_first(todo)
    jobs = _jobs(todo, runs_per_process, out, plug)
    at_once = (f"{parallel} process(es) of up to {runs_per_process} runs at a time" if runs_per_process > 1
               else f"{parallel} at a time")
    say(f"{len(specs)} run(s): {len(specs) - len(todo)} finished, {len(todo)} to run, {at_once}")
    bar = _ProgressBar(show_progress, specs)
    try:
        run_jobs(jobs, parallel, deadline, say, progress=bar.refresh, grace_s=grace_s, env=env)
    finally:
        bar.close()
    return summarize(out, grid)


def resume_first(todo: list[tuple[str, Path, str | None]]) -> list[tuple[str, Path, str | None]]:
    """The runs ordered by their latest checkpoint's step, furthest first; grid order otherwise.

    With fewer slots than runs, the runs closest to done get them: a resumed grid whose earlier call
    lost some runs (out of memory, say) finishes the survivors before it restarts those.
    """
    from rla.rl.checkpoint import list_checkpoints

    def done(entry) -> int:
        found = list_checkpoints(entry[1] / "checkpoints")
        return found[-1][0] if found else -1

    return sorted(todo, key=lambda entry: -done(entry))  # sorted is stable: ties keep the grid's order


def _jobs(todo: list[tuple[str, Path, str | None]], per_process: int, out: Path, plug: str | None = None) -> list[Job]:
    """One ``rla train`` process per run, or with ``per_process`` > 1 groups of up to that many runs
    of the same GPU in one ``rla.rl.run_group`` process (its own output in ``OUT/logs/``); with
    ``plug`` the module ``plug`` runs them instead."""
    if per_process == 1:
        single = [sys.executable, "-m", plug] if plug else [sys.executable, "-m", "rla.cli", "train"]
        resume = [] if plug else ["--resume"]
        return [Job(name, [*single, str(d / "run.yaml"), *resume], d / "train.out", gpu=gpu) for name, d, gpu in todo]
    by_gpu: dict[str | None, list] = {}
    for t in todo:
        by_gpu.setdefault(t[2], []).append(t)
    jobs = []
    for gpu, runs in by_gpu.items():
        for k in range(0, len(runs), per_process):
            part = runs[k:k + per_process]
            name = "+".join(n for n, _, _ in part)
            cmd = [sys.executable, "-m", plug or "rla.rl.run_group", *(str(d / "run.yaml") for _, d, _ in part)]
            jobs.append(Job(name, cmd, out / "logs" / f"group__{part[0][0]}.out", gpu=gpu))
    return jobs


def make_warm_starts(specs: list[RunSpec], out: Path, *, parallel: int = 1, deadline: float | None = None,
                     gpus: list[str] | None = None, say=print, grace_s: float = 30.0,
                     env: dict[str, str] | None = None) -> None:
    """The SFT warm start (``DIR/init/<model>``) of every model of ``specs`` that starts from one and
    lacks it, at most ``parallel`` at once; each is made once and reused by every arm and seed."""
    warm = {}
    for s in specs:
        folder = Path(s.config.init)
        if folder.parent == out / "init" and not (folder / "model.safetensors").is_file():
            warm.setdefault(s.model, (s, folder))
    if not warm:
        return
    jobs = []
    for i, (model, (s, folder)) in enumerate(warm.items()):
        cfg_path = out / "init" / f"{model}.yaml"
        cfg_path.parent.mkdir(parents=True, exist_ok=True)
        cfg_path.write_text(s.config.replace(init="sft", out_dir=str(folder.parent)).to_yaml())
        jobs.append(Job(f"warm start {model}", [sys.executable, "-m", "rla.rl.warm_start_process",
                                                 str(cfg_path), str(folder)],
                         out / "init" / f"{model}.out", gpu=gpus[i % len(gpus)] if gpus else None))
    say(f"warm start (SFT) of {len(jobs)} model(s): {', '.join(warm)}")
    run_jobs(jobs, parallel, deadline, say, grace_s=grace_s, env=env)
    for model, (_, folder) in warm.items():
        try:
            ev = json.loads((folder / "sft.json").read_text())["history"]["evals"][-1]
            say(f"warm start {model}: greedy accuracy {ev['greedy_acc']:.2f}, sampled (T=1) "
                f"{ev['sample_acc']:.2f} -- RL needs rewards: aim for 0.2-0.7 sampled")
        except (OSError, ValueError, KeyError, IndexError):
            pass


def summarize(out: str | Path, grid: Grid | None = None, plots: bool = True) -> dict:
    """``summarize_grid`` (summary.json / summary.md / plots) of ``out``, with ``grid`` or the one
    ``run_grid`` recorded in ``out/grid.yaml``. Returns the grid summary; ``plots=False``: no figures."""
    grid = grid if grid is not None else load_grid(Path(out) / "grid.yaml")
    return summarize_grid(out, grid, plots=plots)


class _ProgressBar:
    """Steps done over a grid's runs, read from their logs at most every 2 s."""

    def __init__(self, enabled: bool, specs: list[RunSpec]):
        self.specs = specs
        self.bar = Progress(enabled and bool(specs), "[bold]experiment[/] steps")
        self.task = self.bar.add("steps", total=sum(s.config.steps for s in specs))
        self._last = 0.0

    def refresh(self) -> None:
        if self.bar.enabled and time.monotonic() - self._last > 2.0:
            self._last = time.monotonic()
            done = sum(min(_steps_done(Path(s.config.out_dir)), s.config.steps) for s in self.specs)
            self.bar.update(self.task, completed=done)

    def close(self) -> None:
        if self.bar.enabled:
            self._last = 0.0
            self.refresh()
            self.bar.close()
