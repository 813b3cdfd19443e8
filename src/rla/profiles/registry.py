"""The profile table: versioned rows read from JSON data files, and the aliases that name them.

Each row is one file in ``rla/profiles/data/`` (the same format :func:`load` reads from a user's
file and ``rla calibrate`` writes). An engine row names its engine, version and mode; the alias
``<engine>`` (default mode) or ``<engine>-<mode>`` resolves to the newest calibrated version of
that engine and mode, so ``get("vllm")`` is ``vllm-0.33`` today and the next calibrated release
tomorrow -- and :func:`alias_target` says which.
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

from packaging.version import InvalidVersion, Version

from rla import strict_json
from rla.strict_json import short
from rla.profiles.model import CONDITIONS, POINTS, VARIANTS, Calibration, PointCondition, PointEvidence, RoundingProfile
from rla.profiles.router import ROUTER_POINTS, RouterPoints

__all__ = ["get", "names", "resolve", "load", "from_dict", "to_dict", "aliases", "alias_target", "all_profiles",
           "LIVE_KEYS", "LIVE_SCORE_KEYS"]

#: The keys of a live calibration block (``Calibration.live``), each required.
LIVE_KEYS = ("settings", "model", "prefill_tokens", "decode_tokens", "start", "found")
#: The keys of its ``start`` and ``found`` rows: the row's name and its measured agreement.
LIVE_SCORE_KEYS = ("name", "prefill_equal", "prefill_k3", "decode_equal", "decode_k3")

#: Order of the built-in rows in tables: HF first, rla last, engines in between by name.
_FIRST, _LAST = ("hf",), ("rla",)


def from_dict(data: dict, source: str = "<dict>") -> RoundingProfile:
    """A profile from its JSON form; every missing or unknown key is an error naming ``source``."""
    if not isinstance(data, dict):
        raise ValueError(f"{source}: a profile is a JSON object, got {type(data).__name__}")
    unknown = set(data) - {"name", "description", "points", "calibration", "variants", "conditions", "router"}
    if unknown:
        raise ValueError(f"{source}: unknown key(s) {sorted(unknown)}; a profile has name, description, points, "
                         "calibration and optionally variants, conditions and router")
    for key in ("name", "points"):
        if key not in data:
            raise ValueError(f"{source}: missing {key!r}")
    pts = data["points"]
    if not isinstance(pts, dict):
        raise ValueError(f"{source}: 'points' must be an object of point -> choice")
    missing = [p for p in POINTS if p not in pts]
    extra = [p for p in pts if p not in POINTS]
    if missing or extra:
        raise ValueError(
            f"{source}: points must be exactly {list(POINTS)}; missing {missing}, unknown {extra}"
        )
    cal = data.get("calibration")
    calibration = None
    if cal is not None:
        if not isinstance(cal, dict):
            raise ValueError(f"{source}: 'calibration' must be an object (engine, version, mode, ...), "
                             f"got {type(cal).__name__}")
        cal = dict(cal)
        points = cal.pop("points", None) or {}
        if not isinstance(points, dict):
            raise ValueError(f"{source}: calibration 'points' must be an object of point -> evidence, "
                             f"got {type(points).__name__}")
        evidence = {}
        for point, ev in points.items():
            if point not in POINTS:
                raise ValueError(f"{source}: calibration names unknown point {point!r}")
            evidence[point] = _evidence(ev, f"{source}: calibration point {point!r}")
        for key in ("engine", "version", "mode", "date", "gpu", "torch", "command", "results"):
            if key in cal and not isinstance(cal[key], str):
                raise ValueError(f"{source}: calibration {key!r} must be a string, got {short(cal[key])}")
        if cal.get("live") is not None:
            _live(cal["live"], f"{source}: calibration 'live'")
        live_points = sorted(p for p, e in evidence.items() if e.evidence == "live")
        if live_points and cal.get("live") is None:
            raise ValueError(f"{source}: calibration points {live_points} have evidence 'live' but the calibration "
                             "has no 'live' block saying what ran and what was measured")
        try:
            calibration = Calibration(points=evidence, **cal)
        except TypeError as e:
            raise ValueError(f"{source}: calibration: {e}") from None
    variants, variant_evidence = _variants(data.get("variants", {}), source)
    conditions = _conditions(data.get("conditions", []), source)
    router = None if data.get("router") is None else _router(data["router"], f"{source}: router")
    try:
        return RoundingProfile(
            name=data["name"], description=data.get("description", ""), calibration=calibration,
            variants=variants, variant_evidence=variant_evidence, conditions=conditions, router=router, **pts
        )
    except ValueError as e:
        raise ValueError(f"{source}: {e}") from None


def _variants(data, source: str) -> tuple[dict, dict]:
    """``variants``: kind -> {"points": {point: choice}, "evidence": {point: evidence}}; every
    variant point needs its evidence (a variant is a claim about the engine's code)."""
    if not isinstance(data, dict):
        raise ValueError(f"{source}: 'variants' must be an object of kind -> {{points, evidence}}")
    variants, evidence = {}, {}
    for kind, v in data.items():
        where = f"{source}: variant {kind!r}"
        if kind not in VARIANTS:
            raise ValueError(f"{where}: unknown kind; variants are {list(VARIANTS)}")
        if not isinstance(v, dict) or set(v) != {"points", "evidence"}:
            raise ValueError(f"{where}: must be an object with exactly 'points' and 'evidence'")
        if not isinstance(v["points"], dict) or not isinstance(v["evidence"], dict):
            raise ValueError(f"{where}: 'points' and 'evidence' must be objects keyed by point")
        if set(v["points"]) != set(v["evidence"]):
            raise ValueError(f"{where}: every point needs its evidence; points {sorted(v['points'])}, "
                             f"evidence {sorted(v['evidence'])}")
        variants[kind] = dict(v["points"])
        evidence[kind] = {p: _evidence(e, f"{where} point {p!r}") for p, e in v["evidence"].items()}
    return variants, evidence


def _conditions(data, source: str) -> tuple[PointCondition, ...]:
    """``conditions``: a list of {"when": {key: [head sizes]}, "points": {point: choice},
    "evidence": {point: evidence}} (:class:`rla.profiles.PointCondition`); every malformed part
    names ``source`` and the condition's index."""
    if not isinstance(data, list):
        raise ValueError(f"{source}: 'conditions' must be a list of {{when, points, evidence}} objects")
    out = []
    for i, c in enumerate(data):
        where = f"{source}: condition {i}"
        if not isinstance(c, dict) or set(c) != {"when", "points", "evidence"}:
            raise ValueError(f"{where}: must be an object with exactly 'when', 'points' and 'evidence'")
        if not isinstance(c["when"], dict) or not set(c["when"]) <= set(CONDITIONS):
            raise ValueError(f"{where}: 'when' must be an object with one of {list(CONDITIONS)}, got {short(c['when'])}")
        if not isinstance(c["evidence"], dict):
            raise ValueError(f"{where}: 'evidence' must be an object of point -> evidence")
        evidence = {p: _evidence(e, f"{where} point {p!r}") for p, e in c["evidence"].items()}
        try:
            out.append(PointCondition(when=c["when"], points=c["points"], evidence=evidence))
        except (TypeError, ValueError) as e:
            raise ValueError(f"{where}: {e}") from None
    return tuple(out)


def _router(data, where: str) -> RouterPoints:
    """The router points of a profile file: ``{"points": {...}, "evidence": {point: {...}}}``."""
    if not isinstance(data, dict) or set(data) - {"points", "evidence"} or "points" not in data:
        raise ValueError(f"{where}: must be an object with 'points' (and optionally 'evidence'), got {short(data)}")
    pts, evidence = data["points"], data.get("evidence") or {}
    if not isinstance(pts, dict) or not isinstance(evidence, dict):
        raise ValueError(f"{where}: 'points' and 'evidence' must be objects of point -> value")
    missing = [p for p in ROUTER_POINTS if p not in pts]
    extra = [p for p in (*pts, *evidence) if p not in ROUTER_POINTS]
    if missing or extra:
        raise ValueError(f"{where}: points must be exactly {list(ROUTER_POINTS)}; missing {missing}, unknown {extra}")
    try:
        return RouterPoints(**pts, evidence={p: _evidence(e, f"{where} evidence {p!r}") for p, e in evidence.items()})
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None


def _evidence(ev, where: str) -> PointEvidence:
    """One calibration point's evidence from its JSON object; every malformed part names ``where``."""
    if not isinstance(ev, dict):
        raise ValueError(f"{where}: must be an object (evidence, matched, note), got {type(ev).__name__}")
    unknown = sorted(set(ev) - {"evidence", "matched", "note"})
    if unknown or "evidence" not in ev:
        raise ValueError(f"{where}: has keys {sorted(ev)}; it needs 'evidence' and may have 'matched', 'note'")
    matched = ev.get("matched")
    try:
        number = matched is None or (not isinstance(matched, bool) and isinstance(matched, (int, float))
                                     and float(matched) == float(matched))
    except OverflowError:
        number = False
    if not number:
        raise ValueError(f"{where}: 'matched' must be a fraction in [0, 1] or null, got {short(matched)}")
    if not isinstance(ev.get("note", ""), str):
        raise ValueError(f"{where}: 'note' must be a string, got {short(ev['note'])}")
    try:
        return PointEvidence(**ev)
    except (ValueError, OverflowError) as e:
        raise ValueError(f"{where}: {e}") from None


def _live(block, where: str) -> None:
    """A live calibration block (``Calibration.live``): every key of :data:`LIVE_KEYS`, nothing else,
    each of its kind; token counts >= 1, every fraction in [0, 1], every k3 a finite number >= 0."""
    if not isinstance(block, dict):
        raise ValueError(f"{where}: must be an object ({', '.join(LIVE_KEYS)}), got {type(block).__name__}")
    if set(block) != set(LIVE_KEYS):
        raise ValueError(f"{where}: has keys {sorted(block)}; it needs exactly {list(LIVE_KEYS)}")
    for key in ("settings", "model"):
        if not isinstance(block[key], dict):
            raise ValueError(f"{where}: {key!r} must be an object, got {short(block[key])}")
    for key in ("prefill_tokens", "decode_tokens"):
        v = block[key]
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{where}: {key!r} must be the number of logprobs scored (an integer >= 1), "
                             f"got {short(v)}")
    for side in ("start", "found"):
        row = block[side]
        if not isinstance(row, dict) or set(row) != set(LIVE_SCORE_KEYS):
            got = sorted(row) if isinstance(row, dict) else short(row)
            raise ValueError(f"{where}: {side!r} must be an object with exactly {list(LIVE_SCORE_KEYS)}, got {got}")
        if not isinstance(row["name"], str) or not row["name"]:
            raise ValueError(f"{where}: {side} 'name' must be a non-empty string, got {short(row['name'])}")
        for key in LIVE_SCORE_KEYS[1:]:
            v = row[key]
            number = not isinstance(v, bool) and isinstance(v, (int, float)) and v == v and abs(v) != float("inf")
            if key.endswith("_equal") and not (number and 0.0 <= v <= 1.0):
                raise ValueError(f"{where}: {side} {key!r} must be a fraction in [0, 1], got {short(v)}")
            if key.endswith("_k3") and not (number and v >= 0.0):
                raise ValueError(f"{where}: {side} {key!r} must be a finite number >= 0, got {short(v)}")


