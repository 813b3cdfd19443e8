"""The rounding model: ten points that say where a stack rounds fp32 intermediates to ``lp``
(nine rounding locations, the LM head's among them, and one arithmetic order, the norms' reduction).

A :class:`RoundingProfile` answers the questions of ``docs/rounding.md`` about three regions of a
transformer block (RoPE, SwiGLU, residual-add + RMSNorm) and the two places where an engine's
compiler fuses across them (the residual carried past the attention add, the q/k-norm output
read by RoPE), the order in which a norm adds its sum of squares, and whether the LM head rounds the logits
(:mod:`rla.profiles.head`). Everything else in ``rla`` reads a profile, never asking which engine it came from.

Notation: ``lp`` is the stack's low-precision dtype (bf16 or fp16) and ``RN(v)`` rounds an fp32 value to
``lp`` (round-to-nearest-even, as ``tensor.to(lp)`` does). Everything written without ``RN`` is one fp32 operation.

A profile of an engine is a *measured* fact about one engine version in one mode: its
:class:`Calibration` says which engine, version, mode, GPU and torch it was measured on, and for
every point the evidence and the fraction of probe outputs the chosen value reproduced.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Literal

from rla.profiles.head import HEAD_POINTS
from rla.profiles.router import RouterPoints
from rla.profiles.variant_points import (VARIANT_EXTENDS, VARIANT_POINT_KINDS, VARIANT_POINTS, VARIANTS,
                                         check_variant_point, has_point)
from rla.profiles.variant_points import replace_variant as _replace_variant

__all__ = ["RoundingProfile", "Calibration", "PointEvidence", "PointCondition", "POINTS", "REGIONS", "REGION_POINTS",
           "EVIDENCE", "VARIANTS", "VARIANT_EXTENDS", "VARIANT_POINTS", "VARIANT_POINT_KINDS", "CONDITIONS", "HEAD_POINTS"]

#: The three regions a profile describes, in the order reports list them.
REGIONS: tuple[str, ...] = ("rope", "swiglu", "rmsnorm")

#: Every rounding point and its choices; the first choice is HF eager's.
POINTS: dict[str, tuple[str, str]] = {
    "rope_cos_sin": ("round", "fp32"),
    "rope_apply": ("per_op", "fused"),
    "rope_inv_freq": ("host", "device"),
    "swiglu": ("per_op", "fused"),
    "norm_weight": ("per_op", "fused"),
    "norm_residual": ("rounded_sum", "fp32_sum"),
    "residual_stream": ("rounded", "fp32_carry"),
    "qk_norm_out": ("round", "fp32"),
    "norm_reduction": ("unpinned", "vllm_block"),
} | HEAD_POINTS

#: The region whose alignment realises each point. ``qk_norm_out='fp32'`` is a chain from the q/k norms (rmsnorm
#: region) into RoPE: it takes effect only when both regions are aligned, and is listed under ``rope`` because it
#: decides what RoPE reads. ``lm_head`` is no region's: every alignment applies it (``rla.alignment.lm_head``).
REGION_POINTS: dict[str, tuple[str, ...]] = {
    "rope": ("rope_cos_sin", "rope_apply", "rope_inv_freq", "qk_norm_out"),
    "swiglu": ("swiglu",),
    "rmsnorm": ("norm_weight", "norm_residual", "residual_stream", "norm_reduction"),
}

#: What a row's :class:`PointCondition` may test: the attention head size (``config.head_dim``, else
#: hidden / heads) in / not in the listed sizes, for an engine that picks a region's kernel by shape
#: (SGLang 0.5.23's fp32 RoPE cache and fused kernel at head sizes 64/128/256/512 only), as data.
CONDITIONS: dict[str, str] = {
    "head_size_in": "the attention head size is one of the listed sizes",
    "head_size_not_in": "the attention head size is none of the listed sizes",
}

#: Evidence strengths, strongest first: the engine itself run live (its own logprobs of a real
#: model, ``rla calibrate --live``: the point's value is the one under which the aligned model
#: reproduces them best, at the model level, so the engine's attention and GEMMs are in the
#: measurement; a row with such a point carries the measurement in ``Calibration.live``); the
#: engine's compiled kernels run on a GPU; its Python (native) ops run under its own compiler
#: (Inductor); the same native ops run eagerly; the source read by a person; the spec of
#: ``hf``/``rla`` themselves (not an engine measurement).
EVIDENCE: tuple[str, ...] = ("live", "kernel", "native_compiled", "native_eager", "source", "definition")


@dataclass(frozen=True)
class PointEvidence:
    """How one point of a calibrated profile was decided."""

    evidence: str
    """One of :data:`EVIDENCE`."""

    matched: float | None = None
    """Fraction of probe output elements the chosen value reproduced bit for bit (None: not run)."""

    note: str = ""
    """What explains the rest (e.g. "reduction order: rstd 1 ulp apart"), or why it was not run."""

    def __post_init__(self) -> None:
        if self.evidence not in EVIDENCE:
            raise ValueError(f"evidence {self.evidence!r} is not one of {EVIDENCE}")
        if self.matched is not None and not 0.0 <= float(self.matched) <= 1.0:
            raise ValueError(f"matched={self.matched!r} is not a fraction in [0, 1]")


@dataclass(frozen=True)
class Calibration:
    """Where and how a profile was measured."""

    engine: str
    """``vllm``, ``sglang``, ``transformers`` or ``rla``."""

    version: str
    """The engine's version, e.g. ``0.33.0``."""

    mode: str
    """The engine's mode, e.g. ``default`` (vLLM V1 -O2 Inductor) or ``eager`` (``enforce_eager``)."""

    date: str = ""
    gpu: str = ""
    torch: str = ""
    command: str = ""
    results: str = ""
    """Path (in the repository) of the conformance report this row comes from."""

    points: dict = field(default_factory=dict)
    """point name -> :class:`PointEvidence`."""

    live: dict | None = None
    """For a row calibrated against the live engine (``live`` evidence): what ran and what was measured --
    ``settings`` (the engine's, as it was started), ``model`` (family and shape), ``prefill_tokens`` /
    ``decode_tokens`` (logprobs scored), and ``start`` / ``found`` (the row the search started from and the row it
    found: ``name``, and ``prefill_equal``, ``prefill_k3``, ``decode_equal``, ``decode_k3`` against the engine).
    Checked by ``rla.profiles.from_dict`` (``registry.LIVE_KEYS``)."""


