"""What a report came from, recorded in ``report.json`` so a folder can be checked against its inputs.

Hashes are SHA-256 of file bytes, streamed in 1 MiB blocks (memory bounded at any size). The
weights hash covers every weight file of a checkpoint folder (``*.safetensors``, ``*.bin``,
``*.pt``, ``*.pth``), sorted by name, each prefixed by its name and size, so a renamed or
re-sharded checkpoint gets a different hash.

The hashes are taken before the work (:func:`inputs_record`) and checked again after it
(:func:`recheck`): a file changed while rla read it is an :class:`InputChangedError` naming it,
so a report never names bytes other than the ones it diagnosed.
"""

from __future__ import annotations

import hashlib
import platform
import sys
from pathlib import Path

__all__ = ["file_sha256", "weights_sha256", "versions", "inputs_record", "recheck", "InputChangedError"]

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")


class InputChangedError(ValueError):
    """An input file's bytes changed between the hash taken before the work and the one after it."""


def _update(h, path: Path) -> None:
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            h.update(block)


def file_sha256(path) -> str:
    h = hashlib.sha256()
    _update(h, Path(path))
    return h.hexdigest()


def weights_sha256(model_dir) -> str:
    """One hash over every weight file in ``model_dir`` (module docstring); an error if there is none."""
    files = sorted(p for p in Path(model_dir).iterdir() if p.is_file() and p.name.endswith(WEIGHT_SUFFIXES))
    if not files:
        raise FileNotFoundError(f"{model_dir}: no weight files ({', '.join(WEIGHT_SUFFIXES)}) to hash")
    h = hashlib.sha256()
    for p in files:
        h.update(f"{p.name}\0{p.stat().st_size}\0".encode())
        _update(h, p)
    return h.hexdigest()


def versions() -> dict[str, str]:
    import numpy
    import torch
    import transformers

    from importlib.metadata import PackageNotFoundError, version

    try:
        rla_version = version("rla")
    except PackageNotFoundError:
        rla_version = "unknown (not installed)"
    return {"rla": rla_version, "python": platform.python_version(), "torch": torch.__version__,
            "transformers": transformers.__version__, "numpy": numpy.__version__}


def inputs_record(*, model_path, rollouts_path, profile: str, command: list[str] | None = None) -> dict:
    """The ``inputs`` block of report.json: model path + weights hash, rollouts path + hash, profile, versions, command."""
    return {
        "model": {"path": str(model_path), "weights_sha256": weights_sha256(model_path)},
        "rollouts": {"path": str(rollouts_path), "sha256": file_sha256(rollouts_path)},
        "profile": profile,
        "versions": versions(),
        "command": list(sys.argv if command is None else command),
    }


def recheck(inputs: dict) -> None:
    """Hash the inputs of ``inputs`` (an :func:`inputs_record`) again; an error names any that changed."""
    changed = []
    model, roll = inputs["model"], inputs["rollouts"]
    try:
        if weights_sha256(model["path"]) != model["weights_sha256"]:
            changed.append(f"the weights in {model['path']}")
    except OSError as e:
        changed.append(f"the weights in {model['path']} ({e})")
    try:
        if file_sha256(roll["path"]) != roll["sha256"]:
            changed.append(f"the rollouts file {roll['path']}")
    except OSError as e:
        changed.append(f"the rollouts file {roll['path']} ({e.strerror or e})")
    if changed:
        raise InputChangedError(
            f"{' and '.join(changed)} changed while rla read {'them' if len(changed) > 1 else 'it'}; no report "
            "was written (it would name bytes other than the ones diagnosed). Run again on files nothing writes to."
        )
