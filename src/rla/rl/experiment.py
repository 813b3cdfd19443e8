"""``rla experiment GRID --out DIR``: models x arms x seeds as resumable ``rla train`` processes.

A grid file::

    base: grpo_tiny.yaml            # a TrainConfig YAML (relative to this file) or a mapping
    overrides: {steps: 200}         # optional, applied to base
    models:                         # optional axis (default: one model, "model")
      qwen2-tiny: {arch: qwen2, size: tiny}
      llama-tiny: {arch: llama, size: tiny}
    arms:
      bf16:    {train_precision: bf16}
      aligned: {train_precision: aligned}
      rope:    {train_precision: aligned, align_regions: [rope]}
      fp16:    {train_precision: fp16}
    seeds: [0, 1, 2]

Every run is its own ``rla train DIR/runs/<model>__<arm>__s<seed>/config.yaml --resume``
subprocess, ``--parallel`` of them at once (several small models share one GPU that way), so an
arm that crashes or is killed does not take the others with it. Runs whose ``summary.json`` says
``finished`` are skipped; the others resume from their last checkpoint. ``--time-limit`` sends
SIGTERM to the runs still going at the deadline; each checkpoints after its current step and
exits, and the next call continues them: that is how an experiment fits calls of a few minutes.
A SIGTERM to ``rla experiment`` itself (an outer ``timeout``) stops the runs the same way; runs
that have not exited ``--grace`` seconds later are killed and resume from their last checkpoint.
Checkpoints (fp32 weights + AdamW state, ~12 bytes a parameter) stay in DIR: continuing in a later
call needs DIR on that machine (or carried to it), not just the logs.

With ``init: sft`` in the base config, each model's supervised warm start runs once
(``DIR/init/<model>``) and every arm and seed of that model starts from it.

At the end (and with ``--summarize-only``) ``DIR/summary.json``, ``DIR/summary.md`` and
``DIR/plots/<model>.png`` are written from the runs' logs.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from rla.rl.config import TrainConfig, _check_keys, read_yaml_mapping
from rla.environment import environment
from rla.rl.runlog import read_log, summarize

__all__ = ["Grid", "RunSpec", "load_grid", "run_grid", "summarize_grid"]


@dataclass
class RunSpec:
    model: str
    arm: str
    seed: int
    config: TrainConfig

    @property
    def name(self) -> str:
        return f"{self.model}__{self.arm}__s{self.seed}"


@dataclass
class Grid:
    models: dict[str, dict]
    arms: dict[str, dict]
    seeds: list[int]
    base: dict[str, Any]
    source: Path | None = None

    def runs(self, out: Path) -> list[RunSpec]:
        specs = []
        for model, model_over in self.models.items():
            for arm, arm_over in self.arms.items():
                for seed in self.seeds:
                    values = {**self.base, **model_over, **arm_over, "seed": seed,
                              "out_dir": str(out / "runs" / f"{model}__{arm}__s{seed}"), "progress": False}
                    if values.get("init", "sft") == "sft":
                        values["init"] = str(out / "init" / model)
                    specs.append(RunSpec(model, arm, seed, _config(values, f"{model}/{arm}/seed {seed}")))
        return specs


def _config(values: dict, where: str) -> TrainConfig:
    init = values.get("init")
    # the warm-start folder does not exist before it is made: validate with init=sft meanwhile
    check = dict(values, init="sft") if init and not Path(init).exists() and init not in ("sft", "bundled", "random") else values
    try:
        cfg = TrainConfig(**check)
    except (TypeError, ValueError) as e:
        raise ValueError(f"grid run {where}: {e}") from None
    cfg.init = values.get("init", cfg.init)
    return cfg


def load_grid(path: str | Path) -> Grid:
    path = Path(path)
    raw = read_yaml_mapping(path, "grid file", "a grid is a mapping with base, arms and seeds")
    unknown = set(raw) - {"base", "overrides", "models", "arms", "seeds"}
    if unknown:
        raise ValueError(f"{path}: unknown grid key(s) {sorted(unknown)}; known: base, overrides, models, arms, seeds")
    base = raw.get("base", {})
    if isinstance(base, str):
        base_path = (path.parent / base) if not Path(base).is_absolute() else Path(base)
        base = read_yaml_mapping(base_path, f"{path}: base config", "a config file is a mapping of field: value")
    if not isinstance(base, dict):
        raise ValueError(f"{path}: base must be a config file name or a mapping")
    base = {**base, **(raw.get("overrides") or {})}
    models = raw.get("models") or {"model": {}}
    arms = raw.get("arms")
    if not arms or not isinstance(arms, dict):
        raise ValueError(f"{path}: arms must be a non-empty mapping of arm name -> config overrides")
    seeds = raw.get("seeds", [0])
    if isinstance(seeds, int):
        seeds = list(range(seeds))
    if not seeds or not all(isinstance(s, int) for s in seeds):
        raise ValueError(f"{path}: seeds must be a list of ints (or a count), got {seeds!r}")
    for name, over in [*models.items(), *arms.items()]:
        if not isinstance(over, dict):
            raise ValueError(f"{path}: {name} must map to config overrides, got {type(over).__name__}")
        if "__" in str(name) or "/" in str(name):
            raise ValueError(f"{path}: name {name!r} may not contain '__' or '/' (it names a folder)")
        _check_keys(over, f"{path}: {name}")
    _check_keys(base, f"{path}: base")
    return Grid(models=dict(models), arms=dict(arms), seeds=list(seeds), base=base, source=path)


# ----------------------------------------------------------------------------------------- running


def _is_finished(run_dir: Path, steps: int) -> bool:
    """True when the run's summary says it reached ``steps`` (a grid may raise steps later)."""
    try:
        return int(json.loads((run_dir / "summary.json").read_text()).get("step", 0)) >= steps
    except (OSError, ValueError):
        return False


