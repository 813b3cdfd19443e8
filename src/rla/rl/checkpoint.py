"""Atomic, resumable training checkpoints: safetensors for tensors, JSON for everything else.

Layout of ``<out_dir>/checkpoints/step_000040/`` (40 = steps completed)::

    model.safetensors       fp32 master weights by parameter name (unsharded)
    optimizer.safetensors   AdamW state by "<param name>/<key>" (exp_avg, exp_avg_sq, step)
    rng_rank0.safetensors   torch CPU (and CUDA) generator states of rank 0 (one file per rank)
    state.json              step, optimizer param_groups, scheduler and loss-scaler state,
                            Python and NumPy RNG states per rank, elapsed time, config

Atomicity: everything is written into a hidden temporary folder next to the final one, every
file is fsync'ed, then the folder is renamed in one ``os.rename``; a kill at any moment leaves
either the previous checkpoints or the new one complete, never a half one. Temporary folders
left by a kill are ignored and removed by the next save. Optimizer state is keyed by parameter
*name*, not by index, so a checkpoint written by a single process resumes under FSDP and back.
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rla.atomic import fsync_path, publish_dir
from rla.errors import UserError

__all__ = ["save", "load", "latest", "list_checkpoints", "rng_state", "set_rng_state", "CheckpointError",
           "CheckpointWriteError"]

_PREFIX = "step_"


class CheckpointError(ValueError, UserError):
    """A checkpoint is missing, incomplete or does not fit the run."""


class CheckpointWriteError(CheckpointError, OSError):
    """A checkpoint could not be written (the disk is full, say); earlier checkpoints are intact."""


try:
    from safetensors import SafetensorError as _SafetensorError
except ImportError:  # older safetensors: its errors are plain exceptions of the Rust binding
    class _SafetensorError(Exception):
        pass


def list_checkpoints(root: str | Path) -> list[tuple[int, Path]]:
    """Complete checkpoints under ``root`` as ``(step, path)``, oldest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    out = []
    for p in root.iterdir():
        if p.is_dir() and p.name.startswith(_PREFIX) and (p / "state.json").is_file():
            try:
                out.append((int(p.name[len(_PREFIX):]), p))
            except ValueError:
                continue
    return sorted(out)


def latest(root: str | Path) -> Path | None:
    found = list_checkpoints(root)
    return found[-1][1] if found else None


# ------------------------------------------------------------------------------------- RNG


