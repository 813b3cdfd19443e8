"""The numbers of the experiment READMEs, recomputed from each folder's files (used by
``lab/checks/check_experiments.py``, which pairs each function with the README text it checks).

GRPO folders are read as ``rla experiment GRID --out DIR --summarize-only`` reads them: the grid
(``rla.rl.grid.load_grid``), each run's log (``rla.rl.runlog.read_log``), its summary
(``rla.rl.runlog.summarize`` with the run's own ``collapse_window``) and the statistics over seeds
(``rla.rl.experiment_summary.stats``: mean, **sample** std with ddof=1). Demo folders are read from
their ``report.json``. Each statistic is named with its check in ``check_experiments.py``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

GRPO = "results/experiments/grpo_h200_2026-11-29"
PILOT = "results/experiments/grpo_h200_pilot_2026-11-29"
INVFREQ_CPU = "results/experiments/invfreq_is_cpu_2026-11-29"
LR3E5 = "results/experiments/lr3e5_cpu_2026-11-29"
SFT = "results/experiments/sft_warmstart"
DEMO_CPU = "results/experiments/demo_2k_cpu_2026-11-29"
DEMO_H200 = "results/experiments/demo_2k_h200_2026-11-29"
DEMO_SHORT = "results/experiments/demo_h200_2026-11-29"
# the 123-token demo of 2026-11-29 (five-point `vllm` row); results/demo/ was rerun under vllm-0.33 since
OLD_DEMO = ("15055fd", "docs/demo/report.json")  # its path at that commit


def _rla(root: Path):
    if str(root / "src") not in sys.path:
        sys.path.insert(0, str(root / "src"))


# ---------------------------------------------------------------- GRPO folders

_RUNS: dict = {}


def runs(root: Path, folder: str) -> list[dict]:
    """Every run of the folder's grid that has a log: model, arm, seed, records, summary."""
    key = (str(root), folder)
    if key not in _RUNS:
        _rla(root)
        from rla.rl.grid import load_grid
        from rla.rl.runlog import read_log, summarize

        out = root / folder
        got = []
        for s in load_grid(out / "grid.yaml").runs(out):
            records = read_log(Path(s.config.out_dir) / "log.jsonl")
            if records:
                got.append({"model": s.model, "arm": s.arm, "seed": s.seed, "records": records,
                            **summarize(records, s.config.collapse_window)})
        _RUNS[key] = got
    return _RUNS[key]


def arm(root, folder, model, name):
    return [r for r in runs(root, folder) if r["model"] == model and r["arm"] == name]


def st(values):
    from rla.rl.experiment_summary import stats
    return stats(values)


def mean(values):
    return st(values)["mean"]


def grpo_row(rs):
    """step-0 k3, k3 over training, step-0 clip leak %, final reward mean and sample std, best, collapsed/n."""
    fr = st([r["final_reward"] for r in rs])
    return [mean([r["step0"]["k3"] for r in rs]), mean([r["mismatch_mean"]["k3"] for r in rs]),
            100 * mean([r["step0"]["clip_leak_0.2"] for r in rs]), [fr["mean"], fr["std"]],
            mean([r["best_reward"] for r in rs]), [sum(bool(r["collapse_events"]) for r in rs), len(rs)]]


def grpo_table(root):
    out = {}
    for model in ("qwen2-tiny", "qwen3-10m"):
        for name in ("bf16", "aligned", "rope", "fp16", "bf16-invfreq"):
            out[(model, name)] = grpo_row(arm(root, GRPO, model, name))
    return out


def _ratio(root, folder, model, num, den, kind):
    get = (lambda r: r["step0"]["k3"]) if kind == "step0" else (lambda r: r["mismatch_mean"]["k3"])
    return mean([get(r) for r in arm(root, folder, model, num)]) / mean([get(r) for r in arm(root, folder, model, den)])


def grpo_k3_step0_ratios(root):
    return [_ratio(root, GRPO, m, "bf16", "aligned", "step0") for m in ("qwen2-tiny", "qwen3-10m")]


def grpo_rope_removes(root):
    """100 (1 - rope/bf16), ratio of means: qwen2-tiny step 0, over training; qwen3-10m the same."""
    return [100 * (1 - _ratio(root, GRPO, m, "rope", "bf16", kind))
            for m in ("qwen2-tiny", "qwen3-10m") for kind in ("step0", "mean")]


def grpo_fp16_below_aligned(root):
    vals = [_ratio(root, GRPO, m, "aligned", "fp16", kind) for m in ("qwen2-tiny", "qwen3-10m") for kind in ("step0", "mean")]
    return [min(vals), max(vals)]


