"""Run subprocesses N at a time with a deadline, stopping them cleanly (the experiment's scheduler).

Every run is its own process, so a run that crashes or is killed does not take the others with
it. At the deadline -- or on a SIGTERM/SIGINT to this process (an outer ``timeout``, Ctrl-C) --
the running ones get SIGTERM (each checkpoints after its current step and exits) and those not
started are left for the next call; runs still going ``grace_s`` later are killed and resume
from their last checkpoint. Each process gets its share of the host's cores (``OMP_NUM_THREADS``)
and, with a GPU list, its own ``CUDA_VISIBLE_DEVICES``.
"""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from rla.rl.runlock import die_with_parent

__all__ = ["Job", "run_jobs"]


def _env(gpu: str | None, threads: int | None = None, extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {**os.environ, **(extra or {})}
    if threads is not None and "OMP_NUM_THREADS" not in env:
        # N runs on one host: each gets its share of the cores instead of all of them
        env["OMP_NUM_THREADS"] = str(threads)
    src = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    if gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = gpu
    return env



@dataclass
class Job:
    name: str
    cmd: list[str]
    log: Path
    gpu: str | None = None
    threads: int | None = None
    proc: subprocess.Popen | None = None
    rc: int | None = None


def run_jobs(jobs: list[Job], parallel: int, deadline: float | None, say, progress=None,
              grace_s: float = 30.0, env: dict[str, str] | None = None) -> dict[str, int | None]:
    """Run ``jobs`` ``parallel`` at a time; at ``deadline`` SIGTERM what runs and wait for it.

    A SIGTERM or SIGINT to this process (an outer ``timeout``, Ctrl-C) counts as the deadline:
    the runs are stopped the same way (checkpointed after their current step), not orphaned.
    Runs still going ``grace_s`` after the stop are killed (they resume from their last
    checkpoint). Every process gets SIGTERM when this one dies, however it dies (``kill -9``
    included; ``rla.rl.runlock.die_with_parent``), so none writes on as an orphan. ``env``: extra
    environment variables for the processes.
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
                                                env=_env(job.gpu, job.threads, env), start_new_session=True,
                                                preexec_fn=functools.partial(die_with_parent, os.getpid()))
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

