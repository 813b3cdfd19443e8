"""Durability helpers for atomic writes (rollout files, checkpoints): fsync a file or a folder."""

from __future__ import annotations

import contextlib
import os


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
