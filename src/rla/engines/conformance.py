"""The result of a calibration: per point the choice, its evidence and how well each choice fits.

``Conformance`` is what ``rla.engines.calibrate.calibrate`` returns. It becomes a profile
(:func:`to_profile`, the JSON format of ``rla.profiles``) and a conformance report (JSON and
Markdown), both stamped with the engine, version, mode, device, torch/triton versions, date and
command, so a row in the profile table can always be traced to the run that measured it.

A profile row is data shipped with the package, so it names no machine: :func:`portable` turns
every absolute path in the row's command and notes into what holds on any machine -- a file
inside the engine (``wheel!vllm/...`` or ``.../site-packages/vllm/...``) into its
package-relative path (``vllm/model_executor/layers/layernorm.py``), any other file into its
name. The reports beside the row keep the run's paths as they were.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

from rla.profiles import POINTS, Calibration, PointEvidence, RoundingProfile, to_dict

__all__ = ["PointResult", "Conformance", "to_profile", "kernels_ran", "markdown", "write", "portable"]

#: An absolute path (POSIX, ``~/...`` or a Windows drive) that starts a word, up to a space,
#: quote, comma or closing bracket (a lone ``/`` between words, as in "a / b", is not one).
_ABSOLUTE = re.compile(r"(?<![\w.~/-])(?:/|~/|[A-Za-z]:[\\/])[^\s'\",;)\]]+")
_INSTALLED = re.compile(r"[\\/](?:site|dist)-packages[\\/]")


def _portable_path(path: str) -> str:
    if "!" in path:  # a wheel member: wheel!inner/path
        return path.split("!", 1)[1]
    parts = _INSTALLED.split(path, maxsplit=1)
    if len(parts) == 2:  # a file of an installed package
        return parts[1].replace("\\", "/")
    return re.split(r"[\\/]", path.rstrip("/\\"))[-1]


def portable(text: str) -> str:
    """``text`` with each absolute path replaced by its package-relative path (a file inside an
    engine's wheel or installed package) or its file name (anything else)."""
    return _ABSOLUTE.sub(lambda m: _portable_path(m.group(0)), text)


@dataclass
class PointResult:
    """How one rounding point was decided.

    ``fractions`` maps every candidate choice to the fraction of probe output elements it
    reproduced bit for bit (for each candidate, the best setting of the other points measured in
    the same experiment). ``ambiguous`` is True when two candidates both reach 100%: then
    ``choice`` is None unless ``fallback`` says where a value came from (weaker evidence).
    ``max_ulp`` is the largest distance, in units in the last place of the output dtype, of the
    elements the chosen value did not reproduce (0 when all matched).
    """

    point: str
    choice: str | None
    evidence: str
    fractions: dict[str, float]
    ambiguous: bool = False
    max_ulp: int | None = None
    elements: int = 0
    experiments: list[str] = field(default_factory=list)
    note: str = ""
    fallback: str = ""


@dataclass
class Conformance:
    """A calibration run: the stamp, the provenance of the engine code that ran, every point."""

    engine: str
    version: str
    mode: str
    device: str
    gpu: str
    torch: str
    triton: str
    transformers: str
    date: str
    command: str
    scale: str
    provenance: dict
    points: dict[str, PointResult]
    notes: list[str] = field(default_factory=list)
    profile_name: str = ""
    """The adapter's name for the profile ("" = ``<engine>-<major.minor>[-<mode>]``)."""

    def as_dict(self) -> dict:
        return asdict(self)


def kernels_ran(conf: Conformance) -> bool:
    """Whether any point was decided from the engine's compiled kernels (``kernel`` evidence)."""
    return any(r.evidence == "kernel" for r in conf.points.values())


def to_profile(conf: Conformance, name: str | None = None, results: str = "") -> RoundingProfile:
    """The calibrated profile. A point left undecided (no choice, no fallback) makes this fail:
    a profile must not hold a value nobody measured or read."""
    undecided = [p for p in POINTS if conf.points.get(p) is None or conf.points[p].choice is None]
    if undecided:
        raise ValueError(
            f"calibration of {conf.engine} {conf.version} ({conf.mode}) left {', '.join(undecided)} "
            "undecided (ambiguous on these probes, and no source fact to fall back on); "
            "run it where the choices part (e.g. on the GPU)"
        )
    evidence = {}
    for p in POINTS:
        r = conf.points[p]
        note = "; ".join(x for x in (r.fallback, r.note) if x)
        evidence[p] = PointEvidence(r.evidence, r.fractions.get(r.choice), portable(note))
    cal = Calibration(
        engine=conf.engine,
        version=conf.version,
        mode=conf.mode,
        date=conf.date,
        gpu=conf.gpu,
        torch=conf.torch,
        command=portable(conf.command),
        results=portable(results),
        points=evidence,
    )
    short = ".".join(conf.version.split(".")[:2])
    default_name = conf.profile_name or f"{conf.engine}-{short}" + ("" if conf.mode == "default" else f"-{conf.mode}")
    if conf.mode == "eager" and not kernels_ran(conf):
        default_name += "-native"  # the kernels did not run: not the engine's eager row
    return RoundingProfile(
        name=name or default_name,
        description=f"{conf.engine} {conf.version} {conf.mode} mode, calibrated by rla calibrate on {conf.gpu or conf.device}",
        calibration=cal,
        **{p: conf.points[p].choice for p in POINTS},
    )


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.4f}%"


