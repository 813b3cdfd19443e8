"""Recompute the headline numbers of every ``results/experiments/*/README.md`` from the files in its folder.

    python lab/checks/check_experiments.py            # the table; exit 1 on any MISMATCH

GRPO folders are read the way ``rla experiment GRID --out DIR --summarize-only`` reads them: the
grid (``rla.rl.grid.load_grid``), each run's log (``rla.rl.runlog.read_log``), its summary
(``rla.rl.runlog.summarize`` with the run's own ``collapse_window``) and the statistics over seeds
(``rla.rl.experiment_summary.stats``: mean, **sample** std with ddof=1). Demo folders are read
from their ``report.json``. Each check names its statistic; each number the README cites stands
between render markers (``lab/checks/render.py``), prose by claim, tables by row
(``lab/checks/readme_tables.py``), and must equal its value rendered from the files.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from experiment_numbers import (  # noqa: E402
    DEMO_CPU, DEMO_H200, DEMO_SHORT, GRPO, INVFREQ_CPU,
    LR3E5, OLD_DEMO, PILOT, SFT, demo_cpu_prose,
    demo_cpu_vs_short, demo_h200_cpu_ref, demo_h200_prose, demo_h200_tokens, demo_h200_vs_cpu,
    demo_short, demo_table, grpo_aligned_spike, grpo_bf16_gap, grpo_fp16_below_aligned,
    grpo_invfreq_fall, grpo_k3_step0_ratios, grpo_memory, grpo_paired, grpo_rope_removes,
    grpo_table, grpo_zero_grad, invfreq_k3, invfreq_mis, invfreq_ratio_max,
    invfreq_table, lr3e5_table, old_demo_rope, pilot_ratios, pilot_reward,
    pilot_table, sft_cpu, sft_table,
)
from dose_numbers import (  # noqa: E402
    DOSE, DOSE_CAL, DOSE_LONG, dose50_calls, dose50_late_gap, dose50_near_1e3, dose50_no_collapse,
    dose50_process_memory, dose50_ratio_range, dose50_rewards, dose50_signal, dose50_steps, dose50_table, dose50_warm_start,
    dose50_warm_start_before, dose_bf16_move, dose_calibration_table, dose_delta_entropy, dose_k3_by_cell,
    dose_long_table, dose_table, dose_threshold,
    DOSE_HIGH, dose_high_bf16, dose_high_calls, dose_high_gains, dose_high_no_collapse, dose_high_prediction,
    dose_high_probe_table, dose_high_run_vs_probe, dose_high_scale2, dose_high_signal, dose_high_table,
    dose_high_vs_first, dose_high_warm_starts,
)
from dose_long_numbers import (  # noqa: E402
    LONG, long_52m_cost, long_52m_prediction, long_at_1e3, long_bench, long_bench_table, long_decode_loop, long_bf16, long_bf16_cells,
    long_bf16_trend, long_call2, long_call4_start, long_calls, long_decades, long_entropy_grad, long_gains, long_max_k3,
    long_no_collapse, long_picks, long_prediction, long_probe_table, long_repro, long_signal, long_sizes, long_table,
    long_vs_short_at_40, long_warm_starts,
)
from dose_long52_numbers import (  # noqa: E402
    LONG52, long52_bench, long52_bf16, long52_calls, long52_doses_vs_probe, long52_exact, long52_gains,
    long52_no_collapse, long52_prediction, long52_table, long52_throughput, long52_timing, long52_warm_start,
)
from moe_numbers import (  # noqa: E402
    MOE, MOE60, moe60_call, moe60_predictions, moe60_warm_start, moe_bf16_seeds, moe_calls, moe_decode_ops, moe_first_layer, moe_k3_ratios, moe_predictions, moe_reward, moe_routing_layers_over_training, moe_routing_ratios, moe_routing_table,
    moe_step_time, moe_table, moe_timing_table, moe_warm_start,
)
from readme_tables import TableCheck, check_results_module, main  # noqa: E402

Check = check_results_module().Check

# ---------------------------------------------------------------- the checks

R = lambda folder: f"{folder}/README.md"  # noqa: E731
LOGS = "runs/*/log.jsonl[.gz] via rla.rl.runlog.read_log/summarize"

TABLES: list[TableCheck] = [
    TableCheck("MoE arms table", R(MOE), f"{MOE}/{LOGS}",
               "per arm: logged steps min-max; step-0 k3 mean ± sample std; k3 over training (mean); final reward mean ± "
               "sample std; best 5-step reward; seeds whose collapse signal fired / seeds; seeds with final < 0.5 x first "
               "reward / seeds", moe_table),
    TableCheck("MoE routing table", R(MOE), f"{MOE}/{LOGS}",
               "% of routed tokens whose expert set differs from the rollout's: step 0 per layer (mean over seeds), layer "
               "mean and any-layer share (mean ± sample std), both over training (mean)", moe_routing_table),
    TableCheck("MoE routing per layer over training", R(MOE), f"{MOE}/{LOGS}",
               "% of routed tokens whose expert set differs, per layer: each run's mean over its logged steps, then the "
               "mean over seeds", moe_routing_layers_over_training),
    TableCheck("MoE timing table", R(MOE), f"{MOE}/{LOGS}",
               "medians over steps 1+ of 3 runs: time/rollout_s, time/train_s, time/sync_s, time/step_s; "
               "1000 time/rollout_s / response/length/max", moe_timing_table),
    TableCheck("MoE60 arms table", R(MOE60), f"{MOE60}/{LOGS}", "as the MoE arms table, the 60-step run",
               lambda root: moe_table(root, MOE60)),
    TableCheck("MoE60 routing table", R(MOE60), f"{MOE60}/{LOGS}", "as the MoE routing table, the 60-step run",
               lambda root: moe_routing_table(root, MOE60)),
    TableCheck("MoE60 routing per layer over training", R(MOE60), f"{MOE60}/{LOGS}",
               "as the MoE routing per layer over training, the 60-step run",
               lambda root: moe_routing_layers_over_training(root, MOE60)),
    TableCheck("MoE60 timing table", R(MOE60), f"{MOE60}/{LOGS}", "as the MoE timing table, the 60-step run",
               lambda root: moe_timing_table(root, MOE60)),
    TableCheck("GRPO H200 table", R(GRPO), f"{GRPO}/{LOGS}",
               "mean over seeds (step-0 k3, k3 over training, step-0 clip leak %, best 5-step reward); "
               "final reward mean ± sample std (ddof=1); seeds whose collapse signal fired / seeds", grpo_table),
    TableCheck("GRPO pilot table", R(PILOT), f"{PILOT}/{LOGS}",
               "means over seeds; final (last 5 steps) and best 5-step reward; collapse: runs fired / runs, seed and first step",
               pilot_table),
    TableCheck("inv_freq / IS CPU table", R(INVFREQ_CPU), f"{INVFREQ_CPU}/{LOGS}",
               "seeds with logs; mean over seeds of the step-0 reward and the final (last 5 steps) reward; MIS: lowest trailing "
               "5-step mean and its step; collapsed: a trailing 5-step mean reward below 0.05", invfreq_table),
    TableCheck("lr 3e-5 probe table", R(LR3E5), f"{LR3E5}/{{bf16,aligned}}/log.jsonl",
               "per step: reward/mean, mismatch/k3, train/clip_frac of each arm's log", lr3e5_table),
    TableCheck("demo 2k CPU table", R(DEMO_CPU), f"{DEMO_CPU}/report.json",
               "metrics[regions]: k3, abs/mean, 100 clip_leak/0.2", demo_table(DEMO_CPU)),
    TableCheck("demo 2k H200 table", R(DEMO_H200), f"{DEMO_H200}/report.json",
               "metrics[regions]: k3, abs/mean, 100 clip_leak/0.2", demo_table(DEMO_H200)),
    TableCheck("SFT warm-start table", R(SFT), f"{SFT}/runs/<run>.md",
               "each run's record: parameters / 1e6, mean correct response tokens, steps done (and planned), calibrated "
               "ms/step, final loss, held-out greedy / sampled (fp32 master; bf16 saved in parentheses)", sft_table),
    TableCheck("dose-response table", R(DOSE), f"{DOSE}/{LOGS}",
               "rla's dose report recomputed from the logs: geometric mean of step-0 k3; collapsed / scored runs; "
               "collapse signal / runs; reward start mean -> final mean ± sample std", dose_table),
    TableCheck("dose long cell table", R(DOSE), f"{DOSE_LONG}/{LOGS}, {DOSE}/{LOGS}",
               "the long cell's seed-0 step-0 k3; the short cell's geometric mean over 3 seeds (rla's dose report)", dose_long_table),
    TableCheck("dose 52M table", R(DOSE), f"{DOSE}/{LOGS}",
               "rla's dose report recomputed from the logs, cell qwen2-50m: as the dose-response table; logged steps of "
               "seeds 0, 1, 2", dose50_table),
    TableCheck("dose k3 by cell table", R(DOSE), f"{DOSE}/{LOGS}",
               "rla's dose report: geometric mean of step-0 k3 over seeds per cell (qwen2-tiny, qwen2-50m); their ratio",
               dose_k3_by_cell),
    TableCheck("dose calibration table", R(DOSE_CAL), f"{DOSE_CAL}/probe.json",
               "geometric mean over seeds of step-0 k3; per seed in seed order", dose_calibration_table),
    TableCheck("dose 52M high probe table", R(DOSE_HIGH), f"{DOSE_HIGH}/probe.json",
               "geometric mean over seeds of step-0 k3; per seed in seed order", dose_high_probe_table),
    TableCheck("dose long probe table", R(LONG), f"{LONG}/probe/*/probe.json",
               "geometric mean over 3 seeds of the probe's step-0 k3, 4M then 52M", long_probe_table),
    TableCheck("dose long table", R(LONG), f"{LONG}/{LOGS}",
               "rla's dose report recomputed from the logs: as the dose-response table; gain = mean final - mean "
               "starting reward", long_table),
    TableCheck("dose long: bf16 by cell", R(LONG), f"{{{DOSE},{DOSE_HIGH},{LONG}}}",
               "bf16 and aligned step-0 k3 geomeans per cell (dose reports; the 52M long cell: its probe.json)", long_bf16_cells),
    TableCheck("dose long: run-group bench", R(LONG), f"{LONG}/run_group_bench/*/runs, logs/call1_commands.log",
               "median step 0 of the thread layout; mean time/step_s of steps 1-2 over 7 runs, and / 7; the commands "
               "log's start-to-exit seconds", long_bench_table),
    TableCheck("dose long 52M table", R(LONG52), f"{LONG52}/{LOGS}",
               "rla's dose report recomputed from the logs: as the dose-response table (an arm whose runs all have k3 = 0 "
               "written as such); gain = mean final - mean starting reward; logged steps of seeds 0-2", long52_table),
    TableCheck("dose 52M high table", R(DOSE_HIGH), f"{DOSE_HIGH}/{LOGS}",
               "rla's dose report recomputed from the logs: as the dose-response table; gain = mean final - mean "
               "starting reward", dose_high_table),
]

PROSE: list = [
    # ---- the MoE routing experiment (issue #32 item 4)
    Check("MoE: the calls", R(MOE), f"{MOE}/logs/call{{1,2}}_{{experiment,gpu_tests}}.log, {MOE}/{LOGS}",
          "call 1: runs failed (exit 2), elapsed s, tests skipped; call 2: steps logged / planned, elapsed s, tests "
          "passed; steps per run min-max", moe_calls),
    Check("MoE: warm start", R(MOE), f"{MOE}/init/qwen3moe-36m/sft.json, {MOE}/logs/call1_warm_start.out",
          "steps_done, wall_time_s, last greedy and sampled accuracy; call 1's last eval step, greedy, sampled", moe_warm_start),
    Check("MoE: k3 ratios", R(MOE), f"{MOE}/{LOGS}", "bf16 / arm, ratio of means over seeds: step-0 k3 of aligned, "
          "router, replay, router-replay; k3 over training, same order", moe_k3_ratios),
    Check("MoE: routing ratios", R(MOE), f"{MOE}/{LOGS}", "bf16 / arm of the routing layer mean: step 0 aligned, "
          "router; over training aligned, router", moe_routing_ratios),
    Check("MoE: predictions", R(MOE), f"{MOE}/{LOGS}, {MOE}/init/qwen3moe-36m/sft.json",
          "PREDICTIONS.md's quantities in its order (moe_numbers.moe_predictions)", moe_predictions),
    Check("MoE: first layer", R(MOE), f"{MOE}/{LOGS}", "largest layer-0 set_differs % over every step of aligned, "
          "of router; their log lines", moe_first_layer),
    Check("MoE: bf16 seeds", R(MOE), f"{MOE}/{LOGS}", "bf16 step-0 k3 per seed; 100 (1 - replay / bf16) per seed",
          moe_bf16_seeds),
    Check("MoE: reward", R(MOE), f"{MOE}/{LOGS}", "mean over 15 runs of reward_first and final_reward; min, max over "
          "the other arms of (mean - bf16 mean) / bf16 sample std", moe_reward),
    Check("MoE: step time", R(MOE), f"{MOE}/{LOGS}", "steps 1+ of 15 runs: median time/step_s, time/rollout_s; "
          "rollout share of summed step time %; median response/length/max", moe_step_time),
    Check("MoE: decode ops", R(MOE), f"{MOE}/decode_ops.json, {GRPO}/{LOGS}", "top-level aten ops per decode step MoE, "
          "dense; host-blocking ops MoE, dense; dense median ms per decode step; that x the op ratio; MoE median ms "
          "per decode step; its ratio to the scaled dense", moe_decode_ops),
    # ---- the MoE routing experiment to 60 steps
    Check("MoE60: the call", R(MOE60), f"{MOE60}/logs/moe_experiment.log, {MOE60}/{LOGS}",
          "steps logged / planned (the bar), elapsed s, runs finished / runs, exit status; steps per run min-max",
          moe60_call),
    Check("MoE60: warm start", R(MOE60), f"{MOE60}/init/qwen3moe-36m/sft.json",
          "steps_done, wall_time_s, last greedy and sampled accuracy", moe60_warm_start),
    Check("MoE60: k3 ratios", R(MOE60), f"{MOE60}/{LOGS}", "as MoE: k3 ratios", lambda root: moe_k3_ratios(root, MOE60)),
    Check("MoE60: routing ratios", R(MOE60), f"{MOE60}/{LOGS}", "as MoE: routing ratios",
          lambda root: moe_routing_ratios(root, MOE60)),
    Check("MoE60: bf16 seeds", R(MOE60), f"{MOE60}/{LOGS}", "as MoE: bf16 seeds", lambda root: moe_bf16_seeds(root, MOE60)),
    Check("MoE60: reward", R(MOE60), f"{MOE60}/{LOGS}", "as MoE: reward", lambda root: moe_reward(root, MOE60)),
    Check("MoE60: step time", R(MOE60), f"{MOE60}/{LOGS}", "as MoE: step time", lambda root: moe_step_time(root, MOE60)),
    Check("MoE60: predictions", R(MOE60), f"{MOE60}/{LOGS}, {MOE60}/logs/moe_experiment.log",
          "PREDICTIONS.md's quantities in its order (moe_numbers.moe60_predictions)", moe60_predictions),
    # ---- dose-response, the long cells
    Check("dose long: warm starts", R(LONG),
          f"{LONG}/init/*/sft.json", "steps_done, wall_time_s, the last "
          "evaluation's greedy and sampled accuracy, 4M then 52M", long_warm_starts),
    Check("dose long: sizes", R(LONG), f"{LONG}/{{dose_report.json,init/qwen2-50m-long/config.json}}", "parameters; hidden size, layers", long_sizes),
    Check("dose long: the calls", R(LONG),
          f"{LONG}/logs/call*_commands.log, {LONG}/{LOGS}", "the commands logs' last stamp; steps per run", long_calls),
    Check("dose long: the picks", R(LONG), f"{LONG}/probe/*/picked_grid.yaml", "the dose arms of both picked grids (equal)", long_picks),
    Check("dose long: no collapse", R(LONG),
          f"{{{LONG},{DOSE}}}/{LOGS}, {LONG}/probe/qwen2-tiny-long/probe.json", "the fits (rla's dose report); "
          "b1x4's probe abs_mean", long_no_collapse),
    Check("dose long: largest k3", R(LONG), f"{LONG}/{LOGS}",
          "largest step-0 k3 of the fitted runs", long_max_k3),
    Check("dose long: the short cell at step 40", R(LONG),
          f"{{{DOSE},{LONG}}}/{LOGS}",
          "short 4M runs whose steps 35-39 mean reward is below half their steps 0-4 mean; k3 geomeans; fitted runs "
          "here and their largest k3", long_vs_short_at_40),
    Check("dose long: gains", R(LONG),
          f"{LONG}/{LOGS}", "mean final - mean start reward per arm with its step-0 k3 geomean", long_gains),
    Check("dose long: at 1e-3", R(LONG), f"{LONG}/{LOGS}", "step-0 k3 geomean and gain", long_at_1e3),
    Check("dose long: bf16", R(LONG),
          f"{LONG}/{LOGS}", "rla's dose report: k3 geomeans, ratios, gains, final reward "
          "mean ± sample std", long_bf16),
    Check("dose long: the collapse signal", R(LONG), f"{LONG}/{LOGS}", "runs whose signal fired / runs (none collapsed)", long_signal),
    Check("dose long: entropy and grad norm", R(LONG),
          f"{{{LONG},{DOSE}}}/{LOGS}",
          "aligned runs' step-0 train/entropy and train/grad_norm, mean over seeds, long then short 4M", long_entropy_grad),
    Check("dose long: decades", R(LONG), f"{{{DOSE},{LONG}}}/{LOGS}",
          "the short 4M k3_50; the long cell's 95% lower bound", long_decades),
    Check("dose long: call 4's prediction", R(LONG),
          f"{LONG}/{LOGS}", "final reward means; b1x2's k3; b1x4's final and k3; "
          "mean time/step_s of call 4's runs, x 40", long_prediction),
    Check("dose long: call 4's start", R(LONG), f"{LONG}/logs/call4_commands.log",
          "the experiment line's UTC stamp", long_call4_start),
    Check("dose long: bf16 trend", R(LONG),
          f"{{{DOSE},{DOSE_HIGH},{LONG}}}",
          "ratios of the bf16 step-0 k3 geomeans of the table", long_bf16_trend),
    Check("dose long: the 52M probe prediction", R(LONG),
          f"{LONG}/{{probe,init}}/qwen2-*-long/", "52M long bf16 probe geomean; last greedy accuracy 52M, 4M; 52M SFT "
          "wall seconds", long_52m_prediction),
    Check("dose long: call 2", R(LONG),
          f"{LONG}/partial_2026-11-30", "logged steps of the 52M runs, planned steps, mean time/step_s; 4M runs' steps",
          long_call2),
    Check("dose long: the 52M cell's cost", R(LONG),
          f"{LONG}/{{partial_2026-11-30,runs}}",
          "steps logged per GPU; (500 - 4M steps x GPU-s per 4M step) / 52M steps; x 21 x 40", long_52m_cost),
    Check("dose long: run-group bench", R(LONG),
          f"{LONG}/run_group_bench", "threads / processes steady step time; 2 x that; alone / (processes / 7)",
          long_bench),
    Check("dose long: the decode loop", R(LONG),
          "results/benchmarks/h200_2026-12-01_decode_loop*.json",
          "tiny: speedup; threads_7 per_token_tok_per_s; per_token tok_per_s", long_decode_loop),
    Check("dose long: reproducibility", R(LONG),
          f"{LONG}/{{partial_2026-11-30/qwen2-tiny-long,.}}/runs",
          "step 0 mismatch/k3, call 2 then call 3", long_repro),
    # ---- dose-response, the 52M high-dose cell
    Check("dose high: the calls", R(DOSE_HIGH),
          f"{DOSE_HIGH}/logs/{{commands.log,call1_experiment.log}}", "each call's start to exit; the probe's seconds; "
          "runs finished after call 1 and the rest", dose_high_calls),
    Check("dose high: the prediction", R(DOSE_HIGH),
          f"{DOSE_HIGH}/probe.json", "geomean of b2, b1, b1x2, b1x4; min-max ratio to 1e-3, 4e-3, 1.6e-2, 6e-2",
          dose_high_prediction),
    Check("dose high: warm starts", R(DOSE_HIGH),
          f"{{{DOSE_HIGH},{DOSE}}}/init/qwen2-50m/sft.json", "steps_done and the last evaluation's sample_acc, here then "
          "the first cell", dose_high_warm_starts),
    Check("dose high: vs the first 52M cell", R(DOSE_HIGH),
          f"{{{DOSE_HIGH},{DOSE}}}/{LOGS}", "step-0 k3 geomeans (rla's dose report) here / first cell; the aligned "
          "runs' step-0 train/entropy, mean over seeds", dose_high_vs_first),
    Check("dose high: scale 2", R(DOSE_HIGH), f"{DOSE_HIGH}/probe.json", "probe geomean b1x2 / b1", dose_high_scale2),
    Check("dose high: run vs probe", R(DOSE_HIGH), f"{DOSE_HIGH}/{{probe.json,runs}}", "b2x0.7's step-0 k3 geomean: the runs' (dose report), the probe's",
          dose_high_run_vs_probe),
    Check("dose high: no collapse", R(DOSE_HIGH),
          f"{{{DOSE_HIGH},{DOSE}}}/{LOGS}", "the fits (rla's dose report): runs, lower bound; 4M k3_50 and interval; "
          "4M b2x0.7 collapsed / scored at its k3", lambda root: [dose_high_no_collapse(root)[0], *dose_high_no_collapse(root)[2:9]]),
    Check("dose high: largest k3", R(DOSE_HIGH), f"{DOSE_HIGH}/{LOGS}", "largest step-0 k3 of the fitted runs", lambda root: [dose_high_no_collapse(root)[1]]),
    Check("dose high: moved up", R(DOSE_HIGH), f"{{{DOSE_HIGH},{DOSE}}}/{LOGS}", "this cell's 95% lower bound / the 4M interval's upper end",
          lambda root: [dose_high_no_collapse(root)[9], dose_high_no_collapse(root)[2], dose_high_no_collapse(root)[5]]),
    Check("dose high: gains", R(DOSE_HIGH),
          f"{{{DOSE_HIGH},{DOSE}}}/{LOGS}", "mean final - mean start reward per arm with its step-0 k3 geomean (52M; "
          "then 4M b3x0.7, b3, b2x0.7)",
          lambda root: [abs(v) if i == 9 else v for i, v in enumerate(dose_high_gains(root))]),
    Check("dose high: bf16", R(DOSE_HIGH),
          f"{DOSE_HIGH}/{LOGS}", "rla's dose report: k3 geomeans, their ratio, gains, final reward mean ± sample std",
          dose_high_bf16),
    Check("dose high: the collapse signal", R(DOSE_HIGH), f"{DOSE_HIGH}/{LOGS}", "runs whose collapse signal fired / runs", dose_high_signal),

    # ---- GRPO H200
    Check("GRPO: step-0 k3 cut", R(GRPO), f"{GRPO}/{LOGS}", "ratio of means over seeds, bf16 / aligned", grpo_k3_step0_ratios),
    Check("GRPO: RoPE alone", R(GRPO),
          f"{GRPO}/{LOGS}", "100 (1 - rope / bf16), ratio of means over seeds", grpo_rope_removes),
    Check("GRPO: fp16 below aligned", R(GRPO), f"{GRPO}/{LOGS}", "min-max over models x (step 0, over training) of aligned / fp16, ratio of means", grpo_fp16_below_aligned),
    Check("GRPO: bf16 final-reward gap", R(GRPO),
          f"{GRPO}/{LOGS}", "min-max over models x (aligned, rope, fp16) of mean final reward - bf16's; / bf16's sample std",
          grpo_bf16_gap),
    Check("GRPO: paired differences", R(GRPO),
          f"{GRPO}/{LOGS}", "final reward of the same seed, aligned - bf16, seeds 0-2", grpo_paired),
    Check("GRPO: when the invfreq reward fell", R(GRPO),
          f"{GRPO}/{LOGS}", "min-max per model of the first step whose mean reward is below 0.05", grpo_invfreq_fall),
    Check("GRPO: zero gradients", R(GRPO),
          f"{GRPO}/{LOGS}", "bf16-invfreq steps with train/grad_norm == 0 / logged steps (3 seeds pooled)", grpo_zero_grad),
    Check("GRPO: collapse steps", R(GRPO),
          f"{GRPO}/{LOGS}", "as lab/checks/check_results.py (first step N whose steps N-4..N mean reward < 0.05; first collapse event)",
          lambda root: check_results_module().invfreq_collapse_steps(root)),
    Check("GRPO: the aligned arm's spike", R(GRPO),
          f"{GRPO}/{LOGS}", "the run whose signal fired: seed, first event step, k3 there, / its step-0 k3", grpo_aligned_spike),
    Check("GRPO: peak memory", R(GRPO), f"{GRPO}/{LOGS}", "peak_memory_mb mean over seeds, aligned vs bf16", grpo_memory),
    # ---- pilot
    Check("pilot: k3 ratios", R(PILOT),
          f"{PILOT}/{LOGS}", "ratio of means: bf16 / aligned at step 0 and over training; aligned / fp16 at step 0", pilot_ratios),
    Check("pilot: reward", R(PILOT),
          f"{PILOT}/{LOGS}", "mean over the 12 runs of the step-0 and final reward; the other arms' mean final reward - bf16's; "
          "/ bf16's sample std", pilot_reward),
    Check("pilot: the demo's RoPE share", R(PILOT), f"git show {OLD_DEMO[0]}:{OLD_DEMO[1]}", "Shapley k3[rope] / k3[none]", old_demo_rope),
    # ---- inv_freq / IS on the CPU
    Check("IS CPU: k3 over training", R(INVFREQ_CPU),
          f"{INVFREQ_CPU}/{LOGS}", "mean over runs of each run's mean k3 over training", invfreq_k3),
    Check("IS CPU: plain arm's ratios", R(INVFREQ_CPU),
          f"{INVFREQ_CPU}/runs/qwen2-tiny__plain__s0", "min-max of train/ratio/max over steps 0-9; 100 mismatch/clip_leak/0.2 at step 0",
          invfreq_ratio_max),
    Check("IS CPU: MIS weights and gradients", R(INVFREQ_CPU),
          f"{INVFREQ_CPU}/runs/qwen2-tiny__{{mis,tis}}__s0", "min-max over steps 0-9 of train/is_weight/mean; of TIS / MIS train/grad_norm",
          invfreq_mis),
    Check("IS CPU: the H200 collapse", R(INVFREQ_CPU), f"{GRPO}/{LOGS}", "as lab/checks/check_results.py", lambda root: check_results_module().invfreq_collapse(root)
          + check_results_module().invfreq_collapse_steps(root)[:2]),
    # ---- demos
    Check("demo 2k CPU: shares and detection", R(DEMO_CPU),
          f"{DEMO_CPU}/report.json", "Shapley k3 / k3[none]; k3[all] / k3[none]; detection ranking's first two", demo_cpu_prose),
    Check("demo 2k CPU: against the 123-token demo", R(DEMO_CPU),
          f"{DEMO_CPU}/report.json, git show {OLD_DEMO[0]}:{OLD_DEMO[1]}", "the old report's RoPE share and k3[none]; k3[none] ratio",
          demo_cpu_vs_short),
    Check("demo 2k H200: shares and detection", R(DEMO_H200),
          f"{DEMO_H200}/report.json", "as the CPU demo", demo_h200_prose),
    Check("demo 2k H200: the CPU run it predicted from", R(DEMO_H200),
          f"{DEMO_CPU}/report.json, git show {OLD_DEMO[0]}:{OLD_DEMO[1]}", "k3[none], k3[all], RoPE share (CPU 2k); RoPE share (old 123-token demo)",
          demo_h200_cpu_ref),
    Check("demo 2k H200: tokens", R(DEMO_H200), f"{DEMO_H200}/report.json", "n_sequences; n_tokens / n_sequences; n_tokens", demo_h200_tokens),
    Check("demo 2k H200: prediction vs result", R(DEMO_H200),
          f"{DEMO_H200}/report.json, {DEMO_CPU}/report.json", "k3[none]; RoPE share; 1 - k3[all]/k3[none] (H200, CPU); k3[all]/k3[none] (H200, CPU)",
          demo_h200_vs_cpu),
    Check("demo H200 short responses", R(DEMO_SHORT),
          f"{DEMO_SHORT}/report.json", "n_tokens / n_sequences; k3[none], k3[all]; RoPE Shapley share; detection best", demo_short),
    # ---- dose-response
    Check("dose: threshold", R(DOSE),
          f"{DOSE}/{LOGS}", "the report's maximum-likelihood logistic fit: k3_50, 95% profile-likelihood interval, slope",
          lambda root: dose_threshold(root)[:4]),
    Check("dose: fitted runs", R(DOSE), f"{DOSE}/{LOGS}", "dose and aligned runs scored; of them collapsed", lambda root: dose_threshold(root)[4:]),
    # ---- dose-response, the 52M cell
    Check("dose 52M: the same doses, less k3", R(DOSE),
          f"{DOSE}/{LOGS}", "min-max over the dose arms of the step-0 k3 geometric mean 4M / 52M (heading); the 52M model's "
          "parameters / 1e6; the same min-max (bullet); bf16's ratio (rla's dose report)", dose50_ratio_range),
    Check("dose 52M: warm start", R(DOSE),
          f"{DOSE}/init/qwen2-50m/sft.json", "history: steps_done, wall_time_s, last evaluation's greedy_acc, sample_acc",
          dose50_warm_start),
    Check("dose 52M: the evaluation before the stop", R(DOSE), f"{DOSE}/init/qwen2-50m/sft.json", "history: the next-to-last evaluation's step and sample_acc",
          dose50_warm_start_before),
    Check("dose 52M: the calls", R(DOSE),
          f"{DOSE}/logs/qwen2-50m_{{commands.log,call1_gpu_util.csv,call*_experiment.log}}",
          "the UTC stamps' differences per call; the largest memory.used sample of call 1; runs reported failed with "
          "OutOfMemoryError in call 1; logged steps of the run that failed so in call 2", dose50_calls),
    Check("dose 52M: per-process memory", R(DOSE), f"{DOSE}/logs/qwen2-50m_call*_experiment.log", "the largest 'has X GiB memory in use' of the out-of-memory reports",
          dose50_process_memory),
    Check("dose 52M: steps done", R(DOSE), f"{DOSE}/{LOGS}", "runs with 100 logged steps; of the others less the shortest: count, min-max steps", dose50_steps),
    Check("dose 52M: rewards", R(DOSE), f"{DOSE}/{LOGS}", "min-max over arms of the mean starting and the mean final reward (rla's dose report)", dose50_rewards),
    Check("dose 52M: no threshold", R(DOSE),
          f"{DOSE}/{LOGS}", "the report's fit (status no_collapse): runs fitted, their largest step-0 k3, the profile's lower bound",
          dose50_no_collapse),
    Check("dose: bf16 from 4M to 52M", R(DOSE),
          f"{DOSE}/{LOGS}", "geometric means of step-0 k3 per cell (rla's dose report); their ratios", dose_bf16_move),
    Check("dose: |delta| and entropy by cell", R(DOSE),
          f"{DOSE}/{LOGS}", "step 0 of each run: bf16's mismatch/abs/mean (mean over seeds) 4M / 52M, 4M, 52M; the aligned "
          "arm's train/entropy (mean over seeds), 52M, 4M", dose_delta_entropy),
    Check("dose 52M: runs near 1e-3", R(DOSE),
          f"{DOSE}/{LOGS}", "those runs' step-0 k3", dose50_near_1e3),
    Check("dose 52M: late reward gap", R(DOSE),
          f"{DOSE}/{LOGS}", "mean reward/mean over steps 90-94, aligned minus b2x0.7 per seed; the largest |arm - aligned| "
          "of the other arms' runs that reached step 94", dose50_late_gap),
    Check("dose 52M: the collapse signal", R(DOSE),
          f"{DOSE}/{LOGS}", "runs whose collapse signal fired; the step most seed-2 runs fired at, and how many "
          "(every event's kinds are k3_spike + reward_falling)", dose50_signal),
    # ---- dose-response, the 52M long cell
    Check("dose long 52M: warm start", R(LONG52),
          f"{{{LONG52},{LONG}}}/init/qwen2-50m-long/sft.json",
          "steps_done, wall_time_s, the last evaluation's greedy and sampled accuracy; the probe's last sampled", long52_warm_start),
    Check("dose long 52M: the calls", R(LONG52),
          f"{LONG52}/logs/call*_{{commands,experiment}}.log, {LONG52}/{LOGS}, {LONG}/partial_2026-11-30",
          "each call's exit seconds; min and max over runs of the peak memory/peak_mb / 1000; the 11-30 runs' min and max; "
          "runs failed in call 2; the failed runs' logged steps and the planned steps", long52_calls),
    Check("dose long 52M: no collapse", R(LONG52),
          f"{{{LONG52},{LONG}}}/{LOGS}",
          "largest step-0 k3 of the fitted runs; fitted runs; the 95% lower bounds here and of the 4M long cell", long52_no_collapse),
    Check("dose long 52M: gains and signal", R(LONG52),
          f"{LONG52}/{LOGS}",
          "gains (mean final - mean start) of aligned, b1x2, -b1x4 with their k3 geomeans; signal runs of b1..b1x4, "
          "their runs, b1's k3 geomean", long52_gains),
    Check("dose long 52M: bf16 vs aligned", R(LONG52),
          f"{LONG52}/{LOGS}", "gains; final reward mean ± sample std", long52_bf16),
    Check("dose long 52M: the exact aligned arm", R(LONG52),
          f"{{{LONG52},{LONG}}}/runs/*aligned*, {LONG}/probe", "aligned log lines (all bit-equal, k3 0), runs, "
          "sum of mismatch/n_tokens; the 4M long aligned geomean and mean step-0 mismatch/bitwise/equal; the probe's geomean",
          long52_exact),
    Check("dose long 52M: the bench", R(LONG52),
          "results/benchmarks/h200_2026-12-01_decode_attention.json",
          "rows: grouped and model seconds_per_generate, speedup; mean common prefix; new tokens; max logprob diff",
          long52_bench),
    Check("dose long 52M: doses vs the probe", R(LONG52),
          f"{LONG52}/{LOGS}, {LONG}/probe/qwen2-50m-long/probe.json",
          "step-0 k3 geomean here / the probe's, per arm; the warm starts' last sampled accuracy", long52_doses_vs_probe),
    Check("dose long 52M: the prediction", R(LONG52),
          f"{LONG52}/init, {LONG52}/{LOGS}",
          "steps_done, wall_time_s; b1x2's gain; bf16's step-0 k3 geomean", long52_prediction),
    Check("dose long 52M: timing", R(LONG52), f"{LONG52}/{LOGS}",
          "min and max over the 16 runs not lost in call 2 of their mean time/step_s", long52_timing),
    Check("dose long 52M: throughput", R(LONG52),
          f"{LONG52}/logs/call{{2,3,4}}_experiment.log",
          "the last progress bar of each call: steps (call 3: minus call 2's), elapsed seconds, and their ratio",
          long52_throughput),
    # ---- SFT
    Check("SFT: the CPU Llama", R(SFT), f"{SFT}/runs/llama-tiny-add4-cpu.json", "steps_done; final_eval greedy_acc, sample_acc; wall_s", sft_cpu),
]


def run_all(root: Path, texts: dict[str, str] | None = None) -> list[dict]:
    from readme_tables import run_all as _run
    return _run(TABLES, PROSE, root, texts)


if __name__ == "__main__":
    sys.exit(main(TABLES, PROSE, __doc__))
