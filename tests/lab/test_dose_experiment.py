"""The dose-response experiment (issue #19): its grid files, the dose in training, and the probe.

- the two grid files parse and expand to the runs their comments promise;
- a 2-step dose arm runs end to end through ``python -m lab.dose.experiment`` on CPU (the CI smoke
  of the GPU grid): the dose reaches the trainer through its ``ops=`` plug, and the report is written;
- ``--probe`` reports, for every run, the step-0 k3 that the run itself logs;
- ``rla`` itself refuses a dose field, naming the lab's plug;
- on the bundled model, k3 grows with the dose (fewer bits, larger scale) and 7 bits is the
  aligned arm exactly.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rla.rl.grid import matches_only
from rla.rl.runlog import read_log

from lab.dose.experiment import main as lab_main
from lab.dose.grid import DoseGrid, load_dose_grid as load_grid


def main(argv: list[str]) -> int:
    """``python -m lab.dose.experiment ...`` in this process (argv as ``rla experiment`` took it)."""
    assert argv[0] == "experiment"
    return lab_main(argv[1:])

from repo_root import ROOT  # noqa: E402
SMALL = ROOT / "lab" / "dose" / "configs" / "experiment_dose_h200_small.yaml"
FULL = ROOT / "lab" / "dose" / "configs" / "experiment_dose_h200.yaml"


def _doses(grid) -> dict[str, tuple[int, float]]:
    return {a: (o["train_dose_bits"], o.get("train_dose_scale", 1.0)) for a, o in grid.arms.items()
            if o.get("train_dose_bits") is not None}


def test_small_grid_is_21_runs_of_the_bundled_model_5_doses_bf16_and_aligned(tmp_path):
    grid = load_grid(SMALL)
    runs = grid.runs(tmp_path)
    assert len(runs) == 21 and len({r.name for r in runs}) == 21
    assert grid.seeds == [0, 1, 2] and list(grid.models) == ["qwen2-tiny"]
    doses = _doses(grid)
    assert len(doses) == 5 and len(set(doses.values())) == 5
    assert {"bf16", "aligned"} <= set(grid.arms) and len(grid.arms) == 7
    for r in runs:
        c = r.config
        assert c.init == "bundled" and c.task == "addition" and c.difficulty == 12 and c.steps == 100
        assert c.prompts_per_step * c.group_size == 128 and c.pi_old == "rollout" and c.rollout_profile == "vllm"
        if r.arm in doses:
            assert c.train_precision == "aligned" and grid.ops_for(r.arm).bits == doses[r.arm][0]
            assert grid.ops_for(r.arm).scale == doses[r.arm][1]
        else:
            assert grid.ops_for(r.arm) is None and c.train_precision == r.arm
    # the doses are ordered: fewer bits, or the same bits at a larger scale, is a larger dose
    order = sorted(doses.values(), key=lambda d: (-d[0], d[1]))
    assert order == [doses[a] for a in ("b4x0.5", "b4", "b3x0.7", "b3", "b2x0.7")]


def test_full_grid_two_sizes_two_lengths(tmp_path):
    from rla import models
    from rla.rl.warm_start import build_task

    grid = load_grid(FULL)
    runs = grid.runs(tmp_path)
    assert len(runs) == 4 * 7 * 3 and grid.seeds == [0, 1, 2]
    assert _doses(grid) == _doses(load_grid(SMALL)) and grid.arms == load_grid(SMALL).arms
    small = {r.name: r.config for r in load_grid(SMALL).runs(tmp_path)}
    params, lengths, configs = {}, {}, {}
    for r in runs:
        c = r.config
        if r.name in small:  # the small grid's runs are this grid's qwen2-tiny cell, config for config
            assert c == small[r.name]
        if r.model not in configs:
            configs[r.model] = (models.load_bundled_model().config if c.init == "bundled"
                                else models.tiny_config(c.arch, c.size))
            params[r.model] = models.param_count(configs[r.model])
        cfg = configs[r.model]
        task = build_task(c)
        lengths[r.model] = task.max_length()
        assert task.max_length() + 32 < cfg.max_position_embeddings
        if c.init != "bundled":
            assert Path(c.init) == tmp_path / "init" / r.model  # made once per cell by the warm start
    assert params["qwen2-tiny"] == params["qwen2-tiny-long"] < 5e6
    assert params["qwen2-50m"] == params["qwen2-50m-long"] >= 30e6
    assert 100 <= lengths["qwen2-tiny"] <= 160 and 100 <= lengths["qwen2-50m"] <= 160
    assert lengths["qwen2-tiny-long"] >= 1024 and lengths["qwen2-50m-long"] >= 1024


def test_only_takes_every_comma_separated_part():
    assert matches_only("qwen2-50m__b3__s0", "qwen2-50m__,__s0")
    assert not matches_only("qwen2-50m__b3__s1", "qwen2-50m__,__s0")
    assert not matches_only("qwen2-50m-long__b3__s0", "qwen2-50m__,__s0")
    assert matches_only("x", None) and matches_only("x", "")


def _smoke_grid(path: Path, steps: int = 2) -> Path:
    path.write_text(f"""
