"""Report folders that are never silently overwritten and never left half written.

- :func:`check_out_dir` runs before any work: the path must not be a file, its nearest existing
  parent must be a writable folder, and a non-empty folder is refused unless ``overwrite``.
- :func:`staged` yields a fresh hidden sibling folder; everything is written there, and only when
  the block ends without error is it moved into place with ``rename`` (an existing folder is first
  renamed aside, then removed). A kill at any moment leaves the old folder or the new one whole
  (or, between the two renames, the old one under ``.NAME.rla-old-*`` and the new one under
  ``.NAME.rla-tmp-*``), never a folder with new files beside old ones.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import uuid
from pathlib import Path

from rla.atomic import fsync_dir, fsync_path

__all__ = ["check_out_dir", "staged"]


def check_out_dir(path, *, overwrite: bool = False, flag: str = "--out") -> Path:
    """Refuse an output folder that cannot or must not be written, before any work."""
    out = Path(path)
    if str(path).strip() == "":
        raise ValueError(f"{flag}: empty path")
    if out.exists() and not out.is_dir():
        raise FileExistsError(f"{flag} {path}: is a file, not a folder; choose a folder path")
    if out.is_dir():
        entries = sorted(p.name for p in out.iterdir())
        if entries and not overwrite:
            shown = ", ".join(entries[:3]) + (", ..." if len(entries) > 3 else "")
            raise FileExistsError(
                f"{flag} {path}: folder is not empty ({len(entries)} entries: {shown}); choose another folder or "
                "pass --overwrite to replace it"
            )
    parent = out.absolute().parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise NotADirectoryError(f"{flag} {path}: cannot create it: {parent} is a file, not a folder")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise PermissionError(f"{flag} {path}: cannot write there: {parent} is not writable")
    return out


@contextlib.contextmanager
def staged(path, *, overwrite: bool = False, flag: str = "--out"):
    """Yield a temporary folder; on success it replaces ``path`` (see the module docstring)."""
    out = check_out_dir(path, overwrite=overwrite, flag=flag).absolute()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.rla-tmp-", dir=out.parent))
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _publish(tmp, out, overwrite, flag)


def _publish(tmp: Path, out: Path, overwrite: bool, flag: str) -> None:
    for f in tmp.iterdir():
        if f.is_file():
            fsync_path(f)
    fsync_dir(tmp)
    if out.is_dir() and any(out.iterdir()):
        if not overwrite:  # appeared while we worked: keep both, say where the new one is
            raise FileExistsError(f"{flag} {out}: a non-empty folder appeared there while rla worked; "
                                  f"the new output is in {tmp}")
        old = out.parent / f".{out.name}.rla-old-{uuid.uuid4().hex[:8]}"
        os.rename(out, old)
        os.rename(tmp, out)
        fsync_dir(out.parent)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(tmp, out)  # onto nothing or an empty folder: one atomic step
        fsync_dir(out.parent)
