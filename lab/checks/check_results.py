"""Recompute every number of the results READMEs from the committed files it cites.

Each check names a claim, the file(s) it is recomputed from and the statistic (mean, sample std
with ddof=1, ratio of means, per-seed range, min-max over cases), and computes its values from
those files (JSON, CSV, run logs). The README's "Results so far" and ``results/README.md`` cite
each value between render markers (``lab/checks/render.py``: ``<!--n:CLAIM#I:SHAPE-->...<!--/n-->``,
the claim's slug, the value's index, its written shape). A claim passes when every value, rendered
in its marker's shape, equals what the marker holds, i.e. the committed text equals a fresh render:
prose around the markers can be reworded freely; a changed number, a value the data no longer
gives, or a claim whose markers are gone is a MISMATCH.

    python lab/checks/check_results.py            # the table; exit 1 on any MISMATCH

Run from the repository root (or pass ``--root``). Uses ``rla.rl.runlog`` (the repo's own log reader
and per-run summary) for the GRPO logs, so the numbers are the ones ``rla experiment
--summarize-only`` computes.
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))
from render import format_like, markers, slug  # noqa: E402  (lab/checks/, beside this script)

TWIN = "results/benchmarks/vllm033_calibration_twin_h200_2026-11-30"
ORDER = "results/benchmarks/vllm033_reduction_order_h200_2026-11-30"
FORWARD = "results/benchmarks/vllm033_engine_forward_h200_2026-11-30"
SGLANG = "results/benchmarks/sglang0523_calibration_h200_2026-11-30"
QK = "results/benchmarks/qk_norm_rope_h200_2026-11-30"
GRPO = "results/experiments/grpo_h200_2026-11-29"
SESSION4 = "results/benchmarks/rope_liger_compile_h200_2026-11-29"
D29 = SESSION4
D29C = "results/benchmarks/e2e_align_ops_isolated_h200_2026-11-29"   # session 3 (its isolated per-op runs and e2e); the one place this path is named


# ---------------------------------------------------------------- README text

def section(text: str, heading: str) -> str:
    """The text under ``heading`` up to the next heading of the same level, whitespace-normalised."""
    level = heading.split(" ")[0]
    lines, inside = [], False
    for line in text.splitlines():
        if line.strip() == heading:
            inside = True
            continue
        if inside and line.startswith(level + " "):
            break
        if inside:
            lines.append(line)
    if not inside:
        raise ValueError(f"heading {heading!r} not found")
    return " ".join(" ".join(lines).split())


def readme_texts(root: Path) -> dict[str, str]:
    """The two texts the claims are parsed from, keyed by a short name."""
    norm = lambda p: " ".join((root / p).read_text().split())  # noqa: E731
    return {"README": section((root / "README.md").read_text(), "## Results so far"),
            "results/README": norm("results/README.md")}


# ---------------------------------------------------------------- checks

@dataclass
class Check:
    name: str
    where: str                      # key of readme_texts()
    files: str
    statistic: str
    compute: Callable[[Path], list] | None = None   # one value per marker index (number, or str as written)
    why_not: str = ""               # set: not recomputable, with the reason
    results: dict = field(default_factory=dict)


def _json(root: Path, rel: str):
    return json.loads((root / rel).read_text())


# -- calibration and twin

def _calibration_points(root):
    for mode in ("default", "eager"):
        rep = _json(root, f"{TWIN}/calibration_{mode}.report.json")
        for p in rep["points"].values():
            yield p["fractions"][p["choice"]], [v for k, v in p["fractions"].items() if k != p["choice"]]


def calib_chosen(root):
    vals = [c for c, _ in _calibration_points(root)]
    return [100 * min(vals), 100 * max(vals)]


def calib_other(root):
    vals = [o for _, others in _calibration_points(root) for o in others]
    return [100 * min(vals), 100 * max(vals)]


def rope_tables(root):
    rows = _json(root, f"{TWIN}/rope_tables.json")["rows"]
    dev = [r for r in rows if r["rope_inv_freq"] == "device"]
    host = {r["model"].split("-")[0]: r for r in rows if r["rope_inv_freq"] != "device"}
    pos = {r["model"].split("-")[0]: r["positions"] for r in rows}
    return [100 * min(r["fp32_equal"] for r in dev), pos["qwen2"] // 1000, pos["llama31"] // 1000,
            100 * host["qwen2"]["fp32_equal"], 100 * host["llama31"]["fp32_equal"]]


def _twin_rows(root, mode):
    return _json(root, f"{TWIN}/twin_{mode}.json")["rows"]


def twin_shapes(root):
    rows = _twin_rows(root, "default") + _twin_rows(root, "eager")
    rand = [r for r in rows if not r["model"].startswith("tiny")]
    hidden = [int(re.search(r"-h(\d+)", r["model"]).group(1)) for r in rand]
    layers = {len(r["layers_equal"]) for r in rand if r.get("layers_equal")}
    toks = [r["tokens"] for r in rows]
    return [min(hidden), max(hidden), layers.pop() if len(layers) == 1 else f"{sorted(layers)}",
            min(toks), max(toks), max(r["position_offset"] for r in rows) // 1000]


def _multi_token_rla(root, mode):
    """Random-init models, more than one token, rla's fused and reference sides; k3 ratio HF / side."""
    rows = [r for r in _twin_rows(root, mode) if not r["model"].startswith("tiny") and r["tokens"] > 1]
    key = lambda r: (r["model"], r["batch"], r["tokens"], r["position_offset"])  # noqa: E731
    hf = {key(r): r for r in rows if r["side"] == "hf"}
    rla = [r for r in rows if r["side"] in ("rla-fused", "rla-reference")]
    eq = [100 * r["logits_equal"] for r in rla]
    ratio = [hf[key(r)]["k3"] / r["k3"] for r in rla]
    return [min(eq), max(eq), min(ratio), max(ratio)]


def twin_eager_engine_kernels(root):
    rows = [r for r in _twin_rows(root, "eager") if r["side"] == "vllm-kernels"]
    ok = all(r["logits_equal"] == 1.0 and all(x == 1.0 for x in r.get("layers_equal") or [1.0]) for r in rows)
    return ["every case" if ok and rows else f"not every case ({len(rows)} rows)"]


def twin_one_token(root):
    rows = [r for m in ("default", "eager") for r in _twin_rows(root, m)
            if r["tokens"] == 1 and r["batch"] == 1 and r["side"].startswith("rla")]
    return ["in both" if rows and all(r["logits_equal"] == 1.0 for r in rows) else "not in both"]


def _e2e_pairs(root):
    """(old, new) e2e files in the order they ran: call 2 once, call 3 twice."""
    d = root / TWIN
    olds = [d / "e2e_old_code.json"] + sorted(d.glob("call3_e2e_old_*.json"))
    news = [d / "e2e_new_code.json"] + sorted(d.glob("call3_e2e_new_*.json"))
    return list(zip(olds, news))


def _e2e(path, model, variant):
    return next(r for r in json.loads(path.read_text())["results"] if r["model"] == model and r["variant"] == variant)


def e2e_cost(root):
    """1 - new/old rla-vllm tok/s on the 1.5B model, per pair, in percent: min-max."""
    r15 = [_e2e(n, "qwen2.5-1.5b", "rla-vllm")["tok_s"] / _e2e(o, "qwen2.5-1.5b", "rla-vllm")["tok_s"]
           for o, n in _e2e_pairs(root)]
    return [100 * (1 - max(r15)), 100 * (1 - min(r15))]


def e2e_old_miss(root):
    r15 = [_e2e(n, "qwen2.5-1.5b", "rla-vllm")["tok_s"] / _e2e(o, "qwen2.5-1.5b", "rla-vllm")["tok_s"]
           for o, n in _e2e_pairs(root)]
    return [min(r15), max(r15)]


# -- reduction order session

