"""Recompute the headline tables of every ``results/benchmarks/*/README.md`` from the JSON beside it.

    python lab/checks/check_bench_readmes.py          # the table; exit 1 on any MISMATCH

Every marked table row (``lab/checks/render.py``'s markers, ``lab/checks/readme_tables.py``) is
rendered from the files and compared with what its markers hold; a marked row the files do not
produce is a mismatch. The session folders' paths are the constants
of ``lab/checks/check_results.py`` (one place to rename them).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from readme_tables import TableCheck, check_results_module, main  # noqa: E402

_cr = check_results_module()
D29C, D29, TWIN, ORDER, FORWARD, SGLANG, QK = _cr.D29C, _cr.D29, _cr.TWIN, _cr.ORDER, _cr.FORWARD, _cr.SGLANG, _cr.QK
FSDP2 = "results/benchmarks/h200x2_2026-11-29_fsdp2"

MODELS = {"Qwen2.5-1.5B": "qwen2.5-1.5b", "Qwen2.5-7B": "qwen2.5-7b"}


def _json(root, rel):
    return json.loads((root / rel).read_text())


def _e2e_rows(root, rel):
    return {(r["model"], r["variant"]): r for r in _json(root, rel)["results"]}


# ---------------------------------------------------------------- the reduction-order session

def order_e2e(root):
    """e2e_new_code_{1,2}.json and e2e_old_code.json: tok/s / hf-bf16 tok/s of the same run, run 1
    and run 2; peak GiB / hf-bf16's (run 1)."""
    new = [_e2e_rows(root, f"{ORDER}/e2e_new_code_{i}.json") for i in (1, 2)]
    old = _e2e_rows(root, f"{ORDER}/e2e_old_code.json")
    out = {}
    for model in ("qwen2.5-1.5b", "qwen2.5-7b"):
        ratio = lambda rows, v: rows[(model, v)]["tok_s"] / rows[(model, "hf-bf16")]["tok_s"]  # noqa: E731
        mem = lambda rows, v: rows[(model, v)]["peak_gib"] / rows[(model, "hf-bf16")]["peak_gib"]  # noqa: E731
        for v in ("rla-vllm", "rla-vllm-eager", "rla-vllm-eager-kernels", "liger"):
            out[(model, v)] = [ratio(new[0], v), ratio(new[1], v), mem(new[0], v)]
        out[(model, "rla-vllm, code before")] = [ratio(old, "rla-vllm"), None, mem(old, "rla-vllm")]
    return out


# ---------------------------------------------------------------- session 3: e2e through rla.align

E2E_VARIANTS = {"HF bf16": "hf-bf16", "rla aligned to vllm (rla.align)": "rla-vllm", "rla aligned to sglang": "rla-sglang",
                "naive fp32 upcasts": "naive-upcast", "fp16": "fp16", "fp32": "fp32"}


def session3_e2e(root):
    """call5_e2e.json: batch x seq, tok/s, / HF bf16's, peak GiB, / HF bf16's (not for a run of another batch: '-')."""
    rows = _e2e_rows(root, f"{D29C}/call5_e2e.json")
    out = {}
    for label, model in MODELS.items():
        hf = rows[(model, "hf-bf16")]
        for vlabel, v in E2E_VARIANTS.items():
            r = rows[(model, v)]
            same_shape = (r["batch"], r["seq"]) == (hf["batch"], hf["seq"])
            out[(label, vlabel)] = [[r["batch"], r["seq"]], r["tok_s"], r["tok_s"] / hf["tok_s"],
                                    r["peak_gib"], r["peak_gib"] / hf["peak_gib"] if same_shape else []]
    return out


def session3_per_op(root):
    """Isolated per-op runs (each implementation in its own process), in the order calls 3, 5 and, for
    RoPE, call 4 with rla's process first then Liger's: eager fwd+bwd rla / Liger (fwd_bwd_ms), GPU-only
    (graph_fwd_bwd_ms) rla / Liger, GPU-only fwd / floor (graph_fwd_ms / floor_fwd_ms), eager fwd / floor
    (fwd_ms / floor_fwd_ms); rla / HF eager, eager and GPU-only fwd+bwd, from call 3 (the run with HF)."""
    files = {op: [f"{D29C}/call3_ops_isolated.json", f"{D29C}/call5_ops_isolated.json"] for op in ("swiglu", "add_rms_norm", "rope")}
    files["rope"] += [f"{D29C}/call4_ops_rope_rla_first.json", f"{D29C}/call4_ops_rope_liger_first.json"]
    out = {}
    for label, op in (("swiglu", "swiglu"), ("add+rmsnorm", "add_rms_norm"), ("rope", "rope")):
        rs = [next(r for r in _json(root, f)["results"] if r["op"] == op) for f in files[op]]
        g = lambda r, impl, k: r["impls"][impl][k]  # noqa: E731
        c3 = rs[0]
        out[(label,)] = [[g(r, "rla", "fwd_bwd_ms") / g(r, "liger", "fwd_bwd_ms") for r in rs],
                         [g(r, "rla", "graph_fwd_bwd_ms") / g(r, "liger", "graph_fwd_bwd_ms") for r in rs],
                         [g(r, "rla", "graph_fwd_ms") / r["floor_fwd_ms"] for r in rs],
                         [g(r, "rla", "fwd_ms") / r["floor_fwd_ms"] for r in rs],
                         [g(c3, "rla", "fwd_bwd_ms") / g(c3, "hf", "fwd_bwd_ms"), g(c3, "rla", "graph_fwd_bwd_ms") / g(c3, "hf", "graph_fwd_bwd_ms")]]
    return out


# ---------------------------------------------------------------- session 4: e2e next to Liger; RoPE variants

def session4_e2e(root):
    """call2_e2e_liger.json (4 x 4096 / 1 x 4096) and call2_e2e_1x512.json: HF tok/s, rla and Liger tok/s
    with / HF; peak GiB HF / rla / Liger (one number, 'each', when the three agree at 0.1 GiB)."""
    out = {}
    for rel in ("call2_e2e_liger.json", "call2_e2e_1x512.json"):
        rows = _e2e_rows(root, f"{D29}/{rel}")
        for label, model in MODELS.items():
            hf, rla, lig = (rows[(model, v)] for v in ("hf-bf16", "rla-vllm", "liger"))
            peaks = [hf["peak_gib"], rla["peak_gib"], lig["peak_gib"]]
            same = len({f"{p:.1f}" for p in peaks}) == 1
            out[(label, f"{hf['batch']} x {hf['seq']}")] = [
                hf["tok_s"], [rla["tok_s"], rla["tok_s"] / hf["tok_s"]], [lig["tok_s"], lig["tok_s"] / hf["tok_s"]],
                peaks[:1] if same else peaks]
    return out


