"""rla.engines.source.cache_lock: one process at a time fills an engine-cache entry (pytest-xdist's
workers download vLLM's wheel through it, ``tests/conftest.py``), a second one waits and then finds
the first's finished entry, and a holder killed with -9 leaves no stale lock behind."""

import os
import subprocess
import sys
import threading

from rla.engines.source import cache_lock

from repo_root import ROOT

HOLDER = """
import sys, time
from rla.engines.source import cache_lock
with cache_lock("w.whl") as folder:
    print("held", flush=True)
    time.sleep(float(sys.argv[1]))
    (folder / "w.whl").write_text("done")
"""


def _holder(seconds, cache):
    env = {**os.environ, "RLA_ENGINE_CACHE": str(cache),
           "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    p = subprocess.Popen([sys.executable, "-c", HOLDER, str(seconds)], env=env, stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "held"
    return p


def test_a_second_process_waits_for_the_entry_and_a_killed_holder_frees_the_lock(tmp_path, monkeypatch):
    monkeypatch.setenv("RLA_ENGINE_CACHE", str(tmp_path))
    holder = _holder(1.0, tmp_path)
    try:
        with cache_lock("w.whl") as folder:
            assert folder == tmp_path and (tmp_path / "w.whl").read_text() == "done"  # waited for it
    finally:
        holder.kill()
        holder.wait()
    (tmp_path / "w.whl").unlink()

    killed = _holder(600, tmp_path)
    killed.kill()  # -9 mid-download: no cleanup ran
    killed.wait()
    got = threading.Event()

    def take():
        with cache_lock("w.whl"):
            got.set()

    threading.Thread(target=take, daemon=True).start()
    assert got.wait(30), "the lock of a process killed with -9 was still held"
    assert not (tmp_path / "w.whl").exists()