def order_twin_exact(root):
    rows = [r for r in _json(root, f"{ORDER}/twin_eager.json")["rows"] if r["side"] == "rla-fused"]
    exact = [r for r in rows if r["logits_equal"] == 1.0 and all(x == 1.0 for x in r["layers_equal"])]
    return [len(exact), len(rows)]


def order_calibration(root):
    rep = _json(root, f"{ORDER}/calibration_eager.report.json")
    chosen = [p["fractions"][p["choice"]] for p in rep["points"].values()]
    return [100 * min(chosen), len(chosen)]


def forward_twin(root):
    """vllm-pieces rows exact (logits and every layer) / all rows; rla-fused logits_equal min-max (>1 token)."""
    rows = _json(root, f"{FORWARD}/twin_default.json")["rows"]
    pieces = [r for r in rows if r["side"] == "vllm-pieces"]
    exact = [r for r in pieces if r["logits_equal"] == 1.0 and all(x == 1.0 for x in r["layers_equal"])]
    fused = [100 * r["logits_equal"] for r in rows if r["side"] == "rla-fused" and r["tokens"] > 1]
    assert len(exact) == len(pieces), "a vllm-pieces row is not bit-exact"
    return [len(exact), min(fused), max(fused)]


def forward_e2e(root):
    """rla-vllm-pieces tok/s and peak / hf-bf16's, 1.5B then 7B."""
    path = root / f"{FORWARD}/e2e.json"
    r = lambda m, k: _e2e(path, m, "rla-vllm-pieces")[k] / _e2e(path, m, "hf-bf16")[k]  # noqa: E731
    return [r("qwen2.5-1.5b", "tok_s"), r("qwen2.5-7b", "tok_s"), r("qwen2.5-1.5b", "peak_gib"), r("qwen2.5-7b", "peak_gib")]


def sglang_points(root):
    """calibration.report.json: 100 x the chosen choice's fraction of rope_apply, swiglu, qk_norm_out;
    rest_diagnosis.json: 100 x the FMA model's fraction of all RoPE elements."""
    rep = _json(root, f"{SGLANG}/calibration.report.json")["points"]
    f = lambda p: 100 * rep[p]["fractions"][rep[p]["choice"]]  # noqa: E731
    fma = 100 * _json(root, f"{SGLANG}/rest_diagnosis.json")["rope"]["equal_everywhere_fma_first_product_exact"]
    return [f("rope_apply"), fma, f("swiglu"), f("qk_norm_out")]


def sglang_norm_points(root):
    """norm_cute/calibration.report.json: 100 x the chosen choice's fraction of norm_weight, norm_residual,
    residual_stream (SGLang's norm path, FlashInfer 0.7.2's CuTe-DSL kernels)."""
    rep = _json(root, f"{SGLANG}/norm_cute/calibration.report.json")["points"]
    return [100 * rep[p]["fractions"][rep[p]["choice"]] for p in ("norm_weight", "norm_residual", "residual_stream")]


def qk_step(root):
    """e2e_fused.json: rla-vllm tok/s / hf-bf16 tok/s and peak / hf-bf16 peak, Qwen3-1.7B then Qwen2.5-1.5B."""
    rows = {(r["model"], r["variant"]): r for r in _json(root, f"{QK}/e2e_fused.json")["results"]}
    out = []
    for m in ("qwen3-1.7b", "qwen2.5-1.5b"):
        a, h = rows[(m, "rla-vllm")], rows[(m, "hf-bf16")]
        out += [a["tok_s"] / h["tok_s"], a["peak_gib"] / h["peak_gib"]]
    return out


def _order_e2e(root, stem):
    return root / f"{ORDER}/{stem}.json"


def order_e2e_ratios(root):
    """tokens/s vs hf-bf16 of one variant per model, min-max over the two new-code runs."""
    out = []
    for variant in ("rla-vllm-eager", "liger", "rla-vllm-eager-kernels"):
        for model in ("qwen2.5-1.5b", "qwen2.5-7b"):
            vals = [_e2e(_order_e2e(root, s), model, variant)["tok_s"] / _e2e(_order_e2e(root, s), model, "hf-bf16")["tok_s"]
                    for s in ("e2e_new_code_1", "e2e_new_code_2")]
            out += [min(vals), max(vals)]
    mem = [_e2e(_order_e2e(root, "e2e_new_code_1"), m, "rla-vllm-eager")["peak_gib"]
           / _e2e(_order_e2e(root, "e2e_new_code_1"), m, "hf-bf16")["peak_gib"] for m in ("qwen2.5-1.5b", "qwen2.5-7b")]
    # the README order: eager 1.5B, eager 7B, memory 1.5B / 7B, liger 1.5B, liger 7B, kernels 1.5B, kernels 7B
    return out[0:4] + mem + out[4:12]


def order_carry_vs_old(root):
    old = _order_e2e(root, "e2e_old_code")
    r = {m: [_e2e(_order_e2e(root, s), m, "rla-vllm")["tok_s"] / _e2e(old, m, "rla-vllm")["tok_s"]
             for s in ("e2e_new_code_1", "e2e_new_code_2")] for m in ("qwen2.5-1.5b", "qwen2.5-7b")}
    return [min(r["qwen2.5-1.5b"]), max(r["qwen2.5-1.5b"]), min(r["qwen2.5-7b"]), max(r["qwen2.5-7b"])]


# -- dose-response (the recomputation lives in lab/checks/dose_numbers.py)

def _dose():
    here = str(Path(__file__).resolve().parent)
    if here not in sys.path:
        sys.path.insert(0, here)
    import dose_numbers
    return dose_numbers


def _dose_prose(root):
    d = _dose()
    fit = d.dose_threshold(root)
    cell = d._cell(root, "qwen2-tiny")
    arms = {a["arm"]: a for a in cell["arms"]}
    doses = sorted((a for a in cell["arms"] if a["role"] == "dose"), key=lambda a: a["step0_k3_geomean"])
    falls = [a for a in doses if a["final_reward"]["mean"] < a["reward_first"]["mean"]]
    below = [a for a in doses if a["step0_k3_geomean"] < falls[0]["step0_k3_geomean"]]
    return [fit[0], fit[1], fit[2], falls[0]["step0_k3_geomean"], below[-1]["step0_k3_geomean"],
            arms["bf16"]["step0_k3_geomean"], arms["aligned"]["step0_k3_geomean"]]


def _dose_52m(root):
    d = _dose()
    lo, hi = d.dose50_ratio_range(root)[:2]
    return [d.dose50_steps(root)[0], d.dose50_no_collapse(root)[1], lo, hi, d.dose_bf16_move(root)[1], d.dose_bf16_move(root)[2]]


def _dose_high(root):
    d = _dose()
    nc = d.dose_high_no_collapse(root)
    g = d.dose_high_gains(root)
    return [nc[1], nc[2], nc[9], g[5], g[6], g[8], g[0]]


def _dose_high_row(root):
    d = _dose()
    nc, g, first = d.dose_high_no_collapse(root), d.dose_high_gains(root), d.dose_high_vs_first(root)
    return [nc[1], nc[2], nc[9], g[5], d.dose_high_bf16(root)[0], first[0]]


def _dose_long():
    _dose()
    import dose_long_numbers
    return dose_long_numbers


def _dose_long_readme(root):
    d = _dose_long()
    nc, g, cells, bench = d.long_no_collapse(root), d.long_gains(root), d.long_bf16_cells(root), d.long_bench(root)
    return [d.long_max_k3(root)[0], nc[1], nc[2], g[0], g[7], cells[("4M, long",)][1], cells[("52M, long",)][1], bench[0]]


def _dose_long_index(root):
    d = _dose_long()
    nc, g, cells, bench = d.long_no_collapse(root), d.long_gains(root), d.long_bf16_cells(root), d.long_bench(root)
    return [d.long_max_k3(root)[0], nc[1], nc[2], g[7], cells[("4M, long",)][1], cells[("4M, long",)][2],
            cells[("52M, long",)][1], bench[0]]


def _dose_long52():
    _dose()
    import dose_long52_numbers
    return dose_long52_numbers


