"""Outputs are never silently overwritten or mixed, and arguments are checked before any work (issue 18)."""

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from rla.cli import main
from rla.diagnosis.output import MANIFEST, check_out_dir, staged
from rla.diagnosis.provenance import file_sha256, weights_sha256
from rla.models import bundled_path

from repo_root import ROOT


def _no_work(monkeypatch):
    """Make any model load fail loudly: a refusal must come before it."""
    import rla.demo
    import rla.hf

    def boom(*a, **k):
        raise AssertionError("work started before the arguments were checked")

    monkeypatch.setattr(rla.demo, "run_demo", boom)
    monkeypatch.setattr(rla.hf, "load_model", boom)


def test_non_empty_out_is_refused_before_work_and_left_alone(tmp_path, monkeypatch, capsys):
    _no_work(monkeypatch)
    out = tmp_path / "mine"
    out.mkdir()
    (out / "rollouts.jsonl").write_text("precious\n")
    assert main(["demo", "--out", str(out)]) == 2
    assert "not empty" in capsys.readouterr().err and "--overwrite" in capsys.readouterr().err + "--overwrite"
    assert main(["diagnose", "--model", str(bundled_path()), "--rollouts", "x.jsonl", "--out", str(out)]) == 2
    assert (out / "rollouts.jsonl").read_text() == "precious\n" and len(list(out.iterdir())) == 1


