"""Mutation check over the core modules: does the suite catch small, plausible bugs?

    python lab/mutation/mutation_check.py                 # every mutation, report to results/mutation_report.md
    python lab/mutation/mutation_check.py --only swiglu   # the mutations whose name contains "swiglu"

Each mutation below is one exact text replacement in one source file (a bug someone could write:
a biased gradient, a wrong denominator, a check left out), paired with the test files that cover
that module. The script copies ``src/``, ``tests/`` and ``pyproject.toml`` to a temporary folder
(the working tree is never modified), first runs each set of paired test files on the unmutated copy (a set that fails there would
"kill" every mutation: its mutations are reported "baseline fails", never counted as killed), then
applies one mutation at a time, runs ``pytest -x -q -p no:cacheprovider`` on the paired test files
and records whether the suite failed ("killed") or passed ("SURVIVED"). A replacement whose text is no longer in the file is
reported as "stale" (the code moved; update the list), never skipped silently, and the script
exits non-zero when any mutation survives or is stale.

Why a fixed list rather than mutmut/cosmic-ray: both generate thousands of operator swaps over
these modules, most of them equivalent or in error messages; at ~5-60 s of pytest per mutant on a
2-core machine that is hours, and their reports need triage by hand. A named list keeps each
mutant meaningful (the four from issue #21 are here by name) and the run to a few minutes. It is
a tool run by hand (``nice -n 10``), not part of CI.
"""

from __future__ import annotations

import argparse
import datetime
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Mutation:
    name: str
    path: str  # relative to the repository root
    old: str
    new: str
    tests: tuple[str, ...]
    why: str