def _two(a, b, fmt):
    """one value when both read the same at the written precision (``fmt``), else both"""
    return [a] if format(a, fmt) == format(b, fmt) else [a, b]


def _span(values, fmt):
    """a - b range as written: min and max, or one value when they read the same"""
    lo, hi = min(values), max(values)
    return [lo] if format(lo, fmt) == format(hi, fmt) else [lo, hi]


def rope_variants(root):
    """call1_rope_variants.json rows: fwd ms, fwd+bwd ms, fwd / floor (fwd_ms / fwd_floor_ms)."""
    rows = {r["arm"]: r for r in _json(root, f"{D29}/call1_rope_variants.json")["rows"]}
    f = lambda a: rows[a]["fwd_ms"]  # noqa: E731
    fb = lambda a: rows[a]["fwd_bwd_ms"]  # noqa: E731
    fl = lambda a: rows[a]["fwd_ms"] / rows[a]["fwd_floor_ms"]  # noqa: E731
    single = {"copy_ of q and k (same q/k bytes, no tables)": "copy",
              "rla, fp32 full table (what the benchmark passed before)": "rla fp32 full",
              "rla, fp32 half table (what rla.align now passes)": "rla fp32 half",
              "rla, bf16 half table": "rla bf16 half",
              "Liger, bf16 full table given (as in a model)": "liger bf16 full",
              "Liger, per-call cast from fp32 (the old benchmark's protocol)": "liger bf16 full, per-call cast from fp32"}
    out = {(label,): [f(a), fb(a), fl(a), "yes" if rows[a]["bitwise_vs_shipped"] else "-"] for label, a in single.items()}
    lf = ["loads-first fp32 half w4", "loads-first bf16 half w4"]
    out[("every q and k load before any store, fp32 / bf16 half, 4 warps",)] = [
        [f(a) for a in lf], [fb(a) for a in lf], _two(fl(lf[0]), fl(lf[1]), ".2f"), "yes"]
    l8 = ["loads-first fp32 half w8", "loads-first bf16 half w8"]
    out[("same, 8 warps",)] = [[f(a) for a in l8], [fb(a) for a in l8], [fl(a) for a in l8], "yes"]
    s4, s8 = ["swap fp32 half w4", "swap bf16 half w4"], ["swap fp32 half w8", "swap bf16 half w8"]
    out[("one contiguous row load plus a swapped reload, 4 / 8 warps",)] = [
        _span([f(a) for a in s4], ".3f") + _span([f(a) for a in s8], ".3f"),
        _span([fb(a) for a in s4], ".3f") + _span([fb(a) for a in s8], ".2f"),
        _span([fl(a) for a in s4 + s8], ".1f"), "yes"]
    return out


# ---------------------------------------------------------------- FSDP2 on two GPUs

def fsdp2_throughput(root):
    """check/fsdp2_check.json: tok/s per GPU (mean of ranks), peak GiB (max of ranks), rank 0's median step s."""
    t = _json(root, f"{FSDP2}/check/fsdp2_check.json")["throughput"]
    out = {}
    for label, k in (("baseline (HF bf16)", "baseline"), ("aligned (rla.align, vllm)", "aligned")):
        out[(label,)] = [t[k]["tokens_per_s_per_gpu_mean"], t[k]["peak_mem_gib_max"], t[k]["per_rank"][0]["step_s_median"]]
    return out


def fsdp2_grpo(root):
    """train_<arm>/log.jsonl (rank 0's records): step-0 k3, mean k3 over the logged steps, step-0 mean
    |delta logp|, step-0 ratio min / max, mean train s/step of steps 1-3, peak GiB (max over steps)."""
    sys.path.insert(0, str(root / "src"))
    from rla.rl.runlog import read_log

    out = {}
    for label, arm in (("aligned (vllm)", "train_aligned"), ("bf16 baseline", "train_bf16")):
        recs = read_log(root / FSDP2 / arm / "log.jsonl")
        k3 = [r["mismatch/k3"] for r in recs]
        first = recs[0]
        out[(label,)] = [first["mismatch/k3"], sum(k3) / len(k3), first["mismatch/abs/mean"],
                         [first["train/ratio/min"], first["train/ratio/max"]],
                         sum(r["time/train_s"] for r in recs[1:4]) / 3,
                         max(r["memory/peak_mb"] for r in recs) / 1024]
    return out


# ---------------------------------------------------------------- vLLM 0.33 twin and RoPE tables

def _twin(mode, sides, folder=TWIN):
    def f(root):
        out = {}
        for r in _json(root, f"{folder}/twin_{mode}.json")["rows"]:
            key = (r["model"], f"{r['batch']}x{r['tokens']} @ {r['position_offset']}")
            out.setdefault(key, {})[r["side"]] = [100 * r["logits_equal"], r["k3"]]
        return {k: [v[s] for s in sides] for k, v in out.items()}
    return f


def rope_tables(root):
    """rope_tables.json: positions, where inv_freq is computed, % of fp32 / bf16 entries equal to vLLM's cache."""
    labels = {("qwen2", "device"): "Qwen2 (theta 1e6)", ("qwen2", "host"): "Qwen2",
              ("llama31", "device"): "Llama-3.1 (llama3 scaling, theta 5e5)", ("llama31", "host"): "Llama-3.1"}
    out = {}
    for r in _json(root, f"{TWIN}/rope_tables.json")["rows"]:
        where = "device" if r["rope_inv_freq"] == "device" else "host"
        out[(labels[(r["model"].split("-")[0], where)],)] = [r["positions"], None, 100 * r["fp32_equal"], 100 * r["bf16_equal"]]
    return out


def _e2e_vs_hf(root, path):
    """(model, variant) -> batch x seq, tok/s, / hf-bf16's, peak GiB, / hf-bf16's (same file, same model)."""
    rows = _e2e_rows(root, path)
    out = {}
    for (model, variant), r in rows.items():
        hf = rows[(model, "hf-bf16")]
        out[(model, variant)] = [f"{r['batch']}x{r['seq']}", r["tok_s"], r["tok_s"] / hf["tok_s"],
                                 r["peak_gib"], r["peak_gib"] / hf["peak_gib"]]
    return out


def forward_e2e(root):
    """e2e.json: batch x seq, tok/s, / hf-bf16's, peak GiB, / hf-bf16's."""
    return _e2e_vs_hf(root, f"{FORWARD}/e2e.json")


