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
"""

from __future__ import annotations

import datetime
import importlib.metadata
import itertools
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from rla.engines import probes as P
from rla.engines.conformance import Conformance, PointResult
from rla.engines.source import EngineUnavailable
from rla.ops import reference as ref
from rla.profiles import POINTS, get

__all__ = ["calibrate", "MODES", "ENGINES", "Experiment"]

MODES = ("default", "eager")
ENGINES = ("vllm",)

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


# ------------------------------------------------------------------------------------------
# The engine side: compiled native ops, kernels, or native ops run eagerly
# ------------------------------------------------------------------------------------------


class _EngineOps:
    """The engine's functions as the chosen mode runs them, and the evidence that gives."""

    def __init__(self, eng, mode: str, device: torch.device, library: str | None):
        self.eng, self.mode, self.device, self.notes = eng, mode, device, []
        native = {
            "rms_norm": eng.rms_norm_native,
            "fused_add_rms_norm": eng.fused_add_rms_norm_native,
            "silu_and_mul": eng.silu_and_mul_native,
            "rope": lambda pos, q, k, hd, cache: eng.rope_native(pos, q, k, hd, cache, True),
        }
        if mode == "default":
            self.evidence = "native_compiled"
            self.ops = {name: self._compile(fn) for name, fn in native.items()}
            self.chain_ops = native  # a chain is compiled as one graph around the native functions
            self.compile_chains = True
        elif device.type == "cuda":
            kernels = eng.c_ops(library)
            self.evidence = "kernel"
            self.ops = {
                "rms_norm": kernels.rms_norm,
                "fused_add_rms_norm": kernels.fused_add_rms_norm,
                "silu_and_mul": kernels.silu_and_mul,
                "rope": lambda pos, q, k, hd, cache: kernels.rotary_embedding(pos, q, k, hd, cache, True),
            }
            self.chain_ops = self.ops
            self.compile_chains = False
            self.notes.append(f"eager mode: vLLM's compiled kernels from {kernels.path}")
        else:
            self.evidence = "native_eager"
            self.ops = self.chain_ops = native
            self.compile_chains = False
            self.notes.append(
                "eager mode on a machine without CUDA: vLLM's enforce_eager runs its CUDA kernels "
                "(torch.ops._C), which cannot run here; every point fell back to vLLM's native ops "
                "run eagerly (evidence native_eager), which are NOT the kernels (e.g. the native "
                "norm run eagerly rounds x*rstd before the weight, the 0.33 kernels do not). "
                "Calibrate eager mode on a GPU for a profile row."
            )

    @staticmethod
    def _compile(fn):
        return torch.compile(fn, backend="inductor", fullgraph=True, dynamic=False)

    def chain(self, fn):
        return self._compile(fn) if self.compile_chains else fn


# ------------------------------------------------------------------------------------------
# Experiments
# ------------------------------------------------------------------------------------------


def _rope_tables(eng, probe: P.RopeProbe, device):
    """(the engine's lp cache as its kernels read it, fp32 cos and sin at the probe's positions)."""
    args = (probe.head_size, probe.head_size, probe.max_position, probe.base, probe.rope_scaling)
    cache32 = eng.cos_sin_cache(*args, dtype=torch.float32, device=device)
    cache_lp = eng.cos_sin_cache(*args, dtype=probe.q.dtype, device=device)
    cos, sin = cache32.index_select(0, probe.positions).chunk(2, dim=-1)
    return cache_lp, cos, sin


def _per_op_experiments(eng, ops: _EngineOps, device, scale, seed) -> list[Experiment]:
    norms = P.norm_probes(device, scale, seed)
    swiglus = P.swiglu_probes(device, scale, seed + 1)
    ropes = P.rope_probes(device, scale, seed + 2)
    out = []
    out.append(_run(
        Experiment("rms_norm", ("norm_weight", "norm_reduction")), norms,
        lambda c: [ops.ops["rms_norm"](c.x, c.weight, c.eps)],
        lambda c, p: [ref.rms_norm(c.x, c.weight, c.eps, p)], {},
    ))

    def add_engine(c):
        out_, res = ops.ops["fused_add_rms_norm"](c.x, c.residual, c.weight, c.eps)
        return [out_, res]

    def add_spec(c, p):
        out_, res = ref.add_rms_norm(c.x, c.residual, c.weight, c.eps, p)
        return [out_, res]

    out.append(_run(Experiment("fused_add_rms_norm", ("norm_weight", "norm_residual", "norm_reduction")), norms,
                    add_engine, add_spec, {}))

    def swiglu_spec(c, p):
        d = c.x.shape[-1] // 2
        return [ref.swiglu(c.x[..., :d], c.x[..., d:], p)]

    out.append(_run(Experiment("silu_and_mul", ("swiglu",)), swiglus,
                    lambda c: [ops.ops["silu_and_mul"](c.x)], swiglu_spec, {}))

    tables = {}

    def rope_engine(c):
        cache_lp, cos, sin = tables[c.name] = _rope_tables(eng, c, device)
        q, k = ops.ops["rope"](c.positions, c.q, c.k, c.head_size, cache_lp)
        return [q, k]

    def rope_spec(c, p):
        _, cos, sin = tables[c.name]
        t, d = c.q.shape[0], c.head_size
        q, k = ref.rope(c.q.view(t, -1, d), c.k.view(t, -1, d), cos, sin, p, unsqueeze_dim=1)
        return [q.reshape(t, -1), k.reshape(t, -1)]

    out.append(_run(Experiment("rotary_embedding", ("rope_cos_sin", "rope_apply")), ropes, rope_engine, rope_spec, {}))
    return out


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