def _dose_long52_readme(root):
    d = _dose_long52()
    nc, g, ex = d.long52_no_collapse(root), d.long52_gains(root), d.long52_exact(root)
    return [nc[0], nc[2], g[3], g[4], ex[0], ex[3]]


def _dose_long52_index(root):
    d = _dose_long52()
    nc, g, ex = d.long52_no_collapse(root), d.long52_gains(root), d.long52_exact(root)
    return [nc[0], nc[2], g[3], g[4], d._arms(root)["bf16"]["step0_k3_geomean"], ex[0]]


def _moe_index(root):
    _dose()  # lab/checks on the path
    import moe_numbers
    return moe_numbers.moe_index(root)


def _moe60_index(root):
    _dose()  # lab/checks on the path
    import moe_numbers
    return moe_numbers.moe60_index(root)


def _decode_attention(root):
    b = _dose_long52().long52_bench(root)
    return [b[2], b[5]]


def order_calibration_words(root):
    fraction, points = order_calibration(root)
    return [fraction, {9: "nine"}.get(points, str(points))]


def order_twin_all_exact(root):
    exact, rows = order_twin_exact(root)
    return [exact] if exact == rows else [-1]


def order_carry_min_and_7b(root):
    r15_min, _, r7_min, r7_max = order_carry_vs_old(root)
    return [r15_min, r7_min, r7_max]


def order_headline(root):
    ratios = order_e2e_ratios(root)
    return [order_calibration(root)[0], *order_twin_exact(root), *ratios[0:2], *ratios[6:8], order_carry_vs_old(root)[0]]


# -- attribution

def _removed_and_rope(rep):
    k3 = {k: v["mismatch/k3"] for k, v in rep["metrics"].items()}
    return 100 * (1 - k3["all"] / k3["none"]), 100 * rep["attribution"]["mismatch/k3"]["rope"] / k3["none"]


def demo_short(root):
    rep = _json(root, "results/demo/report.json")
    removed, rope = _removed_and_rope(rep)
    return [removed, rep["n_tokens"] / rep["n_sequences"], rope]


def demo_2k(folder, with_length):
    def f(root):
        rep = _json(root, f"results/experiments/{folder}/report.json")
        removed, rope = _removed_and_rope(rep)
        return ([rep["n_tokens"] / rep["n_sequences"]] if with_length else []) + [removed, rope]
    return f


# -- GRPO

_GRPO_CACHE: dict = {}


def grpo_runs(root) -> list[dict]:
    """Every run's summary recomputed from its log by ``rla.rl.runlog.summarize`` (window 5)."""
    key = str(root)
    if key not in _GRPO_CACHE:
        sys.path.insert(0, str(root / "src"))
        from rla.rl.runlog import summarize
        runs = []
        for d in sorted((root / GRPO / "runs").iterdir()):
            model, arm, seed = d.name.split("__")
            with gzip.open(d / "log.jsonl.gz", "rt") as fh:
                records = [json.loads(line) for line in fh if line.strip()]
            runs.append({"model": model, "arm": arm, "seed": seed, **summarize(records, 5)})
        _GRPO_CACHE[key] = runs
    return _GRPO_CACHE[key]


def _arm(root, model, arm):
    return [r for r in grpo_runs(root) if r["model"] == model and r["arm"] == arm]


def _mean(xs):
    return sum(xs) / len(xs)


def _sample_std(xs):
    m = _mean(xs)
    return (sum((x - m) ** 2 for x in xs) / (len(xs) - 1)) ** 0.5


def grpo_shape(root):
    runs = grpo_runs(root)
    steps = [r["steps"] for r in runs]
    n_seeds = {len({r["seed"] for r in runs if (r["model"], r["arm"]) == ma})
               for ma in {(r["model"], r["arm"]) for r in runs}}
    return [len({r["model"] for r in runs}), len({r["arm"] for r in runs}),
            n_seeds.pop() if len(n_seeds) == 1 else str(n_seeds),
            min(steps), max(steps)]


def k3_ratio(kind):
    def f(root):
        out = []
        for model in ("qwen2-tiny", "qwen3-10m"):
            get = (lambda r: r["step0"]["k3"]) if kind == "step0" else (lambda r: r["mismatch_mean"]["k3"])
            out.append(_mean([get(r) for r in _arm(root, model, "bf16")])
                       / _mean([get(r) for r in _arm(root, model, "aligned")]))
        return out
    return f


def invfreq_collapse(root):
    runs = [r for r in grpo_runs(root) if r["arm"] == "bf16-invfreq"]
    n = sum(bool(r["collapse_events"]) for r in runs)
    return [n, len(runs)]


def invfreq_collapse_steps(root):
    """min-max over the bf16-invfreq runs of the first step N whose trailing 5-step mean reward
    (steps N-4..N) is below 0.05, and of the step the collapse signal (runlog.summarize) first fired."""
    fell, fired = [], []
    for d in sorted((root / GRPO / "runs").glob("*__bf16-invfreq__*")):
        with gzip.open(d / "log.jsonl.gz", "rt") as fh:
            rewards = [json.loads(line)["reward/mean"] for line in fh if line.strip()]
        fell.append(next(i for i in range(4, len(rewards)) if sum(rewards[i - 4:i + 1]) / 5 < 0.05))
    for r in grpo_runs(root):
        if r["arm"] == "bf16-invfreq":
            fired.append(min(e["step"] for e in r["collapse_events"]))
    return [min(fell), max(fell), min(fired), max(fired)]


def invfreq_reward(root):
    runs = [r for r in grpo_runs(root) if r["arm"] == "bf16-invfreq"]
    return [_mean([r["reward_first"] for r in runs]), _mean([r["final_reward"] for r in runs]), len(runs)]


def reward_gap(root):
    diffs, zs = [], []
    for model in ("qwen2-tiny", "qwen3-10m"):
        b = [r["final_reward"] for r in _arm(root, model, "bf16")]
        a = [r["final_reward"] for r in _arm(root, model, "aligned")]
        diffs.append(_mean(a) - _mean(b))
        zs.append((_mean(a) - _mean(b)) / _sample_std(b))
    return diffs + zs


def invfreq_is_cpu(root):
    runs = sorted((root / "results/experiments/invfreq_is_cpu_2026-11-29/runs").iterdir())
    steps = set()
    for d in runs:
        steps.add(json.loads((d / "summary.json").read_text())["steps"])
    seeds = {}
    for d in runs:
        _, arm, s = d.name.split("__")
        seeds.setdefault(arm, set()).add(s)
    n = [len(v) for v in seeds.values()]
    return [steps.pop() if len(steps) == 1 else str(sorted(steps)), min(n), max(n)]


# -- GPU benchmarks

def sampler(root):
    rows = _json(root, "results/benchmarks/ops_inductor_sampler_h200_2026-11-29/sampler_bundled.json")["rows"]
    graph = next(r for r in rows if "CUDA-graph" in r["arm"])["tok_per_s"]
    hf = next(r for r in rows if r["arm"].startswith("HF generate"))["tok_per_s"]
    return [graph / 1000, graph / hf]


def sampler_earlier(root):
    d = _json(root, "results/benchmarks/logs/s2_call1_sampler_bundled_prefix.json")
    rows = d["rows"]
    graph = next(r for r in rows if "CUDA-graph" in r["arm"])["tok_per_s"]
    hf = next(r for r in rows if r["arm"].startswith("HF generate"))["tok_per_s"]
    return [graph / hf]


def _ratio(root, rel, variant, key, model):
    base = _e2e(root / rel, model, "hf-bf16")[key]
    return _e2e(root / rel, model, variant)[key] / base


def e2e_session4(root):
    f = f"{SESSION4}/call2_e2e_liger.json"   # the call that ran rla and Liger side by side
    return [_ratio(root, f, "rla-vllm", "tok_s", "qwen2.5-1.5b"), _ratio(root, f, "rla-vllm", "tok_s", "qwen2.5-7b"),
            _ratio(root, f, "rla-vllm", "peak_gib", "qwen2.5-1.5b"), _ratio(root, f, "rla-vllm", "peak_gib", "qwen2.5-7b")]


