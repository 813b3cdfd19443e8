"""The stamp every results file and run log carries: GPU, versions, date and command line.

Benchmarks (``rla bench``), training runs (``rla train``) and experiments (``rla experiment``)
write it beside their numbers, so a number can be traced to the hardware and software that made
it. It includes the fused kernels' launch parameters in effect (:func:`rla.ops.launch_config`),
which change speed but not numbers.
"""

from __future__ import annotations

import datetime
import platform
import shlex
import sys
from typing import Any

import torch

from rla.ops import launch_config

__all__ = ["environment", "env_markdown", "cpu_model"]


def environment(device: torch.device | None = None) -> dict[str, Any]:
    """GPU, versions, date and command line: the stamp every results file carries."""
    env: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(shlex.quote(a) for a in sys.argv),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
    }
    for mod in ("triton", "transformers", "liger_kernel"):
        try:
            m = __import__(mod)
            env[mod] = getattr(m, "__version__", None) or _dist_version(mod)
        except Exception:
            env[mod] = None
    env["rla_launch"] = launch_config()
    if torch.cuda.is_available():
        d = device or torch.device("cuda")
        p = torch.cuda.get_device_properties(d)
        env["gpu"] = p.name
        env["gpu_memory_gib"] = round(p.total_memory / 2**30, 1)
        env["sm_count"] = p.multi_processor_count
    else:  # named, never left out: a results file says which machine made it
        env["gpu"] = "none (CPU)"
        env["cpu"] = f"{cpu_model()} ({platform.machine()}), {torch.get_num_threads()} threads"
    return env


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``'s, on Linux) and its widest vector unit as torch's CPU
    kernels see it: CPU results move with both (another CPU's kernels reduce in another order)."""
    name = None
    try:
        with open("/proc/cpuinfo") as f:
            name = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), None)
    except OSError:
        pass
    name = name or platform.processor() or "unknown CPU"
    try:
        capability = torch.backends.cpu.get_cpu_capability()
    except Exception:
        return name
    return f"{name}, {capability}"


def _dist_version(mod: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(mod.replace("_", "-"))
    except PackageNotFoundError:
        return None


def env_markdown(env: dict) -> str:
    """The stamp as a Markdown list, for the results file's table header."""
    keys = ("gpu", "date", "torch", "cuda", "triton", "transformers", "liger_kernel", "command")
    return "\n".join(f"- {k}: `{env.get(k)}`" for k in keys) + "\n"
