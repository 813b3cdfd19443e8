"""One writer per run folder: a lock file naming its owner, and children that die with their parent.

:class:`RunLock` is ``<folder>/.rla-lock``, held with ``flock`` for as long as its owner lives (the
kernel drops an ``flock`` when the process holding it dies, ``kill -9`` included, so a lock is
never left held by a dead process on this host). The file says who holds it: pid, host, the
process's start time, the command, and, for a process started by ``rla experiment``, that
experiment's folder and pid. A second writer is refused with a :class:`RunLockedError` naming the
owner. A lock whose file names another host cannot be checked from here (``flock`` need not
reach across a network file system): it is refused unless ``take_over=True`` (``rla train
--take-over``), which the user passes after making sure that run is gone. The file is never
deleted (deleting it would let two processes lock two different files of one name); a released
lock is an empty file.

:func:`die_with_parent` is the ``preexec_fn`` of every process ``rla experiment`` starts: Linux's
``PR_SET_PDEATHSIG`` sends it SIGTERM when the experiment dies, however it dies (``kill -9``
included), so it checkpoints after its current step and exits instead of writing on as an orphan.
:func:`end_orphans` is the experiment's check of its runs before it starts any: a run folder still
locked by a process started by an earlier experiment of the same folder (an orphan: that
experiment is gone, or this one could not hold the experiment's own lock) is stopped (SIGTERM,
then SIGKILL after a grace period); a run locked by anything else is refused.
"""

from __future__ import annotations

import ctypes
import datetime
import errno
import fcntl
import json
import os
import signal
import socket
import sys
import time
from pathlib import Path

__all__ = ["RunLock", "RunLockedError", "LOCK_NAME", "die_with_parent", "end_orphans", "owner", "EXPERIMENT_ENV"]

LOCK_NAME = ".rla-lock"
EXPERIMENT_ENV = "RLA_EXPERIMENT_LOCK"
"""Set by ``rla experiment`` for its children: ``<experiment folder>:<experiment pid>``."""

_PR_SET_PDEATHSIG = 1


class RunLockedError(OSError):
    """Another process writes this folder (the message names it and says what to do)."""


def _start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (``/proc/PID/stat`` field 22), None if gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    if fields[0] in ("Z", "X"):  # a zombie holds nothing
        return None
    return int(fields[19])


def _alive(pid: int, start: int | None) -> bool:
    now = _start_time(pid)
    return now is not None and (start is None or now == start)


def owner(folder) -> dict | None:
    """What the lock file of ``folder`` says (``{}`` when it names no one), None without a file."""
    path = Path(folder) / LOCK_NAME
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    try:
        data = json.loads(text) if text.strip() else {}
    except ValueError:
        data = {"unreadable": text[:200]}
    return data if isinstance(data, dict) else {"unreadable": text[:200]}


def describe(info: dict) -> str:
    if not info or "pid" not in info:
        return "an rla process (its lock file names no owner)"
    parts = [f"pid {info['pid']} on host {info.get('host', '?')}", f"started {info.get('started', '?')}"]
    if info.get("command"):
        parts.append(f"command: {info['command']}")
    if info.get("experiment"):
        parts.append(f"started by rla experiment {info['experiment']} (pid {info.get('experiment_pid')})")
    return ", ".join(parts)