def e2e_liger(root):
    f = f"{SESSION4}/call2_e2e_liger.json"
    return [_ratio(root, f, "liger", "tok_s", "qwen2.5-1.5b"), _ratio(root, f, "liger", "tok_s", "qwen2.5-7b")]


def e2e_session4_and_liger(root):
    a, b = e2e_session4(root)[:2]
    return [a, b] + e2e_liger(root)


def e2e_29c(root):
    f = f"{D29C}/call5_e2e.json"
    return [_ratio(root, f, "rla-vllm", "tok_s", "qwen2.5-1.5b"), _ratio(root, f, "rla-vllm", "tok_s", "qwen2.5-7b")]


def host_bound(root):
    return [_ratio(root, f"{SESSION4}/call2_e2e_1x512.json", "rla-vllm", "tok_s", "qwen2.5-1.5b")]


def compile_ro(root):
    rla = _e2e(root / f"{SESSION4}/call6_e2e_1x512_compile_reduce-overhead.json", "qwen2.5-1.5b", "rla-vllm")["step_ms"]
    log = (root / f"{SESSION4}/logs/call4_e2e_1x512_compile_reduce-overhead.log").read_text()
    hf = float(re.search(r"qwen2\.5-1\.5b\s+hf-bf16\s+B1xS512\s+\d+ tok/s\s+step ([\d.]+) ms", log).group(1))
    return [rla, hf]


def rope_copy(root):
    rows = _json(root, f"{SESSION4}/call1_rope_variants.json")["rows"]
    copy = next(r for r in rows if r["arm"] == "copy")["fwd_bwd_ms"]
    liger = next(r for r in rows if "liger" in r["arm"].lower())["fwd_bwd_ms"]
    return [100 * (liger / copy - 1)]


def _isolated(root, rel):
    """{op: result} of an isolated per-op run (``rla bench ops --isolate``)."""
    return {r["op"]: r for r in _json(root, rel)["results"]}


OPS_ISOLATED = f"{D29C}/call5_ops_isolated.json"            # SwiGLU and add+RMSNorm: session 3's last run
ROPE_ISOLATED = [f"{D29}/call1_ops_rope_rla_liger_hf.json",   # RoPE with the half tables: session 4, both orders
                 f"{D29}/call1_ops_rope_liger_rla.json"]


def per_op_vs_liger(root):
    """GPU-only (CUDA-graph replay) fwd+bwd, rla / Liger: SwiGLU, add+RMSNorm from OPS_ISOLATED; RoPE as
    the ratio of the means over ROPE_ISOLATED's two process orders. Forwards: min-max of GPU-only
    forward / bandwidth floor over those four op runs."""
    ops = _isolated(root, OPS_ISOLATED)
    ropes = [_isolated(root, f)["rope"] for f in ROPE_ISOLATED]
    g = lambda r, impl, k: r["impls"][impl][k]  # noqa: E731
    ratios = [g(ops[o], "rla", "graph_fwd_bwd_ms") / g(ops[o], "liger", "graph_fwd_bwd_ms") for o in ("swiglu", "add_rms_norm")]
    ratios.append(sum(g(r, "rla", "graph_fwd_bwd_ms") for r in ropes) / sum(g(r, "liger", "graph_fwd_bwd_ms") for r in ropes))
    floors = [g(r, "rla", "graph_fwd_ms") / r["floor_fwd_ms"] for r in (ops["swiglu"], ops["add_rms_norm"], *ropes)]
    return ratios + [min(floors), max(floors)]


NORM_LOG = f"{D29}/logs/call1_fused_tests.log"   # the latest GPU test run that printed the norm comparisons
ALIGN_CUDA = f"{D29}/call1_align_cuda.json"       # the latest family x profile run on CUDA


def norm_ulps(root):
    """From the norm lines of tests/test_fused_gpu.py's output ('NAME: F equal, max U ulp'): min-max
    of U over the cases with a difference, 100 (1 - min F). From the CUDA align run: the families
    whose every row is bit-equal (equal_fraction 1, max_abs_diff 0), named as their count when they
    are all the run's families (the families rla.align registered when it ran; more came later)."""
    lines = re.findall(r"rms_norm [^:\n]*: ([\d.]+) equal, max (\d+) ulp", (root / NORM_LOG).read_text())
    if not lines:
        raise ValueError(f"no norm comparison lines in {NORM_LOG}")
    ulps = [int(u) for _, u in lines if int(u) > 0]
    rows = _json(root, ALIGN_CUDA)["rows"]
    ran = {r["family"] for r in rows}
    exact = ran - {r["family"] for r in rows if r["equal_fraction"] != 1.0 or r["max_abs_diff"] != 0.0}
    words = {7: "seven"}
    families = words.get(len(exact), str(len(exact))) if exact == ran else f"{sorted(exact)} of {sorted(ran)}"
    return [min(ulps), max(ulps), 100 * (1 - min(float(f) for f, _ in lines)), families, len(rows), len(rows)]


def fsdp2(root):
    t = _json(root, "results/benchmarks/h200x2_2026-11-29_fsdp2/check/fsdp2_check.json")["throughput"]
    return [t["aligned"]["tokens_per_s_per_gpu_mean"] / t["baseline"]["tokens_per_s_per_gpu_mean"],
            t["aligned"]["peak_mem_gib_max"] / t["baseline"]["peak_mem_gib_max"]]


def mutations(root):
    text = (root / "results/mutation_report.md").read_text()
    rows = [l for l in text.splitlines() if l.startswith("| ") and not l.startswith("| mutation") and not l.startswith("|---")]
    killed = sum("| killed |" in l for l in rows)
    return [killed, len(rows)]

# -- 2026-12-02: the live attribution, the trainer's batch variance, rla with Liger's FLCE

ATTR = "results/benchmarks/vllm026_attribution_h200_2026-12-02"
MICRO = "results/benchmarks/microbatch_and_gpu_tests_h200_2026-12-02"
MICRO_CPU = "results/benchmarks/microbatch_bundled_cpu_2026-12-02"
HOUSE = "results/benchmarks/house_and_liger_h200_2026-12-02"


BRK = "results/benchmarks/e2e_breakdown_h200_2026-12-02"  # issue #36, the first round's run (the "before")
BRK2 = "results/benchmarks/e2e_breakdown_after_h200_2026-12-02"  # the second round's
TRLV = "results/benchmarks/trl_verl_gpu_h200_2026-12-02"
FAM524 = "results/benchmarks/families_tf524_gpu_tests_h200_2026-12-02"
BRK_MODELS = ("qwen2.5-1.5b", "qwen3-1.7b", "qwen2.5-7b")


def pytest_counts(text: str) -> list:
    """passed, failed, skipped of the last pytest summary line in ``text`` (0 where it names none)."""
    last = [ln for ln in text.splitlines() if re.search(r"\d+ (passed|failed|skipped)", ln)][-1]
    return [int(m.group(1)) if (m := re.search(rf"(\d+) {w}", last)) else 0 for w in ("passed", "failed", "skipped")]


def excess_bytes_per_element(row: dict, liger: dict) -> float:
    """``row``'s step peak above ``liger``'s (e2e_breakdown.json rows of one model), in bytes per token, layer and
    hidden element."""
    return (row["peaks"]["step_peak_gib"] - liger["peaks"]["step_peak_gib"]) * 2 ** 30 / (
        row["batch"] * row["seq"] * row["layers"] * row["hidden"])