def grpo_bf16_gap(root):
    """min-max over both models and the three other ordinary arms of (arm mean - bf16 mean) final
    reward, and of that gap over the bf16 arm's sample std."""
    gaps, zs = [], []
    for m in ("qwen2-tiny", "qwen3-10m"):
        b = st([r["final_reward"] for r in arm(root, GRPO, m, "bf16")])
        for name in ("aligned", "rope", "fp16"):
            g = mean([r["final_reward"] for r in arm(root, GRPO, m, name)]) - b["mean"]
            gaps.append(g)
            zs.append(g / b["std"])
    return [min(gaps), max(gaps), min(zs), max(zs)]


def grpo_paired(root):
    out = []
    for m in ("qwen2-tiny", "qwen3-10m"):
        b = {r["seed"]: r["final_reward"] for r in arm(root, GRPO, m, "bf16")}
        a = {r["seed"]: r["final_reward"] for r in arm(root, GRPO, m, "aligned")}
        out += [a[s] - b[s] for s in sorted(b)]
    return out


def _first_below(records, level=0.05):
    return next(r["step"] for r in records if r["reward/mean"] < level)


def grpo_invfreq_fall(root):
    """min-max per model of the first step whose reward (the step's mean) is below 0.05."""
    out = []
    for m in ("qwen2-tiny", "qwen3-10m"):
        steps = [_first_below(r["records"]) for r in arm(root, GRPO, m, "bf16-invfreq")]
        out += [min(steps), max(steps)]
    return out


def grpo_zero_grad(root):
    """% of logged steps of the bf16-invfreq runs whose grad norm is exactly 0: qwen3-10m, qwen2-tiny."""
    out = []
    for m in ("qwen3-10m", "qwen2-tiny"):
        g = [rec["train/grad_norm"] for r in arm(root, GRPO, m, "bf16-invfreq") for rec in r["records"]
             if rec.get("train/grad_norm") is not None]
        out.append(100 * sum(x == 0 for x in g) / len(g))
    return out


def grpo_memory(root):
    """peak training memory (MB), mean over seeds: qwen2-tiny aligned, bf16; qwen3-10m aligned, bf16."""
    return [mean([r["peak_memory_mb"] for r in arm(root, GRPO, m, a)])
            for m in ("qwen2-tiny", "qwen3-10m") for a in ("aligned", "bf16")]


def grpo_aligned_spike(root):
    r = next(r for r in arm(root, GRPO, "qwen3-10m", "aligned") if r["collapse_events"])
    step = r["collapse_events"][0]["step"]
    k3 = next(rec["mismatch/k3"] for rec in r["records"] if rec["step"] == step)
    return [r["seed"], step, k3, k3 / r["step0"]["k3"], r["step0"]["k3"]]


# ---------------------------------------------------------------- pilot

PILOT_ARMS = {"bf16 (HF eager rounding)": "bf16", "aligned, all three regions": "aligned",
              "aligned, RoPE only": "rope", "fp16 trainer + fp16 engine": "fp16"}


def pilot_table(root):
    out = {}
    for label, name in PILOT_ARMS.items():
        rs = arm(root, PILOT, "qwen2-tiny", name)
        row = grpo_row(rs)
        events = [[r["seed"], r["collapse_events"][0]["step"]] for r in rs if r["collapse_events"]]
        out[(label,)] = row[:3] + [[mean([r["final_reward"] for r in rs]), row[4]], row[5] + sum(events, [])]
    return out


def pilot_ratios(root):
    """step-0 and over-training k3 ratio bf16 / aligned, and aligned / fp16 at step 0 (ratio of means)."""
    return [_ratio(root, PILOT, "qwen2-tiny", "bf16", "aligned", "step0"),
            _ratio(root, PILOT, "qwen2-tiny", "bf16", "aligned", "mean"),
            _ratio(root, PILOT, "qwen2-tiny", "aligned", "fp16", "step0")]


def pilot_reward(root):
    """mean over the 12 runs of the step-0 and of the final reward; the other arms' mean final reward
    (mean of arm means) - bf16's, and that gap / the bf16 arm's sample std."""
    rs = runs(root, PILOT)
    b = st([r["final_reward"] for r in arm(root, PILOT, "qwen2-tiny", "bf16")])
    others = mean([mean([r["final_reward"] for r in arm(root, PILOT, "qwen2-tiny", a)]) for a in ("aligned", "rope", "fp16")])
    return [mean([r["records"][0]["reward/mean"] for r in rs]), mean([r["final_reward"] for r in rs]),
            others - b["mean"], (others - b["mean"]) / b["std"]]


# ---------------------------------------------------------------- inv_freq / IS on the CPU