def rng_state() -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """(JSON-able Python/NumPy states, tensor states) of this process's global generators."""
    version, internal, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    meta = {
        "python": [version, list(internal), gauss],
        "numpy": [kind, [int(k) for k in keys], int(pos), int(has_gauss), float(cached)],
    }
    tensors = {"torch_cpu": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        for i, s in enumerate(torch.cuda.get_rng_state_all()):
            tensors[f"torch_cuda{i}"] = s
    return meta, tensors


def set_rng_state(meta: dict[str, Any], tensors: dict[str, torch.Tensor]) -> None:
    version, internal, gauss = meta["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, pos, has_gauss, cached = meta["numpy"]
    np.random.set_state((kind, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(tensors["torch_cpu"])
    cuda = sorted(k for k in tensors if k.startswith("torch_cuda"))
    if cuda and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([tensors[k] for k in cuda][: torch.cuda.device_count()])


# ------------------------------------------------------------------------------------- save / load


def _tensor_dict(d: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    # safetensors wants contiguous CPU tensors that share no storage
    return {k: v.detach().to("cpu").contiguous().clone() for k, v in d.items()}


def tmp_dir(root: str | Path, step: int, tag: str = "") -> Path:
    """The temporary folder a save of ``step`` writes into (all ranks write their RNG file here).

    ``tag`` (the writer's own, e.g. a random hex string shared by its ranks) makes the name unique
    to one writer, so two writers never write, publish or delete each other's temporary folder.
    """
    return Path(root) / f".tmp_{_PREFIX}{step:06d}" if not tag else Path(root) / f".tmp_{_PREFIX}{step:06d}.{tag}"


def write_rng(root: str | Path, step: int, rank: int, meta: dict, tensors: dict[str, torch.Tensor],
              tag: str = "") -> None:
    """One rank's RNG states into the pending checkpoint of ``step`` (call before ``save``)."""
    from safetensors.torch import save_file

    tmp = tmp_dir(root, step, tag)
    try:
        tmp.mkdir(parents=True, exist_ok=True)
        save_file(_tensor_dict(tensors), str(tmp / f"rng_rank{rank}.safetensors"))
        (tmp / f"rng_rank{rank}.json").write_text(json.dumps(meta))
        for name in (f"rng_rank{rank}.safetensors", f"rng_rank{rank}.json"):
            fsync_path(tmp / name)
    except (OSError, _SafetensorError) as e:
        raise _write_failed(Path(root), step, tmp, e) from e


def save(
    root: str | Path,
    step: int,
    *,
    model: dict[str, torch.Tensor],
    optimizer_state: dict[str, dict[str, torch.Tensor]],
    state: dict[str, Any],
    keep: int = 2,
    tag: str = "",
) -> Path:
    """Finish the pending checkpoint of ``step`` (RNG files already written) and publish it.

    ``optimizer_state``: per parameter name, its AdamW tensors. ``state``: JSON-able rest. Keeps
    the ``keep`` newest checkpoints. A write that fails (a full disk, a file-size limit) removes the
    temporary folder and raises :class:`CheckpointWriteError`; the checkpoints already there are
    left as they were.
    """
    from safetensors.torch import save_file

    root = Path(root)
    tmp = tmp_dir(root, step, tag)
    final = root / f"{_PREFIX}{step:06d}"
    try:
        root.mkdir(parents=True, exist_ok=True)
        tmp.mkdir(parents=True, exist_ok=True)
        save_file(_tensor_dict(model), str(tmp / "model.safetensors"), metadata={"format": "rla.checkpoint/1"})
        flat = {f"{name}/{key}": t for name, st in optimizer_state.items() for key, t in st.items()}
        save_file(_tensor_dict(flat) if flat else {"_empty": torch.zeros(1)}, str(tmp / "optimizer.safetensors"))
        (tmp / "state.json").write_text(json.dumps(state, indent=1, allow_nan=True))
        publish_dir(tmp, final)  # a re-run of the same step replaces it
    except (OSError, _SafetensorError) as e:
        raise _write_failed(root, step, tmp, e) from e
    for _, old in list_checkpoints(root)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    for stale in root.glob(f".tmp_{_PREFIX}*"):
        if stale != tmp:
            shutil.rmtree(stale, ignore_errors=True)
    return final


def _write_failed(root: Path, step: int, tmp: Path, e: BaseException) -> "CheckpointWriteError":
    shutil.rmtree(tmp, ignore_errors=True)
    found = list_checkpoints(root)
    before = f"the last complete one, {found[-1][1].name}, is intact" if found else "there is no earlier checkpoint"
    why = getattr(e, "strerror", None) or str(e)
    return CheckpointWriteError(
        f"could not write the checkpoint of step {step} under {root}: {why} (a full disk or a file-size limit?); "
        f"its partial files were removed and {before}. Free space, then continue with --resume."
    )


def _read(file: Path, how):
    try:
        return how(file)
    except (OSError, ValueError, _SafetensorError) as e:
        raise CheckpointError(f"{file}: cannot be read ({e}); the checkpoint is damaged (truncated?). Move that "
                              "checkpoint folder aside to resume from the one before it") from None


def load(path: str | Path, rank: int = 0) -> dict[str, Any]:
    """Everything in a checkpoint folder: ``model``, ``optimizer_state``, ``state``, ``rng``."""
    from safetensors.torch import load_file

    path = Path(path)
    if not (path / "state.json").is_file():
        raise CheckpointError(f"{path} is not a complete checkpoint (no state.json)")
    state = _read(path / "state.json", lambda f: json.loads(f.read_text()))
    model = _read(path / "model.safetensors", lambda f: load_file(str(f)))
    flat = _read(path / "optimizer.safetensors", lambda f: load_file(str(f)))
    opt: dict[str, dict[str, torch.Tensor]] = {}
    for key, t in flat.items():
        if key == "_empty":
            continue
        name, sub = key.rsplit("/", 1)
        opt.setdefault(name, {})[sub] = t
    rng = None
    if (path / f"rng_rank{rank}.json").is_file():
        rng = (_read(path / f"rng_rank{rank}.json", lambda f: json.loads(f.read_text())),
               _read(path / f"rng_rank{rank}.safetensors", lambda f: load_file(str(f))))
    return {"model": model, "optimizer_state": opt, "state": state, "rng": rng, "path": path}