@pytest.mark.parametrize("argv,message", [
    (["demo", "--out", "{file}"], "is a file"),
    (["demo", "--out", "{file}/sub"], "is a file, not a folder"),
    (["demo", "--device", "banana"], "unknown device"),
    (["diagnose", "--model", "m", "--rollouts", "r", "--device", "banana"], "unknown device"),
])
def test_bad_paths_and_devices_are_refused_before_work(argv, message, tmp_path, monkeypatch, capsys):
    _no_work(monkeypatch)
    f = tmp_path / "a_file"
    f.write_text("x")
    monkeypatch.chdir(tmp_path)
    assert main([a.replace("{file}", str(f)) for a in argv]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without a GPU")
def test_cuda_without_a_gpu_is_a_clear_error(tmp_path, monkeypatch, capsys):
    _no_work(monkeypatch)
    assert main(["demo", "--device", "cuda", "--out", str(tmp_path / "o")]) == 2
    assert "no CUDA GPU is visible" in capsys.readouterr().err


@pytest.mark.skipif(os.geteuid() == 0, reason="root can write anywhere")
def test_unwritable_out_is_refused_as_such(tmp_path, monkeypatch, capsys):
    _no_work(monkeypatch)
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        assert main(["demo", "--out", str(ro / "new")]) == 2
        assert "is not writable" in capsys.readouterr().err
    finally:
        ro.chmod(0o700)


@pytest.mark.parametrize("argv", [
    ["demo", "--max-new-tokens", "0"], ["demo", "-n", "0"], ["demo", "--temperature", "0"],
    ["train", "c.yaml", "--until-step", "-1"], ["train", "c.yaml", "--until-step", "0"],
    ["diagnose", "--model", "m", "--rollouts", "r", "--max-tokens", "0"],
])
def test_numeric_flags_never_mean_default(argv, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2 and "must be" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []  # no run folder, no report folder


def test_train_needs_a_config_and_names_bad_yaml(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["train"]) == 2
    assert "needs a config file" in capsys.readouterr().err
    assert main(["train", "steps=3"]) == 2
    assert "out_dir=" in capsys.readouterr().err
    bad = tmp_path / "bad.yaml"
    bad.write_text("steps: 3\nlr: [1e-5\nseed: 1\n")
    assert main(["train", str(bad)]) == 2
    err = capsys.readouterr().err
    assert f"{bad}:3:5: config file is not valid YAML" in err.replace("\n", "")  # where the parser failed
    grid = tmp_path / "grid.yaml"
    grid.write_text("base: {steps: 2\n")
    assert main(["experiment", str(grid), "--out", str(tmp_path / "e")]) == 2
    assert "not valid YAML" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.yaml", "grid.yaml"]


def test_staged_replaces_whole_or_not_at_all(tmp_path):
    out = tmp_path / "r"
    with staged(out) as t:
        (t / "a").write_text("1")
    assert sorted(p.name for p in out.iterdir()) == [MANIFEST, "a"]
    with pytest.raises(FileExistsError, match="not empty"):
        with staged(out) as t:
            pass
    with pytest.raises(RuntimeError):
        with staged(out, overwrite=True) as t:
            (t / "b").write_text("2")
            raise RuntimeError("killed mid-report")
    assert sorted(p.name for p in out.iterdir()) == [MANIFEST, "a"]  # the old folder, untouched
    with staged(out, overwrite=True) as t:
        (t / "b").write_text("2")
    assert sorted(p.name for p in out.iterdir()) == [MANIFEST, "b"]  # the new one, nothing of the old
    assert [p.name for p in tmp_path.iterdir()] == ["r"]  # no temp folders left
    with pytest.raises(FileExistsError, match="is a file"):
        check_out_dir(out / "b")


def test_demo_and_diagnose_do_not_share_a_default_folder():
    from rla.cli import build_parser

    demo = build_parser(["demo"]).parse_args(["demo"]).out
    diag = build_parser(["diagnose"]).parse_args(["diagnose", "--model", "m", "--rollouts", "r"]).out
    assert demo != diag


def _whole_or_absent(out: Path):
    if not out.exists():
        return "absent"
    names = {p.name for p in out.iterdir()}
    assert names == {"rollouts.jsonl", "report.json", "report.md", "per_position.png", "ratio_hist.png",
                     "attribution.png", MANIFEST}, names
    rep = json.loads((out / "report.json").read_text())
    assert rep["inputs"]["rollouts"]["sha256"] == file_sha256(out / "rollouts.jsonl")  # consistent
    assert rep["inputs"]["model"]["weights_sha256"] == weights_sha256(bundled_path())
    return "whole"


DEMO = ["demo", "-n", "2", "--max-new-tokens", "8", "--no-detect"]


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory):
    """One ``rla demo`` run in a subprocess, shared by the two kill tests (the demo's old report, the
    diagnose test's rollouts): its folder and how long it took."""
    out = tmp_path_factory.mktemp("demo_run") / "demo"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    t0 = time.monotonic()
    subprocess.run([sys.executable, "-m", "rla.cli", *DEMO, "--out", str(out)], check=True, env=env, capture_output=True)
    return out, time.monotonic() - t0


@pytest.mark.slow
def test_kill_9_of_the_demo_leaves_old_or_new_never_a_mix(tmp_path, demo_run):
    """SIGKILL ``rla demo --overwrite`` at random moments over an existing report: the folder is the
    old report or the new one (its report.json's rollouts hash matches its rollouts), never a mix."""
    import shutil

    out = tmp_path / "demo"
    cmd = [sys.executable, "-m", "rla.cli", *DEMO, "--out", str(out)]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    shutil.copytree(demo_run[0], out)  # the old report, as that command wrote it
    full = demo_run[1]
    rng = random.Random(0)
    for delay in sorted(rng.uniform(0.3, 1.1) * full for _ in range(3)):
        p = subprocess.Popen(cmd + ["--overwrite", "--seed", "1"], env=env, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
        time.sleep(delay)
        p.send_signal(signal.SIGKILL)
        p.wait()
        assert _whole_or_absent(out) == "whole"
        stray = [x.name for x in tmp_path.iterdir() if x.name != "demo"]
        for s in stray:  # a kill between the two renames: both parts whole under hidden names
            assert s.startswith(".demo.rla-"), stray


@pytest.mark.slow
def test_kill_9_of_diagnose_leaves_old_or_new_never_a_mix(tmp_path, demo_run):
    """SIGKILL ``rla diagnose --overwrite`` at random moments over an existing report: the folder
    holds the old report or the new one (whole, naming the rollouts it read), never a mix."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    rollouts = demo_run[0] / "rollouts.jsonl"  # read only: the demo's folder stays as the demo wrote it
    out = tmp_path / "report"
    cmd = [sys.executable, "-m", "rla.cli", "diagnose", "--model", str(bundled_path()), "--rollouts", str(rollouts),
           "--profile", "vllm", "--out", str(out)]
    t0 = time.monotonic()
    subprocess.run(cmd, check=True, env=env, capture_output=True)
    full = time.monotonic() - t0
    want = {"report.json", "report.md", "per_position.png", "ratio_hist.png", "attribution.png", MANIFEST}

    def whole():
        assert {p.name for p in out.iterdir()} == want
        rep = json.loads((out / "report.json").read_text())
        assert rep["inputs"]["rollouts"]["sha256"] == file_sha256(rollouts)
        assert rep["inputs"]["model"]["weights_sha256"] == weights_sha256(bundled_path())

    rng = random.Random(1)
    for delay in sorted(rng.uniform(0.3, 1.1) * full for _ in range(3)):
        p = subprocess.Popen(cmd + ["--overwrite"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(delay)
        p.send_signal(signal.SIGKILL)
        p.wait()
        whole()
        stray = [x.name for x in tmp_path.iterdir() if x.name not in ("demo", "report")]
        assert all(s.startswith(".report.rla-") for s in stray), stray