_HAND_MADE = PointEvidence("definition", None, "set by hand (RoundingProfile(variants=...)), not measured")


def to_dict(profile: RoundingProfile) -> dict:
    """The JSON form of ``profile`` (what :func:`from_dict` reads back)."""
    out = {"name": profile.name, "description": profile.description, "points": profile.points()}
    cal = profile.calibration
    if cal is not None:
        c = {k: getattr(cal, k) for k in ("engine", "version", "mode", "date", "gpu", "torch", "command", "results")}
        c["points"] = {
            p: {"evidence": e.evidence, "matched": e.matched, "note": e.note} for p, e in cal.points.items()
        }
        if cal.live is not None:
            c["live"] = cal.live
        out["calibration"] = c
    if profile.variants:
        out["variants"] = {
            kind: {
                "points": dict(points),
                "evidence": {
                    p: {"evidence": e.evidence, "matched": e.matched, "note": e.note}
                    for p, e in (
                        (p, profile.variant_evidence.get(kind, {}).get(p) or _HAND_MADE) for p in points
                    )
                },
            }
            for kind, points in profile.variants.items()
        }
    if profile.conditions:
        out["conditions"] = [
            {"when": {k: list(v) for k, v in c.when.items()}, "points": dict(c.points),
             "evidence": {p: {"evidence": e.evidence, "matched": e.matched, "note": e.note}
                          for p, e in c.evidence.items()}}
            for c in profile.conditions
        ]
    if profile.router is not None:
        out["router"] = {
            "points": profile.router.points(),
            "evidence": {p: {"evidence": e.evidence, "matched": e.matched, "note": e.note}
                         for p, e in profile.router.evidence.items()},
        }
    return out