@dataclass(frozen=True)
class PointCondition:
    """Points that hold instead of the row's for models that meet a condition (:data:`CONDITIONS`).

    ``when`` maps one condition key to the head sizes it lists (e.g. ``{"head_size_not_in": (64,
    128, 256, 512)}``); ``points`` maps points to the choices that hold when it is met; ``evidence``
    says, per point, how that was decided (every point needs its evidence)."""

    when: dict
    points: dict
    evidence: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.when, dict) or len(self.when) != 1 or next(iter(self.when)) not in CONDITIONS:
            raise ValueError(f"a condition's 'when' must name exactly one of {list(CONDITIONS)}, got {self.when!r}")
        sizes = next(iter(self.when.values()))
        if (not isinstance(sizes, (list, tuple)) or not sizes
                or any(isinstance(h, bool) or not isinstance(h, int) or h < 1 for h in sizes)):
            raise ValueError(f"condition {self.when!r}: the head sizes must be a non-empty list of integers >= 1")
        object.__setattr__(self, "when", {next(iter(self.when)): tuple(sizes)})
        if not isinstance(self.points, dict) or not self.points:
            raise ValueError(f"condition {self.when!r}: 'points' must map one or more points to choices")
        for point, value in self.points.items():
            if point not in POINTS or value not in POINTS[point]:
                raise ValueError(f"condition {self.when!r} sets {point}={value!r}; points and choices are {POINTS}")
        if set(self.evidence) != set(self.points):
            raise ValueError(f"condition {self.when!r}: every point needs its evidence; points "
                             f"{sorted(self.points)}, evidence {sorted(self.evidence)}")
        for point, ev in self.evidence.items():
            if not isinstance(ev, PointEvidence):
                raise TypeError(f"condition {self.when!r}: evidence for {point!r} must be a PointEvidence")

    def holds(self, head_size: int) -> bool:
        """Whether a model with attention head size ``head_size`` meets the condition."""
        (key, sizes), = self.when.items()
        return (head_size in sizes) == (key == "head_size_in")