def _collapsed(r, level=0.05):
    """a 5-step (the run's window) trailing mean reward below ``level`` at some step"""
    rewards = [rec["reward/mean"] for rec in r["records"]]
    return any(sum(rewards[i - 4:i + 1]) / 5 < level for i in range(4, len(rewards)))


def invfreq_table(root):
    out = {}
    for label, name in (("plain (as on the H200)", "plain"), ("dualclip", "dualclip"), ("decoupled", "decoupled"),
                        ("tis", "tis"), ("mis", "mis")):
        rs = arm(root, INVFREQ_CPU, "qwen2-tiny", name)
        reward = [mean([r["records"][0]["reward/mean"] for r in rs]), mean([r["final_reward"] for r in rs])]
        if name == "mis":  # the dip: lowest trailing 5-step mean reward and its step
            rec = rs[0]["records"]
            trailing = [(sum(x["reward/mean"] for x in rec[i - 4:i + 1]) / 5, rec[i]["step"]) for i in range(4, len(rec))]
            reward += list(min(trailing))
        n = sum(_collapsed(r) for r in rs)
        collapsed = ("yes" if n else "no") if len(rs) == 1 else [n, len(rs)]
        out[(label,)] = [None, len(rs), reward, collapsed]
    return out


def invfreq_k3(root):
    """mean over runs of each run's k3 over training: decoupled + tis; plain + dualclip; mis."""
    def m(*names):
        return mean([r["mismatch_mean"]["k3"] for n in names for r in arm(root, INVFREQ_CPU, "qwen2-tiny", n)])
    return [m("decoupled", "tis"), m("plain", "dualclip"), m("mis")]


def invfreq_ratio_max(root):
    rec = arm(root, INVFREQ_CPU, "qwen2-tiny", "plain")[0]["records"][:10]
    return [min(r["train/ratio/max"] for r in rec), max(r["train/ratio/max"] for r in rec),
            100 * rec[0]["mismatch/clip_leak/0.2"]]


def invfreq_mis(root):
    """MIS's IS weight mean, min-max over its first 10 steps; TIS / MIS grad norm, same seed and steps, min-max."""
    mis = arm(root, INVFREQ_CPU, "qwen2-tiny", "mis")[0]["records"][:10]
    tis = {r["seed"]: r for r in arm(root, INVFREQ_CPU, "qwen2-tiny", "tis")}[0]["records"][:10]
    w = [r["train/is_weight/mean"] for r in mis]
    g = [t["train/grad_norm"] / m["train/grad_norm"] for t, m in zip(tis, mis)]
    return [min(w), max(w), min(g), max(g)]


# ---------------------------------------------------------------- lr 3e-5 probe

def lr3e5_table(root):
    _rla(root)
    from rla.rl.runlog import read_log

    logs = {a: read_log(root / LR3E5 / a / "log.jsonl") for a in ("bf16", "aligned")}
    out = {}
    for b, a in zip(logs["bf16"], logs["aligned"]):
        out[(str(b["step"]),)] = [b["reward/mean"], a["reward/mean"], b["mismatch/k3"], a["mismatch/k3"],
                                  b["train/clip_frac"], a["train/clip_frac"]]
    return out


# ---------------------------------------------------------------- demos

def _report(root, folder):
    return json.loads((root / folder / "report.json").read_text())


def demo_table(folder):
    labels = {"none (HF eager)": "none", "RoPE only": "rope", "all three": "all"}

    def f(root):
        m = _report(root, folder)["metrics"]
        return {(label,): [m[k]["mismatch/k3"], m[k]["mismatch/abs/mean"], 100 * m[k]["mismatch/clip_leak/0.2"]]
                for label, k in labels.items()}
    return f


def shares(rep):
    """Shapley k3 shares (% of k3 with no region aligned) of RoPE, RMSNorm, SwiGLU; unexplained = k3[all] / k3[none]."""
    k0 = rep["metrics"]["none"]["mismatch/k3"]
    a = rep["attribution"]["mismatch/k3"]
    return [100 * a["rope"] / k0, 100 * a["rmsnorm"] / k0, 100 * a["swiglu"] / k0,
            100 * rep["metrics"]["all"]["mismatch/k3"] / k0]


def detection(rep):
    """best profile's name and k3, the runner-up's name and k3 (report.json's detection ranking)"""
    (best, k_best), (nxt, k_next) = rep["detection"]["ranking"][:2]
    return [best, k_best, nxt, k_next]


def old_demo(root):
    """the 123-token demo of 2026-11-29, as committed then: `git show 15055fd:docs/demo/report.json`"""
    text = subprocess.run(["git", "show", f"{OLD_DEMO[0]}:{OLD_DEMO[1]}"], cwd=root, capture_output=True,
                          text=True, check=True).stdout
    return json.loads(text)


