"""Rounding profiles: where a stack rounds fp32 intermediates to its low-precision dtype.

A profile is data (:mod:`rla.profiles.model`): its rounding points (the LM head's in
:mod:`rla.profiles.head`), and for an engine row the calibration that measured them. The built-in rows are JSON files (:mod:`rla.profiles.registry`):
``hf`` (HF transformers eager), ``rla`` (the paper's recipe) and one row per calibrated engine
version and mode (``vllm-0.33``, ``vllm-0.33-eager``, ``sglang-0.5.23``); the aliases ``vllm``,
``vllm-eager``, ``sglang`` resolve to the newest calibrated row in :func:`get`, and in
``rla.align`` / ``rla.diagnose`` / the integrations to the row of the engine version in use
(:func:`for_engine`: given, recorded in the rollouts, or installed). A new engine, or a new version of
one, is a new data file (``rla calibrate`` writes it), not a new code path.
"""

from rla.profiles.head import HEAD_POINTS, HEAD_SETTINGS
from rla.profiles.model import (
    CONDITIONS,
    EVIDENCE,
    POINTS,
    REGION_POINTS,
    REGIONS,
    Calibration,
    PointCondition,
    PointEvidence,
    RoundingProfile,
    VARIANT_EXTENDS,
    VARIANT_POINT_KINDS,
    VARIANT_POINTS,
    VARIANTS,
)
from rla.profiles.router import ROUTER_POINTS, RouterPoints
from rla.profiles.registry import (
    alias_target,
    aliases,
    all_profiles,
    from_dict,
    get,
    load,
    names,
    resolve,
    to_dict,
)
from rla.profiles.versions import (
    EngineMatch,
    ProfileVersionWarning,
    calibrated_rows,
    engine_alias,
    for_engine,
    installed_version,
    rollout_version,
)

__all__ = [
    "RoundingProfile", "Calibration", "PointEvidence", "POINTS", "REGIONS", "REGION_POINTS", "EVIDENCE", "VARIANTS",
    "VARIANT_EXTENDS", "VARIANT_POINTS", "VARIANT_POINT_KINDS", "PointCondition", "CONDITIONS", "get", "names", "resolve", "load", "from_dict", "to_dict", "aliases", "alias_target", "all_profiles",
    "for_engine", "EngineMatch", "ProfileVersionWarning", "engine_alias", "installed_version",
    "rollout_version", "calibrated_rows", "RouterPoints", "ROUTER_POINTS", "HEAD_POINTS", "HEAD_SETTINGS",
]