OPS_TESTS = ("tests/ops/test_backward_oracle.py", "tests/ops/test_ops.py")
MODEL_ULP_TESTS = ("tests/alignment/test_align_one_ulp.py", "tests/engines/test_vllm_twin_one_ulp.py")
TWIN_ULP_TESTS = ("tests/engines/test_vllm_twin_one_ulp.py",)
MUTATIONS = [
    # --- reference ops (issue #21: the first two)
    Mutation("swiglu-gate-grad-bias-2^-11", "src/rla/ops/reference.py",
             "dgate = (dyf * uf * (sig * (1.0 + gf * (1.0 - sig)))).to(gate.dtype)",
             "dgate = (dyf * uf * (sig * (1.0 + gf * (1.0 - sig))) * (1 + 2**-11)).to(gate.dtype)",
             OPS_TESTS, "a 2^-11 relative bias in SwiGLU's gate gradient (issue #21)"),
    Mutation("rope-backward-ignores-cos-sin-rounding", "src/rla/ops/reference.py",
             "c, s = _rope_tables(cos, sin, ctx.lp, ctx.round_cos_sin)", "c, s = cos.float(), sin.float()",
             OPS_TESTS, "RoPE backward with the fp32 tables where the forward rounded them (issue #21)"),
    Mutation("swiglu-up-grad-uses-rounded-silu", "src/rla/ops/reference.py",
             "dup = (dyf * silu).to(up.dtype)", "dup = (dyf * silu.to(dy.dtype).float()).to(up.dtype)",
             OPS_TESTS, "the up gradient reads RN(silu) instead of the straight-through silu"),
    Mutation("norm-backward-drops-mean-term", "src/rla/ops/reference.py",
             "dv = rstd * (dyw - n * (dyw * n).mean(-1, keepdim=True))", "dv = rstd * dyw",
             OPS_TESTS, "RMSNorm backward without the projection term"),
    Mutation("add-norm-residual-grad-dropped", "src/rla/ops/reference.py",
             "            dv = dv + dresidual.float()", "            dv = dv",
             OPS_TESTS, "add+norm backward ignores the gradient of the residual output"),
    Mutation("norm-weight-not-rounded", "src/rla/ops/reference.py",
             "        return weight.to(lp).float()", "        return weight.float()",
             OPS_TESTS, "an fp32 master weight used unrounded (the engine's copy is RN(w))"),
    Mutation("swiglu-per-op-not-rounded", "src/rla/ops/reference.py",
             "        if per_op:\n            a = _rn(a, lp)", "        if False:\n            a = _rn(a, lp)",
             OPS_TESTS, "per_op SwiGLU forward skips the activation's rounding"),
    # --- diagnosis report (issue #21: the third)
    Mutation("report-share-of-removed-k3", "src/rla/diagnosis/report.py",
             "{phi / none_k3:.1%} | {d.attribution",
             "{phi / (none_k3 * (1 - d.unexplained['mismatch/k3'])):.1%} | {d.attribution",
             ("tests/diagnosis/test_report_numbers.py",), "share divided by the removed k3, not the total (issue #21)"),
    Mutation("explain-share-of-removed-k3", "src/rla/diagnosis/report.py",
             "ranked[0][1] / none[\"mismatch/k3\"] if", "ranked[0][1] / (none[\"mismatch/k3\"] - full[\"mismatch/k3\"]) if",
             ("tests/diagnosis/test_report_numbers.py",), "the explanation's share of the removed k3"),
    # --- attribution
    Mutation("shapley-weight-off-by-one", "src/rla/diagnosis/attribution.py",
             "factorial(n - len(s) - 1) / factorial(n)", "factorial(n - len(s)) / factorial(n)",
             ("tests/diagnosis/test_attribution.py",), "wrong Shapley coalition weight"),
    # --- metrics
    Mutation("k3-taylor-missing-term", "src/rla/metrics.py",
             "s * (1 / 6 + s * (1 / 24", "s * (1 / 5 + s * (1 / 24",
             ("tests/test_metrics.py",), "k3's small-delta series with a wrong coefficient"),
    Mutation("clip-leak-one-sided", "src/rla/metrics.py",
             "np.mean((rho < 1 - eps) | (rho > 1 + eps))", "np.mean(rho > 1 + eps)",
             ("tests/test_metrics.py",), "clip leak counting only ratios above the range"),
    # --- rollout records (issue #21: the fourth, two mutations)
    Mutation("rollout-number-not-finite-checked", "src/rla/rollout/rollouts.py",
             "        return _is_number(v) and math.isfinite(v)", "        return _is_number(v)",
             ("tests/rollout/test_rollout_fields.py", "tests/rollout/test_rollouts.py"), "1e999 (inf) accepted in numeric fields (issue #21)"),
    Mutation("rollout-prompt-ids-not-vocab-checked", "src/rla/rollout/rollouts.py",
             'out["prompt_ids"] = _ids("prompt_ids", d["prompt_ids"], vocab_size)',
             'out["prompt_ids"] = _ids("prompt_ids", d["prompt_ids"], None)',
             ("tests/rollout/test_rollout_fields.py", "tests/rollout/test_rollouts.py"), "prompt_ids never checked against vocab_size (issue #21)"),
    Mutation("rollout-top-p-above-one", "src/rla/rollout/rollouts.py",
             "if not 0 < out[\"top_p\"] <= 1:", "if not 0 < out[\"top_p\"]:",
             ("tests/rollout/test_rollout_fields.py", "tests/rollout/test_rollouts.py"), "top_p > 1 accepted"),
    # --- alignment
    Mutation("unalign-leaves-one-module", "src/rla/alignment/core.py",
             "    for m in patched:\n        uninstall(m)", "    for m in patched[1:]:\n        uninstall(m)",
             ("tests/alignment/test_align_models.py",), "unalign restores all but one patched module"),
    Mutation("aligned-swiglu-hf-profile", "src/rla/alignment/swiglu.py",
             "return self.down_proj(swiglu(self.gate_proj(x), self.up_proj(x), profile))",
             "return self.down_proj(swiglu(self.gate_proj(x), self.up_proj(x), \"hf\"))",
             ("tests/alignment/test_align_spec.py", "tests/alignment/test_align_models.py"), "the dense MLP ignores the profile"),
    # --- the points added with the calibrated profiles
    Mutation("fp32-carry-reads-the-rounded-sum", "src/rla/alignment/rmsnorm.py",
             "out = carry_add(attn_out, residual, mlp_out, torch.float32 if fp32_sum else lp)",
             "out = carry_add(rounded, torch.zeros_like(rounded), mlp_out, torch.float32 if fp32_sum else lp)",
             ("tests/alignment/test_align_models.py",), "residual_stream='fp32_carry' silently carries RN(a + r)"),
    Mutation("qk-chain-rounds-the-norm-output", "src/rla/ops/reference.py",
             "return _norm_fwd(v, rstd, _engine_weight(weight, lp), lp, per_op, out_dtype)",
             "return _norm_fwd(v, rstd, _engine_weight(weight, lp), lp, per_op, out_dtype).to(lp).to(out_dtype or lp)",
             ("tests/alignment/test_align_models.py",), "qk_norm_out='fp32' rounds the q/k-norm output before RoPE anyway"),
    Mutation("moe-out-layer-rounds-the-fp32-sum", "src/rla/alignment/rmsnorm.py",
             "        if not fp32_moe:\n            mlp_out = mlp_out.to(lp)", "        mlp_out = mlp_out.to(lp)",
             ("tests/alignment/test_align_moe_out.py",), "moe_out='fp32': the layer rounds the block's sum anyway"),
    Mutation("moe-out-block-rounds-the-sum", "src/rla/alignment/moe_out.py",
             "return routed.float() + self.shared_experts(hidden_states).float()",
             "return (routed + self.shared_experts(hidden_states)).float()",
             ("tests/alignment/test_align_moe_out.py",), "moe_out='fp32': GLM-4 MoE's block rounds shared + routed"),
    Mutation("moe-out-router-rounds-the-output-scale", "src/rla/alignment/router.py",
             "out = out * torch.tensor(scale, dtype=torch.float32)",
             "out = (out * torch.tensor(scale, dtype=torch.float32)).to(x.dtype).float()",
             ("tests/alignment/test_align_moe_out.py",), "moe_out='fp32' under the router region: the routed scale rounded"),
    # --- the norms' reduction order (issue #20)
    Mutation("vllm-block-pair-sums-in-another-order", "src/rla/ops/reduction.py",
             "s = s + (sq[:, r, :, j] + sq[:, r, :, j + 1])",
             "s = (s + sq[:, r, :, j]) + sq[:, r, :, j + 1]",
             ("tests/ops/test_reduction.py",), "the add + norm kernel's vector pair sums added one square at a time"),
    Mutation("vllm-block-warps-summed-by-torch", "src/rla/ops/reduction.py",
             "    total = warp_sums[:, 0]\n    for w in range(1, tree.warps):\n        total = total + warp_sums[:, w]\n",
             "    total = warp_sums.sum(-1)\n",
             ("tests/ops/test_reduction.py",), "the warps' sums added in PyTorch's order instead of warp order"),
    # --- one ulp (issue #37): inputs built so that a one-ulp change of the arithmetic flips outputs
    Mutation("ulp-norm-rstd-one-over-sqrt", "src/rla/ops/reference.py",
             "return torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + eps)",
             "return 1 / torch.sqrt(v.pow(2).mean(-1, keepdim=True) + eps)",
             ("tests/ops/test_one_ulp.py",), "the reference norm's rstd as 1/sqrt (one fp32 ulp in 0.6% of rows)"),
    Mutation("ulp-carry-add-reordered", "src/rla/ops/reference.py",
             "return ((x.float() + residual.float()) + m.float()).to(out_dtype)",
             "return (x.float() + (residual.float() + m.float())).to(out_dtype)",
             ("tests/ops/test_one_ulp.py",), "fp32_carry's add as x + (r + m): equal unless a partial sum is inexact"),
    Mutation("ulp-rope-attention-scaling-dropped", "src/rla/alignment/rope.py",
             "    if self.attention_scaling != 1.0:\n        cos, sin = cos * self.attention_scaling",
             "    if False:\n        cos, sin = cos * self.attention_scaling",
             ("tests/alignment/test_align_rope.py",), "the aligned rotary drops YaRN's / longrope's attention factor"),
    Mutation("ulp-rope-recomputed-attention-scaling-dropped", "src/rla/alignment/rope.py",
             'attrs["attention_scaling"] = scaling', 'attrs["attention_scaling"] = 1.0',
             ("tests/alignment/test_align_rope.py",), "recomputing a cast model's fp32 frequencies resets the attention factor"),
    # --- one ulp at the aligned-model and CPU-twin level (issue #37): the same kind of change, run
    # against the planted models only (tests/ulp_models.py), never the op tests
    Mutation("ulp-model-norm-rstd-one-over-sqrt", "src/rla/ops/reference.py",
             "return torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + eps)",
             "return 1 / torch.sqrt(v.pow(2).mean(-1, keepdim=True) + eps)",
             MODEL_ULP_TESTS, "the reference norm's rstd as 1/sqrt, seen in an aligned model's logits"),
    Mutation("ulp-model-carry-add-reordered", "src/rla/ops/reference.py",
             "return ((x.float() + residual.float()) + m.float()).to(out_dtype)",
             "return (x.float() + (residual.float() + m.float())).to(out_dtype)",
             MODEL_ULP_TESTS, "fp32_carry's add as a + (r + m), seen through layer 1's norm"),
    Mutation("ulp-model-fp32-carry-reads-the-rounded-sum", "src/rla/alignment/rmsnorm.py",
             "out = carry_add(attn_out, residual, mlp_out, torch.float32 if fp32_sum else lp)",
             "out = carry_add(rounded, torch.zeros_like(rounded), mlp_out, torch.float32 if fp32_sum else lp)",
             MODEL_ULP_TESTS, "residual_stream='fp32_carry' carries RN(a + r)"),
    Mutation("ulp-model-silu-as-x-sigmoid", "src/rla/ops/reference.py",
             "a = F.silu(gate.float())", "a = gate.float() * torch.sigmoid(gate.float())",
             MODEL_ULP_TESTS, "SwiGLU's silu as x * sigmoid(x): one fp32 ulp in ~24% of gates"),
    Mutation("ulp-model-swiglu-fused-rounds-the-activation", "src/rla/ops/reference.py",
             "        if per_op:\n            a = _rn(a, lp)", "        if True:\n            a = _rn(a, lp)",
             MODEL_ULP_TESTS, "fused SwiGLU rounds silu to bf16 before the product (a rounding moved in)"),
    Mutation("ulp-model-rope-tables-through-fp64", "src/rla/alignment/rope.py",
             "cos, sin = freqs.cos(), freqs.sin()",
             "cos, sin = freqs.double().cos().float(), freqs.double().sin().float()",
             MODEL_ULP_TESTS, "the aligned rotary's cos/sin correctly rounded: one fp32 ulp in ~5% of entries"),
    Mutation("ulp-model-rope-rounds-one-product", "src/rla/ops/reference.py",
             "        out = xf * c + _rot(xf) * s", "        out = _rn(xf * c, lp) + _rot(xf) * s",
             MODEL_ULP_TESTS, "fused RoPE rounds x*cos to bf16 before the sum (a rounding moved in)"),
    Mutation("ulp-model-qk-norm-product-reassociated", "src/rla/ops/reference.py",
             "out = w * _rn(n, lp) if per_op else n * w", "out = w * _rn(n, lp) if per_op else v * (rstd * w)",
             MODEL_ULP_TESTS, "a fused norm's product as v * (rstd * w): its fp32 q/k output feeds RoPE"),
    Mutation("ulp-model-qk-chain-rounds-the-norm-output", "src/rla/ops/reference.py",
             "return _norm_fwd(v, rstd, _engine_weight(weight, lp), lp, per_op, out_dtype)",
             "return _norm_fwd(v, rstd, _engine_weight(weight, lp), lp, per_op, out_dtype).to(lp).to(out_dtype or lp)",
             MODEL_ULP_TESTS, "qk_norm_out='fp32' rounds the q/k-norm output before RoPE"),
    # the same changes against the CPU twin's one-ulp test alone: the engine's own code sees them
    Mutation("ulp-twin-norm-rstd-one-over-sqrt", "src/rla/ops/reference.py",
             "return torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + eps)",
             "return 1 / torch.sqrt(v.pow(2).mean(-1, keepdim=True) + eps)",
             TWIN_ULP_TESTS, "the reference norm's rstd as 1/sqrt: the aligned model leaves vLLM's compiled norm"),
    Mutation("ulp-twin-carry-add-reordered", "src/rla/ops/reference.py",
             "return ((x.float() + residual.float()) + m.float()).to(out_dtype)",
             "return (x.float() + (residual.float() + m.float())).to(out_dtype)",
             TWIN_ULP_TESTS, "fp32_carry's add as a + (r + m): not the order Inductor adds in"),
    Mutation("ulp-twin-qk-norm-product-reassociated", "src/rla/ops/reference.py",
             "out = w * _rn(n, lp) if per_op else n * w", "out = w * _rn(n, lp) if per_op else v * (rstd * w)",
             TWIN_ULP_TESTS, "a fused norm's product as v * (rstd * w): the twin's q/k norm output differs"),
    # --- thresholds at their edges (issue #37)
    Mutation("edge-detection-se-11x-small", "src/rla/diagnosis/core.py",
             'se = diff.std(ddof=1) / math.sqrt(n) if n > 1 else float("inf")',
             'se = diff.std(ddof=1) / math.sqrt(n) / 11 if n > 1 else float("inf")',
             ("tests/diagnosis/test_thresholds.py",), "profile detection's standard error 11x too small: calls too close to call"),
    Mutation("edge-detection-calls-at-1.5-se", "src/rla/diagnosis/core.py",
             "    if not z > 2:", "    if not z > 1.5:",
             ("tests/diagnosis/test_thresholds.py",), "detection calls at 1.5 standard errors instead of 2"),
    Mutation("edge-beyond-rounding-factor-100", "src/rla/diagnosis/scale.py",
             "FAR = 10.0", "FAR = 100.0",
             ("tests/diagnosis/test_thresholds.py",), "'beyond rounding' only past 100x the rounding scale"),
    Mutation("edge-grad-spike-on-the-mean", "src/rla/metrics.py",
             "elif prev.size and gn[t] > grad_factor * float(np.median(prev)):",
             "elif prev.size and gn[t] > grad_factor * float(np.mean(prev)):",
             ("tests/diagnosis/test_thresholds.py",), "the collapse signal's grad spike against the running mean, not the median"),
    # --- experiment summaries (issue #21: the table's ± was the population std)
    Mutation("summary-std-population", "src/rla/rl/experiment_summary.py",
             "std = float(vals.std(ddof=1)) if vals.size > 1 else None", "std = float(vals.std()) if vals.size > 1 else None",
             ("tests/rl/test_summary_stats.py",), "the std over seeds is the population std (ddof=0), not the sample std"),
    Mutation("final-reward-window-short-by-one", "src/rla/rl/runlog.py",
             '"final_reward": _mean(rewards[-window:]),', '"final_reward": _mean(rewards[-window + 1:]),',
             ("tests/rl/test_grpo.py",), "final reward averages the last window - 1 steps"),
]


