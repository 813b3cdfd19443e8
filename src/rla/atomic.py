"""Atomic writes: a crash leaves the old file or folder (or none), never a half-written one.

One recipe for every file ``rla`` publishes (rollout files, run logs, diagnosis reports) and every
folder (checkpoints, warm-start models): write beside the destination (same folder, so the rename
stays on one file system), flush and fsync, then rename over the destination in one
``os.replace`` / ``os.rename``, and fsync the folder so the new name survives a power cut.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO

__all__ = ["atomic_file", "write_text", "publish_dir", "fsync_path", "fsync_dir"]


def fsync_path(path) -> None:
    """fsync a file (or, on platforms that allow opening one, a folder) by path."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path) -> None:
    """fsync a folder so a rename inside it survives a power cut; a no-op where folders cannot be opened."""
    with contextlib.suppress(OSError):
        fsync_path(path)


@contextlib.contextmanager
def atomic_file(path: str | os.PathLike[str]) -> Iterator[IO[str]]:
    """A UTF-8 text file (``\\n`` newlines) that replaces ``path`` only when the block succeeds.

    On any error in the block the temporary file is removed and ``path`` is left as it was. An
    existing file keeps its permission bits; a new one gets 0o644.
    """
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    mode = stat.S_IMODE(os.stat(path).st_mode) if os.path.exists(path) else 0o644
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{os.path.basename(path)}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    fsync_dir(folder)


def write_text(path: str | os.PathLike[str], text: str) -> None:
    """Write ``text`` to ``path`` atomically (:func:`atomic_file`)."""
    with atomic_file(path) as f:
        f.write(text)


def publish_dir(tmp: str | os.PathLike[str], final: str | os.PathLike[str]) -> None:
    """Publish the finished folder ``tmp`` as ``final`` (a sibling), replacing a folder there.

    Every file in ``tmp`` and ``tmp`` itself are fsync'ed first, so the renamed folder is complete
    on disk. Replacing an existing ``final`` removes it just before the rename: a crash between
    the two leaves ``tmp`` complete beside no ``final``, never a half-written ``final``.
    """
    tmp, final = Path(tmp), Path(final)
    for f in tmp.rglob("*"):
        if f.is_file():
            fsync_path(f)
    fsync_dir(tmp)
    if final.exists():
        shutil.rmtree(final)
    os.rename(tmp, final)
    fsync_dir(final.parent)