def qk_e2e(root):
    """e2e_fused.json: tok/s, / hf-bf16's, peak GiB, / hf-bf16's (the table has no shape column)."""
    return {key: vals[1:] for key, vals in _e2e_vs_hf(root, f"{QK}/e2e_fused.json").items()}


def qk_alternating(root):
    """e2e_alternating_<i>.json: the chain (odd runs fused), rla-vllm tok/s and peak GiB."""
    out = {}
    for i in range(1, 5):
        (r,) = _json(root, f"{QK}/e2e_alternating_{i}.json")["results"]
        out[(f"e2e_alternating_{i}",)] = ["fused" if i % 2 else "two-op", r["tok_s"], r["peak_gib"]]
    return out


def sglang_points(root, report="calibration.report.json", only=None):
    """calibration.report.json: choice, evidence, '<choice>: <100 fraction>%' per choice, max ulp;
    a point whose op did not run: its kept evidence and 'not run here' (a word each)."""
    out = {}
    for name, p in _json(root, f"{SGLANG}/{report}")["points"].items():
        if only and name not in only:
            continue
        key = (name,)
        if p["elements"]:
            shares = ", ".join(f"{c}: {100 * f:.4f}%" for c, f in p["fractions"].items())
            out[key] = [p["choice"], p["evidence"], shares, p["max_ulp"]]
        else:
            out[key] = [p["choice"], None, "not run here", None]
    return out


def sglang_rest(root):
    """rest_diagnosis.json: elements, differing from rla's choice, in the named class, reproduced."""
    d = _json(root, f"{SGLANG}/rest_diagnosis.json")
    r, s = d["rope"], d["swiglu"]
    rope = [r["elements"], r["differ_from_fused_choice"], r["of_the_rest_equal_fma_first_product_exact"],
            r["of_the_rest_equal_fma_first_product_exact"], None]
    swiglu = [s["elements"], s["differ"], s["differ_gate_below_-80"], s["equal_with_ftz_and_fast_division_model"], None]
    return {("RoPE (FusedRopeKernel, head 128, 8192 tokens, positions to 32k)",): rope,
            ("SwiGLU (ActivationKernel, 4096 x 4096 at input scales 1, 4, 16, 64)",): swiglu}


# ---------------------------------------------------------------- the decode attention (2026-12-01)

DECODE_ATTN = "results/benchmarks/h200_2026-12-01_decode_attention"


def decode_attention_table(root):
    """per model: model and grouped seconds_per_generate, speedup, graphs (model, grouped), peak GiB (model, grouped)."""
    rows = {r["size"]: r for r in _json(root, f"{DECODE_ATTN}.json")["rows"]}
    return {(name,): [r["model"]["seconds_per_generate"], r["grouped"]["seconds_per_generate"], r["speedup"],
                      [r["model"]["graphs"], r["grouped"]["graphs"]], [r["model"]["peak_gib"], r["grouped"]["peak_gib"]]]
            for name, r in (("4M", rows["tiny"]), ("52M", rows["50m"]))}


HOUSE = _cr.HOUSE
_HOUSE_E2E = {"old": "e2e-old1", "new": "e2e-new2", "new2": "e2e"}
_HOUSE_SHAPES = {"qwen2.5-1.5b": "Qwen2.5-1.5B, 4 x 4096", "qwen2.5-7b": "Qwen2.5-7B, 1 x 4096"}


def house_e2e(root):
    """e2e-old1 / e2e-new2 / e2e (this tree, the Liger run): step_ms of hf-bf16 and rla-vllm; tok_s of
    the two new runs / the old run's."""
    runs = {k: _e2e_rows(root, f"{HOUSE}/{d}/e2e_NVIDIA_H200_2026-12-02.json") for k, d in _HOUSE_E2E.items()}
    out = {}
    for m, shape in _HOUSE_SHAPES.items():
        for v in ("hf-bf16", "rla-vllm"):
            r = {k: runs[k][(m, v)] for k in runs}
            out[(shape, v)] = [r["old"]["step_ms"], r["new"]["step_ms"], r["new2"]["step_ms"],
                               r["new"]["tok_s"] / r["old"]["tok_s"], r["new2"]["tok_s"] / r["old"]["tok_s"]]
    return out


def house_liger(root):
    """e2e (one run): tok_s and peak_gib of liger-flce and rla-vllm+liger-flce, and their ratios."""
    rows = _e2e_rows(root, f"{HOUSE}/e2e/e2e_NVIDIA_H200_2026-12-02.json")
    out = {}
    for m, shape in _HOUSE_SHAPES.items():
        a, b = rows[(m, "liger-flce")], rows[(m, "rla-vllm+liger-flce")]
        out[(shape,)] = [a["tok_s"], b["tok_s"], b["tok_s"] / a["tok_s"], a["peak_gib"], b["peak_gib"],
                         b["peak_gib"] / a["peak_gib"]]
    return out


ROUTER = "results/benchmarks/router_probe_h200_2026-12-02"


def _router_range(cases, row, key):
    values = [100 * c["rows"][row][key] for c in cases]
    return [min(values), max(values)]


def _router_rows(groups: dict) -> dict:
    """per kernel group (name -> cases): cases; vLLM row's ids in slot order and weights bit-equal,
    SGLang row's weights bit-equal, HF's id sets equal (100 x fraction, min-max over the cases)."""
    return {(name,): [len(g), _router_range(g, "vllm-0.33", "ids_equal_in_order"),
                      _router_range(g, "vllm-0.33", "weights_bit_equal"),
                      _router_range(g, "sglang-0.5.23", "weights_bit_equal"), _router_range(g, "hf", "id_sets_equal")]
            for name, g in groups.items()}


def _softmax_groups(cases) -> dict:
    return {"topk_softmax, 8 / 64 / 128 experts (fused)": [c for c in cases if c["op"] == "topk_softmax" and c["fused"]],
            "topk_softmax, 60 experts (fallback)": [c for c in cases if c["op"] == "topk_softmax" and not c["fused"]]}


def router_probe(root):
    """the first run: _router_rows of the softmax groups and of every grouped_topk case."""
    cases = _json(root, f"{ROUTER}/router_probe.json")["cases"]
    return _router_rows({**_softmax_groups(cases),
                         "grouped_topk, 8 and 256 experts": [c for c in cases if c["op"] == "grouped_topk"]})


ROUTER_RERUN = f"{ROUTER}/rerun"


