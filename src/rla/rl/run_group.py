"""``python -m rla.rl.run_group RUN.yaml [RUN.yaml ...]``: several runs in one process, one thread each.

``rla experiment --runs-per-process K`` launches this through its scheduler. Small models leave a
GPU mostly idle: one decode step of a 4M-parameter model is a few microseconds of work behind a
kernel launch. Separate processes only time-slice the GPU (their kernels never overlap without
MPS), whereas threads of one process, each on its own CUDA stream, put their kernels on the GPU
side by side, and share one CUDA context, one Triton cache and one copy of the libraries.

Every run keeps what it has as its own process: its folder, config, log, checkpoints and
``--resume``; its own seeds (every random choice of a run derives from ``(seed, step, rank)``,
never from the global generators that the threads share); its own ``train.out``, where its
messages and, if it fails, its traceback go. A run that fails does not stop the others; the
process exits 1 if any failed. SIGTERM / SIGINT stop every run after its current step,
checkpointed, as they stop one run.

What differs from one run per process:

- the runs' first steps in the process (step 0, or the first after a resume) run one after
  another before the threads start: that is where Triton compiles and the sampler captures its
  CUDA graph (``rla.rollout.static_decode`` also takes one capture at a time, in thread-local
  mode, for a later shape);
- ``memory/peak_mb`` is the process's peak, shared by its runs, and ``time/*`` is wall time with
  the other runs in the process competing for the GPU and the interpreter;
- no progress bar.

Not a user command: ``rla train`` runs one run.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
import traceback
from pathlib import Path

__all__ = ["run_group"]


class _RunLog:
    """``print``-like: one run's messages, appended to its ``train.out``."""

    def __init__(self, path: Path):
        self.path = path
        self._lock = threading.Lock()

    def __call__(self, *parts, **_) -> None:
        with self._lock, open(self.path, "a") as f:
            f.write(" ".join(str(p) for p in parts) + "\n")

    def failure(self, what: str) -> None:
        self(f"{what}:\n{traceback.format_exc()}")


def _stream_for(device):
    import torch

    return torch.cuda.Stream(device) if device.type == "cuda" else None


def _on(stream):
    import torch

    return torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext()


def run_group(paths: list[str | Path], say=print, ops_for=None) -> dict[str, str]:
    """Run the configs at ``paths`` (each resumed from its own checkpoint) in threads of this process.

    ``ops_for(path)``: each run's ``Trainer`` plug (``ops=``), for a study's entry point
    (``rla.rl.experiment.run_grid``'s ``plug``); None: rla's own ops. Returns
    ``{out_dir: "finished" | "stopped" | "failed"}``.
    """
    import torch

    from rla.rl.config import load_config
    from rla.rl.trainer import Trainer

    configs = [load_config(str(p)) for p in paths]
    outs = [c.out_dir for c in configs]
    dup = sorted({o for o in outs if outs.count(o) > 1})
    if dup:
        raise ValueError(f"run_group: two runs write to the same folder {dup[0]}; each run needs its own out_dir")
    if any(c.fsdp for c in configs):
        raise ValueError("run_group runs single-process runs; an FSDP run (fsdp: true) needs its own torchrun")

    logs, trainers, status = {}, {}, {}
    stop = threading.Event()

    def request_stop(signum, frame):
        stop.set()
        for t in trainers.values():
            t._stop = True

    previous = {sig: signal.signal(sig, request_stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        # build every trainer first (the global seeds each one sets are used only while it is built)
        for path, cfg in zip(paths, configs):
            out = Path(cfg.out_dir)
            out.mkdir(parents=True, exist_ok=True)
            logs[cfg.out_dir] = log = _RunLog(out / "train.out")
            try:
                ops = ops_for(path) if ops_for is not None else None
                trainers[cfg.out_dir] = Trainer(cfg.replace(progress=False), resume=True, log=log, ops=ops)
            except Exception:
                log.failure("failed to start")
                status[cfg.out_dir] = "failed"
                say(f"{cfg.out_dir}: failed to start (see its train.out)")
        started = {o: t.step for o, t in trainers.items()}
        closed: set[str] = set()
        streams = {o: _stream_for(t.device) for o, t in trainers.items()}
        if any(s is not None for s in streams.values()):
            torch.cuda.synchronize()  # what the constructors put on the default stream, before other streams read it

        # each run's first step in this process (the first of the run, or the one after a resume)
        # alone: that is where Triton compiles and the sampler captures its CUDA graph, which
        # should not overlap other threads' work
        for o, t in trainers.items():
            if stop.is_set() or t.step >= t.cfg.steps:
                continue
            try:
                with _on(streams[o]):
                    rec = t.run_step()
                if streams[o] is not None:
                    streams[o].synchronize()
                if rec is not None:
                    logs[o](f"step {rec['step']} done in the group's serial first pass ({rec['time/step_s']:.1f} s)")
            except Exception:
                logs[o].failure(f"failed at step {t.step}")
                status[o] = "failed"

        def work(o, t):
            try:
                with _on(streams[o]):
                    if stop.is_set():  # stopped during the first pass: keep its step, as a stopped run does
                        if t.step > started[o]:
                            t.save_checkpoint()
                        result = t.train(until_step=t.step)
                    else:
                        result = t.train()
                    if streams[o] is not None:
                        streams[o].synchronize()
                status[o] = "finished" if result["finished"] else "stopped"
            except Exception:
                logs[o].failure(f"failed at step {t.step}")
                status[o] = "failed"
            finally:
                closed.add(o)
                t.close()

        threads = [threading.Thread(target=work, args=(o, t), name=o, daemon=True)
                   for o, t in trainers.items() if o not in status]
        for th in threads:
            th.start()
        for th in threads:
            while th.is_alive():  # join in slices so that the signal handler runs
                th.join(0.5)
        for o, t in trainers.items():
            if o not in closed:
                t.close()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    for o in outs:
        say(f"{o}: {status.get(o, 'failed')}")
    return status


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: python -m rla.rl.run_group RUN.yaml [RUN.yaml ...]", file=sys.stderr)
        return 2
    status = run_group(argv)
    return 1 if any(s == "failed" for s in status.values()) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
