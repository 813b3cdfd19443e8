"""Argument checks shared by the commands: refuse bad values before any work, with a clear message.

Numeric flags are argparse ``type=`` functions (argparse prints ``rla CMD: error: argument ...``
and exits 2 before anything runs); a device is checked against what this machine has.
"""

from __future__ import annotations

import argparse

__all__ = ["positive_int", "nonnegative_int", "positive_float", "check_device", "model_path", "MODEL_HELP"]


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None


def positive_int(text: str) -> int:
    v = _int(text)
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {v}")
    return v


def nonnegative_int(text: str) -> int:
    v = _int(text)
    if v < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {v}")
    return v


def positive_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not v > 0 or v == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text}")
    return v


MODEL_HELP = "'bundled' (the bundled tiny model; ./bundled for a folder of that name)"


def model_path(text: str) -> str:
    """``--model``: an HF checkpoint folder, or ``bundled`` for the bundled tiny model's folder."""
    if text == "bundled":
        from rla.models import bundled_path

        return str(bundled_path())
    return text


def check_device(name: str) -> str:
    """``name`` if this machine can run on it; a ValueError that says why not otherwise."""
    import torch

    try:
        dev = torch.device(name)
    except (RuntimeError, TypeError):
        raise ValueError(f"--device {name!r}: unknown device; use cpu, cuda or cuda:N") from None
    if dev.type == "cpu":
        return name
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            build = "a CPU-only build" if torch.version.cuda is None else f"built for CUDA {torch.version.cuda}"
            raise ValueError(f"--device {name}: no CUDA GPU is visible here (torch {torch.__version__}, {build}); "
                             "use --device cpu")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ValueError(f"--device {name}: only {torch.cuda.device_count()} CUDA device(s) visible")
        return name
    if dev.type == "mps" and torch.backends.mps.is_available():
        return name
    raise ValueError(f"--device {name}: not available on this machine; use cpu or cuda")