def _run_pytest(tree: Path, tests: tuple[str, ...]) -> tuple[bool, float, str]:
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *tests],
                          cwd=tree, capture_output=True, text=True)
    tail = (proc.stdout.strip().splitlines() or [""])[-1]
    return proc.returncode != 0, time.monotonic() - t0, tail


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default=None, help="run the mutations whose name contains this")
    ap.add_argument("--report", default=str(ROOT / "results" / "mutation_report.md"), help="Markdown report path")
    args = ap.parse_args(argv)
    chosen = [m for m in MUTATIONS if args.only is None or args.only in m.name]
    if not chosen:
        raise SystemExit(f"no mutation name contains {args.only!r}; names: {', '.join(m.name for m in MUTATIONS)}")
    for m in chosen:  # bad input fails before any copying or pytest
        if not (ROOT / m.path).is_file() or any(not (ROOT / t).is_file() for t in m.tests):
            raise SystemExit(f"{m.name}: {m.path} or one of {m.tests} does not exist")
    rows = []
    with tempfile.TemporaryDirectory(prefix="rla-mutation-") as tmp:
        tree = Path(tmp)
        shutil.copytree(ROOT / "src", tree / "src", ignore=shutil.ignore_patterns("__pycache__"))
        shutil.copytree(ROOT / "tests", tree / "tests", ignore=shutil.ignore_patterns("__pycache__"))
        shutil.copy2(ROOT / "pyproject.toml", tree / "pyproject.toml")
        baseline = {}
        for tests in dict.fromkeys(m.tests for m in chosen):
            failed, secs, tail = _run_pytest(tree, tests)
            baseline[tests] = not failed
            print(f"baseline {', '.join(tests)}: {'passes' if not failed else 'FAILS'} ({secs:.0f} s: {tail})", flush=True)
        for m in chosen:
            if not baseline[m.tests]:
                rows.append((m, "baseline fails", 0.0, ""))
                continue
            target = tree / m.path
            original = target.read_text()
            count = original.count(m.old)
            if count != 1:
                rows.append((m, "stale" if count == 0 else f"ambiguous ({count} matches)", 0.0, ""))
                print(f"{m.name}: {rows[-1][1]}", flush=True)
                continue
            target.write_text(original.replace(m.old, m.new))
            try:
                failed, secs, tail = _run_pytest(tree, m.tests)
            finally:
                target.write_text(original)
            rows.append((m, "killed" if failed else "SURVIVED", secs, tail))
            print(f"{m.name}: {rows[-1][1]} ({secs:.0f} s: {tail})", flush=True)
    _write_report(Path(args.report), rows, argv, baseline)
    return 0 if all(r[1] == "killed" for r in rows) else 1


