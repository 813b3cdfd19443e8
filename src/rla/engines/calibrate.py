"""Calibration: run an engine's own region code on probes and find, point by point, the rounding
choice of ``docs/rounding.md`` that reproduces it bit for bit.

For every experiment the engine's output is computed once; the spec's output is computed with
``rla.ops.reference`` (the PyTorch reference of the spec, on the probes' device) for every
combination of the points the experiment depends on (``profile.replace(point=choice)``), and each
combination's fraction of bit-equal output elements is counted. A point's candidate fraction is
the best over the other points of its experiments. The candidate at 100% wins; two candidates at
100% are *ambiguous* and reported as such, never guessed; none at 100% gives the best one with
the largest ulp distance of the rest, so the report shows what is left.

Modes and evidence (``rla.profiles.EVIDENCE``):

- ``default`` (vLLM V1, -O2): vLLM compiles its native ops with Inductor, so the native functions
  are compiled here with ``torch.compile(fn, backend="inductor", fullgraph=True)`` on the probes'
  device -> ``native_compiled``. On the CPU that is Inductor's C++ backend, not Triton: its
  decisions about where to round are the same lowering rules, but the reduction order differs,
  so GPU evidence is the one a GPU profile row needs.
- ``eager`` (``enforce_eager``): vLLM runs its compiled CUDA kernels (``torch.ops._C``) ->
  ``kernel``. Without CUDA they cannot run: the points fall back to the native functions run
  eagerly (``native_eager``), which are *not* the kernels, and the report says so.

Cross-op points (``residual_stream``, ``qk_norm_out``) come from a small chain built from the
engine's own functions -- add+norm -> gate/up GEMM -> silu_and_mul -> down GEMM -> add+norm, and
q/k norm -> RoPE -- compiled as one graph in ``default`` mode (the kernels, one after the other, in
``eager`` mode), against the spec's two choices with the per-op points fixed to their calibrated
values. ``rope_inv_freq`` compares the engine's fp32 cos/sin cache, built by its own builder on
the device, with HF's rotary init evaluated on the host and on the device; on a CPU the two
places are the same, so the point is decided from the engine's source instead (``source``).
``lm_head`` is a setting of the run (vLLM's ``head_dtype``, SGLang's ``--enable-fp32-lm-head``),
not a kernel: the adapter reads its default from the engine's source (``source_fact``).

Engines: an adapter (``rla.engines.adapter.ENGINES``: ``rla.engines.vllm``, ``rla.engines.sglang``;
the :class:`~rla.engines.adapter.RegionEngine` contract) gives its region functions for a mode and
device as a ``rla.engines.regions.RegionOps``; nothing here knows an engine. SGLang (one mode, ``default``: its CUDA path) runs its own JIT-compiled CUDA kernels ->
``kernel``. An op whose code cannot run here (a kernel that failed to build, a library that does
not load into this torch) leaves its points to the adapter's *baseline* profile: the choice and
evidence of the checked-in row are kept, and the report says which op did not run and why.

This module is the run: it orders the steps and stamps the result. The pieces live apart: bit
counting in :mod:`rla.engines.bit_match`, the experiments in :mod:`rla.engines.region_experiments`,
the decisions from counts in :mod:`rla.engines.decisions`, the adapter registry in
:mod:`rla.engines.adapter`.
"""

from __future__ import annotations

import datetime
import importlib.metadata

import torch

from rla.engines.adapter import ENGINES, load_engine
from rla.engines.conformance import Conformance, PointResult
from rla.engines.decisions import decide, kept_from_baseline, point_evidence, settle_reduction
from rla.engines.region_experiments import (
    attempt,
    inv_freq_point,
    per_op_experiments,
    qk_experiment,
    residual_experiment,
)
from rla.engines.source import EngineUnavailable
from rla.profiles import POINTS

__all__ = ["calibrate"]


def _stamp_versions():
    try:
        triton = importlib.metadata.version("triton")
    except importlib.metadata.PackageNotFoundError:
        triton = ""
    return torch.__version__, triton


#: The points the per-op experiments decide, with the ops they come from.
_PER_OP_POINTS: dict[str, tuple[str, ...]] = {
    "rope_cos_sin": ("rope",),
    "rope_apply": ("rope",),
    "swiglu": ("silu_and_mul",),
    "norm_weight": ("rms_norm", "fused_add_rms_norm"),
    "norm_residual": ("fused_add_rms_norm",),
    "norm_reduction": ("rms_norm", "fused_add_rms_norm"),
}


