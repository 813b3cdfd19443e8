"""The experiments calibration runs on an engine's region code (:class:`~rla.engines.adapter.RegionEngine`).

- per op: the engine's ``rms_norm``, ``fused_add_rms_norm``, ``silu_and_mul`` and ``rope`` on the
  probes of :mod:`rla.engines.probes`, against ``rla.ops.reference`` under every combination of
  the points each op depends on;
- cross-op chains built from the engine's own functions: add+norm -> gate/up GEMM ->
  silu_and_mul -> down GEMM -> add+norm (``residual_stream``), and q/k norm -> RoPE
  (``qk_norm_out``), compiled as one Inductor graph when the mode compiles (``compile_chains``),
  else one op after the other, with the per-op points fixed to their decided values;
- ``rope_inv_freq``: the engine's fp32 cos/sin cache, built by its own builder on the device,
  against HF's rotary init evaluated on the host and on the device.

An experiment whose op cannot run here (``EngineUnavailable``: a kernel that does not build, a
library that does not load into this torch) is recorded on the :class:`RegionOps` and skipped,
not fatal; calibration then keeps the baseline's evidence for its points.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from rla.engines import probes as P
from rla.engines.bit_match import Experiment, count_equal, run_combinations
from rla.engines.conformance import PointResult
from rla.engines.decisions import weakest
from rla.engines.regions import RegionOps
from rla.engines.source import EngineUnavailable
from rla.ops import reference as ref

__all__ = ["attempt", "compile_chain", "per_op_experiments", "residual_experiment", "qk_experiment",
           "inv_freq_point"]

_LP = torch.bfloat16


def compile_chain(fn):
    return torch.compile(fn, backend="inductor", fullgraph=True, dynamic=False)


def attempt(ops: RegionOps, names: tuple[str, ...], build, say=None):
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
    exp.evidence = weakest(ops.evidence[n] for n in names)
    return exp


def _rope_tables(eng, probe: P.RopeProbe, device):
    """(the engine's cache as its rope code reads it, fp32 cos and sin at the probe's positions)."""
    args = (probe.head_size, probe.head_size, probe.max_position, probe.base, probe.rope_scaling)
    cache32 = eng.cos_sin_cache(*args, dtype=torch.float32, device=device)
    cache_kernel = eng.rope_cache(*args, query_dtype=probe.q.dtype, device=device)
    cos, sin = cache32.index_select(0, probe.positions).chunk(2, dim=-1)
    return cache_kernel, cos, sin


def per_op_experiments(eng, ops: RegionOps, device, scale, seed, say=None) -> list[Experiment]:
    norms = P.norm_probes(device, scale, seed)
    swiglus = P.swiglu_probes(device, scale, seed + 1)
    ropes = P.rope_probes(device, scale, seed + 2)
    out = []
    out.append(attempt(ops, ("rms_norm",), lambda: run_combinations(
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

    out.append(attempt(ops, ("fused_add_rms_norm",), lambda: run_combinations(
        Experiment("fused_add_rms_norm", ("norm_weight", "norm_residual", "norm_reduction")), norms,
        add_engine, add_spec, {}), say))

    def swiglu_spec(c, p):
        d = c.x.shape[-1] // 2
        return [ref.swiglu(c.x[..., :d], c.x[..., d:], p)]

    out.append(attempt(ops, ("silu_and_mul",), lambda: run_combinations(
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

    out.append(attempt(ops, ("rope",), lambda: run_combinations(
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


def residual_experiment(ops: RegionOps, device, scale, seed, fixed) -> Experiment:
    """residual.stream: does the MLP's add read RN(a + r) or the fp32 a + r?"""
    fused_add, silu_and_mul = ops.chain_ops["fused_add_rms_norm"], ops.chain_ops["silu_and_mul"]
    eps = 1e-6

    def chain(a, r, w1, w_gu, w_d, w2):
        h1, r1 = fused_add(a, r, w1, eps)
        m = F.linear(silu_and_mul(F.linear(h1, w_gu)), w_d)
        return fused_add(m, r1, w2, eps)

    run = compile_chain(chain) if ops.compile_chains else chain

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

    return run_combinations(Experiment("residual chain", ("residual_stream",)), _residual_chain_probes(device, scale, seed),
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


def qk_experiment(eng, ops: RegionOps, device, scale, seed, fixed) -> Experiment:
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
        run = runs.setdefault((t, d), compile_chain(chain) if ops.compile_chains else chain)
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

    return run_combinations(Experiment("q/k norm -> rope chain", ("qk_norm_out",)), _qk_chain_probes(device, scale, seed), engine, spec, fixed)


def _hf_rotary(probe: P.RopeProbe):
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    params = {"rope_type": "default", "rope_theta": probe.base}
    if probe.rope_scaling:
        params = {**probe.rope_scaling, "rope_theta": probe.base}
    config = LlamaConfig(hidden_size=probe.head_size, num_attention_heads=1, head_dim=probe.head_size,
                         max_position_embeddings=probe.max_position, rope_parameters=params)
    return LlamaRotaryEmbedding(config), config


def inv_freq_point(eng, device, scale, seed) -> PointResult:
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
            n_eq, n, ulp = count_equal(cache, hf)
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