def router_rerun(root):
    """the rerun (grouped_topk modelled): as router_probe, grouped_topk split into vLLM's small kernel
    (8, 256 experts) and its fused kernel (512)."""
    cases = _json(root, f"{ROUTER_RERUN}/router_probe.json")["cases"]
    grouped = [c for c in cases if c["op"] == "grouped_topk"]
    return _router_rows({**_softmax_groups(cases),
                         "grouped_topk, 8 and 256 experts (small kernel)": [c for c in grouped if c["small_kernel"]],
                         "grouped_topk, 512 experts (fused kernel)": [c for c in grouped if not c["small_kernel"]]})


GROUPED_FLIPS = ("vllm-0.33", "vllm-0.33 sigmoid=torch", "vllm-0.33 sigmoid_renorm=divide",
                 "vllm-0.33 sigmoid_renorm=reciprocal")


def router_rerun_grouped(root):
    """per small-kernel grouped_topk case (experts, logits): 100 x weights bit-equal under the vLLM
    row and under it with one router value changed."""
    cases = _json(root, f"{ROUTER_RERUN}/router_probe.json")["cases"]
    return {(f"{c['experts']} experts, top-{c['k']}, {c['logits']}",):
            [100 * c["rows"][r]["weights_bit_equal"] for r in GROUPED_FLIPS]
            for c in cases if c["op"] == "grouped_topk" and c["small_kernel"]}


def router_combine(root):
    """per k: 100 x the fraction of moe_sum outputs bit-equal under fp32_slot_order and lp_slot_order
    (the smaller of the two hidden sizes' fractions)."""
    cases = [c for c in _json(root, f"{ROUTER}/router_probe.json")["cases"] if c["op"] == "moe_sum"]
    return {(f"k = {k}",): [min(100 * c["rows"][v]["outputs_bit_equal"] for c in cases if c["k"] == k)
                            for v in ("fp32_slot_order", "lp_slot_order")]
            for k in sorted({c["k"] for c in cases})}


RESIDUAL = "results/benchmarks/residual_source_gpu_tests_h200_2026-12-02"


def residual_source_tests(root):
    """pytest -q's progress characters in gpu_tests.log: passed ('.'), failed ('F'), skipped ('s')."""
    text = (root / RESIDUAL / "gpu_tests.log").read_text()
    heads = (line.split(" [")[0].split("tests_rc")[0] for line in text.splitlines())
    marks = "".join(h for h in heads if h and set(h) <= set(".Fs"))
    return {("the H200 call",): [marks.count("."), marks.count("F"), marks.count("s")]}


MICRO, MICRO_CPU = _cr.MICRO, _cr.MICRO_CPU
_MICRO_MODELS = {"hf": "HF eager", "aligned": "aligned (vllm)"}
_MICRO_LAYOUTS = {"mb1 vs fp32 (rounding's size)": "alone, vs the same model in fp32",
                  "mb4_right vs mb1": "micro-batch 4, right-padded, vs alone",
                  "mb8_right vs mb1": "micro-batch 8, right-padded, vs alone",
                  "mb4_left vs mb1": "micro-batch 4, left-padded, vs alone",
                  "mb8_left vs mb1": "micro-batch 8, left-padded, vs alone",
                  "mb8_left_no_position_ids vs mb1": "micro-batch 8, left-padded, no position ids, vs alone"}


def microbatch_table(folder):
    """microbatch.json (lab/triage/microbatch_consistency.py): per (model, layout) k3, 100 x the share
    of tokens with ratio outside [0.9, 1.1], 100 x the share bit-equal, max |dlogp|."""
    def compute(root):
        return {(_MICRO_MODELS[r["model"]], _MICRO_LAYOUTS[r["layout"]]):
                [r["k3"], 100 * r["share_outside_0.9_1.1"], 100 * r["share_bitwise_equal"], r["max_abs_delta"]]
                for r in _json(root, f"{folder}/microbatch.json")["rows"]}
    return compute


ATTR = "results/benchmarks/vllm026_attribution_h200_2026-12-02"
_ATTR_EAGER = {"HF eager (no row)": "hf", "row": "row", "row + vLLM's attention kernel": "row+vllm_attn",
               "row + merged q/k/v and gate/up GEMMs": "row+merged", "row + vLLM's attention + merged GEMMs": "row+vllm_attn+merged",
               "row + fp32 attention": "row+fp32_attn", "row + fp32 LM head": "row+fp32_head",
               "HF eager + vLLM's attention (no row)": "hf+vllm_attn"}
_ATTR_DEFAULT = {"HF eager": ("attribution", "default", "hf"), "row (vllm-0.33)": ("attribution", "default", "row"),
                 "row + vLLM's attention": ("attribution", "default", "row+vllm_attn"),
                 "twin (default mode: vLLM's native ops compiled in pieces) + vLLM's attention": ("twin", "default", "twin-default-stock"),
                 "the same twin, compiled with vLLM's own Inductor options": ("twin", "default", "twin-default-vllm_opts"),
                 "the same, and merged GEMMs": ("twin", "default", "twin-default-vllm_opts+merged"),
                 "eager twin (vLLM's _C kernels) + vLLM's attention, against the eager engine": ("twin", "eager", "twin-eager")}


def _attr_row(root, file, mode, side):
    """The first row of a side (the batched engine run; the solo run's rows follow it)."""
    return next(r for r in _json(root, f"{ATTR}/{file}.json")["rows"] if r["mode"] == mode and r["side"] == side)


def attribution_eager(root):
    """eager rows of attribution.json (batched run): 100 x prefill equal, k3, max abs; 100 x decode equal, k3."""
    out = {}
    for label, side in _ATTR_EAGER.items():
        r = _attr_row(root, "attribution", "eager", side)
        out[(label,)] = [100 * r["prefill"]["equal"], r["prefill"]["k3"], r["prefill"]["max_abs"],
                         100 * r["decode"]["equal"], r["decode"]["k3"]]
    return out


def attribution_default(root):
    """default-mode sides (attribution.json, twin.json): 100 x prefill equal, k3, max abs."""
    out = {}
    for label, (file, mode, side) in _ATTR_DEFAULT.items():
        r = _attr_row(root, file, mode, side)
        out[(label,)] = [100 * r["prefill"]["equal"], r["prefill"]["k3"], r["prefill"]["max_abs"]]
    return out


MOE_SYNCS = "results/benchmarks/moe_decode_syncs_cpu_2026-12-02"


