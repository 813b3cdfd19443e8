"""The experiment summary's MoE columns, from hand-written logs: step-0 routing per layer (mean over
seeds, against ``statistics``), its layer mean and any-layer share, both over training, and the
reward criterion of collapse (final window mean below half the first). One grid, one call: the
summary draws its figures, which is most of the cost."""

import json
import statistics
from pathlib import Path

from rla.rl.experiment_summary import summarize_grid
from rla.rl.grid import grid_from_mapping

# per arm and seed: the step-0 per-layer set_differs, then the rewards of 10 steps
LOGS = {
    ("bf16", 0): ([0.02, 0.01, 0.03], [0.5] * 5 + [0.1] * 5),  # collapses by the reward criterion
    ("bf16", 1): ([0.04, 0.00, 0.01], [0.5] * 5 + [0.3] * 5),  # 0.3 >= 0.25: does not
    ("replay", 0): ([0.0, 0.0, 0.0], [0.5] * 10),
    ("replay", 1): ([0.0, 0.0, 0.0], [0.4] * 5 + [0.6] * 5),
}


def _write(out: Path):
    for (arm, seed), (layers, rewards) in LOGS.items():
        run = out / "runs" / f"moe__{arm}__s{seed}"
        run.mkdir(parents=True)
        lines = []
        for step, r in enumerate(rewards):
            per = [x * (1 + step) for x in layers]  # grows over training
            lines.append({"step": step, "reward/mean": r, "mismatch/k3": 1e-4, "time/elapsed_s": float(step),
                          "memory/peak_mb": 1.0, "routing/set_differs": per,
                          "routing/set_differs_mean": statistics.fmean(per),
                          "routing/any_layer_set_differs": min(1.0, sum(per))})
        (run / "log.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))


def test_routing_columns_and_the_reward_collapse_count(tmp_path):
    grid = grid_from_mapping({"base": {"arch": "qwen3_moe", "size": "micro", "init": "random", "steps": 10},
                              "models": {"moe": {}}, "arms": {"bf16": {}, "replay": {"routing_replay": "experts"}},
                              "seeds": [0, 1]}, tmp_path / "grid.yaml")
    _write(tmp_path)
    summary = summarize_grid(tmp_path, grid)
    arms = {a["arm"]: a for a in summary["arms"]}
    bf16 = arms["bf16"]
    want = [statistics.fmean([LOGS[("bf16", s)][0][i] for s in (0, 1)]) for i in range(3)]
    assert bf16["step0_routing_set_differs_per_layer"] == want
    assert bf16["step0_routing_set_differs_mean"]["mean"] == statistics.fmean(
        [statistics.fmean(LOGS[("bf16", s)][0]) for s in (0, 1)])
    over = [statistics.fmean([statistics.fmean([x * (1 + t) for x in LOGS[("bf16", s)][0]]) for t in range(10)])
            for s in (0, 1)]
    assert abs(bf16["routing_set_differs_mean_over_training"]["mean"] - statistics.fmean(over)) < 1e-15
    assert bf16["seeds_with_reward_collapse"] == 1 and arms["replay"]["seeds_with_reward_collapse"] == 0
    assert arms["replay"]["step0_routing_any_layer_set_differs"]["mean"] == 0.0
    md = (tmp_path / "summary.md").read_text()
    assert "### moe: routing" in md and "| bf16 | 3.00 | 0.50 | 2.00 |" in md
    assert (tmp_path / "plots" / "moe_routing.png").is_file()



def test_without_plots_the_numbers_are_the_same_and_no_figure_is_drawn(tmp_path):
    """``plots=False`` (what lab/checks/dose_numbers.py asks: it reads numbers only) draws nothing and changes no
    number of the summary."""
    spec = {"base": {"arch": "qwen3_moe", "size": "micro", "init": "random", "steps": 10}, "models": {"moe": {}},
            "arms": {"bf16": {}, "replay": {"routing_replay": "experts"}}, "seeds": [0, 1]}
    with_plots, without = tmp_path / "a", tmp_path / "b"
    summaries = []
    for out, plots in ((with_plots, True), (without, False)):
        out.mkdir()
        _write(out)
        summaries.append(summarize_grid(out, grid_from_mapping(spec, out / "grid.yaml"), plots=plots))
    assert summaries[1]["plots"] == {} and not (without / "plots").exists()
    assert summaries[0]["plots"] and summaries[0]["arms"] == summaries[1]["arms"]
    assert summaries[0]["relative"] == summaries[1]["relative"]
