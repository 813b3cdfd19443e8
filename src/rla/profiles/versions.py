"""Which calibrated row an engine alias means for the engine the user actually runs.

``"vllm"`` names an engine and a mode (read from the row it aliases: its ``calibration.engine`` and
``calibration.mode``), not a version. :func:`for_engine` finds the version -- given by the caller,
recorded in the rollout records (their ``engine_version`` field), or the installed package's
metadata (read with :mod:`importlib.metadata`, never by importing the engine) -- and picks the
built-in row calibrated for that version and mode. A version with no calibrated row gets the
nearest one and a :class:`ProfileVersionWarning` that names both versions and ``rla calibrate``.
The versions come from the data files' ``calibration.version``: a new row is a new file, never a
new branch here.
"""

from __future__ import annotations

import importlib.metadata
import logging
import os
import warnings
from dataclasses import dataclass

from packaging.version import InvalidVersion, Version

from rla.profiles.model import RoundingProfile
from rla.profiles.registry import aliases, all_profiles

__all__ = [
    "EngineMatch", "ProfileVersionWarning", "for_engine", "engine_alias", "installed_version",
    "rollout_version", "calibrated_rows",
]

_log = logging.getLogger("rla.profiles")


class ProfileVersionWarning(UserWarning):
    """The engine version in use has no calibrated row; the nearest row is used instead."""


@dataclass(frozen=True)
class EngineMatch:
    """The row an engine alias resolved to, and why.

    ``version`` is the engine's version (None: not found anywhere, so the newest row is used);
    ``source`` says where it came from (``"given"``, ``"rollouts"``, ``"installed"`` or ``"none"``);
    ``calibrated`` is True when ``profile`` was calibrated on that very release.
    """

    alias: str
    engine: str
    mode: str
    version: str | None
    source: str
    profile: RoundingProfile
    calibrated: bool

    @property
    def row_version(self) -> str:
        return self.profile.calibration.version

    def message(self) -> str:
        """One line for a log or an alignment report."""
        row = f"{self.profile.name} (calibrated on {self.engine} {self.row_version}, mode {self.mode})"
        if self.version is None:
            return (f"profile {self.alias!r} -> {row}: no {self.engine} version found (given, recorded "
                    f"in rollouts or installed), so the newest calibrated row")
        where = {"given": "given", "rollouts": "recorded in the rollouts", "installed": "installed"}[self.source]
        if self.calibrated:
            return f"profile {self.alias!r} -> {row}: the row of {self.engine} {self.version} ({where})"
        return (
            f"profile {self.alias!r} -> {row}, the nearest calibrated row: {self.engine} {self.version} "
            f"({where}) has no calibrated row, and where an engine rounds changes between versions. "
            f"Calibrate it: rla calibrate --engine {self.engine} "
            f"--mode {self.mode} --out {self.engine}-{self.version}-{self.mode}.json, then "
            f"rla.align(model, rla.profiles.load('{self.engine}-{self.version}-{self.mode}.json'))"
        )


def _release(v: str) -> Version | None:
    try:
        return Version(Version(v).base_version)  # 0.33.0+cu130 -> 0.33.0; 0.33 == 0.33.0
    except InvalidVersion:
        return None


def engine_alias(name: str) -> tuple[str, str] | None:
    """``(engine, mode)`` for an engine alias (``"vllm"`` -> ``("vllm", "default")``), None for
    anything else (a versioned row name, ``hf``, ``rla``, an unknown name)."""
    target = aliases().get(name) if isinstance(name, str) else None
    if target is None:
        return None
    cal = all_profiles()[target].calibration
    return cal.engine, cal.mode


def calibrated_rows(engine: str, mode: str) -> list[RoundingProfile]:
    """The built-in rows of ``engine`` in ``mode``, oldest version first."""
    rows = [p for p in all_profiles().values()
            if p.calibration is not None and p.calibration.engine == engine and p.calibration.mode == mode]
    return sorted(rows, key=lambda p: _release(p.calibration.version) or Version("0"))


def installed_version(engine: str) -> str | None:
    """The installed ``engine``'s version from its package metadata (the engine is not imported),
    or None when it is not installed."""
    try:
        return importlib.metadata.version(engine)
    except importlib.metadata.PackageNotFoundError:
        return None


def rollout_version(records, engine: str | None = None) -> str | None:
    """The ``engine_version`` the rollout records carry (loaded records: this floor does not read
    files of the rollout floor above it), among those of ``engine`` when given; None when none
    carries one. Two different versions in one set of records is a ``ValueError``: they need
    different rows."""
    if isinstance(records, (str, os.PathLike)):
        raise TypeError("rollout_version takes loaded records (rla.rollout.rollouts.load(path)), not a path")
    versions = set()
    for r in records:
        v = getattr(r, "engine_version", None)
        if v is None or (engine is not None and not r.engine.startswith(engine)):
            continue
        versions.add(v)
    if len(versions) > 1:
        raise ValueError(
            f"the rollout records come from several {engine or 'engine'} versions ({', '.join(sorted(versions))}); "
            "each needs its own profile row: diagnose or align them separately"
        )
    return versions.pop() if versions else None


def _nearest(rows: list[RoundingProfile], version: Version) -> RoundingProfile:
    """The newest row not newer than ``version``; the oldest row when ``version`` predates all."""
    older = [p for p in rows if (_release(p.calibration.version) or Version("0")) <= version]
    return older[-1] if older else rows[0]


def for_engine(alias: str, version: str | None = None, records=None, *, warn: bool = True) -> EngineMatch | None:
    """The calibrated row for ``alias`` (``"vllm"``, ``"vllm-eager"``, ``"sglang"``) and the engine
    version in use: ``version`` if given, else the ``engine_version`` of ``records``, else the
    installed package's. None when ``alias`` is not an engine alias (use :func:`rla.profiles.resolve`).

    An uncalibrated version gets the nearest row (the newest calibrated release before it, else the
    oldest) and, with ``warn``, a :class:`ProfileVersionWarning`; the match is logged either way.
    """
    em = engine_alias(alias)
    if em is None:
        return None
    engine, mode = em
    source = "given"
    if version is None and records is not None:
        version, source = rollout_version(records, engine), "rollouts"
    if version is None:
        version, source = installed_version(engine), "installed"
    if version is None:
        source = "none"
    rows = calibrated_rows(engine, mode)
    wanted = None if version is None else _release(str(version))
    if version is not None and wanted is None:
        raise ValueError(f"{engine} version {version!r} is not a version number (e.g. 0.33.0)")
    if wanted is None:
        row, exact = rows[-1], False
    else:
        same = [p for p in rows if _release(p.calibration.version) == wanted]
        row, exact = (same[-1], True) if same else (_nearest(rows, wanted), False)
    match = EngineMatch(alias, engine, mode, None if version is None else str(version), source, row, exact)
    if version is not None and not exact and warn:
        warnings.warn(match.message(), ProfileVersionWarning, stacklevel=3)
    else:
        _log.info("rla: %s", match.message())
    return match