def breakdown_vs_liger(root):
    """e2e_breakdown.json of the second round (one run, alternating passes): per shape (1.5B, Qwen3-1.7B, 7B)
    tok_s / liger's of rla-vllm-eager, then of rla-vllm; step_peak_gib / liger's of rla-vllm; rla-vllm's peak above
    liger's in bytes per token, layer and hidden element (the three shapes: min, max)."""
    rows = {(r["model"], r["variant"]): r for r in _json(root, f"{BRK2}/e2e_breakdown/e2e_breakdown.json")["results"]}
    tok = lambda m, v: rows[(m, v)]["time"]["tok_s"] / rows[(m, "liger")]["time"]["tok_s"]  # noqa: E731
    peak = lambda m, v: rows[(m, v)]["peaks"]["step_peak_gib"]  # noqa: E731
    per = [excess_bytes_per_element(rows[(m, "rla-vllm")], rows[(m, "liger")]) for m in BRK_MODELS]
    return ([tok(m, "rla-vllm-eager") for m in BRK_MODELS] + [tok(m, "rla-vllm") for m in BRK_MODELS]
            + [peak(m, "rla-vllm") / peak(m, "liger") for m in BRK_MODELS] + [min(per), max(per)])


def trl_verl_gpu(root):
    """trl_vllm_colocate.json: the vLLM version, step 1's kl, the largest mismatch/k3 over the steps; verl's
    pytest.txt: passed, skipped."""
    d = _json(root, f"{TRLV}/trl/trl_vllm_colocate.json")
    passed, _, skipped = pytest_counts((root / TRLV / "verl" / "pytest.txt").read_text())
    return [d["vllm"], d["steps"][0]["kl"], max(x["mismatch/k3"] for x in d["steps"]), passed, skipped]


def live_attribution(root):
    """Prefill bit-equal % of the eager row + vLLM's attention, of the default-mode twin + it, and
    of the default row + it, against the committed (batched) engine outputs."""
    rows = _json(root, f"{ATTR}/attribution.json")["rows"]
    twin = _json(root, f"{ATTR}/twin.json")["rows"]

    def eq(rs, mode, side):
        (r,) = [r for r in rs if r["mode"] == mode and r["side"] == side and r["engine"].startswith("engine-")]
        return 100 * r["prefill"]["equal"]
    return [eq(rows, "eager", "row+vllm_attn"), eq(twin, "default", "twin-default-stock"),
            eq(rows, "default", "row+vllm_attn")]


def microbatch_variance(root):
    """HF eager: min and max k3 of micro-batch 4/8 (either padding, with position ids) vs alone;
    k3 of bf16 alone vs the fp32 model."""
    rows = [r for r in _json(root, f"{MICRO}/microbatch.json")["rows"] if r["model"] == "hf"]
    mb = [r["k3"] for r in rows if r["layout"].startswith("mb") and "fp32" not in r["layout"]
          and "no_position_ids" not in r["layout"]]
    (fp32,) = [r["k3"] for r in rows if "fp32" in r["layout"]]
    return [min(mb), max(mb), fp32]


def _e2e_rows(root, rel):
    return {(r["model"], r["variant"]): r for r in _json(root, rel)["results"]}


def liger_flce(root):
    """rla-vllm+liger-flce / liger-flce tok_s (1.5B, 7B) and peak_gib (1.5B, 7B); the aligned step's
    tokens/s after the house move against before, min and max over the two new runs and two shapes,
    as a % change."""
    new = _e2e_rows(root, f"{HOUSE}/e2e/e2e_NVIDIA_H200_2026-12-02.json")
    new2 = _e2e_rows(root, f"{HOUSE}/e2e-new2/e2e_NVIDIA_H200_2026-12-02.json")
    old = _e2e_rows(root, f"{HOUSE}/e2e-old1/e2e_NVIDIA_H200_2026-12-02.json")
    models = ("qwen2.5-1.5b", "qwen2.5-7b")
    tok = [new[(m, "rla-vllm+liger-flce")]["tok_s"] / new[(m, "liger-flce")]["tok_s"] for m in models]
    mem = [new[(m, "rla-vllm+liger-flce")]["peak_gib"] / new[(m, "liger-flce")]["peak_gib"] for m in models]
    moved = [100 * (n[(m, "rla-vllm")]["tok_s"] / old[(m, "rla-vllm")]["tok_s"] - 1) for n in (new, new2) for m in models]
    return [*tok, *mem, min(moved), max(moved)]



FAMILIES = "results/benchmarks/families_kernels_h200_2026-12-02"
GEMMA_LIVE = "results/benchmarks/vllm026_gemma3_h200_2026-12-02"
MOE_LIVE = "results/benchmarks/vllm026_families_h200_2026-12-02"


def gemma3_live(root):
    """Gemma 3 h2560 x 4 layers against live vLLM 0.26: the eager row's prefill bit-equal % in eager
    mode; the % of HF eager's prefill k3 the default row removes in default mode."""
    def rows(mode):
        rep = _json(root, f"{GEMMA_LIVE}/runs/gemma3-h2560-L4-{mode}/engine-attention/report.json")
        return {r["side"]: r["prefill"] for r in rep["rows"]}
    eager, default = rows("eager"), rows("default")
    return [100 * eager["vllm-0.26-eager"]["equal"], 100 * (1 - default["vllm-0.26"]["k3"] / default["hf"]["k3"])]


def _k3_removed(root, folder, call, model, mode, side):
    """% of HF eager's prefill k3 that ``side`` removes in the live report ``runs/<call>/verify-<model>-<mode>``."""
    rep = _json(root, f"{folder}/runs/{call}/verify-{model}-{mode}/report.json")
    rows = {r["side"]: r["prefill"] for r in rep["rows"]}
    return 100 * (1 - rows[side]["k3"] / rows["hf"]["k3"])


def moe_families_live(root):
    """GLM-4 MoE, GPT-OSS and DeepSeek-V3 (MoE regions) against live vLLM 0.26: the % of HF eager's prefill k3
    removed by the running mode's row: GLM-4 MoE eager, default; GPT-OSS eager, default; DeepSeek-V3 eager."""
    def removed(*run):
        return _k3_removed(root, MOE_LIVE, *run)
    return [removed("eager", "glm4moe-h2048", "eager", "vllm-0.26-eager"),
            removed("default", "glm4moe-h2048", "default", "vllm-0.26"),
            removed("eager", "gptoss-h2880", "eager", "vllm-0.26-eager"),
            removed("default", "gptoss-h2880", "default", "vllm-0.26"),
            removed("deepseek-eager-rerun", "deepseekv3-h2048", "eager", "vllm-0.26-eager")]


EVENING_LIVE = "results/benchmarks/vllm026_qwen35_gptoss_h200_2026-12-02"


def evening_live(root):
    """The evening's live runs: % of HF eager's prefill k3 removed by GPT-OSS's default row with its gpt_oss variant
    (default mode) and by DeepSeek-V3's eager row with its MLA aligned (eager mode)."""
    def removed(*run):
        return _k3_removed(root, EVENING_LIVE, *run)
    return [removed("gptoss-default-variant", "gptoss-h2880", "default", "vllm-0.26"),
            removed("deepseekv3-eager-mla", "deepseekv3-h2048", "eager", "vllm-0.26-eager")]


DEC3_LIVE = "results/benchmarks/vllm026_qwen35_gemma4_h200_2026-12-03"


def dec3_live(root):
    """2026-12-03's live runs: % of HF eager's prefill k3 removed by the running mode's row on Gemma 4 (eager,
    default) and Qwen3.5 dense (eager, default)."""
    def removed(*run):
        return _k3_removed(root, DEC3_LIVE, *run)
    return [removed("gemma4-eager", "gemma4-h2560", "eager", "vllm-0.26-eager"),
            removed("gemma4-default", "gemma4-h2560", "default", "vllm-0.26"),
            removed("qwen35-eager", "qwen35-h2048", "eager", "vllm-0.26-eager"),
            removed("qwen35-default", "qwen35-h2048", "default", "vllm-0.26")]


RESCORE_LIVE = "results/benchmarks/vllm026_rescore_h200_2026-12-03"
TWINS_0312 = "results/benchmarks/twin_families_h200_2026-12-03"


