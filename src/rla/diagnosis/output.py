"""Report folders that are never silently overwritten, never left half written, and whose
``--overwrite`` deletes nothing rla did not write.

- :func:`check_out_dir` runs before any work: the path must not be a file, must not be the
  current folder or a folder above it, must not hold (or be) an input of the run (``inputs``:
  rollouts, weights, a profile), its nearest existing parent must take a file (probed by writing
  one, so ``/proc/x`` or a read-only mount fails here, not after the run), and a non-empty
  folder is refused unless ``overwrite``. With ``overwrite`` the folder must be one rla wrote:
  every entry in it is listed in its manifest (:data:`MANIFEST`, written with every folder
  :func:`staged` publishes) with the size and SHA-256 it had; anything else there (a file rla did
  not write, or one changed since) is named and the folder refused, so nothing is deleted that
  rla did not write.
- :func:`staged` yields a fresh hidden sibling folder; everything is written there, and only when
  the block ends without error is it moved into place with ``rename`` (an existing folder is first
  checked again, renamed aside, then removed). A kill at any moment leaves the old folder or the
  new one whole (or, between the two renames, the old one under ``.NAME.rla-old-*`` and the new
  one under ``.NAME.rla-tmp-*``), never a folder with new files beside old ones.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import uuid
from pathlib import Path

from rla.atomic import fsync_dir, fsync_path

__all__ = ["check_out_dir", "staged", "write_manifest", "foreign_entries", "OutputFolderError", "MANIFEST"]


class OutputFolderError(FileExistsError):
    """An output folder that must not be written or replaced (a user error: the message says why)."""


MANIFEST = ".rla-manifest.json"
"""The list of files rla wrote into a published folder (relative path -> size and SHA-256)."""


def _sha256(path: Path) -> str:
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def write_manifest(folder) -> Path:
    """List every file under ``folder`` (but the manifest) with its size and SHA-256, in :data:`MANIFEST`."""
    folder = Path(folder)
    files = {}
    for p in sorted(folder.rglob("*")):
        rel = p.relative_to(folder).as_posix()
        if rel != MANIFEST and p.is_file() and not p.is_symlink():
            files[rel] = {"size": p.stat().st_size, "sha256": _sha256(p)}
    path = folder / MANIFEST
    path.write_text(json.dumps({"format": "rla.manifest/1", "files": files}, indent=1))
    return path


def foreign_entries(folder) -> list[str]:
    """Entries of ``folder`` that its manifest does not list as rla wrote them (sorted, relative).

    A folder without a (readable) manifest has every entry foreign.
    """
    folder = Path(folder)
    try:
        listed = json.loads((folder / MANIFEST).read_text())["files"]
        if not isinstance(listed, dict):
            raise TypeError
    except (OSError, ValueError, TypeError, KeyError):
        listed = {}
    parents = {Path(rel).parents[i].as_posix() for rel in listed for i in range(len(Path(rel).parents) - 1)}
    foreign = []
    for p in sorted(folder.rglob("*")):
        rel = p.relative_to(folder).as_posix()
        if rel == MANIFEST and listed:
            continue
        if p.is_dir() and not p.is_symlink():
            if rel not in parents:
                foreign.append(rel + "/")
            continue
        want = listed.get(rel)
        try:
            ok = (isinstance(want, dict) and p.is_file() and not p.is_symlink()
                  and p.stat().st_size == want.get("size") and _sha256(p) == want.get("sha256"))
        except OSError:
            ok = False
        if not ok:
            foreign.append(rel + (" (changed since rla wrote it)" if want is not None else ""))
    return [f for f in foreign if not any(f.startswith(d) and f != d for d in foreign if d.endswith("/"))]


def _within(child: Path, parent: Path) -> bool:
    return child == parent or parent in child.parents


def _probe_writable(parent: Path, flag: str, path) -> None:
    try:  # named like the staging folders, so a kill that leaves it names its origin
        fd, probe = tempfile.mkstemp(dir=parent, prefix=f".{Path(path).name or 'out'}.rla-probe-")
        try:
            os.write(fd, b"x")
        finally:
            os.close(fd)
            os.unlink(probe)
    except OSError as e:
        raise PermissionError(f"{flag} {path}: cannot write there: {parent}: {e.strerror or e}") from None


def check_out_dir(path, *, overwrite: bool = False, flag: str = "--out", inputs=()) -> Path:
    """Refuse an output folder that cannot or must not be written, before any work (module docstring).

    ``inputs``: paths the run reads (files or folders); an output folder that is one of them or
    holds one is refused, with or without ``overwrite``.
    """
    out = Path(path)
    if str(path).strip() == "":
        raise ValueError(f"{flag}: empty path")
    if out.exists() and not out.is_dir():
        raise FileExistsError(f"{flag} {path}: is a file, not a folder; choose a folder path")
    real = out.resolve()
    cwd = Path.cwd().resolve()
    if _within(cwd, real):
        raise OutputFolderError(f"{flag} {path}: is the current folder or a folder above it; rla writes its "
                                "output into a folder of its own: choose a new folder name")
    for inp in inputs:
        if inp is None:
            continue
        r = Path(inp).resolve()
        if _within(r, real):
            what = "is" if r == real else "holds"
            raise OutputFolderError(f"{flag} {path}: {what} an input of this run ({inp}); choose another folder")
    if out.is_dir():
        entries = sorted(p.name for p in out.iterdir())
        if entries and not overwrite:
            shown = ", ".join(entries[:3]) + (", ..." if len(entries) > 3 else "")
            raise FileExistsError(
                f"{flag} {path}: folder is not empty ({len(entries)} entries: {shown}); choose another folder or "
                "pass --overwrite to replace it"
            )
        if entries:
            _check_replaceable(out, flag, path)
    parent = out.absolute().parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise NotADirectoryError(f"{flag} {path}: cannot create it: {parent} is a file, not a folder")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise PermissionError(f"{flag} {path}: cannot write there: {parent} is not writable")
    _probe_writable(parent, flag, path)
    return out


def _check_replaceable(out: Path, flag: str, path) -> None:
    foreign = foreign_entries(out)
    if foreign:
        shown = ", ".join(foreign[:5]) + (", ..." if len(foreign) > 5 else "")
        raise OutputFolderError(
            f"{flag} {path}: --overwrite replaces only a folder rla wrote, and {len(foreign)} entr"
            f"{'y' if len(foreign) == 1 else 'ies'} in it rla did not write ({shown}; no {MANIFEST} lists "
            "them); move them away or choose another folder. Nothing was deleted."
        )


@contextlib.contextmanager
def staged(path, *, overwrite: bool = False, flag: str = "--out", inputs=()):
    """Yield a temporary folder; on success it replaces ``path`` (see the module docstring).

    ``inputs``: what the run reads (:func:`check_out_dir`). The published folder gets a manifest.
    """
    inputs = tuple(inputs)
    out = check_out_dir(path, overwrite=overwrite, flag=flag, inputs=inputs).absolute()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.rla-tmp-", dir=out.parent))
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    try:
        write_manifest(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if overwrite and out.is_dir() and any(out.iterdir()):
        try:  # again: what was put there while rla worked is not rla's to delete either
            _check_replaceable(out, flag, out)
        except OutputFolderError as e:
            raise OutputFolderError(f"{e} The new output is in {tmp}.") from None
    _publish(tmp, out, overwrite, flag)


def _publish(tmp: Path, out: Path, overwrite: bool, flag: str) -> None:
    for f in tmp.iterdir():
        if f.is_file():
            fsync_path(f)
    fsync_dir(tmp)
    if out.is_dir() and any(out.iterdir()):
        if not overwrite:  # appeared while we worked: keep both, say where the new one is
            raise OutputFolderError(f"{flag} {out}: a non-empty folder appeared there while rla worked; "
                                  f"the new output is in {tmp}")
        old = out.parent / f".{out.name}.rla-old-{uuid.uuid4().hex[:8]}"
        os.rename(out, old)
        os.rename(tmp, out)
        fsync_dir(out.parent)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(tmp, out)  # onto nothing or an empty folder: one atomic step
        fsync_dir(out.parent)