def moe_decode_syncs(root):
    """before.json, after.json: per decode step, top-level aten ops before, after; host syncs before
    (total, nonzero, item, host copies), after (the same)."""
    def rows(name):
        return {(r["arch"], r["batch"]): r for r in _json(root, f"{MOE_SYNCS}/{name}.json")["rows"]}

    def syncs(r):
        return [r["syncs_total"], r["blocking_on_cuda"]["aten::nonzero"], r["blocking_on_cuda"]["aten::_local_scalar_dense"],
                sum(r["host_copies"].values())]

    before, after = rows("before"), rows("after")
    labels = {("qwen3_moe", 1): "MoE 10m, 1", ("qwen3_moe", 8): "MoE 10m, 8",
              ("qwen3_moe", 128): "MoE 10m, 128 (the experiment's 16 x 8)", ("qwen2", 128): "dense Qwen2 tiny, 128"}
    return {(label,): [before[k]["top_level_aten_ops"], after[k]["top_level_aten_ops"], *syncs(before[k]), *syncs(after[k])]
            for k, label in labels.items()}


R = lambda folder: f"{folder}/README.md"  # noqa: E731

# ---------------------------------------------------------------- 2026-12-02, this session's H200 calls

TRLV, FAM524, BRK, BRK2 = _cr.TRLV, _cr.FAM524, _cr.BRK, _cr.BRK2


def trl_colocate_steps(root):
    """trl/trl_vllm_colocate.json, per logged step: kl, reward, mismatch/k3, mismatch/n_tokens, 100 x
    mismatch/bitwise/equal, sampling/importance_sampling_ratio/max."""
    steps = _json(root, f"{TRLV}/trl/trl_vllm_colocate.json")["steps"]
    return {(f"step {i}",): [x["kl"], x["reward"], x["mismatch/k3"], x["mismatch/n_tokens"],
                             100 * x["mismatch/bitwise/equal"], x["sampling/importance_sampling_ratio/max"]]
            for i, x in enumerate(steps, 1)}


def trl_colocate_checks(root):
    """trl/trl_vllm_colocate.json: its checks (step1_kl_zero, mismatch_every_step, trl_keys_kept, weights_synced),
    weight_syncs, gpu_peak_memory_gib; the vLLM and TRL versions."""
    d = _json(root, f"{TRLV}/trl/trl_vllm_colocate.json")
    c = d["checks"]
    return {("TRL 1.16 colocate",): [d["vllm"], d["trl"], *[str(c[k]).lower() for k in
                                     ("step1_kl_zero", "mismatch_every_step", "trl_keys_kept", "weights_synced")],
                                     d["weight_syncs"], d["gpu_peak_memory_gib"]]}


def verl_gpu_cases(root):
    """verl/cases/<case>/rank0.json: strategy, aligned, any forward input cast, logits equal plain and under
    autocast, gradients compared (actor cases), unequal, max |diff|."""
    out = {}
    for f in sorted((root / TRLV / "verl" / "cases").glob("*/rank0.json")):
        d = json.loads(f.read_text())
        out[(f.parent.name,)] = [d["strategy"], str(d["aligned"]).lower(), str(d["any_input_cast"]).lower(),
                                 str(d["logits_equal_plain"]).lower(), str(d["logits_equal_autocast"]).lower(),
                                 d.get("grads_compared", "-"),
                                 len(d["grads_unequal"]) if "grads_unequal" in d else "-",
                                 d.get("grads_max_abs_diff", "-")]
    return out


_pytest_counts = _cr.pytest_counts


def verl_gpu_pytest(root):
    """verl/pytest.txt's summary line: passed, failed, skipped."""
    return {("verl 0.9.1 FSDPEngine, 1 GPU",): _pytest_counts((root / TRLV / "verl" / "pytest.txt").read_text())}


def families_tf524_tests(root):
    """tests_families_tf524.txt's summary line: passed, failed, skipped."""
    return {("transformers 5.24.0",): _pytest_counts((root / FAM524 / "tests_families_tf524.txt").read_text())}


_BRK_SHAPES = {"qwen2.5-1.5b": "Qwen2.5-1.5B, 4 x 4096", "qwen3-1.7b": "Qwen3-1.7B, 2 x 4096", "qwen2.5-7b": "Qwen2.5-7B, 1 x 4096"}


def _brk_rows(root, folder=BRK):
    return {(r["model"], r["variant"]): r for r in _json(root, f"{folder}/e2e_breakdown/e2e_breakdown.json")["results"]}


def breakdown_speed_memory(root, folder=BRK):
    """e2e_breakdown.json per shape and variant: tok_s, gpu_ms_median, step_peak_gib; tok_s / liger's,
    step_peak_gib / liger's."""
    rows, out = _brk_rows(root, folder), {}
    for m, shape in _BRK_SHAPES.items():
        lg = rows[(m, "liger")]
        for v in ("hf-bf16", "liger", "rla-vllm", "rla-vllm-eager", "liger-flce", "rla-vllm+liger-flce"):
            r = rows[(m, v)]
            out[(shape, v)] = [r["time"]["tok_s"], r["time"]["gpu_ms_median"], r["peaks"]["step_peak_gib"],
                               r["time"]["tok_s"] / lg["time"]["tok_s"], r["peaks"]["step_peak_gib"] / lg["peaks"]["step_peak_gib"]]
    return out


def breakdown_memory_gap(root, folder=BRK):
    """per shape: rla-vllm's step peak - liger's (GiB), and that in bytes per token, layer and hidden element; the
    same for rla-vllm-eager."""
    rows, out = _brk_rows(root, folder), {}
    for m, shape in _BRK_SHAPES.items():
        lg = rows[(m, "liger")]
        a, e = rows[(m, "rla-vllm")], rows[(m, "rla-vllm-eager")]
        out[(shape,)] = [a["peaks"]["step_peak_gib"] - lg["peaks"]["step_peak_gib"], _cr.excess_bytes_per_element(a, lg),
                         e["peaks"]["step_peak_gib"] - lg["peaks"]["step_peak_gib"], _cr.excess_bytes_per_element(e, lg)]
    return out


def breakdown_kernels(root, folder=BRK):
    """per shape and variant (rla-vllm, rla-vllm-eager, liger), kernel ms of one profiled step: norm, copies/casts,
    other, total."""
    rows, out = _brk_rows(root, folder), {}
    for m, shape in _BRK_SHAPES.items():
        for v in ("rla-vllm", "rla-vllm-eager", "liger"):
            us = rows[(m, v)]["kernels"]["us"]
            out[(shape, v)] = [us["norm"] / 1e3, us["copies/casts"] / 1e3, us["other"] / 1e3, sum(us.values()) / 1e3]
    return out