class RunLock:
    """``flock`` of ``<folder>/.rla-lock`` (module docstring). Use as a context manager or call
    :meth:`release`; ``what`` names the folder's kind in messages (``run folder``, ``experiment folder``)."""

    def __init__(self, folder, *, take_over: bool = False, what: str = "run folder", say=None):
        self.folder = Path(folder)
        self.path = self.folder / LOCK_NAME
        self.fd: int | None = None
        self.folder.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as e:
                if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    raise
                info = owner(self.folder) or {}
                end = time.monotonic() + 2.0
                while "pid" not in info and time.monotonic() < end:  # it has the flock, its name follows
                    time.sleep(0.02)
                    info = owner(self.folder) or {}
                raise RunLockedError(
                    f"{self.folder}: this {what} is being written by another process: {describe(info)}. One "
                    f"writer per {what}: wait for it to finish, or stop it"
                    + (f" (kill {info['pid']})" if "pid" in info else "") + " and run again."
                ) from None
            previous = owner(self.folder) or {}
            host = socket.gethostname()
            if previous.get("pid") is not None and previous.get("host") not in (None, host) and not take_over:
                raise RunLockedError(
                    f"{self.folder}: the lock of this {what} is held by {describe(previous)}, another host, whose "
                    "process rla cannot check from here. If that run is gone, pass --take-over (take_over=True) "
                    "to take the folder over; if it still runs, two writers would mix their output."
                )
            if previous.get("pid") is not None and say is not None:
                say(f"{self.folder}: taking over the lock of {describe(previous)}, which is no longer running")
            self.fd = fd
            self.info = {
                "pid": os.getpid(), "host": host, "start_ticks": _start_time(os.getpid()),
                "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                "command": " ".join(sys.argv),
            }
            exp = os.environ.get(EXPERIMENT_ENV)
            if exp and ":" in exp:
                folder_, pid = exp.rsplit(":", 1)
                self.info.update(experiment=folder_, experiment_pid=int(pid))
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps(self.info).encode(), 0)
            os.fsync(fd)
        except BaseException:
            if self.fd is None:
                os.close(fd)
            raise

    def release(self) -> None:
        if self.fd is None:
            return
        try:
            os.ftruncate(self.fd, 0)  # released: an empty file (never deleted; module docstring)
        finally:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = None

    def __enter__(self) -> "RunLock":
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def is_held(folder) -> bool:
    """Whether some process holds the lock of ``folder`` now (a probe that takes and drops it)."""
    path = Path(folder) / LOCK_NAME
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)  # closing drops a lock the probe took
    return False


_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None


def die_with_parent(parent_pid: int, sig: int = signal.SIGTERM) -> None:
    """``preexec_fn`` for a child that must not outlive the process that starts it (Linux).

    Use as ``preexec_fn=functools.partial(die_with_parent, os.getpid())``. ``PR_SET_PDEATHSIG``
    survives the ``exec``; a parent that died before the call is caught by checking ``getppid``
    afterwards. Elsewhere a no-op (the experiment's :func:`end_orphans` still finds what survives).
    """
    if _LIBC is None:
        return
    if _LIBC.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        return
    if os.getppid() != parent_pid:
        os.kill(os.getpid(), sig)


def end_orphans(run_dirs, experiment: Path, grace_s: float = 30.0, say=print) -> None:
    """Before an experiment starts its runs: stop orphans of an earlier call, refuse foreign writers.

    Call while holding the experiment folder's own lock: then every process an earlier
    ``rla experiment`` of this folder started is an orphan. A run folder locked by one of those is
    stopped (SIGTERM; SIGKILL ``grace_s`` later) and waited for; one locked by any other process
    is a :class:`RunLockedError` naming it, before anything starts.
    """
    experiment = Path(experiment).resolve()
    orphans, foreign = [], []
    for d in run_dirs:
        if not is_held(d):
            continue
        info = owner(d) or {}
        ours = info.get("experiment") and Path(info["experiment"]).resolve() == experiment
        same_host = info.get("host") == socket.gethostname()
        if ours and same_host and "pid" in info and info["pid"] != os.getpid():
            orphans.append((Path(d), info))
        else:
            foreign.append((Path(d), info))
    if foreign:
        lines = "; ".join(f"{d}: {describe(i)}" for d, i in foreign)
        raise RunLockedError(f"{len(foreign)} run folder(s) of {experiment} are being written by a process this "
                             f"experiment did not start ({lines}); wait for it or stop it, then run again")
    for d, info in orphans:
        say(f"{d}: still written by {describe(info)}, left running when that experiment died; stopping it "
            "(it checkpoints after its current step)")
        _signal(info, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for d, info in orphans:
        while is_held(d) and time.monotonic() < deadline:
            time.sleep(0.2)
        if is_held(d):
            say(f"{d}: pid {info['pid']} did not stop within {grace_s:.0f} s: killed (it resumes from its last "
                "checkpoint)")
            _signal(info, signal.SIGKILL)
            end = time.monotonic() + 10.0
            while is_held(d) and time.monotonic() < end:
                time.sleep(0.1)
            if is_held(d):
                raise RunLockedError(f"{d}: pid {info['pid']} still holds the lock after SIGKILL; stop it and run again")


def _signal(info: dict, sig: int) -> None:
    pid, start = int(info["pid"]), info.get("start_ticks")
    if _alive(pid, start):  # the recorded process, not a later one that reuses its pid
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass
