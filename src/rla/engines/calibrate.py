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

Engines: an adapter (``ENGINES``: ``rla.engines.vllm``, ``rla.engines.sglang``) gives its region
functions for a mode and device as a ``rla.engines.regions.RegionOps``; nothing here knows an
engine. SGLang (one mode, ``default``: its CUDA path) runs its own JIT-compiled CUDA kernels ->
``kernel``. An op whose code cannot run here (a kernel that failed to build, a library that does
not load into this torch) leaves its points to the adapter's *baseline* profile: the choice and
evidence of the checked-in row are kept, and the report says which op did not run and why.
"""

from __future__ import annotations

import datetime
import importlib
import importlib.metadata
import itertools
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from rla.engines import probes as P
from rla.engines.conformance import Conformance, PointResult
from rla.engines.regions import RegionOps
from rla.engines.source import EngineUnavailable
from rla.ops import reference as ref
from rla.profiles import EVIDENCE, POINTS, get

__all__ = ["calibrate", "ENGINES", "Experiment", "load_engine"]

#: The adapter registry: engine name -> module with ``load(wheel)``. An adapter's engine object
#: has ``name``, ``version``, ``modes``, ``provenance``, ``baseline`` (a profile name or None),
#: ``profile_name``, ``region_ops(mode, device, library)``, ``rope_cache(...)``,
#: ``cos_sin_cache(...)`` and ``source_fact(point)``.
ENGINES: dict[str, str] = {"vllm": "rla.engines.vllm", "sglang": "rla.engines.sglang"}

_LP = torch.bfloat16


# ------------------------------------------------------------------------------------------
# Counting bit equality
# ------------------------------------------------------------------------------------------


def _ordered(t: torch.Tensor) -> torch.Tensor:
    """Sign-magnitude bit patterns mapped to integers in numeric order (ulp steps apart)."""
    bits = {torch.bfloat16: torch.int16, torch.float16: torch.int16, torch.float32: torch.int32}[t.dtype]
    i = t.contiguous().view(bits).to(torch.int64)
    mag = i & ((1 << (8 * t.element_size() - 1)) - 1)
    return torch.where(i < 0, -mag, mag)


def _compare(engine: torch.Tensor, spec: torch.Tensor) -> tuple[int, int, int]:
    """(equal elements, elements, max ulp distance of the unequal ones)."""
    if engine.shape != spec.shape or engine.dtype != spec.dtype:
        raise ValueError(f"engine output {tuple(engine.shape)} {engine.dtype} vs spec {tuple(spec.shape)} {spec.dtype}")
    eq = (engine == spec) | (engine.isnan() & spec.isnan())
    n_eq = int(eq.sum())
    ulp = 0 if n_eq == eq.numel() else int((_ordered(engine) - _ordered(spec))[~eq].abs().max())
    return n_eq, eq.numel(), ulp


@dataclass
class Experiment:
    """One engine function (or chain) on its probes against the spec under every combination of
    ``points``; ``counts[combo] = [equal, total, max_ulp]``."""

    name: str
    points: tuple[str, ...]
    counts: dict = field(default_factory=dict)
    evidence: str = ""

    def add(self, combo: tuple[str, ...], engine_outs, spec_outs) -> None:
        c = self.counts.setdefault(combo, [0, 0, 0])
        for e, s in zip(engine_outs, spec_outs):
            n_eq, n, ulp = _compare(e, s)
            c[0] += n_eq
            c[1] += n
            c[2] = max(c[2], ulp)


def _run(exp: Experiment, cases, engine_fn, spec_fn, fixed: dict) -> Experiment:
    """``cases``: probe list; ``engine_fn(case) -> outputs``; ``spec_fn(case, profile) -> outputs``."""
    base = get("hf").replace(**fixed)
    combos = list(itertools.product(*(POINTS[p] for p in exp.points)))
    for case in cases:
        engine_outs = engine_fn(case)
        for combo in combos:
            exp.add(combo, engine_outs, spec_fn(case, base.replace(**dict(zip(exp.points, combo)))))
    return exp


def _decide(point: str, experiments: list[Experiment], evidence: str, note: str = "") -> PointResult:
    mine = [e for e in experiments if point in e.points]
    fractions, ulps, total = {}, {}, 0
    for choice in POINTS[point]:
        eq, n, ulp = 0, 0, 0
        for e in mine:
            i = e.points.index(point)
            best = max((c for combo, c in e.counts.items() if combo[i] == choice), key=lambda c: c[0])
            eq, n, ulp = eq + best[0], n + best[1], max(ulp, best[2])
        fractions[choice], ulps[choice], total = eq / n, ulp, n
    perfect = [c for c, f in fractions.items() if f == 1.0]
    ambiguous = len(perfect) > 1
    choice = None if ambiguous else max(fractions, key=fractions.get)
    return PointResult(
        point=point,
        choice=choice,
        evidence=evidence,
        fractions=fractions,
        ambiguous=ambiguous,
        max_ulp=None if choice is None else ulps[choice],
        elements=total,
        experiments=[e.name for e in mine],
        note=note,
    )


def _weakest(evidences) -> str:
    """The weakest of several evidences (``EVIDENCE`` lists them strongest first)."""
    return max(evidences, key=EVIDENCE.index)


def _point_evidence(point: str, experiments: list[Experiment]) -> str:
    return _weakest(e.evidence for e in experiments if point in e.points)


def _compile(fn):
    return torch.compile(fn, backend="inductor", fullgraph=True, dynamic=False)


def _attempt(ops: RegionOps, names: tuple[str, ...], build, say=None):
    """Run one experiment if the engine has its ops; an op that fails to run here
    (``EngineUnavailable``, e.g. a kernel that does not build) is recorded, not fatal.
    ``say(message)`` is told when it starts (``rla calibrate`` prints it)."""
    if not ops.has(*names):
        return None
    if say is not None:
        say(" + ".join(names))
    try:
        exp = build()
    except EngineUnavailable as e:
        for n in names:
            ops.unavailable.setdefault(n, str(e))
            ops.ops.pop(n, None)
        return None
    exp.evidence = _weakest(ops.evidence[n] for n in names)
    return exp


# ------------------------------------------------------------------------------------------
# Experiments
# ------------------------------------------------------------------------------------------


def _rope_tables(eng, probe: P.RopeProbe, device):
    """(the engine's cache as its rope code reads it, fp32 cos and sin at the probe's positions)."""
    args = (probe.head_size, probe.head_size, probe.max_position, probe.base, probe.rope_scaling)
    cache32 = eng.cos_sin_cache(*args, dtype=torch.float32, device=device)
    cache_kernel = eng.rope_cache(*args, query_dtype=probe.q.dtype, device=device)
    cos, sin = cache32.index_select(0, probe.positions).chunk(2, dim=-1)
    return cache_kernel, cos, sin


def _per_op_experiments(eng, ops: RegionOps, device, scale, seed, say=None) -> list[Experiment]:
    norms = P.norm_probes(device, scale, seed)
    swiglus = P.swiglu_probes(device, scale, seed + 1)
    ropes = P.rope_probes(device, scale, seed + 2)
    out = []
    out.append(_attempt(ops, ("rms_norm",), lambda: _run(
        Experiment("rms_norm", ("norm_weight", "norm_reduction")), norms,
        lambda c: [ops.ops["rms_norm"](c.x, c.weight, c.eps)],
        lambda c, p: [ref.rms_norm(c.x, c.weight, c.eps, p)], {},
    ), say))

    def add_engine(c):
        out_, res = ops.ops["fused_add_rms_norm"](c.x, c.residual, c.weight, c.eps)
        return [out_, res]

    def add_spec(c, p):
        out_, res = ref.add_rms_norm(c.x, c.residual, c.weight, c.eps, p)
        return [out_, res]

    out.append(_attempt(ops, ("fused_add_rms_norm",), lambda: _run(
        Experiment("fused_add_rms_norm", ("norm_weight", "norm_residual", "norm_reduction")), norms,
        add_engine, add_spec, {}), say))

    def swiglu_spec(c, p):
        d = c.x.shape[-1] // 2
        return [ref.swiglu(c.x[..., :d], c.x[..., d:], p)]

    out.append(_attempt(ops, ("silu_and_mul",), lambda: _run(
        Experiment("silu_and_mul", ("swiglu",)), swiglus,
        lambda c: [ops.ops["silu_and_mul"](c.x)], swiglu_spec, {}), say))

    tables = {}

    def rope_engine(c):
        cache, cos, sin = tables[c.name] = _rope_tables(eng, c, device)
        q, k = ops.ops["rope"](c.positions, c.q, c.k, c.head_size, cache)
        return [q, k]

    def rope_spec(c, p):
        _, cos, sin = tables[c.name]
        t, d = c.q.shape[0], c.head_size
        q, k = ref.rope(c.q.view(t, -1, d), c.k.view(t, -1, d), cos, sin, p, unsqueeze_dim=1)
        return [q.reshape(t, -1), k.reshape(t, -1)]

    out.append(_attempt(ops, ("rope",), lambda: _run(
        Experiment("rotary_embedding", ("rope_cos_sin", "rope_apply")), ropes, rope_engine, rope_spec, {}), say))
    return [e for e in out if e is not None]


@dataclass(frozen=True)
class _ChainProbe:
    name: str
    tensors: tuple


def _residual_chain_probes(device, scale, seed):
    shapes = [(16, 256, 512)] if scale == "small" else [(1, 1536, 8960), (512, 1536, 8960), (64, 3584, 18944)]
    gen = torch.Generator().manual_seed(seed)
    cases = []
    for t, h, i in shapes:
        for kind in ("random", "range"):
            a = P._values(kind, (t, h), gen)
            r = P._values("random", (t, h), gen) * 4
            w1, w2 = (1 + 0.1 * torch.randn(h, generator=gen) for _ in range(2))
            w_gu = torch.randn(2 * i, h, generator=gen) / h**0.5
            w_d = torch.randn(h, i, generator=gen) / i**0.5
            ts = tuple(x.to(_LP).to(device) for x in (a, r, w1, w_gu, w_d, w2))
            cases.append(_ChainProbe(f"add+norm->mlp->add {t}x{h}x{i} {kind}", ts))
    return cases


def _residual_experiment(ops: RegionOps, device, scale, seed, fixed) -> Experiment:
    """residual.stream: does the MLP's add read RN(a + r) or the fp32 a + r?"""
    fused_add, silu_and_mul = ops.chain_ops["fused_add_rms_norm"], ops.chain_ops["silu_and_mul"]
    eps = 1e-6

    def chain(a, r, w1, w_gu, w_d, w2):
        h1, r1 = fused_add(a, r, w1, eps)
        m = F.linear(silu_and_mul(F.linear(h1, w_gu)), w_d)
        return fused_add(m, r1, w2, eps)

    run = _compile(chain) if ops.compile_chains else chain

    def spec(c, p):
        a, r, w1, w_gu, w_d, w2 = c.tensors
        h1, rounded = ref.add_rms_norm(a, r, w1, eps, p)
        g = F.linear(h1, w_gu)
        d = g.shape[-1] // 2
        m = F.linear(ref.swiglu(g[..., :d], g[..., d:], p), w_d)
        if p.residual_stream == "fp32_carry":  # the next add reads the fp32 a + r
            total = m.float() + (a.float() + r.float())
            new_residual = total.to(_LP)
            h2 = ref.rms_norm(total if p.norm_residual == "fp32_sum" else new_residual.float(), w2, eps, p, dtype=_LP,
                              after_add=True)
            return [h2, new_residual]
        h2, new_residual = ref.add_rms_norm(m, rounded, w2, eps, p)
        return [h2, new_residual]

    return _run(Experiment("residual chain", ("residual_stream",)), _residual_chain_probes(device, scale, seed),
                lambda c: list(run(*c.tensors)), spec, fixed)


def _qk_chain_probes(device, scale, seed):
    configs = [(24, 4, 2, 128, 40960)] if scale == "small" else [(1, 16, 8, 128, 40960), (512, 16, 8, 128, 40960), (2048, 32, 8, 128, 40960)]
    gen = torch.Generator().manual_seed(seed)
    cases = []
    for t, hq, hk, d, max_pos in configs:
        for kind in ("random", "range"):
            q = P._values(kind, (t, hq * d), gen)
            k = P._values(kind, (t, hk * d), gen)
            wq, wk = (1 + 0.1 * torch.randn(d, generator=gen) for _ in range(2))
            positions = torch.randint(0, max_pos, (t,), generator=gen)
            probe = P.RopeProbe(f"q/k norm->rope {t}x{hq}/{hk}x{d} {kind}", positions.to(device),
                                q.to(_LP).to(device), k.to(_LP).to(device), d, 1e6, max_pos)
            cases.append((probe, wq.to(_LP).to(device), wk.to(_LP).to(device)))
    return cases


def _qk_experiment(eng, ops: RegionOps, device, scale, seed, fixed) -> Experiment:
    """qk_norm.out: does RoPE read RN(norm(q)) or the unrounded norm output? The engine's fused
    q/k norm (``qk_norm``) where it has one, else its ``rms_norm`` on each head."""
    rope, qk_norm = ops.chain_ops["rope"], ops.chain_ops.get("qk_norm")
    rms_norm = ops.chain_ops.get("rms_norm")
    eps = 1e-6
    runs, tables = {}, {}

    def engine(case):
        probe, wq, wk = case
        d, t = probe.head_size, probe.q.shape[0]

        def chain(positions, q, k, wq, wk, cache):
            if qk_norm is not None:
                qn, kn = qk_norm(q, k, wq, wk, eps, d)
            else:
                qn = rms_norm(q.view(t, -1, d), wq, eps).view(t, -1)
                kn = rms_norm(k.view(t, -1, d), wk, eps).view(t, -1)
            return rope(positions, qn, kn, d, cache)

        cache, cos, sin = tables[probe.name] = _rope_tables(eng, probe, device)
        run = runs.setdefault((t, d), _compile(chain) if ops.compile_chains else chain)
        return list(run(probe.positions, probe.q, probe.k, wq, wk, cache))

    def spec(case, p):
        probe, wq, wk = case
        d, t = probe.head_size, probe.q.shape[0]
        _, cos, sin = tables[probe.name]
        out_dtype = torch.float32 if p.qk_norm_out == "fp32" else None
        qn = ref.rms_norm(probe.q.view(t, -1, d), wq, eps, p, dtype=_LP, out_dtype=out_dtype)
        kn = ref.rms_norm(probe.k.view(t, -1, d), wk, eps, p, dtype=_LP, out_dtype=out_dtype)
        q, k = ref.rope(qn, kn, cos, sin, p, unsqueeze_dim=1, dtype=_LP)
        return [q.reshape(t, -1), k.reshape(t, -1)]

    return _run(Experiment("q/k norm -> rope chain", ("qk_norm_out",)), _qk_chain_probes(device, scale, seed), engine, spec, fixed)


def _hf_rotary(probe: P.RopeProbe):
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    params = {"rope_type": "default", "rope_theta": probe.base}
    if probe.rope_scaling:
        params = {**probe.rope_scaling, "rope_theta": probe.base}
    config = LlamaConfig(hidden_size=probe.head_size, num_attention_heads=1, head_dim=probe.head_size,
                         max_position_embeddings=probe.max_position, rope_parameters=params)
    return LlamaRotaryEmbedding(config), config


def _inv_freq_point(eng, device, scale, seed) -> PointResult:
    """rope.inv_freq: the engine's fp32 cache vs HF's rotary with inv_freq from the host / device."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    seen, counts = set(), {"host": [0, 0, 0], "device": [0, 0, 0]}
    for probe in P.rope_probes(device, scale, seed + 2):
        key = (probe.head_size, probe.base, probe.max_position, str(probe.rope_scaling))
        if key in seen:
            continue
        seen.add(key)
        cache = eng.cos_sin_cache(probe.head_size, probe.head_size, probe.max_position, probe.base,
                                  probe.rope_scaling, dtype=torch.float32, device=device)
        module, config = _hf_rotary(probe)
        init = module.compute_default_rope_parameters if module.rope_type == "default" else ROPE_INIT_FUNCTIONS[module.rope_type]
        with torch.device(device):  # HF's init, evaluated where the engine evaluates its own
            on_device = init(config)[0]
        candidates = {"host": module.inv_freq.clone(), "device": on_device}
        module.to(device)
        positions = torch.arange(probe.max_position, device=device)[None]
        x = torch.zeros(1, device=device, dtype=torch.float32)
        half = probe.head_size // 2
        for where, inv_freq in candidates.items():
            module.inv_freq = inv_freq.to(device)
            cos, sin = module(x, positions)
            hf = torch.cat((cos[0, :, :half], sin[0, :, :half]), dim=-1)
            n_eq, n, ulp = _compare(cache, hf)
            c = counts[where]
            c[0], c[1], c[2] = c[0] + n_eq, c[1] + n, max(c[2], ulp)
    fractions = {w: c[0] / c[1] for w, c in counts.items()}
    perfect = [w for w, f in fractions.items() if f == 1.0]
    ambiguous = len(perfect) > 1
    choice = None if ambiguous else max(fractions, key=fractions.get)
    return PointResult(
        "rope_inv_freq", choice, "native_eager", fractions, ambiguous,
        None if choice is None else counts[choice][2], counts["host"][1], ["cos/sin cache tables"],
        note="the engine's cache builder run as the engine runs it (eagerly, at model init), fp32 entries compared",
    )


# ------------------------------------------------------------------------------------------
# The run
# ------------------------------------------------------------------------------------------


def _settle_reduction(red: PointResult, notes: list[str]) -> None:
    """``norm_reduction`` names an order rla reproduces; it is chosen only when that order alone
    reproduces every probe element. Otherwise the engine's order is not one rla reproduces (or
    the probes do not tell the orders apart) and the point is ``unpinned``, which says so."""
    reproduced = [c for c, f in red.fractions.items() if c != "unpinned" and f == 1.0]
    # ambiguous as everywhere (docs/rounding.md): two or more choices at 100%, whatever is then kept
    red.ambiguous = sum(f == 1.0 for f in red.fractions.values()) > 1
    if len(reproduced) == 1 and red.fractions.get("unpinned", 0.0) < 1.0:
        red.choice = reproduced[0]
        return
    red.choice = "unpinned"
    red.max_ulp = None
    red.fallback = (
        "the probes do not tell the orders apart" if reproduced
        else "no order rla reproduces matched every element: the engine's own order is left unpinned"
    )
    notes.append(f"norm_reduction: {red.fallback} (fractions: "
                 + ", ".join(f"{c} {100 * f:.4f}%" for c, f in red.fractions.items()) + ")")


def _stamp_versions():
    try:
        triton = importlib.metadata.version("triton")
    except importlib.metadata.PackageNotFoundError:
        triton = ""
    return torch.__version__, triton


def load_engine(engine: str, wheel: str | None = None):
    """The adapter of ``engine`` (``ENGINES``), loaded from ``wheel`` or the installed package."""
    if engine not in ENGINES:
        raise ValueError(f"unknown engine {engine!r}; supported: {', '.join(ENGINES)}")
    return importlib.import_module(ENGINES[engine]).load(wheel)


#: The points the per-op experiments decide, with the ops they come from.
_PER_OP_POINTS: dict[str, tuple[str, ...]] = {
    "rope_cos_sin": ("rope",),
    "rope_apply": ("rope",),
    "swiglu": ("silu_and_mul",),
    "norm_weight": ("rms_norm", "fused_add_rms_norm"),
    "norm_residual": ("fused_add_rms_norm",),
    "norm_reduction": ("rms_norm", "fused_add_rms_norm"),
}


def _kept_from_baseline(eng, point: str, why: str) -> PointResult:
    """A point nothing ran for: the adapter's baseline profile's choice and evidence, said so."""
    if eng.baseline is None:
        raise EngineUnavailable(f"{eng.name} {eng.version}: nothing ran for {point} ({why}), and the "
                                "adapter names no baseline profile to keep it from")
    base = get(eng.baseline)
    ev = base.calibration.points.get(point) if base.calibration else None
    evidence = ev.evidence if ev else "source"
    matched = "" if ev is None or ev.matched is None else f", matched {100 * ev.matched:.4f}% there"
    return PointResult(
        point=point,
        choice=getattr(base, point),
        evidence=evidence,
        fractions={},
        fallback=f"not run here ({why}); kept from profile {base.name} (evidence {evidence}{matched})",
        note=ev.note if ev else "",
    )


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
        return _kept_from_baseline(eng, point, why)

    say = (lambda m: progress(f"{eng.name} {eng.version} {mode} on {dev.type}: {m}")) if progress else None
    with torch.no_grad(), torch._dynamo.config.patch(recompile_limit=64):
        per_op = _per_op_experiments(eng, ops, dev, scale, seed, say)
        points = {}
        for p, needed in _PER_OP_POINTS.items():
            decided = any(p in e.points for e in per_op)
            points[p] = _decide(p, per_op, _point_evidence(p, per_op)) if decided else keep(p, needed)
        fixed = {p: r.choice or POINTS[p][0] for p, r in points.items()}
        chain_note = "a small chain of the engine's functions" + (
            " compiled as one Inductor graph" if ops.compile_chains else ", one op after the other"
        )
        residual_ops = ("fused_add_rms_norm", "silu_and_mul")
        residual = _attempt(ops, residual_ops, lambda: _residual_experiment(ops, dev, scale, seed + 3, fixed), say)
        qk_ops = ("rope", "qk_norm") if "qk_norm" in ops.ops or "qk_norm" in ops.unavailable else ("rope", "rms_norm")
        qk = _attempt(ops, qk_ops, lambda: _qk_experiment(eng, ops, dev, scale, seed + 4, fixed), say)
        for p, exp, needed in (("residual_stream", residual, residual_ops), ("qk_norm_out", qk, qk_ops)):
            points[p] = keep(p, needed) if exp is None else _decide(p, [exp], exp.evidence, chain_note)
        if say is not None:
            say("rotary cos/sin cache (rope_inv_freq)")
        points["rope_inv_freq"] = _inv_freq_point(eng, dev, scale, seed)

    if "norm_reduction" not in kept:
        _settle_reduction(points["norm_reduction"], notes)
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
