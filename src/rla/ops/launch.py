"""Launch parameters of the fused Triton kernels, read and set through public names.

The kernels' block sizes, warps and grid shapes change their speed, never their numbers (each
program computes whole rows or whole elements; the GPU tests check every launch shape bit for
bit against the reference), with one exception: the norm's ``norm.*`` tile decides the register
layout a row's ``tl.sum`` reduces over (so the order of the sum under
``norm_reduction='unpinned'`` and of the backward's per-row sum), and its backward grid the rows
each d_weight partial adds; the defaults keep the per-row layouts of the tiles tuned before
(``_triton_norm.NARROW_COLS``). The defaults are the values ``lab/bench/tune_fused.py`` picked on an
H200; another GPU may want others, so benchmarks stamp the parameters in effect into every results
file (:func:`launch_config`) and ``rla bench --config tuned.json`` applies a tuned set
(:func:`set_launch_config`). Keys are ``<kernel>.<parameter>``, e.g. ``"rope.num_warps"``; the
values live in the kernel modules, which read them at each launch.

Without Triton there are no kernels: :func:`launch_config` returns ``{}`` and
:func:`set_launch_config` raises.
"""

from __future__ import annotations

import importlib
import importlib.util

__all__ = ["PARAMETERS", "launch_config", "set_launch_config"]

#: Public key -> (kernel module, its module-level name, allowed value types).
PARAMETERS: dict[str, tuple[str, str, tuple[type, ...]]] = {
    "swiglu.fwd_block": ("rla.ops._triton_swiglu", "FWD_BLOCK", (int,)),
    "swiglu.fwd_warps": ("rla.ops._triton_swiglu", "FWD_WARPS", (int,)),
    "swiglu.bwd_block": ("rla.ops._triton_swiglu", "BWD_BLOCK", (int,)),
    "swiglu.bwd_warps": ("rla.ops._triton_swiglu", "BWD_WARPS", (int,)),
    "geglu.fwd_block": ("rla.ops._triton_geglu", "FWD_BLOCK", (int,)),
    "geglu.fwd_warps": ("rla.ops._triton_geglu", "FWD_WARPS", (int,)),
    "geglu.bwd_block": ("rla.ops._triton_geglu", "BWD_BLOCK", (int,)),
    "geglu.bwd_warps": ("rla.ops._triton_geglu", "BWD_WARPS", (int,)),
    "swiglu_oai.fwd_block": ("rla.ops._triton_swiglu_oai", "FWD_BLOCK", (int,)),
    "swiglu_oai.fwd_warps": ("rla.ops._triton_swiglu_oai", "FWD_WARPS", (int,)),
    "swiglu_oai.bwd_block": ("rla.ops._triton_swiglu_oai", "BWD_BLOCK", (int,)),
    "swiglu_oai.bwd_warps": ("rla.ops._triton_swiglu_oai", "BWD_WARPS", (int,)),
    "rope.num_warps": ("rla.ops._triton_rope", "NUM_WARPS", (int,)),
    "rope.tokens": ("rla.ops._triton_rope", "TOKENS", (int,)),
    "norm.fwd_rows": ("rla.ops._triton_norm", "FWD_ROWS", (int,)),
    "norm.fwd_warps": ("rla.ops._triton_norm", "FWD_WARPS", (int, type(None))),
    "norm.bwd_rows": ("rla.ops._triton_norm", "BWD_ROWS", (int,)),
    "norm.bwd_warps": ("rla.ops._triton_norm", "BWD_WARPS", (int, type(None))),
    "norm.bwd_programs_per_sm": ("rla.ops._triton_norm", "BWD_PROGRAMS_PER_SM", (int,)),
    "norm.bwd_stages": ("rla.ops._triton_norm", "BWD_STAGES", (int,)),
    "norm.narrow_cols": ("rla.ops._triton_norm", "NARROW_COLS", (int,)),
    "norm.bwd_narrow_warps": ("rla.ops._triton_norm", "BWD_NARROW_WARPS", (int,)),
    "norm.bwd_unroll": ("rla.ops._triton_norm", "BWD_UNROLL", (int,)),
    "norm.evict": ("rla.ops._triton_norm", "EVICT", (str,)),
}

_POW2 = ("_block", "_warps", "_rows", ".tokens", ".num_warps")
_EVICT = ("", "evict_first", "evict_last")


def _has_triton() -> bool:
    return importlib.util.find_spec("triton") is not None


def launch_config() -> dict[str, int | str | None]:
    """The launch parameters in effect, ``{key: value}``; ``{}`` where Triton is not installed."""
    if not _has_triton():
        return {}
    return {key: getattr(importlib.import_module(mod), name) for key, (mod, name, _) in PARAMETERS.items()}


def set_launch_config(config: dict) -> None:
    """Set launch parameters from ``{key: value}`` (the shape :func:`launch_config` returns).

    Every key and value is checked before anything is set, so a bad entry changes nothing: an
    unknown key, a value of the wrong type (``bool`` is not an ``int`` here), a count that is not a
    positive integer, a block, row, token or warp count that is not a power of two (Triton's
    ``tl.arange`` and ``num_warps`` need one), an unroll other than 1 or 2, or an unknown eviction
    policy is a ``ValueError`` naming it.
    """
    if not isinstance(config, dict):
        raise ValueError(f"launch config must be a mapping of parameter -> value, got {type(config).__name__}")
    for key, value in config.items():
        if key not in PARAMETERS:
            raise ValueError(f"launch config: unknown parameter {key!r}; known: {', '.join(PARAMETERS)}")
        types = PARAMETERS[key][2]
        if isinstance(value, bool) or not isinstance(value, types):
            want = " or ".join("None" if t is type(None) else t.__name__ for t in types)
            raise ValueError(f"launch config: {key} must be {want}, got {value!r}")
        if isinstance(value, int) and value < 1:
            raise ValueError(f"launch config: {key} must be a positive integer, got {value}")
        if isinstance(value, int) and key.endswith(_POW2) and value & (value - 1):
            raise ValueError(f"launch config: {key} must be a power of two (a tl.arange extent or a warp count), got {value}")
        if key == "norm.bwd_unroll" and value not in (1, 2):
            raise ValueError(f"launch config: norm.bwd_unroll must be 1 or 2 (tiles per loop step), got {value}")
        if key == "norm.evict" and value not in _EVICT:
            raise ValueError(f"launch config: norm.evict must be one of {_EVICT}, got {value!r}")
    if config and not _has_triton():
        raise ValueError("launch config: Triton is not installed, so there are no fused kernels to configure")
    for key, value in config.items():
        mod, name, _ = PARAMETERS[key]
        setattr(importlib.import_module(mod), name, value)