def load(path: str | Path) -> RoundingProfile:
    """Read a profile file (JSON, as ``rla calibrate --out`` writes it)."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise FileNotFoundError(f"cannot read profile file {path}: {e.strerror}") from None
    try:
        data = strict_json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON ({e.msg} at line {e.lineno})") from None
    except ValueError as e:  # a key given twice, nesting too deep, NaN
        raise ValueError(f"{path}: {e}") from None
    return from_dict(data, str(path))


def _load_table() -> dict[str, RoundingProfile]:
    rows = {}
    for entry in resources.files("rla.profiles").joinpath("data").iterdir():
        if entry.name.endswith(".json"):
            p = from_dict(json.loads(entry.read_text()), f"rla/profiles/data/{entry.name}")
            if p.name in rows:
                raise ValueError(f"two built-in profile files are named {p.name!r}")
            rows[p.name] = p
    middle = sorted(n for n in rows if n not in _FIRST + _LAST)
    order = [n for n in _FIRST if n in rows] + middle + [n for n in _LAST if n in rows]
    return {n: rows[n] for n in order}


def _version(p: RoundingProfile) -> Version:
    try:
        return Version(p.calibration.version)
    except InvalidVersion:
        return Version("0")


def _load_aliases(table) -> dict[str, str]:
    newest: dict[str, RoundingProfile] = {}
    for p in table.values():
        cal = p.calibration
        if cal is None or cal.engine in ("transformers", "rla"):
            continue
        alias = cal.engine if cal.mode == "default" else f"{cal.engine}-{cal.mode}"
        if alias not in newest or _version(p) > _version(newest[alias]):
            newest[alias] = p
    return {alias: p.name for alias, p in newest.items()}


# Read once at import (five small files): lookups are then plain dict reads, which torch.compile
# traces (a name resolved inside a compiled region must not call into importlib or a cache).
_TABLE = _load_table()
_ALIASES = _load_aliases(_TABLE)


def _table() -> dict[str, RoundingProfile]:
    return _TABLE


def aliases() -> dict[str, str]:
    """alias -> versioned row: ``vllm`` -> the newest calibrated vLLM default-mode row, etc."""
    return dict(_ALIASES)


def all_profiles() -> dict[str, RoundingProfile]:
    """The built-in rows by name, in table order."""
    return dict(_table())


def names() -> list[str]:
    """Names of the built-in rows, in table order (aliases not included)."""
    return list(_table())


def alias_target(name: str) -> str | None:
    """The versioned row an alias resolves to (``"vllm"`` -> ``"vllm-0.33"``), None for a row name."""
    return _ALIASES.get(name)


def get(name: str) -> RoundingProfile:
    """The built-in row called ``name``, or the row an alias resolves to; unknown names list both."""
    if isinstance(name, str):
        name = _ALIASES.get(name, name)
        if name in _TABLE:
            return _TABLE[name]
    table = _TABLE
    known = ", ".join(list(table) + [f"{a} (= {t})" for a, t in aliases().items()])
    raise KeyError(
        f"unknown rounding profile {name!r}; known profiles: {known}. Load a calibrated file with "
        "rla.profiles.load(path), or make a custom one with rla.profiles.get('vllm').replace(name=..., ...)."
    )


def resolve(profile: str | RoundingProfile) -> RoundingProfile:
    """Accept a profile name (or alias) or a ``RoundingProfile``; anything else is a ``TypeError``."""
    if isinstance(profile, RoundingProfile):
        return profile
    if isinstance(profile, str):
        return get(profile)
    raise TypeError(
        f"profile must be a name ({', '.join(_table())}) or a RoundingProfile, got {type(profile).__name__}"
    )
