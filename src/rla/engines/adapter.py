"""The engine adapter contract, as code: what an adapter gives, and which adapters there are.

An *engine adapter* is rla's view of one inference engine version, built from the engine's own
code (its package or wheel, loaded at run time; nothing of it is copied into rla). Three
contracts, so that each user asks only for what it needs:

- :class:`Engine`: identity. ``name`` (as in profiles and reports: ``vllm``, ``sglang``),
  ``version`` (the engine's version string), ``modes`` (the modes it can be run or calibrated
  in, the first the engine's default) and ``provenance`` (for each function, dispatch link or
  kernel that runs: ``{"file", "sha256", "line"}`` of the source, so a result names the exact
  code behind it). Every adapter has these; reports and results stamps read nothing else.
- :class:`RegionEngine`: the engine's *region code*, as calibration (:mod:`rla.engines.calibrate`)
  and the conformance report read it: ``region_ops(mode, device, library)`` gives the region
  functions of one mode as a :class:`~rla.engines.regions.RegionOps` (signatures there);
  ``cos_sin_cache`` / ``rope_cache`` / ``inv_freq`` are the engine's own rotary builders (the fp32
  table, the table as its rope kernel reads it, the fp32 frequencies); ``source_fact(point)``
  states a point's value from the source where running the code cannot decide it (raising
  ``KeyError`` for a point it has no fact for); ``baseline`` names the profile whose evidence is
  kept for a point nothing could run for (``None``: the adapter's ops never go missing), and
  ``profile_name`` the row name calibration writes (``""``: ``<name>-<major.minor>[-<mode>]``).
  :class:`~rla.engines.vllm.VllmEngine` and :class:`~rla.engines.sglang.SglangEngine` implement
  it. The twin (:mod:`rla.engines.vllm_twin`) and the engine-backed ops (:mod:`rla.engines.backed`,
  :mod:`rla.engines.vllm_forward`) use one engine's region code beyond this contract (vLLM's
  native ops by name, its compiled ``_C`` kernels), which is why their names say the engine.
- :class:`RolloutEngine`: the engine *running*: its own generate path on a model, returning rla
  rollout records (:class:`rla.rollout.rollouts.RolloutRecord`) with the engine's version, mode
  and settings in each. ``mode`` is the one mode this instance runs in; ``settings`` the
  engine-side switches it was started with (attention backend, ``enforce_eager``, compile
  options...), recorded so a record says what produced it. A live engine (vLLM's offline
  ``LLM``) implements this and :class:`Engine`, not :class:`RegionEngine`: it cannot hand out
  single region ops, and calibrating against it is a model-level search, not per-op probes.

The contracts are ``typing.Protocol`` classes (structural: an adapter does not inherit from
them) and ``runtime_checkable``; :func:`missing` lists what an object lacks of one, with the
callables checked to be callable (``isinstance`` alone only checks that names exist).

:data:`ENGINES` is the registry of region adapters: engine name -> module with
``load(wheel=None)``; :func:`load_engine` loads one and checks it against :class:`RegionEngine`.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

__all__ = ["Engine", "RegionEngine", "RolloutEngine", "ENGINES", "load_engine", "missing"]


@runtime_checkable
class Engine(Protocol):
    """Identity of one engine version: what every adapter gives."""

    name: str
    version: str
    modes: tuple[str, ...]
    provenance: dict[str, dict[str, Any]]


@runtime_checkable
class RegionEngine(Engine, Protocol):
    """An engine's region code, loaded from its package or wheel: what calibration runs."""

    baseline: str | None
    profile_name: str

    def region_ops(self, mode: str, device, library: str | None = None):
        """The region functions of ``mode`` on ``device`` (a :class:`~rla.engines.regions.RegionOps`)."""

    def cos_sin_cache(self, head_size: int, rotary_dim: int, max_position: int, base: float,
                      rope_scaling: dict | None = None, dtype=None, device="cpu"):
        """The engine's cos/sin table [max_position, rotary_dim] = cat(cos, sin), brought to ``dtype``."""

    def rope_cache(self, head_size: int, rotary_dim: int, max_position: int, base: float,
                   rope_scaling: dict | None, query_dtype, device):
        """The cos/sin table as the engine's rope kernel reads it for a query of ``query_dtype``."""

    def inv_freq(self, rotary_dim: int, base: float, rope_scaling: dict | None = None, device="cpu"):
        """The engine's fp32 rotary frequencies, evaluated on ``device``."""

    def source_fact(self, point: str) -> dict[str, str]:
        """``{"choice", "why", "where"}`` of ``point`` as the source states it; ``KeyError`` if none."""


@runtime_checkable
class RolloutEngine(Engine, Protocol):
    """The engine running its own generate path: prompts in, rla rollout records out."""

    mode: str
    settings: dict[str, Any]

    def generate(self, prompts: Sequence[Sequence[int]], params, *, metadata: dict | None = None) -> list:
        """One :class:`~rla.rollout.rollouts.RolloutRecord` per prompt (and per sample), sampled by the
        engine under ``params`` (temperature, top-k / top-p, max new tokens), each carrying the
        engine's name, version, mode and ``settings``."""


#: Members of each contract that must be callable (the rest are data attributes).
_METHODS = {
    Engine: (),
    RegionEngine: ("region_ops", "cos_sin_cache", "rope_cache", "inv_freq", "source_fact"),
    RolloutEngine: ("generate",),
}
_ATTRIBUTES = {
    Engine: ("name", "version", "modes", "provenance"),
    RegionEngine: ("name", "version", "modes", "provenance", "baseline", "profile_name"),
    RolloutEngine: ("name", "version", "modes", "provenance", "mode", "settings"),
}


def missing(obj: Any, contract: type) -> list[str]:
    """What ``obj`` lacks of ``contract`` (one of this module's three): absent attributes, members
    that should be callable and are not, a ``modes`` that is not a non-empty tuple of strings.
    Empty when ``obj`` conforms."""
    if contract not in _METHODS:
        raise ValueError(f"{contract!r} is not an engine contract; one of Engine, RegionEngine, RolloutEngine")
    out = [f"no attribute {a!r}" for a in _ATTRIBUTES[contract] + _METHODS[contract] if not hasattr(obj, a)]
    out += [f"{m!r} is not callable" for m in _METHODS[contract] if hasattr(obj, m) and not callable(getattr(obj, m))]
    modes = getattr(obj, "modes", None)
    if hasattr(obj, "modes") and not (isinstance(modes, tuple) and modes and all(isinstance(m, str) for m in modes)):
        out.append(f"'modes' must be a non-empty tuple of mode names, got {modes!r}")
    return out


#: The region adapters: engine name -> module with ``load(wheel=None)``.
ENGINES: dict[str, str] = {"vllm": "rla.engines.vllm", "sglang": "rla.engines.sglang"}


def load_engine(engine: str, wheel: str | None = None):
    """The region adapter of ``engine`` (:data:`ENGINES`), loaded from ``wheel`` or the installed
    package; an adapter that does not meet :class:`RegionEngine` is a bug in rla and raises
    ``RuntimeError`` naming what it lacks (the CLI shows it as an internal error, with its traceback)."""
    if engine not in ENGINES:
        raise ValueError(f"unknown engine {engine!r}; supported: {', '.join(ENGINES)}")
    eng = importlib.import_module(ENGINES[engine]).load(wheel)
    lacks = missing(eng, RegionEngine)
    if lacks:
        raise RuntimeError(f"rla's {engine} adapter breaks the RegionEngine contract: {'; '.join(lacks)}")
    return eng