def demo_cpu_prose(root):
    rep = _report(root, DEMO_CPU)
    return shares(rep) + detection(rep)


def demo_cpu_vs_short(root):
    rep, old = _report(root, DEMO_CPU), old_demo(root)
    k0, k0_old = rep["metrics"]["none"]["mismatch/k3"], old["metrics"]["none"]["mismatch/k3"]
    return [shares(old)[0], k0_old, k0 / k0_old]


def old_demo_rope(root):
    return [shares(old_demo(root))[0]]


def demo_h200_cpu_ref(root):
    cpu = _report(root, DEMO_CPU)
    return [cpu["metrics"]["none"]["mismatch/k3"], cpu["metrics"]["all"]["mismatch/k3"], shares(cpu)[0], shares(old_demo(root))[0]]


def demo_h200_prose(root):
    rep = _report(root, DEMO_H200)
    return shares(rep) + detection(rep)


def demo_h200_tokens(root):
    rep = _report(root, DEMO_H200)
    return [rep["n_sequences"], rep["n_tokens"] // rep["n_sequences"], rep["n_tokens"]]


def demo_h200_vs_cpu(root):
    cpu, gpu = _report(root, DEMO_CPU), _report(root, DEMO_H200)
    removed = lambda r: 100 * (1 - r["metrics"]["all"]["mismatch/k3"] / r["metrics"]["none"]["mismatch/k3"])  # noqa: E731
    return [gpu["metrics"]["none"]["mismatch/k3"], shares(gpu)[0], removed(gpu), removed(cpu), shares(gpu)[3], shares(cpu)[3]]


def demo_short(root):
    rep = _report(root, DEMO_SHORT)
    m = rep["metrics"]
    return [rep["n_tokens"] / rep["n_sequences"], rep["n_tokens"], rep["n_sequences"], m["none"]["mismatch/k3"],
            m["all"]["mismatch/k3"], shares(rep)[0], rep["detection"]["best"]]


# ---------------------------------------------------------------- SFT warm starts

BUNDLED = "tiny-qwen2-d12"  # the model rla ships (src/rla/assets/tiny-qwen2)
SFT_RUNS = ["tiny-qwen2-d12", "tiny-qwen2-d15", "tiny-qwen2-d18", "qwen3-10m-add30", "llama-10m-sort32",
            "qwen3-10m-add12", "llama-10m-add12"]


def _field(text, name):
    import re
    m = re.search(rf"^\| {re.escape(name)} \| (.*) \|$", text, re.M)
    if not m:
        raise LookupError(f"no '{name}' row")
    return m.group(1)


def sft_table(root):
    """each run's record (runs/<name>.md, written by lab/tools/train_tiny_model.py): parameters (M),
    mean response tokens, steps (of planned), ms/step, final loss, held-out greedy / sampled."""
    import re
    out = {}
    for name in SFT_RUNS:
        text = (root / SFT / "runs" / f"{name}.md").read_text()
        params = int(_field(text, "parameters").replace(",", "")) / 1e6
        tokens = int(re.search(r"mean correct response (\d+) tokens", _field(text, "task")).group(1))
        steps = int(re.search(r"(\d+) steps x", _field(text, "training")).group(1))
        cal = _field(text, "calibration")
        ms = float(re.search(r"([\d.]+) ms/step", cal).group(1))
        planned = re.search(r"-> (\d+) steps", cal)
        loss = float(re.match(r"([\d.]+)", _field(text, "final training loss")).group(1))
        ev = re.findall(r"greedy ([\d.]+), sampled at T=1 ([\d.]+)", text)
        bf16 = re.search(r"held-out exact match, saved bf16 weights \| greedy ([\d.]+), sampled at T=1 ([\d.]+)", text)
        greedy = [float(ev[0][0])] + ([float(bf16.group(1))] if bf16 else [])
        sampled = [float(ev[0][1])] + ([float(bf16.group(2))] if bf16 else [])
        steps_cell = [steps] + ([int(planned.group(1))] if planned and int(planned.group(1)) != steps else [])
        out[(f"{name} (bundled)" if name == BUNDLED else name,)] = [params, None, tokens, steps_cell, ms, loss, greedy, sampled]
    return out




def sft_cpu(root):
    d = json.loads((root / SFT / "runs" / "llama-tiny-add4-cpu.json").read_text())
    ev = d["final_eval"]
    ev = json.loads(ev.replace("'", '"')) if isinstance(ev, str) else ev
    return [d["steps_done"], ev["greedy_acc"], ev["sample_acc"], d["wall_s"]]