base:
  arch: qwen2
  size: micro
  init: random
  task: counting
  difficulty: 2
  task_args: {{digits: 2}}
  prompts_per_step: 2
  group_size: 4
  device: cpu
  steps: {steps}
  checkpoint_every: 1000
models:
  micro: {{}}
arms:
  aligned: {{train_precision: aligned}}
  b2: {{train_precision: aligned, train_dose_bits: 2}}
seeds: [0]
""")
    return path


def test_cpu_smoke_two_step_dose_arm_runs_and_is_reported(tmp_path):
    out = tmp_path / "exp"
    grid = _smoke_grid(tmp_path / "grid.yaml")
    assert main(["experiment", str(grid), "--out", str(out), "--parallel", "2"]) == 0
    logs = {arm: read_log(out / "runs" / f"micro__{arm}__s0" / "log.jsonl") for arm in ("aligned", "b2")}
    assert [len(v) for v in logs.values()] == [2, 2]
    # the dose is the run's plug, recorded beside its config, not a config field
    assert "train_dose" not in (out / "runs" / "micro__b2__s0" / "config.yaml").read_text()
    assert json.loads((out / "runs" / "micro__b2__s0" / "dose.json").read_text()) == {"bits": 2, "scale": 1.0}
    assert not (out / "runs" / "micro__aligned__s0" / "dose.json").exists()
    # same weights and rollouts at step 0: the dose alone moves the training forward off the engine
    assert logs["aligned"][0]["reward/mean"] == logs["b2"][0]["reward/mean"]
    assert logs["b2"][0]["mismatch/k3"] > 10 * logs["aligned"][0]["mismatch/k3"]
    rep = json.loads((out / "dose_report.json").read_text())
    assert rep["cells"][0]["fit"]["status"] == "too_few"  # 2 steps: nothing is scored, and it says so
    assert all(r["why"].startswith("2 steps") for r in rep["runs"])

    # the probe measures the same step-0 k3 the runs logged, in one process without training
    assert main(["experiment", str(grid), "--out", str(tmp_path / "probe"), "--probe"]) == 0
    probe = json.loads((tmp_path / "probe" / "probe.json").read_text())
    got = {r["arm"]: r["k3"] for r in probe["runs"]}
    assert got == {arm: logs[arm][0]["mismatch/k3"] for arm in logs}
    assert "| micro | b2 |" in (tmp_path / "probe" / "probe.md").read_text()


@pytest.mark.slow
def test_on_the_bundled_model_k3_grows_with_the_dose_and_seven_bits_is_aligned(tmp_path):
    from lab.dose.probe import probe_step0

    arms = {"aligned": {"train_precision": "aligned"},
            "b7": {"train_precision": "aligned", "train_dose_bits": 7},
            "b4x0.5": {"train_precision": "aligned", "train_dose_bits": 4, "train_dose_scale": 0.5},
            "b2": {"train_precision": "aligned", "train_dose_bits": 2}}
    # 32 new tokens, not the task's 128: k3 is a per-token mean, and the dose's order shows in the first 32
    base = {"init": "bundled", "task": "addition", "difficulty": 12, "prompts_per_step": 1, "group_size": 4,
            "device": "cpu", "max_new_tokens": 32}
    res = probe_step0(DoseGrid(models={"tiny": {}}, arms=arms, seeds=[0], base=base), tmp_path, say=lambda *a: None)
    k3 = {r["arm"]: r["k3"] for r in res["runs"]}
    assert k3["b7"] == k3["aligned"]
    assert 3 * k3["aligned"] < k3["b4x0.5"] and 10 * k3["b4x0.5"] < k3["b2"]


def _pick_grid(path: Path) -> Path:
    path.write_text("""