def breakdown_after_vs_before(root):
    """per shape: rla-vllm's and rla-vllm-eager's gpu_ms_median before (BRK) and after (BRK2), and tok_s / liger's
    tok_s of the same run, before and after."""
    b, a, out = _brk_rows(root, BRK), _brk_rows(root, BRK2), {}
    for m, shape in _BRK_SHAPES.items():
        for v in ("rla-vllm", "rla-vllm-eager", "liger"):
            rel = lambda rows: rows[(m, v)]["time"]["tok_s"] / rows[(m, "liger")]["time"]["tok_s"]  # noqa: E731
            out[(shape, v)] = [b[(m, v)]["time"]["gpu_ms_median"], a[(m, v)]["time"]["gpu_ms_median"], rel(b), rel(a)]
    return out


def qk_bwd_tiles(root):
    """qk_bwd_tiles.txt per tile and kernel: ms per call, ms per step (28 layers), d_x equal to the one-row tile's."""
    import re
    out = {}
    for line in (root / BRK2 / "qk_bwd_tiles.txt").read_text().splitlines():
        m = re.match(r"(\S+)\s+rows/warps/unroll \(([^)]*)\)\s+(.+?)\s{2,}([\d.]+) ms/call\s+([\d.]+) ms/step\s+d_x (==|!=) one-row", line)
        if m:
            kernel = "fused q/k norm + RoPE" if m.group(3).startswith("fused") else "norm (q and k)"
            out[(m.group(1), kernel)] = [m.group(2).replace(", ", " x "), float(m.group(4)), float(m.group(5)),
                                         "yes" if m.group(6) == "==" else "no"]
    return out


def breakdown_gpu_tests(root):
    """gpu_tests.log's summary line: passed, failed, skipped (deselected not counted)."""
    return {("the H200 call",): _pytest_counts((root / BRK / "gpu_tests.log").read_text())}


P36 = "results/benchmarks/perf36_gpu_tests_h200_2026-12-02"  # issue #36: the GPU tests by name
EFB = "results/benchmarks/engine_forward_breakdown_h200_2026-12-02"  # issue #36 item 3


def perf36_gpu_tests(root):
    """gpu_tests.log's summary line: passed, failed, skipped."""
    return {("the H200 call",): _pytest_counts((root / P36 / "gpu_tests.log").read_text())}


def engine_forward_steps(root):
    """one_variant_per_process/<variant>/engine_forward_breakdown.json (Qwen3-1.7B 2 x 4096): per variant the median
    step GPU ms, host ms, step peak GiB, saved MiB per layer, saved bytes per token, layer and hidden element."""
    out = {}
    for variant in ("rla-vllm", "pieces"):
        (r,) = _json(root, f"{EFB}/one_variant_per_process/{variant}/engine_forward_breakdown.json")["results"]
        out[(f"`{variant}`",)] = [r["time"]["gpu_ms"], r["time"]["host_ms"], r["peaks"]["step_peak_gib"],
                                  r["saved"]["per_layer_bytes"] / 2**20, r["saved"]["per_layer_per_token_hidden"]]
    return out


P36R3 = "results/benchmarks/perf36_round3_h200_2026-12-02"  # issue #36, third round: the fixed tools on the GPU
_R3_VARIANTS = ("hf-bf16", "liger", "rla-vllm", "rla-vllm-eager")


def _r3_rows(root, part):
    return {(r["model"], r["variant"]): r for r in _json(root, f"{P36R3}/{part}/e2e_breakdown.json")["results"]}


def _per_element(r, kinds=None):
    """Saved bytes per token, layer and hidden element, averaged over the decoder layers (outside: the rest)."""
    layers = {k: v for k, v in r["saved"]["per_layer"].items() if k != "outside"}
    scale = r["batch"] * r["seq"] * r["hidden"] * len(layers)
    return sum(b for kind in layers.values() for k, b in kind.items() if kinds is None or k in kinds) / scale


def round3_saved(root):
    """saved/e2e_breakdown.json per shape and variant: bytes per token, layer and hidden element over all layers,
    and of them norm (+ rope: Qwen3's fused q/k norm + RoPE), swiglu/act, attention; MiB kept outside the layers."""
    rows, out = _r3_rows(root, "saved"), {}
    for m, shape in _BRK_SHAPES.items():
        for v in _R3_VARIANTS:
            r = rows[(m, v)]
            out[(shape, v)] = [_per_element(r), _per_element(r, ("norm", "rope", "residual add")),
                               _per_element(r, ("swiglu/act",)), _per_element(r, ("attention",)),
                               sum(r["saved"]["per_layer"]["outside"].values()) / 2**20]
    return out


def round3_memory_gap(root):
    """per shape: rla-vllm's saved bytes minus liger's (saved/, GiB: every layer's and outside the layers) beside
    the step peaks' difference of the same variants in the second round's run (BRK2), and their ratio."""
    saved, peaks, out = _r3_rows(root, "saved"), _brk_rows(root, BRK2), {}
    for m, shape in _BRK_SHAPES.items():
        a, b = saved[(m, "rla-vllm")]["saved"], saved[(m, "liger")]["saved"]
        gap = (a["activation_bytes"] - b["activation_bytes"]) / 2**30
        peak = peaks[(m, "rla-vllm")]["peaks"]["step_peak_gib"] - peaks[(m, "liger")]["peaks"]["step_peak_gib"]
        out[(shape,)] = [gap, peak, peak / gap]
    return out


def round3_kernels(root):
    """kernels/e2e_breakdown.json per shape and variant (liger, rla-vllm, rla-vllm-eager): kernel ms of one profiled
    step by kind (rope, norm, residual add, swiglu/act, gemm, copies/casts) and the total."""
    rows, out = _r3_rows(root, "kernels"), {}
    for m, shape in _BRK_SHAPES.items():
        for v in ("liger", "rla-vllm", "rla-vllm-eager"):
            us = rows[(m, v)]["kernels"]["us"]
            out[(shape, v)] = [us[k] / 1e3 for k in ("rope", "norm", "residual add", "swiglu/act", "gemm", "copies/casts")] \
                + [sum(us.values()) / 1e3, sum(us.values()) / sum(rows[(m, "liger")]["kernels"]["us"].values())]
    return out


def engine_forward_round2(root):
    """round2/engine_forward_breakdown.json (Qwen3-1.7B 2 x 4096, one process): per variant step GPU ms, host ms,
    bwd recompute ms, gaps ms, step peak GiB, saved B per token/layer/hidden, parameters whose gradient equals
    pieces' (pieces: its own second step's), of all."""
    out = {}
    for r in _json(root, f"{EFB}/round2/engine_forward_breakdown.json")["results"]:
        vs = r.get("vs_pieces") or r.get("repeat")
        out[(f"`{r['variant']}`",)] = [r["time"]["gpu_ms"], r["time"]["host_ms"], r["kernels_us"]["bwd recompute"] / 1e3,
                                       r["gaps_ms"], r["peaks"]["step_peak_gib"], r["saved"]["per_layer_per_token_hidden"],
                                       f"{vs['equal_params']}/{vs['params']}" if vs else "-"]
    return out