def markdown(conf: Conformance) -> str:
    """The conformance report as Markdown: stamp, one row per point, notes, provenance."""
    lines = [
        f"# Conformance: {conf.engine} {conf.version}, mode `{conf.mode}`",
        "",
        f"- device: {conf.device} ({conf.gpu or 'no GPU'}); torch {conf.torch}; triton {conf.triton or '-'}",
        f"- date: {conf.date}; probe scale: {conf.scale}",
        f"- command: `{conf.command}`",
        "",
        "| point | choice | evidence | " + " | ".join(["fraction equal per choice", "ambiguous", "max ulp of the rest", "note"]) + " |",
        "|---|---|---|---|---|---|---|",
    ]
    for p in POINTS:
        r = conf.points.get(p)
        if r is None:
            lines.append(f"| `{p}` | not calibrated | - | - | - | - | |")
            continue
        fr = ", ".join(f"{c}: {_pct(v)}" for c, v in r.fractions.items())
        note = "; ".join(x for x in (r.fallback, r.note) if x).replace("|", "/")
        lines.append(
            f"| `{p}` | {r.choice or '**undecided**'} | {r.evidence} | {fr} | "
            f"{'yes' if r.ambiguous else 'no'} | {'-' if r.max_ulp is None else r.max_ulp} | {note} |"
        )
    if conf.notes:
        lines += ["", "## Notes", ""] + [f"- {n}" for n in conf.notes]
    lines += ["", "## Engine code that ran", "", "| function | file | sha256 |", "|---|---|---|"]
    for fn, prov in conf.provenance.items():
        lines.append(f"| `{fn}` | `{prov['file']}`:{prov.get('line', '')} | `{prov['sha256'][:16]}` |")
    return "\n".join(lines) + "\n"


def write(conf: Conformance, out: str | Path, name: str | None = None, *, profile: bool = True) -> dict[str, Path]:
    """Write ``out`` (the profile JSON) and, beside it, ``<stem>.report.json`` and
    ``<stem>.report.md``. A run with an undecided point (or ``profile=False``) writes the reports
    only, and says so by returning no ``profile`` path."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    stem = out.with_suffix("")
    paths = {"report_json": Path(f"{stem}.report.json"), "report_md": Path(f"{stem}.report.md")}
    paths["report_json"].write_text(json.dumps(conf.as_dict(), indent=2) + "\n")
    paths["report_md"].write_text(markdown(conf))
    if not profile:
        return paths
    try:
        profile = to_profile(conf, name, results=str(paths["report_md"].name))
    except ValueError:
        return paths
    out.write_text(json.dumps(to_dict(profile), indent=2) + "\n")
    paths["profile"] = out
    return paths