def _residual_experiment(ops: _EngineOps, device, scale, seed, fixed) -> Experiment:
    """residual.stream: does the MLP's add read RN(a + r) or the fp32 a + r?"""
    fused_add, silu_and_mul = ops.chain_ops["fused_add_rms_norm"], ops.chain_ops["silu_and_mul"]
    eps = 1e-6

    def chain(a, r, w1, w_gu, w_d, w2):
        h1, r1 = fused_add(a, r, w1, eps)
        m = F.linear(silu_and_mul(F.linear(h1, w_gu)), w_d)
        return fused_add(m, r1, w2, eps)

    run = ops.chain(chain)

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


def _qk_experiment(eng, ops: _EngineOps, device, scale, seed, fixed) -> Experiment:
    """qk_norm.out: does RoPE read RN(norm(q)) or the unrounded norm output?"""
    rms_norm, rope = ops.chain_ops["rms_norm"], ops.chain_ops["rope"]
    eps = 1e-6
    runs, tables = {}, {}

    def engine(case):
        probe, wq, wk = case
        d, t = probe.head_size, probe.q.shape[0]

        def chain(positions, q, k, wq, wk, cache):
            qn = rms_norm(q.view(t, -1, d), wq, eps).view(t, -1)
            kn = rms_norm(k.view(t, -1, d), wk, eps).view(t, -1)
            return rope(positions, qn, kn, d, cache)

        cache_lp, cos, sin = tables[probe.name] = _rope_tables(eng, probe, device)
        run = runs.setdefault((t, d), ops.chain(chain))
        return list(run(probe.positions, probe.q, probe.k, wq, wk, cache_lp))

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
        note="the engine's cache builder run as vLLM runs it (eagerly, at model init), fp32 entries compared",
    )


# ------------------------------------------------------------------------------------------
# The run
# ------------------------------------------------------------------------------------------


def _settle_reduction(red: PointResult, notes: list[str]) -> None:
    """``norm_reduction`` names an order rla reproduces; it is chosen only when that order alone
    reproduces every probe element. Otherwise the engine's order is not one rla reproduces (or
    the probes do not tell the orders apart) and the point is ``unpinned``, which says so."""
    reproduced = [c for c, f in red.fractions.items() if c != "unpinned" and f == 1.0]
    if len(reproduced) == 1 and red.fractions.get("unpinned", 0.0) < 1.0:
        red.choice, red.ambiguous = reproduced[0], False
        return
    red.choice, red.ambiguous = "unpinned", False
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
) -> Conformance:
    """Calibrate ``engine`` in ``mode`` on ``device``; returns the :class:`Conformance`.

    ``scale`` picks the probe set (``small`` on a CPU, ``full`` on a GPU by default). ``wheel``
    loads the engine from a wheel file instead of the installed package; ``library`` names the
    kernel library for ``eager`` mode on CUDA.
    """
    if engine == "sglang":
        raise NotImplementedError(
            "--engine sglang: not supported yet: rla's SGLang adapter (its FlashInfer / sgl-kernel "
            "and JIT region kernels) is not written; calibrate --engine vllm, or use the measured "
            "sglang-0.5.23 row of `rla profiles`"
        )
    if engine not in ENGINES:
        raise ValueError(f"unknown engine {engine!r}; supported: {', '.join(ENGINES)}")
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; one of {', '.join(MODES)}")
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise EngineUnavailable(f"--device {device}: this torch ({torch.__version__}) sees no CUDA device")
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"device must be cpu or cuda, got {device!r}")
    scale = scale or ("full" if dev.type == "cuda" else "small")

    from rla.engines import vllm

    eng = vllm.load(wheel)
    ops = _EngineOps(eng, mode, dev, library)
    notes = list(ops.notes)

    with torch.no_grad(), torch._dynamo.config.patch(recompile_limit=64):
        per_op = _per_op_experiments(eng, ops, dev, scale, seed)
        points = {p: _decide(p, per_op, ops.evidence) for p in
                  ("rope_cos_sin", "rope_apply", "swiglu", "norm_weight", "norm_residual", "norm_reduction")}
        fixed = {p: r.choice or POINTS[p][0] for p, r in points.items()}
        chains = [_residual_experiment(ops, dev, scale, seed + 3, fixed),
                  _qk_experiment(eng, ops, dev, scale, seed + 4, fixed)]
        chain_note = "a small chain of the engine's functions" + (
            " compiled as one Inductor graph" if ops.compile_chains else ", one op after the other"
        )
        points["residual_stream"] = _decide("residual_stream", chains, ops.evidence, chain_note)
        points["qk_norm_out"] = _decide("qk_norm_out", chains, ops.evidence, chain_note)
        points["rope_inv_freq"] = _inv_freq_point(eng, dev, scale, seed)

    _settle_reduction(points["norm_reduction"], notes)
    inv = points["rope_inv_freq"]
    if inv.ambiguous:
        fact = eng.source_fact("rope_inv_freq")
        inv.choice, inv.evidence, inv.fallback = fact["choice"], "source", fact["why"]
        notes.append(
            f"rope_inv_freq: on {dev.type} the host and the device are the same place, so both "
            f"candidates match; the value comes from vLLM's source ({fact['where']})"
        )
    for r in points.values():
        if r.ambiguous and r.choice is None:
            notes.append(f"{r.point}: ambiguous on these probes (every candidate at 100%); left undecided")
    if dev.type == "cpu" and mode == "default":
        notes.append(
            "default mode on the CPU: Inductor's C++ backend compiled the native ops; a GPU row "
            "needs the same run on the GPU (Triton), where reduction orders differ"
        )
    torch_v, triton_v = _stamp_versions()
    return Conformance(
        engine="vllm",
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
    )