def _steps_done(run_dir: Path) -> int:
    try:
        with open(run_dir / "log.jsonl", "rb") as f:
            return sum(1 for line in f if line.endswith(b"\n"))
    except OSError:
        return 0


def _env(gpu: str | None, threads: int | None = None) -> dict[str, str]:
    env = dict(os.environ)
    if threads is not None and "OMP_NUM_THREADS" not in env:
        # N runs on one host: each gets its share of the cores instead of all of them
        env["OMP_NUM_THREADS"] = str(threads)
    src = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    if gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = gpu
    return env


@dataclass
class _Job:
    name: str
    cmd: list[str]
    log: Path
    gpu: str | None = None
    threads: int | None = None
    proc: subprocess.Popen | None = None
    rc: int | None = None


def _run_jobs(jobs: list[_Job], parallel: int, deadline: float | None, say, progress=None,
              grace_s: float = 30.0) -> dict[str, int | None]:
    """Run ``jobs`` ``parallel`` at a time; at ``deadline`` SIGTERM what runs and wait for it.

    A SIGTERM or SIGINT to this process (an outer ``timeout``, Ctrl-C) counts as the deadline:
    the runs are stopped the same way (checkpointed after their current step), not orphaned.
    Runs still going ``grace_s`` after the stop are killed (they resume from their last
    checkpoint).
    """
    pending, running, done = list(jobs), [], {}
    threads = max(1, (os.cpu_count() or 1) // max(1, min(parallel, len(jobs) or 1)))
    for job in jobs:
        job.threads = threads
    stop_requested = False

    def on_signal(signum, frame):
        nonlocal stop_requested
        stop_requested = True

    previous = {}
    try:
        for sig in (signal.SIGTERM, signal.SIGINT):
            previous[sig] = signal.signal(sig, on_signal)
    except ValueError:  # not the main thread
        previous = {}
    terminated, stop_by = False, None
    try:
        while pending or running:
            now = time.monotonic()
            if (stop_requested or (deadline is not None and now > deadline)) and not terminated:
                terminated = True
                for job in running:
                    job.proc.send_signal(signal.SIGTERM)
                why = "stop requested" if stop_requested else "time limit"
                say(f"{why}: stopping {len(running)} run(s) after their current step; {len(pending)} not started")
                for job in pending:
                    done[job.name] = None
                pending = []
                stop_by = now + grace_s
            while pending and len(running) < parallel and not terminated:
                job = pending.pop(0)
                job.log.parent.mkdir(parents=True, exist_ok=True)
                with open(job.log, "ab") as out:
                    job.proc = subprocess.Popen(job.cmd, stdout=out, stderr=subprocess.STDOUT,
                                                env=_env(job.gpu, job.threads), start_new_session=True)
                running.append(job)
            for job in list(running):
                rc = job.proc.poll()
                if rc is not None:
                    job.rc = rc
                    done[job.name] = rc
                    running.remove(job)
                    if rc != 0 and not terminated:
                        tail = job.log.read_text(errors="replace").strip().splitlines()[-3:]
                        say(f"[red]{job.name} failed (exit {rc})[/]: " + " | ".join(tail))
            if terminated and running and time.monotonic() > stop_by:
                say(f"{len(running)} run(s) did not stop within {grace_s:.0f} s: killed (they resume from "
                    "their last checkpoint)")
                for job in running:
                    job.proc.kill()
                    job.proc.wait()
                    done[job.name] = job.proc.returncode
                running = []
            if progress is not None:
                progress()
            time.sleep(0.5)
    finally:
        for job in running:  # only on an exception here: never leave runs behind
            job.proc.kill()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return done


def run_grid(grid: Grid, out: str | Path, *, parallel: int = 1, time_limit_s: float | None = None,
             gpus: list[str] | None = None, only: str | None = None, say=print, show_progress: bool = True,
             grace_s: float = 30.0) -> dict:
    """Warm starts, then every unfinished run; then ``summarize_grid``. Returns the summary."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + time_limit_s if time_limit_s else None
    specs = grid.runs(out)
    if only:
        specs = [s for s in specs if only in s.name]
    (out / "grid.yaml").write_text(yaml.safe_dump(
        {"base": grid.base, "models": grid.models, "arms": grid.arms, "seeds": grid.seeds}, sort_keys=False))

    # 1. one warm start per model that needs it
    warm = {}
    for s in specs:
        folder = Path(s.config.init)
        if folder.parent == out / "init" and not (folder / "model.safetensors").is_file():
            warm.setdefault(s.model, (s, folder))
    if warm:
        jobs = []
        for i, (model, (s, folder)) in enumerate(warm.items()):
            cfg_path = out / "init" / f"{model}.yaml"
            cfg_path.parent.mkdir(parents=True, exist_ok=True)
            cfg_path.write_text(s.config.replace(init="sft", out_dir=str(folder.parent)).to_yaml())
            jobs.append(_Job(f"warm start {model}", [sys.executable, "-m", "rla.rl.experiment", "warm-start",
                                                     str(cfg_path), str(folder)],
                             out / "init" / f"{model}.out", gpu=gpus[i % len(gpus)] if gpus else None))
        say(f"warm start (SFT) of {len(jobs)} model(s): {', '.join(warm)}")
        _run_jobs(jobs, parallel, deadline, say, grace_s=grace_s)
        for model, (_, folder) in warm.items():
            try:
                ev = json.loads((folder / "sft.json").read_text())["history"]["evals"][-1]
                say(f"warm start {model}: greedy accuracy {ev['greedy_acc']:.2f}, sampled (T=1) "
                    f"{ev['sample_acc']:.2f} -- RL needs rewards: aim for 0.2-0.7 sampled")
            except (OSError, ValueError, KeyError, IndexError):
                pass

    # 2. the runs
    todo = []
    for i, s in enumerate(specs):
        run_dir = Path(s.config.out_dir)
        if _is_finished(run_dir, s.config.steps):
            continue
        if not Path(s.config.init).exists() and s.config.init not in ("bundled", "random"):
            say(f"[yellow]{s.name}: its warm start {s.config.init} is missing (failed or out of time); skipped[/]")
            continue
        run_dir.mkdir(parents=True, exist_ok=True)
        # the grid's config for this run; the trainer keeps what it ran as config.yaml and refuses
        # to resume under a changed one
        (run_dir / "run.yaml").write_text(s.config.to_yaml())
        cmd = [sys.executable, "-m", "rla.cli", "train", str(run_dir / "run.yaml"), "--resume"]
        todo.append(_Job(s.name, cmd, run_dir / "train.out", gpu=gpus[i % len(gpus)] if gpus else None))
    say(f"{len(specs)} run(s): {len(specs) - len(todo)} finished, {len(todo)} to run, {parallel} at a time")
    bar = _ProgressBar(show_progress, specs)
    try:
        _run_jobs(todo, parallel, deadline, say, progress=bar.refresh, grace_s=grace_s)
    finally:
        bar.close()
    return summarize_grid(out, grid)


class _ProgressBar:
    def __init__(self, enabled: bool, specs: list[RunSpec]):
        self.specs = specs
        self.bar = None
        if enabled and specs:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self.bar = Progress(TextColumn("[bold]experiment[/] steps"), BarColumn(), MofNCompleteColumn(),
                                TimeElapsedColumn())
            self.task = self.bar.add_task("steps", total=sum(s.config.steps for s in specs))
            self.bar.start()
            self._last = 0.0

    def refresh(self) -> None:
        if self.bar is not None and time.monotonic() - self._last > 2.0:
            self._last = time.monotonic()
            done = sum(min(_steps_done(Path(s.config.out_dir)), s.config.steps) for s in self.specs)
            self.bar.update(self.task, completed=done)

    def close(self) -> None:
        if self.bar is not None:
            self._last = 0.0
            self.refresh()
            self.bar.stop()


# ----------------------------------------------------------------------------------------- summary


def _stats(values: list) -> dict[str, float | None]:
    import numpy as np

    vals = np.array([v for v in values if isinstance(v, (int, float))], dtype=float)
    vals = vals[np.isfinite(vals)]
    if not vals.size:
        return {"mean": None, "std": None, "min": None, "max": None, "n": 0}
    return {"mean": float(vals.mean()), "std": float(vals.std()), "min": float(vals.min()),
            "max": float(vals.max()), "n": int(vals.size)}


def summarize_grid(out: str | Path, grid: Grid | None = None) -> dict:
    """``summary.json``, ``summary.md`` and ``plots/`` of an experiment folder, from its logs."""
    from rla.rl.plots import plot_arms

    out = Path(out)
    if grid is None:
        grid = load_grid(out / "grid.yaml")
    runs, by_model, run_envs = [], {}, []
    for s in grid.runs(out):
        run_dir = Path(s.config.out_dir)
        records = read_log(run_dir / "log.jsonl")
        summ = summarize(records, s.config.collapse_window)
        run_env = _run_environment(run_dir)
        if run_env and run_env not in run_envs:
            run_envs.append(run_env)
        runs.append({"name": s.name, "model": s.model, "arm": s.arm, "seed": s.seed,
                     "finished": _is_finished(run_dir, s.config.steps), "planned_steps": s.config.steps, **summ})
        by_model.setdefault(s.model, {}).setdefault(s.arm, []).append(records)
    arms = []
    for model in grid.models:
        for arm in grid.arms:
            rs = [r for r in runs if r["model"] == model and r["arm"] == arm]
            got = [r for r in rs if r["steps"]]
            arms.append({
                "model": model, "arm": arm, "overrides": grid.arms[arm], "seeds": len(rs),
                "seeds_with_logs": len(got), "seeds_finished": sum(r["finished"] for r in rs),
                "step0_k3": _stats([r["step0"]["k3"] for r in got]),
                "step0_abs_mean": _stats([r["step0"]["abs_mean"] for r in got]),
                "step0_clip_leak_0.2": _stats([r["step0"]["clip_leak_0.2"] for r in got]),
                "k3_over_training": _stats([r["mismatch_mean"]["k3"] for r in got]),
                "abs_mean_over_training": _stats([r["mismatch_mean"]["abs_mean"] for r in got]),
                "final_reward": _stats([r["final_reward"] for r in got]),
                "best_reward": _stats([r["best_reward"] for r in got]),
                "seeds_with_collapse": sum(bool(r["collapse_events"]) for r in got),
                "collapse_events": sum(len(r["collapse_events"]) for r in got),
                "first_collapse_steps": [r["first_collapse_step"] for r in got if r["first_collapse_step"] is not None],
                "wall_time_s": _stats([r["wall_time_s"] for r in got]),
                "peak_memory_mb": _stats([r["peak_memory_mb"] for r in got]),
            })
    plots = {}
    for model, arm_logs in by_model.items():
        if any(rec for logs in arm_logs.values() for rec in logs):
            plots[model] = str(plot_arms(arm_logs, out / "plots" / f"{model}.png",
                                         title=f"{model}: GRPO, rollouts {grid.base.get('rollout_profile', 'vllm')} bf16"))
    summary = {"environment": environment(), "run_environments": run_envs, "grid": {"base": grid.base, "models": grid.models, "arms": grid.arms,
                                                       "seeds": grid.seeds}, "arms": arms, "runs": runs, "plots": plots}
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str, allow_nan=True))
    (out / "summary.md").write_text(_markdown(summary, out))
    return summary


#: what tells two runs' machines apart (date, command line and launch parameters differ per run)
_ENV_KEYS = ("gpu", "torch", "cuda", "transformers", "triton", "python")


def _run_environment(run_dir: Path) -> dict[str, Any] | None:
    """The GPU and versions a run recorded in its summary.json, if any."""
    try:
        env = json.loads((run_dir / "summary.json").read_text()).get("environment")
    except (OSError, ValueError):
        return None
    return {k: env.get(k) for k in _ENV_KEYS} if env else None


def _env_line(env: dict[str, Any]) -> str:
    line = f"GPU: {env.get('gpu') or 'none (CPU)'} · torch {env['torch']} · transformers {env['transformers']}"
    if env.get("triton"):
        line += f" · triton {env['triton']}"
    return line + f" · python {env['python']}"


def _fmt(st: dict, digits: str = ".2e") -> str:
    if not st or st.get("mean") is None:
        return "-"
    if st["n"] > 1:
        return f"{st['mean']:{digits}} ± {st['std']:{digits}}"
    return f"{st['mean']:{digits}}"


def _markdown(summary: dict, out: Path) -> str:
    env = summary["environment"]
    runs_on = summary.get("run_environments") or []
    lines = [
        "# GRPO under rollout/training rounding mismatch",
        "",
        *([f"Runs: {_env_line(e)}" for e in runs_on] or ["Runs: environment not recorded in their summary.json"]),
        "",
        f"Summarized {env['date']} ({_env_line(env)})",
        "",
        "Step-0 metrics: the training forward before the first update of the first step, against the "
        "rollout engine's logprobs, on identical weights. Over training: the same measurement before each "
        "step's first update, averaged over steps. Values are mean ± std over seeds. Collapse: docs/metrics.md's "
        "signal (k3 > 10x its step-0 value or grad norm > 10x its running median, with falling reward).",
        "",
    ]
    for model in summary["grid"]["models"]:
        lines += [f"## {model}", "", "| arm | seeds (done) | step-0 k3 | step-0 mean abs delta | step-0 clip leak 0.2 "
                  "| k3 over training | final reward | best reward | seeds with collapse | wall time (s) | peak MB |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
        for a in summary["arms"]:
            if a["model"] != model:
                continue
            lines.append(
                f"| {a['arm']} | {a['seeds']} ({a['seeds_finished']}) | {_fmt(a['step0_k3'])} | "
                f"{_fmt(a['step0_abs_mean'])} | {_fmt(a['step0_clip_leak_0.2'], '.3f')} | {_fmt(a['k3_over_training'])} | "
                f"{_fmt(a['final_reward'], '.3f')} | {_fmt(a['best_reward'], '.3f')} | "
                f"{a['seeds_with_collapse']}/{a['seeds_with_logs']} | {_fmt(a['wall_time_s'], '.0f')} | "
                f"{_fmt(a['peak_memory_mb'], '.0f')} |")
        if model in summary["plots"]:
            lines += ["", f"![{model}]({Path(summary['plots'][model]).relative_to(out)})"]
        lines.append("")
    lines += ["## Arms", ""]
    for name, over in summary["grid"]["arms"].items():
        lines.append(f"- **{name}**: `{json.dumps(over)}`")
    lines += ["", "## Runs", "", "| run | steps | finished | step-0 k3 | final reward | collapse at |", "|---|---|---|---|---|---|"]
    for r in summary["runs"]:
        k3 = r.get("step0", {}).get("k3") if r["steps"] else None
        fr = r.get("final_reward") if r["steps"] else None
        lines.append(f"| {r['name']} | {r['steps']}/{r['planned_steps']} | {r['finished']} | "
                     f"{'-' if k3 is None else f'{k3:.2e}'} | {'-' if fr is None else f'{fr:.3f}'} | "
                     f"{r.get('first_collapse_step') if r.get('first_collapse_step') is not None else '-'} |")
    lines += ["", "Raw logs: `runs/<model>__<arm>__s<seed>/log.jsonl` (one line per step).", ""]
    return "\n".join(lines)


def _main(argv: list[str]) -> int:
    """``python -m rla.rl.experiment warm-start CONFIG FOLDER`` (what run_grid launches)."""
    if len(argv) != 3 or argv[0] != "warm-start":
        print("usage: python -m rla.rl.experiment warm-start CONFIG FOLDER", file=sys.stderr)
        return 2
    from rla.rl.config import load_config
    from rla.rl.trainer import resolve_device
    from rla.rl.warm_start import warm_start

    cfg = load_config(argv[1])
    warm_start(cfg, argv[2], resolve_device(cfg.device))
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