def _write_report(path: Path, rows, argv, baseline: dict) -> None:
    import torch

    try:
        import transformers
        tf = transformers.__version__
    except ImportError:
        tf = "not installed"
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    survived = [m.name for m, status, _, _ in rows if status != "killed"]
    lines = [
        "# Mutation check: latest report",
        "",
        f"- GPU: none (CPU: {platform.machine()}, {platform.system()})",
        f"- Versions: python {platform.python_version()}, torch {torch.__version__}, transformers {tf}",
        f"- Date: {datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds')}",
        f"- Command: `python lab/mutation/mutation_check.py{' ' + ' '.join(argv) if argv else ''}` (at commit {commit or 'unknown'})",
        "",
        f"{sum(r[1] == 'killed' for r in rows)} of {len(rows)} mutations killed; "
        + (f"surviving or stale: {', '.join(survived)}." if survived else "none survives."),
        f"Baseline (each paired test set on the unmutated copy): {sum(baseline.values())} of {len(baseline)} pass"
        + ("." if all(baseline.values()) else f"; failing: {'; '.join(', '.join(t) for t, ok in baseline.items() if not ok)}."),
        "",
        "| mutation | file | status | pytest time (s) | tests | what it breaks |",
        "|---|---|---|---|---|---|",
    ]
    for m, status, secs, _ in rows:
        lines.append(f"| {m.name} | `{m.path}` | {status} | {secs:.0f} | {', '.join(f'`{t}`' for t in m.tests)} | {m.why} |")
    path.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
