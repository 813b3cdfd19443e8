"""``rla.engines.vllm._decompressed`` (``c_ops(library=...xz)``): the file handling, on the CPU with a small
``.xz`` (loading the library needs CUDA; decompressing it does not). The content lands in the engine cache
whole, once, again when the ``.xz`` is newer; it is written under ``cache_lock`` into a temporary file of its
own name, never into the library's path, and a failed write leaves nothing behind."""

from __future__ import annotations

import fcntl
import lzma
import os

import pytest

from rla.engines import EngineUnavailable
from rla.engines import vllm as V

MIB = 1 << 20


def _xz(path, data: bytes):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(lzma.compress(data))
    return path


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("RLA_ENGINE_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_the_content_is_decompressed_once_and_again_when_the_xz_is_newer(tmp_path, cache):
    data = os.urandom(2 * MIB + 123)  # more than one 1 MiB chunk
    src = _xz(tmp_path / "src" / "lib.so.xz", data)
    dest = V._decompressed(src)
    assert dest == cache / "libraries" / "lib.so" and dest.read_bytes() == data
    assert sorted(p.name for p in dest.parent.iterdir()) == ["lib.so"]  # no temporary file left
    before = dest.stat()
    assert V._decompressed(src) == dest
    after = dest.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)  # up to date: not written again

    newer = os.urandom(MIB // 2)
    _xz(src, newer)
    os.utime(src, (before.st_mtime + 10, before.st_mtime + 10))
    assert V._decompressed(src).read_bytes() == newer
    assert sorted(p.name for p in dest.parent.iterdir()) == ["lib.so"]


def test_a_plain_file_is_itself_and_a_missing_one_is_named(tmp_path, cache):
    plain = tmp_path / "lib.so"
    plain.write_bytes(b"\x7fELF")
    assert V._decompressed(plain) == plain and not cache.exists()
    with pytest.raises(EngineUnavailable, match=r"kernel library .*gone\.so\.xz does not exist"):
        V._decompressed(tmp_path / "gone.so.xz")


class _Reader:
    """lzma.open's file, recording on each read what the cache holds and whether the entry's lock is held."""

    def __init__(self, f, cache, seen, fail_after=None):
        self.f, self.cache, self.seen, self.fail_after = f, cache, seen, fail_after

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.f.close()

    def read(self, n):
        with open(self.cache / ".library-lib.so.lock", "a") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                held = False
                fcntl.flock(lock, fcntl.LOCK_UN)
            except BlockingIOError:
                held = True
        self.seen.append((held, tuple(sorted(p.name for p in (self.cache / "libraries").iterdir()))))
        if self.fail_after is not None and len(self.seen) > self.fail_after:
            raise OSError("disk full")
        return self.f.read(n)


def _reading(monkeypatch, cache, seen, fail_after=None):
    plain = lzma.open
    monkeypatch.setattr(V.lzma, "open", lambda p: _Reader(plain(p), cache, seen, fail_after))


def test_it_writes_under_the_lock_into_a_file_of_its_own(tmp_path, cache, monkeypatch):
    data = os.urandom(2 * MIB)
    src = _xz(tmp_path / "lib.so.xz", data)
    (cache / "libraries").mkdir(parents=True)
    (cache / "libraries" / ".lib.so.0123abcd.part").write_bytes(b"a killed writer's")
    seen = []
    _reading(monkeypatch, cache, seen)
    assert V._decompressed(src).read_bytes() == data
    assert len(seen) == 3  # two 1 MiB chunks, then the end
    held, names = zip(*seen)
    assert all(held)
    assert len(set(names)) == 1 and len(names[0]) == 1  # one temporary file, the stale one gone, no lib.so yet
    (tmp,) = names[0]
    assert tmp.startswith(".lib.so.") and tmp.endswith(".part") and tmp != ".lib.so.0123abcd.part"
    assert sorted(p.name for p in (cache / "libraries").iterdir()) == ["lib.so"]


def test_a_failed_write_leaves_nothing(tmp_path, cache, monkeypatch):
    src = _xz(tmp_path / "lib.so.xz", os.urandom(2 * MIB))
    seen = []
    _reading(monkeypatch, cache, seen, fail_after=1)
    with pytest.raises(OSError, match="disk full"):
        V._decompressed(src)
    assert len(seen) == 2 and [p.name for p in (cache / "libraries").iterdir()] == []