base:
  arch: qwen2
  size: micro
  init: sft
  sft_steps: 2
  sft_batch_size: 4
  task: counting
  difficulty: 2
  task_args: {digits: 4}
  prompts_per_step: 2
  group_size: 4
  device: cpu
  steps: 2
models:
  micro: {}
arms:
  bf16: {train_precision: bf16}
  aligned: {train_precision: aligned}
  b5: {train_precision: aligned, train_dose_bits: 5}
  b3: {train_precision: aligned, train_dose_bits: 3}
  b1: {train_precision: aligned, train_dose_bits: 1}
seeds: [0, 1]
""")
    return path


def test_probe_makes_the_warm_start_and_picks_the_doses_nearest_each_target(tmp_path, capsys):
    """--probe on a grid whose model starts from SFT makes the warm start first (as a run would);
    --pick-doses writes a grid of the non-dose arms and, per target, the dose arm nearest in log k3."""
    import yaml

    grid = _pick_grid(tmp_path / "grid.yaml")
    out = tmp_path / "p"
    assert main(["experiment", str(grid), "--out", str(out), "--probe", "--probe-seeds", "0",
                 "--pick-doses", "1e-9,1e9"]) == 0
    assert (out / "init" / "micro" / "model.safetensors").is_file()
    probe = json.loads((out / "probe.json").read_text())
    k3 = {a["arm"]: a["k3_geomean"] for a in probe["arms"]}
    assert k3["b5"] < k3["b3"] < k3["b1"]  # the dose orders the mismatch
    picked = yaml.safe_load((out / "picked_grid.yaml").read_text())
    # the smallest target takes the smallest dose, the largest the largest; non-dose arms stay
    assert list(picked["arms"]) == ["bf16", "aligned", "b5", "b1"]
    assert picked["seeds"] == [0, 1] and list(picked["models"]) == ["micro"]
    # the picked grid is a grid: it loads, and its runs start from the same warm start
    runs = load_grid(out / "picked_grid.yaml").runs(out)
    assert {Path(r.config.init) for r in runs} == {out / "init" / "micro"}
    # a second pick does not overwrite the first
    before = (out / "picked_grid.yaml").read_text()
    assert main(["experiment", str(grid), "--out", str(out), "--probe", "--pick-doses", "1e-3"]) != 0
    assert "not overwritten" in capsys.readouterr().err
    assert (out / "picked_grid.yaml").read_text() == before


def test_pick_doses_greedy_assignment_and_refusals(tmp_path):
    from lab.dose.probe import check_pick, pick_doses

    arms = {"aligned": {"train_precision": "aligned"},
            **{f"d{i}": {"train_precision": "aligned", "train_dose_bits": i} for i in (1, 2, 3)}}
    grid = DoseGrid(models={"m": {}}, arms=arms, seeds=[0], base={"init": "bundled", "device": "cpu"})
    result = {"arms": [{"arm": "aligned", "k3_geomean": 1e-6}, {"arm": "d3", "k3_geomean": 1e-3},
                       {"arm": "d2", "k3_geomean": 2e-3}, {"arm": "d1", "k3_geomean": 1e-1}]}
    # order is kept: 1e-3 -> d3 (exact), 1.5e-3 -> d2, 1 -> d1, although 1.5e-3 alone is nearer d2
    chosen, rows = pick_doses(result, grid, [1e-3, 1.5e-3, 1.0])
    assert [r["arm"] for r in rows] == ["d3", "d2", "d1"]
    assert list(chosen) == ["aligned", "d3", "d2", "d1"]
    # a target below every arm takes the smallest, not an arm left over at the far end (a greedy
    # closest-pair-first rule gave 1e-6 the 1e-1 arm here: 1e-4 and 1e-2 took d3 and d2 first)
    _, rows = pick_doses(result, grid, [1e-6, 1e-4, 1e-2])
    assert [r["arm"] for r in rows] == ["d3", "d2", "d1"]
    # the targets' order in the list does not matter
    _, rows = pick_doses(result, grid, [1e-2, 1e-6, 1e-4])
    assert [r["arm"] for r in rows] == ["d1", "d3", "d2"]
    # with spare arms the least total distance wins: 2e-3 -> d2, not d3
    _, rows = pick_doses(result, grid, [2e-3])
    assert rows[0]["arm"] == "d2" and rows[0]["decades_off"] == 0.0
    with pytest.raises(ValueError, match="only 3 dose arm"):
        check_pick(grid, [1e-3, 1e-2, 1e-1, 1.0])
    with pytest.raises(ValueError, match="positive"):
        check_pick(grid, [1e-3, -1.0])
    with pytest.raises(ValueError, match="repeat"):
        check_pick(grid, [1e-3, 1e-3])
    two = DoseGrid(models={"m": {}, "n": {}}, arms=arms, seeds=[0], base={"init": "bundled", "device": "cpu"})
    with pytest.raises(ValueError, match="one model"):
        check_pick(two, [1e-3])
    check_pick(two, [1e-3], only="n__")


def test_rla_refuses_a_dose_field_and_names_the_plug(tmp_path):
    """The knob left TrainConfig: ``rla experiment`` / ``rla train`` refuse a dose, naming the lab's plug;
    an old run config with the fields at their "off" values (every committed config.yaml) still reads."""
    import yaml

    from rla.cli import main as rla_main
    from rla.rl.config import load_config
    from rla.rl.grid import load_grid as rla_load_grid

    with pytest.raises(ValueError, match=r"train_dose_bits=2 is no longer a TrainConfig field.*lab\.dose"):
        rla_load_grid(_smoke_grid(tmp_path / "grid.yaml"))
    assert rla_main(["train", "out_dir=" + str(tmp_path / "r"), "train_dose_bits=3"]) != 0
    with pytest.raises(ValueError, match=r"train_dose_scale=0\.5 is no longer a TrainConfig field"):
        load_config(None, ["train_dose_scale=0.5"])
    old = tmp_path / "old.yaml"
    old.write_text(yaml.safe_dump({"init": "bundled", "train_dose_bits": None, "train_dose_scale": 1.0}))
    assert load_config(old).init == "bundled"


def test_the_lab_grid_refuses_a_bad_dose(tmp_path):
    path = _smoke_grid(tmp_path / "grid.yaml")
    path.write_text(path.read_text().replace("b2: {train_precision: aligned, train_dose_bits: 2}",
                                             "b2: {train_precision: bf16, train_dose_bits: 2}"))
    with pytest.raises(ValueError, match="needs train_precision=aligned"):
        load_grid(path)
    path.write_text(path.read_text().replace("b2: {train_precision: bf16, train_dose_bits: 2}",
                                             "b2: {train_precision: aligned, train_dose_bits: 9}"))
    with pytest.raises(ValueError, match=r"must be an int in \[1, 7\]"):
        load_grid(path)