@dataclass(frozen=True)
class RoundingProfile:
    """Where one stack rounds in RoPE, SwiGLU and residual-add + RMSNorm. Make a custom profile with
    ``rla.profiles.get("vllm").replace(name=..., swiglu="per_op")``; values are checked on construction."""

    name: str
    """Identifier, e.g. ``"vllm-0.33"``; what reports and rollout records print."""

    rope_cos_sin: Literal["round", "fp32"]
    """``round``: RoPE uses c = RN(cos), s = RN(sin) (a cos/sin cache stored in ``lp``: HF eager,
    vLLM); ``fp32``: cos and sin stay fp32 (SGLang's fp32 cache)."""

    rope_apply: Literal["per_op", "fused"]
    """``per_op``: out = RN(RN(x*c) + RN(rot(x)*s)), every product rounded like eager PyTorch on
    ``lp`` tensors; ``fused``: out = RN(x*c + rot(x)*s), one rounding at the store."""

    rope_inv_freq: Literal["host", "device"]
    """Where ``inv_freq = 1/(base**(arange(0,d,2)/d))`` (and its scaling) and the angles' cos/sin are evaluated:
    ``host`` = ``inv_freq`` on the CPU at init, as HF does; ``device`` = on the device the model runs on, as vLLM
    and SGLang build their cos/sin cache (CPU and GPU ``pow`` differ by one ulp in 3-8% of frequencies)."""

    swiglu: Literal["per_op", "fused"]
    """``per_op``: out = RN(RN(silu(g)) * u), the activation rounded before the product (HF's
    ``act_fn(gate) * up``, vLLM's ``silu_and_mul`` CUDA kernel); ``fused``: out = RN(silu(g) * u)."""

    norm_weight: Literal["per_op", "fused"]
    """``per_op``: out = RN(w * RN(x*rstd)), the normalised value rounded before the weight (HF's
    ``weight * hidden.to(input_dtype)``); ``fused``: out = RN((x*rstd) * w), one rounding."""

    norm_residual: Literal["rounded_sum", "fp32_sum"]
    """What the norm after a residual add reads. ``rounded_sum``: s = RN(x + r), the bf16 residual
    stream; ``fp32_sum``: the fp32 sum x + r, kept in registers by a fused add+norm kernel. The
    residual handed on is RN(x + r) in both cases (but see ``residual_stream``)."""

    residual_stream: Literal["rounded", "fp32_carry"] = "rounded"
    """``rounded``: the residual after the attention add is RN(a + r) before the MLP's add; ``fp32_carry``: the
    MLP's add reads the fp32 a + r (Inductor recomputes it inside the consumer kernel and drops the cast), so the
    next residual is RN(h + (a + r)). The residual entering attention is rounded in both."""

    qk_norm_out: Literal["round", "fp32"] = "round"
    """Qwen3-style per-head q/k norms: ``round`` = RoPE reads RN(norm(q)); ``fp32`` = RoPE reads
    the unrounded norm output (one fused chain, rounded once at RoPE's store)."""

    norm_reduction: Literal["unpinned", "vllm_block"] = "unpinned"
    """The order a norm adds its sum of squares (an arithmetic order, not a rounding location, but it moves rstd
    by an ulp just the same): ``unpinned`` = whichever kernel runs (PyTorch's for the reference, Triton's tree for
    the fused kernels); ``vllm_block`` = vLLM's CUDA norm kernels' per-thread partials and block reduction."""

    lm_head: Literal["lp", "fp32"] = "lp"
    """``lp``: logits RN(h @ W^T), as every engine by default; ``fp32``: unrounded (:mod:`rla.profiles.head`)."""

    post_norm_out: Literal["round", "fp32"] = "round"
    """A variant point (:data:`VARIANT_POINTS`, defined there; :meth:`variant` sets it): Gemma's post-norms' output."""

    attn_gate: Literal["per_op", "fused"] = "per_op"
    """A variant point, as ``post_norm_out``: where Qwen3.5's attention output gate attn * sigmoid(gate) rounds."""

    moe_out: Literal["round", "fp32"] = "round"
    """Variant point (``moe_experts``): the add after an MoE block reads RN(shared + routed) or their fp32 sum."""
    ple_inputs: Literal["per_op", "fused"] = "per_op"
    """Variant point (``gemma4``): Gemma 4's per-layer inputs rounded op by op, or one fp32 chain rounded once."""
    ple_add: Literal["stream", "rounded"] = "stream"
    """Variant point (``gemma4``): the per-layer-input add reads the stream ``residual_stream`` says, or RN of it."""
    stream_variance: Literal["normalised", "fp32"] = "normalised"
    """Variant point (``gemma4``): a norm after a layer takes its mean square of what it normalises, or of the fp32."""
    embed_variance: Literal["normalised", "fp32"] = "normalised"
    """Variant point (``gemma4``): the first input norm's mean square, of RN(embedding) or of the fp32 product."""

    oai_glu: Literal["sigmoid", "quotient"] = "sigmoid"
    """Variant point (``gpt_oss``): the fused clamped SwiGLU's fp32 chain, via 1 / (1 + e) or one division."""

    description: str = field(default="", compare=False)
    """One line on which stack this profile describes and why."""

    calibration: Calibration | None = field(default=None, compare=False, repr=False)
    """Where and how the profile was measured (None for a hand-made profile)."""

    variants: dict = field(default_factory=dict, compare=False, repr=False)
    """kind (one of :data:`VARIANTS`) -> {point: choice}: the points that differ for that kind of
    module, because the engine runs other code for it (e.g. vLLM's CUDA norm kernels take only a
    weight in the input's dtype, so its zero-centred norm, whose weight ``w.float() + 1`` is fp32,
    runs the PyTorch ops). Points not named keep the row's value. :meth:`variant` applies them."""

    variant_evidence: dict = field(default_factory=dict, compare=False, repr=False)
    """kind -> {point: :class:`PointEvidence`}: how each variant point was decided."""

    conditions: tuple = field(default=(), compare=False, repr=False)
    """:class:`PointCondition` s: points that differ for models of some head sizes, because the
    engine runs another kernel for them (SGLang 0.5.23's RoPE: fp32 cache and fused kernel at head
    sizes 64/128/256/512, a bf16 cache and a per-op kernel otherwise). No two conditions set the
    same point. :meth:`at_head_size` applies them; ``rla.align`` does so with the model's head size."""

    router: RouterPoints | None = field(default=None, repr=False)
    """Where the stack rounds inside an MoE block (:mod:`rla.profiles.router`), with the evidence
    per point; None when the row claims no router values (``hf``: HF's own module is the
    baseline; a file written by ``rla calibrate``, which does not measure routers yet)."""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError("RoundingProfile.name must be a non-empty string")
        for point, allowed in {**POINTS, **VARIANT_POINTS}.items():
            value = getattr(self, point)
            if value not in allowed:
                raise ValueError(f"RoundingProfile {self.name!r}: {point}={value!r} is not one of {allowed}")
        for kind, changes in self.variants.items():
            if kind not in VARIANTS:
                raise ValueError(f"RoundingProfile {self.name!r}: unknown variant {kind!r}; variants are {list(VARIANTS)}")
            if not isinstance(changes, dict):
                raise ValueError(f"RoundingProfile {self.name!r}: variant {kind!r} must map points to choices")
            for point, value in changes.items():
                check_variant_point(self.name, kind, point, value, POINTS)
        for kind, evidence in self.variant_evidence.items():
            missing = sorted(set(evidence) - set(self.variants.get(kind, {})))
            if missing:
                raise ValueError(f"RoundingProfile {self.name!r}: evidence for variant {kind!r} names {missing}, "
                                 "which the variant does not set")
        if not isinstance(self.conditions, tuple) or not all(isinstance(c, PointCondition) for c in self.conditions):
            raise TypeError(f"RoundingProfile {self.name!r}: conditions must be a tuple of PointCondition")
        seen: dict[str, dict] = {}
        for c in self.conditions:
            for point in c.points:
                if point in seen:
                    raise ValueError(f"RoundingProfile {self.name!r}: conditions {seen[point]!r} and {c.when!r} both "
                                     f"set {point!r}; a point may depend on one condition only")
                seen[point] = c.when
        if self.router is not None and not isinstance(self.router, RouterPoints):
            raise TypeError(f"RoundingProfile {self.name!r}: router must be a RouterPoints or None, "
                            f"got {type(self.router).__name__}")

    def points(self) -> dict[str, str]:
        """The rounding points as a plain dict (for tables and JSON), in :data:`POINTS` order."""
        return {point: getattr(self, point) for point in POINTS}

    def kind_points(self, kind: str) -> dict[str, str]:
        """The variant points ``kind``'s modules have (:data:`VARIANT_POINT_KINDS`), valued as here."""
        return {p: getattr(self, p) for p, kinds in VARIANT_POINT_KINDS.items() if kind in kinds}

    def same_rounding(self, other: "RoundingProfile") -> bool:
        """True when both profiles round at the same places (names may differ) on the families the
        points were measured on; the variants (other kinds of modules) are not compared."""
        return self.points() == other.points()

    def variant(self, kind: str) -> "RoundingProfile":
        """The profile that holds for modules of ``kind`` (:data:`VARIANTS`): this row with the
        variant's points applied (those of the kind it extends first, :data:`VARIANT_EXTENDS`), named
        ``<name>/<kind>`` when any differ (itself otherwise); a variant point only where ``kind`` has it."""
        if kind not in VARIANTS:
            raise ValueError(f"unknown variant {kind!r}; variants are {list(VARIANTS)}")
        wanted = {**self.variants.get(VARIANT_EXTENDS.get(kind, ""), {}), **self.variants.get(kind, {})}
        wanted = {p: v for p, v in wanted.items() if has_point(kind, p)}
        changes = {p: v for p, v in wanted.items() if getattr(self, p) != v}
        if not changes:
            return self
        return dataclasses.replace(self, name=f"{self.name}/{kind}", calibration=None, variants={},
                                   variant_evidence={}, **changes)

    def variant_on(self, kind: str, on: "RoundingProfile") -> "RoundingProfile":
        """``on`` (this row or its family's variant) with this row's ``kind`` points (variant points too) over it."""
        mine = {**self.variant(kind).points(), **self.variant(kind).kind_points(kind)}
        changes = {p: v for p, v in mine.items() if getattr(self, p) != v and getattr(on, p) != v}
        return dataclasses.replace(on, name=f"{on.name}/{kind}", calibration=None, variants={}, variant_evidence={},
                                   **changes) if changes else on

    def at_head_size(self, head_size: int) -> "RoundingProfile":
        """The profile that holds for a model with attention head size ``head_size``: this row with
        the points of every condition that holds applied, named ``<name>@head_size=<h>`` when any
        differ (itself otherwise). Its variants stay; its conditions are resolved, so it has none."""
        if isinstance(head_size, bool) or not isinstance(head_size, int) or head_size < 1:
            raise ValueError(f"head_size must be an integer >= 1, got {head_size!r}")
        changes = {p: v for c in self.conditions if c.holds(head_size) for p, v in c.points.items()
                   if getattr(self, p) != v}
        if not changes:
            return self
        return dataclasses.replace(self, name=f"{self.name}@head_size={head_size}", calibration=None,
                                   conditions=(), **changes)

    def differs_from(self, other: "RoundingProfile") -> tuple[str, ...]:
        """Regions whose rounding differs between the two profiles."""
        return tuple(
            region
            for region in REGIONS
            if any(getattr(self, p) != getattr(other, p) for p in REGION_POINTS[region])
        )

    def replace_variant(self, kind: str, name: str | None = None, **changes) -> "RoundingProfile":
        """:func:`rla.profiles.variant_points.replace_variant` of this row (evidence of ``changes`` dropped)."""
        return _replace_variant(self, kind, name, **changes)

    def replace(self, **changes) -> "RoundingProfile":
        """A copy with ``changes``; a changed point drops the calibration (it is no longer measured).
        The variants stay: they say what the engine's code does for a kind of module (pass
        ``variants={}`` to drop them)."""
        if any(p in changes for p in (*POINTS, *VARIANT_POINTS)) and "calibration" not in changes:
            changes["calibration"] = None
        return dataclasses.replace(self, **changes)