def rescore_live(root):
    """2026-12-03's re-score under the changed rows: % of HF eager's prefill k3 the default row removes on Gemma 4
    (the committed engine outputs re-scored) and Gemma 3 (a new engine run)."""
    return [_k3_removed(root, RESCORE_LIVE, "rescore-default", "gemma4-h2560", "default", "vllm-0.26"),
            _k3_removed(root, RESCORE_LIVE, "gemma3-default", "gemma3-h2560", "default", "vllm-0.26")]


def twin_families_eager(root):
    """The family twins on the H200, eager mode: the lowest logits bit-equal % of the aligned model (``rla``) over
    Gemma 3's and GLM-4 MoE's shapes."""
    rows = _json(root, f"{TWINS_0312}/runs/three-families/families/twin_families.json")["rows"]
    return [100 * min(r["logits_equal"] for r in rows if r["mode"] == "eager" and r["side"] == "rla"
                      and r["model"] in ("gemma3-h2560", "glm4moe-h2048"))]


def gemma3_e2e(root):
    """Gemma 3 4B training step: rla-vllm / hf-bf16 tok_s, its peak / hf-bf16's, liger / hf-bf16 tok_s."""
    (rel,) = [p.relative_to(root).as_posix() for p in (root / FAMILIES / "e2e").glob("*.json")]
    rows = _e2e_rows(root, rel)
    hf = rows[("gemma3-4b", "hf-bf16")]
    rla_, liger = rows[("gemma3-4b", "rla-vllm")], rows[("gemma3-4b", "liger")]
    return [rla_["tok_s"] / hf["tok_s"], rla_["peak_gib"] / hf["peak_gib"], liger["tok_s"] / hf["tok_s"]]


CAL = f"{TWIN}/calibration_{{default,eager}}.report.json"

