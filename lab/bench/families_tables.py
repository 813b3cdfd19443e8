"""The tables of issue #33's two H200 results folders of 2026-12-02, rendered from their files.

- ``results/benchmarks/families_kernels_h200_2026-12-02/`` (``lab/bench/families_h200_session.sh``):
  the gated GPU tests' summaries, the gelu probe (``gelu_probe.json``), the Gemma 3 4B training step
  (``e2e/*.json``), and the CPU finding of why the aligned step is not faster
  (``why/gemma_dispatch_cpu.json``, ``lab/bench/gemma_dispatch_cpu.py``) with its prediction, which
  also reads the H200 add + RMSNorm timings of ``h200_2026-11-29_ops.json`` and
  ``e2e_align_ops_isolated_h200_2026-11-29/call{3,5}_ops_isolated.json``.
- ``results/benchmarks/vllm026_gemma3_h200_2026-12-02/`` (``lab/bench/vllm026_session.sh``, stages
  ``gemma3-eager gemma3-default``): the live vLLM 0.26 runs' ``report.json`` per mode.
- ``results/benchmarks/vllm026_families_h200_2026-12-02/`` (stages ``fam-eager fam-default``): the live
  runs on GLM-4 MoE, GPT-OSS and DeepSeek-V3 (``runs/<call>/verify-<model>-<mode>/report.json``).

- ``results/benchmarks/vllm026_qwen35_gemma4_h200_2026-12-03/`` (stages ``fam-eager fam-default famcal-default``):
  the live runs on Qwen3.5 dense and Gemma 4 and the Gemma 4 default-mode calibration (every point with its flip).
- ``results/benchmarks/vllm026_rescore_h200_2026-12-03/`` (stages ``fam-default famcal-default`` with ``SAVED``): the
  committed default-mode engine outputs re-scored under the changed rows, their calibrations, Gemma 3 again.
- ``results/benchmarks/twin_families_h200_2026-12-03/`` (``lab/bench/twin_families_session.sh``): the family twins'
  ``twin_families.json`` per call, as ``lab/bench/twin_families.py`` summarises them.
- ``results/benchmarks/twin_families_h100_2026-12-05/``: the same summary of the Gemma 4 and Qwen3.5 MoE twin call.
- ``results/benchmarks/families_gpu_tests_h200_2026-12-03/``: the GPU tests' JUnit XML, per test file.
- ``results/benchmarks/vllm026_current_rows_h200_2026-12-03/`` (``SAVED`` re-scoring under the rows with ``moe_out`` and
  ``attn_gate``): the verify calls' printed tables (``runs/rescore-default/verify-tables.md``: their reports did not
  come back) and the calibrations' reports.
- ``results/benchmarks/gptoss_gap_h200_2026-12-03/``: ``lab/bench/gptoss_gap_probe.py``'s stages (``runs/probe/``) and the
  GPU tests' JUnit XML of the same call.
- ``results/benchmarks/twin_gemma4_h200_2026-12-03/``: Gemma 4's twin lines of ``runs/families.log`` (the stage's limit
  stopped it before its JSON).
- ``results/benchmarks/gptoss_quotient_h200_2026-12-04/``: two calls (``runs/first/``, ``runs/second/``): the probe at
  512 and 2048 tokens, GPT-OSS's twin lines of ``families.log``, the GPU tests' JUnit XML.
- ``results/benchmarks/vllm026_qwen35moe_h200_2026-12-04/``: the verify reports of Qwen3.5 MoE's live run and of its
  outputs re-scored with the router region.

``python lab/bench/families_tables.py [--write]`` prints every block; ``--write`` puts each into its
README between ``<!-- NAME -->`` and ``<!-- /NAME -->``. ``tests/lab/test_families_tables.py`` checks
that the committed blocks are the render.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from rla.profiles import VARIANT_POINTS

ROOT = Path(__file__).resolve().parents[2]
BENCH = Path("results/benchmarks")
KERNELS = BENCH / "families_kernels_h200_2026-12-02"
LIVE = BENCH / "vllm026_gemma3_h200_2026-12-02"
MOE_LIVE = BENCH / "vllm026_families_h200_2026-12-02"
#: (model, mode, the call's folder under runs/) of MOE_LIVE, in the table's order
MOE_RUNS = (("glm4moe-h2048", "eager", "eager"), ("glm4moe-h2048", "default", "default"),
            ("gptoss-h2880", "eager", "eager"), ("gptoss-h2880", "default", "default"),
            ("deepseekv3-h2048", "eager", "deepseek-eager-rerun"))
EVENING = BENCH / "vllm026_qwen35_gptoss_h200_2026-12-02"
#: the evening's verify runs (after the gpt_oss variant of vllm-0.26 and the MLA alignment), as MOE_RUNS
EVENING_RUNS = (("gptoss-h2880", "default", "gptoss-default-variant"), ("deepseekv3-h2048", "default", "deepseekv3-default"),
                ("deepseekv3-h2048", "eager", "deepseekv3-eager-mla"))
DEC3 = BENCH / "vllm026_qwen35_gemma4_h200_2026-12-03"
#: 2026-12-03's verify runs, as MOE_RUNS
DEC3_RUNS = (("qwen35-h2048", "eager", "qwen35-eager"), ("qwen35-h2048", "default", "qwen35-default"),
             ("gemma4-h2560", "eager", "gemma4-eager"), ("gemma4-h2560", "default", "gemma4-default"))
RESCORE = BENCH / "vllm026_rescore_h200_2026-12-03"
#: the re-scored runs and Gemma 3's new one, as MOE_RUNS
RESCORE_RUNS = (("gemma4-h2560", "default", "rescore-default"), ("qwen35-h2048", "default", "rescore-default"),
                ("glm4moe-h2048", "default", "rescore-default"), ("gemma3-h2560", "default", "gemma3-default"))
TWINS = BENCH / "twin_families_h200_2026-12-03"
GPU_TESTS = BENCH / "families_gpu_tests_h200_2026-12-03"
CURRENT = BENCH / "vllm026_current_rows_h200_2026-12-03"
GEMMA4_TWIN = BENCH / "twin_gemma4_h200_2026-12-03"
TWINS_1205 = BENCH / "twin_families_h100_2026-12-05"  # Gemma 4 and Qwen3.5 MoE, default mode (H100)
GPTOSS_GAP = BENCH / "gptoss_gap_h200_2026-12-03"
QUOTIENT = BENCH / "gptoss_quotient_h200_2026-12-04"
QWEN35MOE = BENCH / "vllm026_qwen35moe_h200_2026-12-04"
#: its verify runs, as MOE_RUNS: the live engine, then its outputs re-scored with the router region
QWEN35MOE_RUNS = tuple(("qwen35moe-h2048", mode, call) for call in ("live", "router-rescore") for mode in ("eager", "default"))
#: The H200 timings of rla bench ops' add_rms_norm case (16384 x 3584, forward + backward) that turn
#: bytes into milliseconds: PyTorch's eager ops ("hf") and rla's fused kernel ("rla").
OPS_TIMINGS = (BENCH / "h200_2026-11-29_ops.json", BENCH / "e2e_align_ops_isolated_h200_2026-11-29/call3_ops_isolated.json",
               BENCH / "e2e_align_ops_isolated_h200_2026-11-29/call5_ops_isolated.json")
CALIBRATION = "calibration: bench ops add_rms_norm hf [16384, 3584]"
LAYERS_4B = 34
MIB = 2**20


def _json(root: Path, rel) -> dict:
    return json.loads((root / rel).read_text())


def _table(head: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


# ---------------------------------------------------------------- families_kernels folder


def e2e_table(root: Path, folder: Path = KERNELS) -> str:
    (path,) = sorted((root / folder / "e2e").glob("*.json"))
    rows = json.loads(path.read_text())["results"]
    hf = next(r for r in rows if r["variant"] == "hf-bf16")
    return _table(
        ["model", "variant", "batch x seq", "step ms (median of 5)", "tok/s", "vs hf-bf16", "peak GiB", "vs hf-bf16",
         "loss", "aligned by"],
        [[r["model"], r["variant"], f"{r['batch']}x{r['seq']}", f"{r['step_ms']:.1f}", f"{r['tok_s']:.0f}",
          f"{r['tok_s'] / hf['tok_s']:.3f}", f"{r['peak_gib']:.1f}", f"{r['peak_gib'] / hf['peak_gib']:.3f}",
          f"{r['loss']:.3f}", r["aligned_by"]] for r in rows])


def tests_table(root: Path, folder: Path = KERNELS) -> str:
    rows = []
    for name, what in (("tests-gated.txt", "`gpu_run.sh tests-gated`: fused GeGLU / clamped SwiGLU bitwise tests, "
                        "family ops, aligned families on CUDA"),
                       ("tests-opcheck.txt", "`gpu_run.sh tests-gated`: the ops' `opcheck` cases")):
        text = (root / folder / name).read_text()
        summary = re.findall(r"^(\d+ passed.*?) in [0-9.]+s", text, re.M)[-1]
        skips = sorted(set(re.findall(r"^SKIPPED \[\d+\] \S+: (.*)$", text, re.M)))
        rows.append([f"`{name}`", what, summary, "; ".join(skips) or "-"])
    return _table(["file", "what", "result", "skipped because"], rows)


def gelu_table(root: Path, folder: Path = KERNELS) -> str:
    res = _json(root, folder / "gelu_probe.json")["results"]
    return _table(["expression", "inputs", "n", "bit-equal to PyTorch's CUDA op", "differ"],
                  [[k.split("/")[1] if k.startswith("gelu") else "tanh: libdevice vs torch.tanh", k.split("/")[2],
                    f"{r['n']:,}", f"{r['bit_equal']:.6f}", f"{r['differ']:,}"] for k, r in res.items()])


def _why(root: Path, folder: Path) -> dict:
    return _json(root, folder / "why" / "gemma_dispatch_cpu.json")


def _scaled(calls: int, layers: int, to: int = LAYERS_4B) -> int:
    """Calls of a kind in a ``to``-layer model from a ``layers``-layer census (per layer + extra)."""
    return (calls // layers) * to + calls % layers


def dispatch_table(root: Path, folder: Path = KERNELS) -> str:
    c = _why(root, folder)["census"]
    return _table(["rla.ops call", "path on CUDA", "input dtype", "width (small model)", "output", "calls per layer",
                   f"calls in the {LAYERS_4B}-layer step"],
                  [[f"`{r['op']}`", r["path"], r["x_dtype"], r["width"], r["out_dtype"], f"{r['per_layer']:.2f}",
                    _scaled(r["calls"], c["layers"])] for r in c["calls"]])


#: The traffic cases of the census's reference calls, and the census row (op, x dtype, out dtype) of each.
KINDS = {
    "rla ref rms_norm bf16 -> bf16 (post-attn / post-ff norm; first layer's input norm)": ("rms_norm", "bfloat16", "stack dtype", "wide"),
    "rla ref rms_norm fp32 sum -> bf16 (input norm of layers 1.., final norm)": ("rms_norm", "float32", "stack dtype", "wide"),
    "rla ref add_rms_norm of source (pre-feed-forward norm)": ("add_rms_norm", "bfloat16", "stack dtype", "wide"),
    "rla ref rms_norm q (bf16 -> fp32, q_norm)": ("rms_norm", "bfloat16", "float32", "q"),
    "rla ref rms_norm k (bf16 -> fp32, k_norm)": ("rms_norm", "bfloat16", "float32", "k"),
}


def _counts(why: dict) -> dict[str, int]:
    c = why["census"]
    out = {}
    for name, (op, xd, od, which) in KINDS.items():
        rows = [r for r in c["calls"] if (r["op"], r["x_dtype"], r["out_dtype"]) == (op, xd, od)
                and r["path"].startswith("reference")]
        (r,) = rows
        calls = _scaled(r["calls"], c["layers"])
        out[name] = calls // 2 if which in ("q", "k") else calls  # the census's q/k row counts q_norm and k_norm
    return out


def _rates(root: Path) -> tuple[list[float], list[float]]:
    """ms per byte of PyTorch's eager add + norm ops and of rla's fused kernel, from the H200 runs."""
    cal = _why(root, KERNELS)["traffic"][CALIBRATION]
    ref_b, fused_b = cal["fwd_bytes"] + cal["bwd_bytes"], cal["fused_fwd_bytes"] + cal["fused_bwd_bytes"]
    ref, fused = [], []
    for rel in OPS_TIMINGS:
        for r in _json(root, rel)["results"]:
            if r["op"] == "add_rms_norm":
                if "hf" in r["impls"]:
                    ref.append(r["impls"]["hf"]["fwd_bwd_ms"] / ref_b)
                fused.append(r["impls"]["rla"]["fwd_bwd_ms"] / fused_b)
    return ref, fused


def traffic_table(root: Path, folder: Path = KERNELS) -> str:
    why = _why(root, folder)
    t, counts = why["traffic"], _counts(why)
    rows = []
    for name, r in t.items():
        fused = (f"{(r['fused_fwd_bytes'] + r['fused_bwd_bytes']) / MIB:.0f}" if "fused_fwd_bytes" in r else "-")
        rows.append([name, counts.get(name, "-"), f"{r['fwd_kernels']} + {r['bwd_kernels']}",
                     f"{(r['fwd_bytes'] + r['bwd_bytes']) / MIB:.0f}", fused])
    return _table(["call (forward + backward, e2e shape)", f"calls in the {LAYERS_4B}-layer step",
                   "aten kernels (fwd + bwd)", "MiB moved", "MiB the fused norm kernel moves"], rows)


def prediction(root: Path, folder: Path = KERNELS) -> dict:
    why = _why(root, folder)
    t, counts = why["traffic"], _counts(why)
    ref_bytes = sum(counts[k] * (t[k]["fwd_bytes"] + t[k]["bwd_bytes"]) for k in KINDS)
    fused_bytes = sum(counts[k] * (t[k]["fused_fwd_bytes"] + t[k]["fused_bwd_bytes"]) for k in KINDS)
    ref_rate, fused_rate = _rates(root)
    (path,) = sorted((root / folder / "e2e").glob("*.json"))
    rows = {r["variant"]: r for r in json.loads(path.read_text())["results"]}
    rla, hf, liger = rows["rla-vllm"], rows["hf-bf16"], rows["liger"]
    tokens = rla["batch"] * rla["seq"]
    ref_ms = [ref_bytes * r for r in ref_rate]
    fused_ms = [fused_bytes * r for r in fused_rate]
    save = (min(ref_ms) - max(fused_ms), max(ref_ms) - min(fused_ms))
    steps = (rla["step_ms"] - save[1], rla["step_ms"] - save[0])
    return dict(ref_gib=ref_bytes / 2**30, fused_gib=fused_bytes / 2**30, ref_ms=(min(ref_ms), max(ref_ms)),
                fused_ms=(min(fused_ms), max(fused_ms)), save_ms=save, step_ms=steps,
                ratio=tuple(sorted(tokens / (s / 1e3) / hf["tok_s"] for s in steps)), rla_step=rla["step_ms"], hf_step=hf["step_ms"],
                rla_ratio=rla["tok_s"] / hf["tok_s"], liger_step=liger["step_ms"], liger_ratio=liger["tok_s"] / hf["tok_s"],
                ref_gbs=tuple(1e3 / r / 1e9 for r in ref_rate), fused_gbs=tuple(1e3 / r / 1e9 for r in fused_rate))


def prediction_text(root: Path, folder: Path = KERNELS) -> str:
    p = prediction(root, folder)
    span = lambda v, f: f"{min(v):{f}}-{max(v):{f}}"  # noqa: E731
    t = _why(root, folder)["traffic"]
    mib = lambda k: (t[k]["fwd_bytes"] + t[k]["bwd_bytes"]) / MIB  # noqa: E731
    k = list(KINDS)
    rla_layer = 2 * mib(k[0]) + mib(k[1]) + mib(k[2]) + mib(k[3]) + mib(k[4])
    hf_layer = (2 * mib("hf Gemma3RMSNorm [8192, 2560]") + 2 * mib("hf layer add + Gemma3RMSNorm [8192, 2560]")
                + mib("hf Gemma3RMSNorm q [65536, 256]") + mib("hf Gemma3RMSNorm k [32768, 256]"))
    return "\n".join([
        f"- Per layer (a later one), rla's reference norms move {rla_layer:,.0f} MiB forward + backward; HF eager's four "
        f"norms, its two adds and its q/k norms {hf_layer:,.0f} MiB ({rla_layer / hf_layer:.2f}x).",
        f"- The zero-centred norms of one step move {p['ref_gib']:.0f} GiB through the reference's aten kernels; the "
        f"fused norm kernel would move {p['fused_gib']:.1f} GiB.",
        f"- At the rates the H200 measured for the add + norm case (PyTorch's eager ops "
        f"{span(p['ref_gbs'], '.0f')} GB/s by this byte count, rla's fused kernel "
        f"{span(p['fused_gbs'], '.0f')} GB/s), that is {span(p['ref_ms'], '.0f')} ms against "
        f"{span(p['fused_ms'], '.0f')} ms: {span(p['save_ms'], '.0f')} ms saved.",
        f"- A cross-check at the same rates: HF eager's own norms, adds and q/k norms cost "
        f"{span([hf_layer * MIB * LAYERS_4B * r for r in _rates(root)[0]], '.0f')} ms of its {p['hf_step']:.1f} ms step; "
        f"Liger, which fuses them (and GeGLU, RoPE), is {p['hf_step'] - p['liger_step']:.1f} ms faster than HF.",
        f"- Predicted aligned step: {span(p['step_ms'], '.0f')} ms instead of {p['rla_step']:.1f} ms, "
        f"{span(p['ratio'], '.2f')}x HF eager's tokens/s instead of {p['rla_ratio']:.3f}x "
        f"(Liger in the same run: {p['liger_step']:.1f} ms, {p['liger_ratio']:.3f}x).",
    ])


# ---------------------------------------------------------------- vllm026_gemma3 folder


def live_table(root: Path, folder: Path = LIVE) -> str:
    rows = []
    for mode in ("eager", "default"):
        rep = _json(root, folder / "runs" / f"gemma3-h2560-L4-{mode}" / "engine-attention" / "report.json")
        hf = next(r for r in rep["rows"] if r["side"] == "hf")
        for r in rep["rows"]:
            removed = lambda part: "-" if r is hf else f"{1 - r[part]['k3'] / hf[part]['k3']:.0%}"  # noqa: E731
            pos = r["prefill"]["by_position"]
            rows.append([rep["engine"]["mode"], f"`{r['side']}`", f"{r['prefill']['equal']:.3%}",
                         f"{r['prefill']['k3']:.2e}", removed("prefill"), f"{r['prefill']['max_abs']:.2e}",
                         " / ".join(f"{pos[b]['equal']:.3%}, {pos[b]['k3']:.2e}" for b in sorted(pos)),
                         f"{r['decode']['equal']:.3%}", f"{r['decode']['k3']:.2e}", removed("decode")])
    return _table(["engine mode", "side", "prefill bit-equal", "prefill k3", "k3 removed", "prefill max abs dlogp",
                   "by position 0-1024 / 1024-4096 (bit-equal, k3)", "decode bit-equal", "decode k3",
                   "decode k3 removed"], rows)


def moe_live_table(root: Path, folder: Path = MOE_LIVE, runs=MOE_RUNS) -> str:
    rows = []
    for model, mode, call in runs:
        rep = _json(root, folder / "runs" / call / f"verify-{model}-{mode}" / "report.json")
        hf = next(r for r in rep["rows"] if r["side"] == "hf")
        attn = rep["engine"]["settings"]["train_attention"].split(" ")[0]
        mla = rep["engine"].get("environment", {}).get("VLLM_MLA_DISABLE")
        for r in rep["rows"]:
            removed = lambda part: "-" if r is hf else f"{1 - r[part]['k3'] / hf[part]['k3']:.0%}"  # noqa: E731
            regions = "-" if r.get("regions") is None else ",".join(r["regions"])
            rows.append([rep["model"]["family"], rep["engine"]["mode"] + (" (MLA off)" if mla == "1" else ""), attn,
                         f"`{r['side']}`", regions, f"{r['prefill']['equal']:.3%}", f"{r['prefill']['k3']:.2e}",
                         removed("prefill"), f"{r['prefill']['max_abs']:.3g}", f"{r['decode']['k3']:.2e}",
                         removed("decode")])
    return _table(["family", "engine mode", "training attention", "side", "regions", "prefill bit-equal", "prefill k3",
                   "prefill k3 removed", "prefill max abs dlogp", "decode k3", "decode k3 removed"], rows)


def calibration_table(root: Path, folder: Path = EVENING, call: str = "gptoss-default",
                      stem: str = "calibrate-gptoss-h2880-default") -> str:
    """The points ``rla calibrate --live`` changed from its start row: start, found, and the found row's prefill k3
    with that point flipped back (the report's ``flips``); then the two rows' scores."""
    rep = _json(root, folder / "runs" / call / f"{stem}.report.json")
    start, best = rep["start_score"]["points"], rep["best"]
    rows = [[f"`{p}`", start[p], f"**{best[p]}**", f"{rep['flips'][p]['prefill_k3']:.2e}"]
            for p in best if best[p] != start[p]]
    rows.append(["(the whole row)", f"{rep['start_score']['prefill']['k3']:.2e}", f"**{rep['score']['prefill']['k3']:.2e}**", "-"])
    return _table(["point", f"`{rep['start']}`", "found", "found row with this point flipped back (prefill k3)"], rows)


def flips_table(root: Path, folder: Path = DEC3, call: str = "gemma4-calibrate-default",
                stem: str = "calibrate-gemma4-h2560-default") -> str:
    """Every point of a ``rla calibrate --live`` report: the start row's value, the found row's, and the found
    row's prefill k3 with the point flipped to its other value (or why that value could not be scored)."""
    rep = _json(root, folder / "runs" / call / f"{stem}.report.json")
    start, best = rep["tried"][0]["points"], rep["best"]  # the first row tried is the start, its variant points too
    rows = []
    for p, flip in rep["flips"].items():
        k3 = f"{flip['prefill_k3']:.3e}" if "prefill_k3" in flip else "not scored: " + flip.get("error", "?")
        # a variant point (the flip names its kind) is not among the found row's points: its value is the other choice
        found = best.get(p) or next(v for v in VARIANT_POINTS[p] if v != flip["other"])
        rows.append([f"`{p}`" + (f" ({flip['kind']})" if flip.get("kind") else ""), start[p], found, f"{flip['other']}: {k3}"])
    rows.append(["(the whole row)", f"{rep['start_score']['prefill']['k3']:.3e}", f"{rep['score']['prefill']['k3']:.3e}", "-"])
    return _table(["point", f"`{rep['start']}`", "found", "found row with the point flipped (prefill k3)"], rows)


def twin_table(root: Path, call: str, folder: Path = TWINS) -> str:
    """``lab/bench/twin_families.py``'s summary of one twin call's ``twin_families.json``."""
    sys.path.insert(0, str(ROOT / "lab" / "bench"))
    import twin_families

    return twin_families.summarize(root / folder / "runs" / call / "families" / "twin_families.json").strip("\n")


def junit_table(root: Path, files: tuple[str, ...] = ("gpu_tests.xml",), folder: Path = GPU_TESTS) -> str:
    """Per test file of a pytest ``--junitxml`` report: passed, failed, errors, skipped; then the items not passed."""
    import xml.etree.ElementTree as ET

    counts, bad = {}, []
    for name in files:
        for case in ET.parse(root / folder / "runs" / name).iter("testcase"):
            where = case.get("classname").replace(".", "/") + ".py"
            status = next((c.tag for c in case if c.tag in ("failure", "error", "skipped")), "passed")
            counts.setdefault(where, dict.fromkeys(("passed", "failure", "error", "skipped"), 0))[status] += 1
            if status in ("failure", "error"):
                bad.append(f"- {status}: `{where}::{case.get('name')}`")
    rows = [[f"`{w}`", *map(str, c.values())] for w, c in counts.items()]
    rows.append(["(all)", *(str(sum(c[k] for c in counts.values())) for k in ("passed", "failure", "error", "skipped"))])
    table = _table(["test file", "passed", "failed", "errors", "skipped"], rows)
    return table + ("\n\n" + "\n".join(bad) if bad else "")


def printed_live_table(root: Path, folder: Path = CURRENT, call: str = "rescore-default") -> str:
    """Each row's prefill and decode k3 removed, per family, from the tables the verify calls printed
    (``verify-tables.md``: ``=== verify <mode> <model>``, then the side table), beside the last scoring's
    ``report.json`` of the same engine outputs (``RESCORE``)."""
    text = (root / folder / "runs" / call / "verify-tables.md").read_text()
    rows = []
    for mode, model, body in re.findall(r"=== verify (\w+) (\S+) .*?\n(.*?)\n\n", text, re.S):
        c = next(c for m, md, c in RESCORE_RUNS if (m, md) == (model, mode))
        last = _json(root, RESCORE / "runs" / c / f"verify-{model}-{mode}" / "report.json")
        before = {r["side"]: r for r in last["rows"]}
        was = lambda side, part: f"{1 - before[side][part]['k3'] / before['hf'][part]['k3']:.0%}"  # noqa: E731
        for line in body.splitlines():
            if not line.startswith("| ") or line.startswith("| side"):
                continue
            side, eq, k3, removed, _, _, _, dremoved, _ = (c.strip() for c in line.strip("|").split("|"))
            rows.append([last["model"]["family"], f"`{side}`", eq, k3,
                         "-" if side == "hf" else f"{removed} ({was(side, 'prefill')})",
                         "-" if side == "hf" else f"{dremoved} ({was(side, 'decode')})"])
    return _table(["family", "row", "prefill bit-equal", "prefill k3", "k3 removed (last scoring)",
                   "decode k3 removed (last scoring)"], rows)


_TWIN_LINE = re.compile(r"^(\S+)\s+(default|eager)\s+(\S+)\s+(\S+)\s+eq=([\d.]+)% k3=(\S+) kl=(\S+) layers=\[([^]]*)\]")


def _twin_lines(path: Path):
    """``twin_families.py``'s per-side lines of a ``families.log``, each as (mode, shape, side, eq, k3, kl, layers):
    the logged strings (``eq`` without its ``%``, ``layers`` the list of each layer stream's fraction bit-equal)."""
    for line in path.read_text().splitlines():
        if m := _TWIN_LINE.match(line):
            yield (*m.group(2, 3, 4, 5, 6, 7), m.group(8).split(","))


def twin_log_table(root: Path, mode: str, shape: str, folder: Path = GEMMA4_TWIN) -> str:
    """One mode and shape of a twin call's ``families.log`` (``twin_families.py``'s per-side lines)."""
    rows = [[f"`{side}`", f"{float(eq):.2f}%", k3, kl, ", ".join(f"{float(v):.3f}" for v in layers)]
            for md, sh, side, eq, k3, kl, layers in _twin_lines(root / folder / "runs" / "families.log")
            if (md, sh) == (mode, shape)]
    return _table(["side", "bit-equal", "k3", "KL", "layer streams bit-equal"], rows)


def twin_calls_table(root: Path, folder: Path, calls: tuple[str, ...], sides: tuple[str, ...] = ("hf", "rla")) -> str:
    """Each call's twin lines (``runs/<call>/families.log``) of ``sides``, every mode and shape: logits bit-equal, k3,
    KL and the first layer's output stream."""
    rows = [[call, md, sh, f"`{side}`", f"{eq}%", k3, kl, layers[0].strip()]  # as logged
            for call in calls
            for md, sh, side, eq, k3, kl, layers in _twin_lines(root / folder / "runs" / call / "families.log")
            if side in sides]
    return _table(["call", "mode", "batch x tokens @ first position", "side", "logits bit-equal", "k3", "KL",
                   "layer 0 stream bit-equal"], rows)


def probe_table(root: Path, folder: Path = GPTOSS_GAP, kinds: tuple[str, ...] = ("stage",), run: str = "probe") -> str:
    """``gptoss_gap_probe.json``'s rows of one kind: the per-layer stages (``stage``), the ``isolated`` ops on
    the twin's own inputs, the tables, or the ``kernels``; each with its fraction bit-equal and max |d|."""
    rep = _json(root, folder / "runs" / run / "gptoss_gap_probe.json")

    def kind(stage: str) -> str:
        head = stage.split(":")[0]
        return head if head in ("tables", "isolated") else "kernels" if head.startswith("kernels") else "stage"

    rows = [[r["stage"], "-" if r["layer"] is None else r["layer"], f"{r['equal']:.4%}", f"{r['max_abs']:.3g}"]
            + ([f"{r['rows_with_diff']:.2%}"] if "kernels" in kinds else [])
            for r in rep["rows"] if kind(r["stage"]) in kinds]
    return _table(["stage", "layer", "bit-equal", "max abs d"] + (["rows with a difference"] if "kernels" in kinds else []),
                  rows)


BLOCKS = {
    KERNELS / "README.md": {"tests-table": tests_table, "gelu-table": gelu_table, "e2e-table": e2e_table,
                            "dispatch-table": dispatch_table, "traffic-table": traffic_table,
                            "prediction": prediction_text},
    LIVE / "README.md": {"live-table": live_table},
    MOE_LIVE / "README.md": {"moe-live-table": moe_live_table},
    EVENING / "README.md": {"evening-live-table": lambda root: moe_live_table(root, EVENING, EVENING_RUNS),
                            "evening-calibration-table": calibration_table},
    DEC3 / "README.md": {"dec3-live-table": lambda root: moe_live_table(root, DEC3, DEC3_RUNS),
                         "dec3-flips-table": flips_table},
    RESCORE / "README.md": {
        "rescore-live-table": lambda root: moe_live_table(root, RESCORE, RESCORE_RUNS),
        **{f"rescore-flips-{m}": (lambda root, m=m: flips_table(root, RESCORE, "rescore-default", f"calibrate-{m}-default"))
           for m in ("gemma4-h2560", "qwen35-h2048", "glm4moe-h2048")}},
    TWINS / "README.md": {"twin-three-families": lambda root: twin_table(root, "three-families"),
                          "twin-qwen35": lambda root: twin_table(root, "qwen35")},
    TWINS_1205 / "README.md": {"twin-gemma4-qwen35moe": lambda root: twin_table(root, "gemma4-qwen35moe", TWINS_1205)},
    GPU_TESTS / "README.md": {"gpu-tests-table": junit_table},
    CURRENT / "README.md": {
        "current-live-table": printed_live_table,
        **{f"current-flips-{m}": (lambda root, m=m: flips_table(root, CURRENT, "rescore-default", f"calibrate-{m}-default"))
           for m in ("glm4moe-h2048", "qwen35-h2048")}},
    GPTOSS_GAP / "README.md": {
        "gptoss-probe-stages": probe_table,
        "gptoss-probe-isolated": lambda root: probe_table(root, kinds=("tables", "isolated")),
        "gptoss-probe-kernels": lambda root: probe_table(root, kinds=("kernels",)),
        "gptoss-gpu-tests": lambda root: junit_table(root, ("gpu_tests.xml", "gpu_ops.xml"), GPTOSS_GAP)},
    QUOTIENT / "README.md": {
        "quotient-kernels": lambda root: probe_table(root, QUOTIENT, ("kernels",), "first/probe"),
        "quotient-stages-512": lambda root: probe_table(root, QUOTIENT, ("stage",), "first/probe"),
        "quotient-2048-first": lambda root: probe_table(root, QUOTIENT, ("tables", "isolated"), "first/probe2048"),
        "quotient-2048-second": lambda root: probe_table(root, QUOTIENT, ("stage", "tables", "isolated"),
                                                         "second/probe2048"),
        "quotient-twin": lambda root: twin_calls_table(root, QUOTIENT, ("first", "second")),
        "quotient-gpu-tests": lambda root: junit_table(
            root, ("first/gpu_tests.xml", "first/gpu_ops.xml", "second/gpu_rope.xml"), QUOTIENT)},
    QWEN35MOE / "README.md": {"qwen35moe-live-table": lambda root: moe_live_table(root, QWEN35MOE, QWEN35MOE_RUNS)},
    GEMMA4_TWIN / "README.md": {f"gemma4-twin-{mode}-{shape.replace('@', '-at-')}": (
        lambda root, mode=mode, shape=shape: twin_log_table(root, mode, shape))
        for mode, shape in (("default", "1x512@0"), ("default", "1x2048@0"), ("default", "2x512@20000"), ("eager", "1x512@0"))},
}


def blocks(text: str) -> dict[str, str]:
    return {m.group(1): m.group(2).strip("\n") for m in re.finditer(r"<!-- ([a-z0-9-]+) -->\n(.*?)<!-- /\1 -->", text, re.S)}


def render(root: Path = ROOT) -> dict[Path, dict[str, str]]:
    return {readme: {name: fn(root) for name, fn in fns.items()} for readme, fns in BLOCKS.items()}


def write(root: Path = ROOT) -> None:
    for readme, new in render(root).items():
        path = root / readme
        text = path.read_text()
        for name, body in new.items():
            text, n = re.subn(rf"<!-- {name} -->\n.*?<!-- /{name} -->", lambda m: f"<!-- {name} -->\n{body}\n<!-- /{name} -->",
                              text, flags=re.S)
            if n != 1:
                raise SystemExit(f"{readme}: no single <!-- {name} --> block")
        path.write_text(text)


def main(argv: list[str]) -> int:
    if "--write" in argv:
        write()
    for readme, new in render().items():
        for name, body in new.items():
            print(f"== {readme} {name}\n{body}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