def engine_forward_control(root):
    """round2_control/efb_{math,default}/engine_forward_breakdown.json (Qwen3-1.7B, 4 layers): per SDPA backend and
    variant, the parameters whose gradient equals pieces' (pieces: its own second step's), of all, and the max abs
    difference."""
    out = {}
    for sdpa in ("math", "default"):
        for r in _json(root, f"{EFB}/round2_control/efb_{sdpa}/engine_forward_breakdown.json")["results"]:
            vs = r.get("vs_pieces") or r["repeat"]
            out[(sdpa, f"`{r['variant']}`")] = [f"{vs['equal_params']}/{vs['params']}", vs["max_abs_diff"]]
    return out


TABLES: list[TableCheck] = [
    TableCheck("engine forward control", R(EFB), f"{EFB}/round2_control/efb_*/engine_forward_breakdown.json",
               "grads equal to pieces' (pieces: its second step), max abs diff", engine_forward_control),
    TableCheck("round3 saved", R(P36R3), f"{P36R3}/saved/e2e_breakdown.json",
               "B per token/layer/hidden: all, norm+rope, swiglu/act, attention; MiB outside the layers", round3_saved),
    TableCheck("round3 memory gap", R(P36R3), f"{P36R3}/saved/e2e_breakdown.json, {BRK2}/e2e_breakdown/e2e_breakdown.json",
               "saved GiB rla-vllm - liger, step peak GiB rla-vllm - liger, ratio", round3_memory_gap),
    TableCheck("engine forward round2", R(EFB), f"{EFB}/round2/engine_forward_breakdown.json",
               "step GPU ms, host ms, bwd recompute ms, gaps ms, peak GiB, saved B per token/layer/hidden, grads equal",
               engine_forward_round2),
    TableCheck("round3 kernels", R(P36R3), f"{P36R3}/kernels/e2e_breakdown.json",
               "kernel ms by kind, total, total / liger's", round3_kernels),
    TableCheck("perf36 GPU tests", R(P36), f"{P36}/gpu_tests.log", "passed, failed, skipped", perf36_gpu_tests),
    TableCheck("engine forward steps", R(EFB), f"{EFB}/one_variant_per_process/*/engine_forward_breakdown.json",
               "per variant: step GPU ms, host ms, peak GiB, saved MiB per layer, saved B per token/layer/hidden",
               engine_forward_steps),
    TableCheck("TRL colocate steps", R(TRLV), f"{TRLV}/trl/trl_vllm_colocate.json",
               "per step: kl, reward, mismatch/k3, mismatch/n_tokens, 100 x mismatch/bitwise/equal, IS ratio max",
               trl_colocate_steps),
    TableCheck("TRL colocate checks", R(TRLV), f"{TRLV}/trl/trl_vllm_colocate.json",
               "vllm, trl, the four checks, weight_syncs, gpu_peak_memory_gib", trl_colocate_checks),
    TableCheck("verl GPU cases", R(TRLV), f"{TRLV}/verl/cases/*/rank0.json",
               "strategy, aligned, input cast, logits equal plain / autocast, grads compared, unequal, max |diff|",
               verl_gpu_cases),
    TableCheck("verl GPU pytest", R(TRLV), f"{TRLV}/verl/pytest.txt", "passed, failed, skipped", verl_gpu_pytest),
    TableCheck("families GPU tests tf524", R(FAM524), f"{FAM524}/tests_families_tf524.txt", "passed, failed, skipped",
               families_tf524_tests),
    TableCheck("breakdown speed and memory", R(BRK), f"{BRK}/e2e_breakdown/e2e_breakdown.json",
               "tok_s, gpu_ms_median, step_peak_gib; tok_s / liger's, step_peak_gib / liger's", breakdown_speed_memory),
    TableCheck("breakdown memory gap", R(BRK), f"{BRK}/e2e_breakdown/e2e_breakdown.json",
               "step peak - liger's (GiB) and per token, layer and hidden element (bytes): rla-vllm, rla-vllm-eager",
               breakdown_memory_gap),
    TableCheck("breakdown kernels", R(BRK), f"{BRK}/e2e_breakdown/e2e_breakdown.json",
               "kernel ms: norm, copies/casts, other, total", breakdown_kernels),
    TableCheck("after speed and memory", R(BRK2), f"{BRK2}/e2e_breakdown/e2e_breakdown.json",
               "tok_s, gpu_ms_median, step_peak_gib; tok_s / liger's, step_peak_gib / liger's",
               lambda root: breakdown_speed_memory(root, BRK2)),
    TableCheck("after vs before", R(BRK2), f"{BRK}/e2e_breakdown/e2e_breakdown.json, {BRK2}/e2e_breakdown/e2e_breakdown.json",
               "gpu_ms_median before, after; tok_s / liger's before, after", breakdown_after_vs_before),
    TableCheck("after kernels", R(BRK2), f"{BRK2}/e2e_breakdown/e2e_breakdown.json", "kernel ms: norm, copies/casts, other, total",
               lambda root: breakdown_kernels(root, BRK2)),
    TableCheck("q/k backward tiles", R(BRK2), f"{BRK2}/qk_bwd_tiles.txt", "tile, ms per call, ms per step, d_x equal",
               qk_bwd_tiles),
    TableCheck("breakdown GPU tests", R(BRK), f"{BRK}/gpu_tests.log", "passed, failed, skipped", breakdown_gpu_tests),
    TableCheck("moe decode syncs", R(MOE_SYNCS), f"{MOE_SYNCS}/before.json, after.json",
               "per decode step: ops before, after; syncs before (total, nonzero, item, copies), after (the same)",
               moe_decode_syncs),
    TableCheck("attribution eager", R(ATTR), f"{ATTR}/attribution.json",
               "eager sides: 100 x prefill equal, prefill k3, max abs dlogp, 100 x decode equal, decode k3", attribution_eager),
    TableCheck("attribution default", R(ATTR), f"{ATTR}/attribution.json, twin.json",
               "default-mode sides: 100 x prefill equal, prefill k3, max abs dlogp", attribution_default),
    TableCheck("router probe", R(ROUTER), f"{ROUTER}/router_probe.json",
               "cases; 100 x fraction min-max: vLLM row ids in order, its weights bit-equal, SGLang's weights, HF's id sets",
               router_probe),
    TableCheck("router probe combine", R(ROUTER), f"{ROUTER}/router_probe.json",
               "100 x fraction of moe_sum outputs bit-equal, fp32_slot_order and lp_slot_order", router_combine),
    TableCheck("router probe rerun", R(ROUTER), f"{ROUTER_RERUN}/router_probe.json",
               "cases; 100 x fraction min-max: vLLM row ids in order, its weights bit-equal, SGLang's weights, HF's id sets",
               router_rerun),
    TableCheck("router probe rerun grouped", R(ROUTER), f"{ROUTER_RERUN}/router_probe.json",
               "100 x fraction of weights bit-equal: the vLLM row, then one router value changed", router_rerun_grouped),
    TableCheck("residual source gpu tests", R(RESIDUAL), f"{RESIDUAL}/gpu_tests.log",
               "pytest's progress marks: passed, failed, skipped", residual_source_tests),
    TableCheck("microbatch H200", R(MICRO), f"{MICRO}/microbatch.json",
               "per model and layout: k3, 100 x share outside [0.9, 1.1], 100 x share bit-equal, max abs delta",
               microbatch_table(MICRO)),
    TableCheck("microbatch bundled CPU", R(MICRO_CPU), f"{MICRO_CPU}/microbatch.json",
               "per model and layout: k3, 100 x share outside [0.9, 1.1], 100 x share bit-equal, max abs delta",
               microbatch_table(MICRO_CPU)),
    TableCheck("house e2e", R(HOUSE), f"{HOUSE}/e2e*/e2e_NVIDIA_H200_2026-12-02.json",
               "step_ms old, new, new (Liger run); tok_s new / old for both new runs", house_e2e),
    TableCheck("house liger flce", R(HOUSE), f"{HOUSE}/e2e/e2e_NVIDIA_H200_2026-12-02.json",
               "tok_s and peak_gib of liger-flce and rla-vllm+liger-flce, ratios", house_liger),
    TableCheck("decode attention", f"{DECODE_ATTN}.md", f"{DECODE_ATTN}.json",
               "rows: seconds_per_generate of each arm, speedup, captured graphs, peak_gib", decode_attention_table),
    TableCheck("SGLang 0.5.23 calibration", R(SGLANG), f"{SGLANG}/calibration.report.json", "choice, evidence, 100 x fraction per choice, max ulp", sglang_points),
    TableCheck("SGLang 0.5.23 norm path (CuTe-DSL)", R(SGLANG), f"{SGLANG}/norm_cute/calibration.report.json", "choice, evidence, 100 x fraction per choice, max ulp",
               lambda root: sglang_points(root, "norm_cute/calibration.report.json",
                                          ("norm_weight", "norm_residual", "residual_stream", "norm_reduction"))),
    TableCheck("fused q/k norm + RoPE e2e", R(QK), f"{QK}/e2e_fused.json", "tok/s, / hf-bf16 tok/s, peak GiB, / hf-bf16 peak", qk_e2e),
    TableCheck("fused vs two-op q/k chain, alternating", R(QK), f"{QK}/e2e_alternating_*.json", "chain by run (odd: fused), tok/s, peak GiB", qk_alternating),
    TableCheck("SGLang 0.5.23 rest", R(SGLANG), f"{SGLANG}/rest_diagnosis.json", "element counts", sglang_rest),
    TableCheck("engine-backed default mode vs the twin", R(FORWARD),
               f"{FORWARD}/twin_default.json", "% of logits bit-equal / k3 per side",
               _twin("default", ("hf", "rla-fused", "rla-reference", "vllm-pieces"), FORWARD)),
    TableCheck("engine-backed default mode e2e", R(FORWARD), f"{FORWARD}/e2e.json", "batch x seq, tok/s, / hf-bf16, peak GiB, / hf-bf16", forward_e2e),
    TableCheck("reduction order e2e", R(ORDER), f"{ORDER}/e2e_*.json",
               "tok_s / hf-bf16 tok_s in the same run (runs 1, 2); peak_gib / hf-bf16 (run 1)", order_e2e),
    TableCheck("session 3 e2e", R(D29C), f"{D29C}/call5_e2e.json",
               "per model and variant: batch x seq, tok_s, tok_s / HF bf16's, peak_gib, peak_gib / HF bf16's", session3_e2e),
    TableCheck("session 3 per-op", R(D29C), f"{D29C}/call{{3,5}}_ops_isolated.json, call4_ops_rope_*.json",
               "per run: rla / liger fwd_bwd_ms and graph_fwd_bwd_ms; rla graph_fwd_ms and fwd_ms / floor_fwd_ms; call 3: rla / hf",
               session3_per_op),
    TableCheck("session 4 e2e next to Liger", R(D29), f"{D29}/call2_e2e_liger.json, call2_e2e_1x512.json",
               "tok_s and tok_s / HF bf16's of rla-vllm and liger; peak_gib of the three", session4_e2e),
    TableCheck("session 4 RoPE variants", R(D29), f"{D29}/call1_rope_variants.json",
               "fwd_ms, fwd_bwd_ms, fwd_ms / fwd_floor_ms per arm; ranges min-max over the arms a row names", rope_variants),
    TableCheck("FSDP2 throughput", R(FSDP2), f"{FSDP2}/check/fsdp2_check.json",
               "tokens_per_s_per_gpu_mean, peak_mem_gib_max, rank 0's step_s_median", fsdp2_throughput),
    TableCheck("FSDP2 GRPO", R(FSDP2), f"{FSDP2}/train_{{aligned,bf16}}/log.jsonl",
               "step-0 k3; mean k3 over steps; step-0 abs mean; step-0 ratio min, max; mean time/train_s of steps 1-3; max memory/peak_mb / 1024",
               fsdp2_grpo),
    TableCheck("twin default mode", R(TWIN), f"{TWIN}/twin_default.json", "per case and side: 100 logits_equal, k3", _twin("default", ["hf", "rla-fused", "rla-reference"])),
    TableCheck("twin eager mode", R(TWIN), f"{TWIN}/twin_eager.json", "per case and side: 100 logits_equal, k3",
               _twin("eager", ["hf", "rla-fused", "rla-reference", "vllm-kernels"])),
    TableCheck("RoPE tables vs vLLM's cache", R(TWIN), f"{TWIN}/rope_tables.json",
               "positions; 100 fp32_equal, 100 bf16_equal", rope_tables),
]
PROSE: list = []


def run_all(root: Path, texts: dict[str, str] | None = None) -> list[dict]:
    from readme_tables import run_all as _run
    return _run(TABLES, PROSE, root, texts)


if __name__ == "__main__":
    sys.exit(main(TABLES, PROSE, __doc__))