CHECKS: list[Check] = [
    Check("live attribution", "README", f"{ATTR}/attribution.json, twin.json",
          "prefill bit-equal %: eager row + vLLM's attention, default twin + it, default row + it", live_attribution),
    Check("trainer micro-batch variance", "README", f"{MICRO}/microbatch.json",
          "HF k3 micro-batch 4/8 vs alone, min and max; HF bf16 vs fp32", microbatch_variance),
    Check("liger flce", "README", f"{HOUSE}/e2e*/e2e_NVIDIA_H200_2026-12-02.json",
          "rla+FLCE / FLCE tok_s and peak (1.5B, 7B); aligned step tok_s new vs old, min-max %", liger_flce),
    Check("aligned step vs Liger", "README", f"{BRK2}/e2e_breakdown/e2e_breakdown.json",
          "tok_s / liger's: vllm-eager, vllm (1.5B, Qwen3, 7B); vllm peak / liger's; its excess bytes per token, "
          "layer and hidden element min, max", breakdown_vs_liger),
    Check("TRL colocate and verl FSDP1 on GPU", "README", f"{TRLV}/trl/trl_vllm_colocate.json, {TRLV}/verl/pytest.txt",
          "vllm version; step-1 kl; max mismatch/k3; verl passed, skipped", trl_verl_gpu),
    Check("Gemma 3 live", "README", f"{GEMMA_LIVE}/runs/*/engine-attention/report.json",
          "eager row's prefill bit-equal % (eager mode); default row's prefill k3 removed % (default mode)", gemma3_live),
    Check("MoE families live", "README", f"{MOE_LIVE}/runs/*/verify-*/report.json",
          "prefill k3 removed % by the running mode's row: GLM-4 MoE eager, default; GPT-OSS eager, default; "
          "DeepSeek-V3 (MoE regions) eager", moe_families_live),
    Check("evening live", "README", f"{EVENING_LIVE}/runs/*/verify-*/report.json",
          "% prefill k3 removed: GPT-OSS default (gpt_oss variant), DeepSeek-V3 eager (MLA aligned)", evening_live),
    Check("Gemma 4 and Qwen3.5 live", "README", f"{DEC3_LIVE}/runs/*/verify-*/report.json",
          "% prefill k3 removed by the running mode's row: Gemma 4 eager, default; Qwen3.5 eager, default", dec3_live),
    Check("rescore live", "README", f"{RESCORE_LIVE}/runs/*/verify-*/report.json",
          "% prefill k3 removed by the default row: Gemma 4 (re-scored), Gemma 3 (new run)", rescore_live),
    Check("twin families eager", "README", f"{TWINS_0312}/runs/three-families/families/twin_families.json",
          "min logits bit-equal % of rla in eager mode, Gemma 3 and GLM-4 MoE", twin_families_eager),
    Check("Gemma 3 e2e", "README", f"{FAMILIES}/e2e/e2e_NVIDIA_H200_2026-12-02.json",
          "rla-vllm / hf-bf16 tok_s and peak; liger / hf-bf16 tok_s", gemma3_e2e),
    # ---- README: engine calibration and twin
    Check("calibration: chosen choice reproduces the engine", "README", CAL, "min-max over the 16 points (8 x 2 modes) of the chosen choice's fraction equal", calib_chosen),
    Check("calibration: the other choice", "README", CAL, "min-max over the 16 points of the non-chosen choice's fraction equal", calib_other),
    Check("RoPE tables vs vLLM's GPU cache", "README",
          f"{TWIN}/rope_tables.json", "min fp32_equal of device rows; positions // 1000; host rows' fp32_equal", rope_tables),
    Check("twin: shapes", "README", f"{TWIN}/twin_{{default,eager}}.json", "min-max hidden (model names), layer count, min-max tokens, max first position // 1000",
          twin_shapes),
    Check("twin eager: engine kernels bit-equal", "README", f"{TWIN}/twin_eager.json", "all vllm-kernels rows: logits_equal == 1 and every layers_equal == 1", twin_eager_engine_kernels),
    Check("twin eager: rla's kernels", "README", f"{TWIN}/twin_eager.json", "min-max over random-init models, >1 token, rla-fused and rla-reference: logits_equal; HF k3 / side k3",
          lambda root: _multi_token_rla(root, "eager")),
    Check("twin default: rla", "README", f"{TWIN}/twin_default.json", "as above, default mode", lambda root: _multi_token_rla(root, "default")),
    Check("twin: one token bit-exact", "README", f"{TWIN}/twin_{{default,eager}}.json", "1x1 rows of rla-fused and rla-reference: logits_equal == 1", twin_one_token),
    Check("earlier e2e miss", "README", f"{TWIN}/e2e_{{old,new}}_code.json, call3_e2e_*.json", "per pair (old, new in run order): new/old rla-vllm tok/s, 1.5B, min-max",
          e2e_old_miss),
    # ---- README: reduction order session
    Check("reduction order: calibration", "README", f"{ORDER}/calibration_eager.report.json", "min over points of the chosen choice's fraction; number of points",
          order_calibration_words),
    Check("reduction order: twin", "README", f"{ORDER}/twin_eager.json", "rla-fused rows with logits_equal == 1 and every layer == 1 (must be all rows)",
          order_twin_all_exact),
    Check("reduction order: e2e", "README",
          f"{ORDER}/e2e_new_code_{{1,2}}.json", "tok_s / hf-bf16 tok_s in the same run, min-max over the two runs; peak_gib / hf-bf16 (run 1)",
          order_e2e_ratios),
    Check("fp32_carry add vs the step before", "README", f"{ORDER}/e2e_{{new_code_1,new_code_2,old_code}}.json", "rla-vllm tok/s new / old (same call), 1.5B (min) and 7B (min-max)",
          order_carry_min_and_7b),
    # ---- README: engine-backed default mode, SGLang's kernels
    Check("engine-backed default: twin", "README",
          f"{FORWARD}/twin_default.json", "vllm-pieces rows exact in logits and every layer (all of them); rla-fused logits_equal min-max, >1 token",
          forward_twin),
    Check("engine-backed default: e2e", "README",
          f"{FORWARD}/e2e.json", "rla-vllm-pieces tok_s / hf-bf16 tok_s; peak_gib / hf-bf16 peak_gib", forward_e2e),
    Check("SGLang kernels", "README",
          f"{SGLANG}/calibration.report.json, rest_diagnosis.json", "chosen fraction of rope_apply; FMA model over all RoPE elements; swiglu; qk_norm_out",
          sglang_points),
    Check("SGLang norm path", "README",
          f"{SGLANG}/norm_cute/calibration.report.json", "chosen fraction of norm_weight, norm_residual, residual_stream",
          sglang_norm_points),
    Check("fused q/k chain step", "README",
          f"{QK}/e2e_fused.json", "rla-vllm / hf-bf16 tok_s and peak_gib, qwen3-1.7b then qwen2.5-1.5b", qk_step),
    Check("fused q/k chain step (index)", "results/README",
          f"{QK}/e2e_fused.json", "as above", qk_step),
    Check("SGLang norm path (index)", "results/README",
          f"{SGLANG}/norm_cute/calibration.report.json", "chosen fraction of norm_weight, norm_residual, residual_stream",
          sglang_norm_points),
    # ---- README: dose-response
    Check("dose-response", "README",
          "results/experiments/dose_response_h200_2026-11-30/runs/*/log.jsonl.gz",
          "rla's dose report recomputed from the logs: threshold, interval; step-0 k3 geomean of the first arm whose mean final "
          "reward < its mean start and of the arm below it; bf16 and aligned geomeans", _dose_prose),
    Check("dose-response: 52M", "README",
          "results/experiments/dose_response_h200_2026-11-30/runs/qwen2-50m__*/log.jsonl.gz",
          "rla's dose report, cell qwen2-50m: runs with 100 steps; largest fitted step-0 k3 (none collapsed); min-max over the dose arms of the "
          "4M / 52M step-0 k3 geomean; bf16's 52M geomean and 4M / 52M", _dose_52m),
    Check("dose-response: 52M, high doses", "README",
          "results/experiments/dose_response_50m_high_h200_2026-11-30/runs/*/log.jsonl.gz",
          "rla's dose report: largest fitted step-0 k3, 95% lower bound, / the 4M upper end; b1x0.7's k3 geomean; gains "
          "(mean final - mean start) of b1x0.7 and b1x1.4; aligned's gain", _dose_high),
    Check("dose-response: 52M, high doses (index)", "results/README",
          "results/experiments/dose_response_50m_high_h200_2026-11-30/runs/*/log.jsonl.gz",
          "as above; bf16's step-0 k3 geomean; b2x0.7's geomean here / in the first 52M cell", _dose_high_row),
    Check("dose-response: long cell", "README",
          "results/experiments/dose_response_long_h200_2026-12-01/{runs,probe,run_group_bench}",
          "rla's dose report of the long cell: largest fitted k3, 95% lower bound / the short 4M k3_50; aligned's gain; "
          "b1x2's k3; bf16 geomeans 4M (runs) and 52M (probe); threads / processes step time", _dose_long_readme),
    Check("dose-response: long cell (index)", "results/README",
          "results/experiments/dose_response_long_h200_2026-12-01/{runs,probe,run_group_bench}", "as above, with aligned's geomean",
          _dose_long_index),
    Check("dose-response: the 52M long cell", "README",
          "results/experiments/dose_response_long52_h200_2026-12-01/runs, "
          "results/experiments/dose_response_long_h200_2026-12-01/runs", "largest fitted k3; 95% lower bound; -b1x4's gain, its k3 "
          "geomean; aligned log lines (all k3 0); the 4M long aligned geomean", _dose_long52_readme),
    Check("dose-response: the 52M long cell (index)", "results/README",
          "results/experiments/dose_response_long52_h200_2026-12-01/runs", "as above; bf16's step-0 k3 geomean", _dose_long52_index),
    Check("MoE routing 60", "README", "results/experiments/moe_routing60_h200_2026-12-02/runs",
          "steps per run min-max; routing layer mean % at step 0 and over training, bf16, aligned, router; k3 bf16 / "
          "arm: step 0 router, router-replay, over training router-replay; runs collapsed by either criterion; median "
          "time/step_s", _moe60_index),
    Check("MoE routing 60 (index)", "results/README", "results/experiments/moe_routing60_h200_2026-12-02/runs",
          "as above", _moe60_index),
    Check("MoE routing (index)", "results/README", "results/experiments/moe_routing_h200_2026-12-02/runs", "as above",
          _moe_index),
    Check("decode attention", "README",
          "results/benchmarks/h200_2026-12-01_decode_attention.json", "rows[50m].speedup, rows[tiny].speedup",
          _decode_attention),
    Check("decode loop", "README", "results/benchmarks/h200_2026-12-01_decode_loop.json", "rows[tiny].speedup",
          lambda root: [_dose_long().long_decode_loop(root)[0]]),
    # ---- README: attribution
    Check("attribution at ~123 tokens", "README",
          "results/demo/report.json", "1 - k3[all]/k3[none]; n_tokens / n_sequences; Shapley k3[rope] / k3[none]", demo_short),
    Check("attribution at 2k, CPU", "README", "results/experiments/demo_2k_cpu_2026-11-29/report.json", "n_tokens / n_sequences; 1 - k3[all]/k3[none]; Shapley k3[rope] / k3[none]",
          demo_2k("demo_2k_cpu_2026-11-29", True)),
    Check("attribution at 2k, H200", "README", "results/experiments/demo_2k_h200_2026-11-29/report.json", "1 - k3[all]/k3[none]; Shapley k3[rope] / k3[none]",
          demo_2k("demo_2k_h200_2026-11-29", False)),
    # ---- README: GRPO
    Check("GRPO grid and length", "README", f"{GRPO}/runs/*/log.jsonl.gz", "distinct models, arms, seeds per arm; min-max steps over runs", grpo_shape),
    Check("GRPO step-0 k3 ratio", "README", f"{GRPO}/runs/*/log.jsonl.gz", "ratio of means over 3 seeds of step-0 k3, bf16 / aligned", k3_ratio("step0")),
    Check("GRPO k3 ratio over training", "README", f"{GRPO}/runs/*/log.jsonl.gz", "ratio of means over 3 seeds of each run's mean k3 over steps, bf16 / aligned", k3_ratio("mean")),
    Check("GRPO rounded inv_freq collapses", "README", f"{GRPO}/runs/*bf16-invfreq*/log.jsonl.gz", "runs of bf16-invfreq (both models) whose collapse signal fired / runs", invfreq_collapse),
    Check("GRPO rounded inv_freq: when it collapsed", "README",
          f"{GRPO}/runs/*bf16-invfreq*/log.jsonl.gz",
          "min-max over the 6 runs of the first step N with mean reward over steps N-4..N < 0.05, and of the first collapse event",
          invfreq_collapse_steps),
    Check("GRPO rounded inv_freq reward", "README", f"{GRPO}/runs/*bf16-invfreq*/log.jsonl.gz", "mean over the 6 runs of reward_first (first 5-step mean) and final_reward (last 5 steps)",
          invfreq_reward),
    Check("GRPO final-reward gap", "README",
          f"{GRPO}/runs/*/log.jsonl.gz", "difference of means (aligned - bf16) of final_reward; / sample std (ddof=1) of the bf16 arm", reward_gap),
    Check("CPU inv_freq/IS experiment", "README", "results/experiments/invfreq_is_cpu_2026-11-29/runs/*/summary.json", "steps per run (all equal); min-max seeds per arm", invfreq_is_cpu),
    # ---- README: throughput and GPU fast path
    Check("sampler throughput", "README", "results/benchmarks/ops_inductor_sampler_h200_2026-11-29/sampler_bundled.json", "graph-decode tok/s / 1000; graph / HF generate tok/s (one call per arm)", sampler),
    Check("sampler earlier call", "README", "results/benchmarks/logs/s2_call1_sampler_bundled_prefix.json", "graph / HF generate tok/s", sampler_earlier),
    Check("e2e through rla.align", "README",
          f"{SESSION4}/call2_e2e_liger.json", "rla-vllm / hf-bf16 tok_s and peak_gib (1.5B, 7B; one call)", e2e_session4),
    Check("Liger e2e", "README", f"{SESSION4}/call2_e2e_liger.json", "liger / hf-bf16 tok_s (1.5B, 7B; one call)", e2e_liger),
    Check("host-bound step", "README", f"{SESSION4}/call2_e2e_1x512.json", "rla-vllm / hf-bf16 tok_s, 1.5B 1x512", host_bound),
    Check("reduce-overhead step", "README", f"{SESSION4}/call6_e2e_1x512_compile_reduce-overhead.json; HF's from {SESSION4}/logs/call4_e2e_1x512_compile_reduce-overhead.log",
          "step_ms (rla, JSON); HF's step ms parsed from a log line (its JSON was not kept)", compile_ro),
    Check("Liger RoPE vs copy", "README", f"{SESSION4}/call1_rope_variants.json", "Liger fwd+bwd ms / copy fwd+bwd ms - 1", rope_copy),
    Check("per-op vs Liger, bandwidth floor", "README",
          f"{OPS_ISOLATED}; RoPE: {', '.join(ROPE_ISOLATED)}",
          "GPU-only fwd+bwd rla / liger (RoPE: ratio of the means over two process orders); min-max GPU-only fwd / floor",
          per_op_vs_liger),
    Check("norm ulps, seven families", "README",
          f"{NORM_LOG}; {ALIGN_CUDA}",
          "min-max max-ulp over norm cases with a difference, 100 (1 - min equal fraction); families all bit-equal vs "
          "rla.alignment.families; rows", norm_ulps),
    Check("FSDP2", "README", "results/benchmarks/h200x2_2026-11-29_fsdp2/check/fsdp2_check.json", "aligned / baseline: tok/s per GPU (mean of ranks), peak GiB (max of ranks)",
          fsdp2),
    # ---- results/README headlines: benchmarks
    Check("[bench] calibration headline", "results/README", CAL + f", {TWIN}/rope_tables.json", "as the README checks above",
          lambda root: calib_chosen(root) + rope_tables(root)[:1]),
    Check("[bench] default mode", "results/README", f"{TWIN}/twin_default.json", "as above", lambda root: _multi_token_rla(root, "default")[:2]),
    Check("[bench] e2e cost", "results/README", f"{TWIN}/e2e_*", "as above", e2e_cost),
    Check("[bench] reduction order headline", "results/README",
          f"{ORDER}/*", "as the README checks above",
          order_headline),
    Check("[bench] engine-backed default mode", "results/README",
          f"{FORWARD}/twin_default.json, e2e.json", "as the README's checks", lambda root: forward_twin(root) + forward_e2e(root)),
    Check("[bench] SGLang kernels", "results/README",
          f"{SGLANG}/calibration.report.json, rest_diagnosis.json", "rope_apply, swiglu, qk_norm_out chosen fractions; the FMA model over RoPE",
          lambda root: [sglang_points(root)[i] for i in (0, 2, 3, 1)]),
    Check("[bench] sampler", "results/README", "results/benchmarks/ops_inductor_sampler_h200_2026-11-29/sampler_bundled.json, logs/s2_call1_sampler_bundled_prefix.json", "as above",
          lambda root: sampler(root) + sampler_earlier(root)),
    Check("[bench] session 3 e2e", "results/README", "results/benchmarks/e2e_align_ops_isolated_h200_2026-11-29/call5_e2e.json", "rla-vllm / hf-bf16 tok_s (1.5B, 7B)", e2e_29c),
    Check("[bench] session 4 e2e and Liger", "results/README", f"{SESSION4}/call2_e2e_liger.json", "rla-vllm / hf-bf16 and liger / hf-bf16 tok_s (one call)", e2e_session4_and_liger),
    Check("[bench] FSDP2", "results/README", "results/benchmarks/h200x2_2026-11-29_fsdp2/check/fsdp2_check.json", "as above", lambda root: fsdp2(root)[:1]),
    Check("[bench] mutation report", "results/README", "results/mutation_report.md", "rows with status killed; rows", mutations),
    # ---- results/README headlines: experiments
    Check("[exp] GRPO", "results/README", f"{GRPO}/runs/*/log.jsonl.gz", "as the README checks above", lambda root: k3_ratio("step0")(root) + invfreq_collapse(root)),
    Check("[exp] demo 2k CPU", "results/README", "results/experiments/demo_2k_cpu_2026-11-29/report.json", "as above",
          lambda root: (lambda v: [v[1], v[0], v[2]])(demo_2k("demo_2k_cpu_2026-11-29", True)(root))),
    Check("[exp] demo 2k H200", "results/README", "results/experiments/demo_2k_h200_2026-11-29/report.json", "as above", demo_2k("demo_2k_h200_2026-11-29", False)),
]