def calibrate(
    engine: str = "vllm",
    mode: str = "default",
    *,
    wheel: str | None = None,
    device: str = "cpu",
    library: str | None = None,
    scale: str | None = None,
    seed: int = 0,
    command: str = "",
    progress=None,
) -> Conformance:
    """Calibrate ``engine`` in ``mode`` on ``device``; returns the :class:`Conformance`.

    ``scale`` picks the probe set (``small`` on a CPU, ``full`` on a GPU by default). ``wheel``
    loads the engine from a wheel file instead of the installed package; ``library`` names the
    kernel library for vLLM's ``eager`` mode on CUDA. ``progress(message)``, when given, is called
    as each experiment starts (the whole run takes minutes).
    """
    if engine not in ENGINES:
        raise ValueError(f"unknown engine {engine!r}; supported: {', '.join(ENGINES)}")
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise EngineUnavailable(f"--device {device}: this torch ({torch.__version__}) sees no CUDA device")
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"device must be cpu or cuda, got {device!r}")
    scale = scale or ("full" if dev.type == "cuda" else "small")

    eng = load_engine(engine, wheel)
    if mode not in eng.modes:
        raise ValueError(f"unknown mode {mode!r} for {engine}; one of {', '.join(eng.modes)}")
    ops = eng.region_ops(mode, dev, library)
    notes = list(ops.notes)

    kept: dict[str, tuple[str, ...]] = {}  # point -> the ops that did not run for it

    def keep(point, needed):
        missing = tuple(n for n in needed if not ops.has(n))
        kept[point] = missing
        why = ", ".join(f"{n} did not run" if n in ops.unavailable else f"{n} is not on this engine's path"
                        for n in missing)
        return kept_from_baseline(eng, point, why)

    say = (lambda m: progress(f"{eng.name} {eng.version} {mode} on {dev.type}: {m}")) if progress else None
    with torch.no_grad(), torch._dynamo.config.patch(recompile_limit=64):
        per_op = per_op_experiments(eng, ops, dev, scale, seed, say)
        points = {}
        for p, needed in _PER_OP_POINTS.items():
            decided = any(p in e.points for e in per_op)
            points[p] = decide(p, per_op, point_evidence(p, per_op)) if decided else keep(p, needed)
        fixed = {p: r.choice or POINTS[p][0] for p, r in points.items()}
        chain_note = "a small chain of the engine's functions" + (
            " compiled as one Inductor graph" if ops.compile_chains else ", one op after the other"
        )
        residual_ops = ("fused_add_rms_norm", "silu_and_mul")
        residual = attempt(ops, residual_ops, lambda: residual_experiment(ops, dev, scale, seed + 3, fixed), say)
        qk_ops = ("rope", "qk_norm") if "qk_norm" in ops.ops or "qk_norm" in ops.unavailable else ("rope", "rms_norm")
        qk = attempt(ops, qk_ops, lambda: qk_experiment(eng, ops, dev, scale, seed + 4, fixed), say)
        for p, exp, needed in (("residual_stream", residual, residual_ops), ("qk_norm_out", qk, qk_ops)):
            points[p] = keep(p, needed) if exp is None else decide(p, [exp], exp.evidence, chain_note)
        if say is not None:
            say("rotary cos/sin cache (rope_inv_freq)")
        points["rope_inv_freq"] = inv_freq_point(eng, dev, scale, seed)
    head = eng.source_fact("lm_head")  # a setting of the run, not a kernel a probe could tell apart
    points["lm_head"] = PointResult(point="lm_head", choice=head["choice"], evidence="source", fractions={},
                                    fallback=head["why"])

    if "norm_reduction" not in kept:
        settle_reduction(points["norm_reduction"], notes)
    inv = points["rope_inv_freq"]
    if inv.ambiguous:
        fact = eng.source_fact("rope_inv_freq")
        inv.choice, inv.evidence, inv.fallback = fact["choice"], "source", fact["why"]
        notes.append(
            f"rope_inv_freq: on {dev.type} the host and the device are the same place, so both "
            f"candidates match; the value comes from {eng.name}'s source ({fact['where']})"
        )
    for r in points.values():
        if r.ambiguous and r.choice is None:
            notes.append(f"{r.point}: ambiguous on these probes (every candidate at 100%); left undecided")
    for op, why in ops.unavailable.items():
        for_op = [p for p, missing in kept.items() if op in missing]
        notes.append(f"{op} did not run here: {why}"
                     + (f" -> {', '.join(for_op)} kept from profile {eng.baseline}" if for_op else ""))
    if dev.type == "cpu" and ops.compile_chains:
        notes.append(
            "default mode on the CPU: Inductor's C++ backend compiled the native ops; a GPU row "
            "needs the same run on the GPU (Triton), where reduction orders differ"
        )
    torch_v, triton_v = _stamp_versions()
    return Conformance(
        engine=eng.name,
        version=eng.version,
        mode=mode,
        device=str(dev),
        gpu=torch.cuda.get_device_name(dev) if dev.type == "cuda" else "none (CPU)",
        torch=torch_v,
        triton=triton_v,
        transformers=importlib.metadata.version("transformers"),
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        command=command,
        scale=scale,
        provenance=eng.provenance,
        points={p: points[p] for p in POINTS},
        notes=notes,
        profile_name=eng.profile_name,
    )