# ---------------------------------------------------------------- running

def written_numbers(check: Check, texts: dict[str, str]) -> list[tuple[str, str]]:
    """``(written, shape)`` of each of the claim's values, in index order, from its render markers."""
    name = slug(check.name)
    found: dict[int, list[tuple[str, str]]] = {}
    for mk in markers(texts[check.where]):
        for claim, i in mk["names"]:
            if claim == name:
                found.setdefault(i, []).append((mk["written"], mk["shape"]))
    if not found:
        raise LookupError(f"no marker of claim {name!r} in {check.where} (not cited)")
    if sorted(found) != list(range(1, max(found) + 1)):
        raise LookupError(f"claim {name!r} in {check.where} has markers {sorted(found)}, not 1..{max(found)}")
    twice = [i for i, f in found.items() if len(f) > 1]
    if twice:
        raise LookupError(f"claim {name!r}: value(s) {twice} cited more than once in {check.where}")
    return [found[i][0] for i in sorted(found)]


def claim_values(root: Path) -> dict[str, list | Exception]:
    """Every claim's values (or the exception computing them raised), by its marker name."""
    out = {}
    for c in CHECKS:
        try:
            out[slug(c.name)] = c.compute(root) if c.compute else []
        except Exception as e:  # reported, never skipped
            out[slug(c.name)] = e
    return out


def run_check(check: Check, root: Path, texts: dict[str, str]) -> dict:
    row = {"claim": check.name, "where": check.where, "file": check.files, "statistic": check.statistic}
    try:
        written = written_numbers(check, texts)
    except LookupError as e:
        return {**row, "written": "-", "recomputed": "-", "status": f"MISMATCH: {e} (the text changed?)"}
    row["written"] = ", ".join(w for w, _ in written)
    if check.why_not:
        return {**row, "recomputed": "-", "status": f"not recomputable: {check.why_not}"}
    try:
        values = check.compute(root)
    except Exception as e:  # a missing or changed file is a failure of the claim, not of the checker
        return {**row, "recomputed": "-", "status": f"MISMATCH: could not recompute ({type(e).__name__}: {e})"}
    shown = [format_like(v, shape) for v, (_, shape) in zip(values, written)]
    row["recomputed"] = ", ".join(shown)
    same = len(values) == len(written) and all(s == w for s, (w, _) in zip(shown, written))
    return {**row, "status": "ok" if same else "MISMATCH"}


def run_all(root: Path, texts: dict[str, str] | None = None) -> list[dict]:
    texts = readme_texts(root) if texts is None else texts
    return [run_check(c, root, texts) for c in CHECKS]


def table(rows: list[dict]) -> str:
    out = ["| claim | where | file | statistic | recomputed | written | status |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['claim']} | {r['where']} | `{r['file']}` | {r['statistic']} | {r['recomputed']} | {r['written']} | {r['status']} |")
    n_ok = sum(r["status"] == "ok" for r in rows)
    n_bad = sum(r["status"].startswith("MISMATCH") for r in rows)
    n_not = sum(r["status"].startswith("not recomputable") for r in rows)
    out.append(f"\n{len(rows)} claims: {n_ok} ok, {n_bad} MISMATCH, {n_not} not recomputable")
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", default=str(Path(__file__).resolve().parents[2]), help="repository root")
    args = ap.parse_args(argv)
    rows = run_all(Path(args.root))
    print(table(rows))
    return 1 if any(r["status"].startswith("MISMATCH") for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
