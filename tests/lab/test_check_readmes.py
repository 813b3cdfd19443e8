"""lab/checks/check_experiments.py and lab/checks/check_bench_readmes.py: every experiment README and every
results-folder README headline table recomputes from its files, and one changed number is caught."""

import importlib.util
import re
import os
import subprocess
import sys
from pathlib import Path

import pytest

from repo_root import ROOT  # noqa: E402
SCRIPTS = ROOT / "lab" / "checks"
FIGURE = ROOT / "lab" / "dose" / "cells_figure.py"


def _load(name):
    if str(SCRIPTS) not in sys.path:
        sys.path.insert(0, str(SCRIPTS))
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
    return sys.modules[name]


def _bad(rows):
    return [r for r in rows if r["status"] != "ok"]


def _explain(rows):
    return "\n".join(f"{r['claim']}: written {r['written']}, recomputed {r['recomputed']} ({r['status']})" for r in rows)


# ---------------------------------------------------------------- the committed READMEs

def test_every_experiment_readme_number_matches_its_folder():
    mod = _load("check_experiments")
    rows = mod.run_all(ROOT)
    assert not _bad(rows), _explain(_bad(rows))
    # every experiment folder with a README is covered, and not by one row each
    folders = {p.parent.name for p in (ROOT / "results" / "experiments").glob("*/README.md")}
    covered = {r["where"].split("/")[1] for r in rows}
    assert folders <= covered, f"experiment READMEs without a check: {sorted(folders - covered)}"
    assert len(rows) >= 60


#: Results folders whose README only lists the files (their numbers are written, and checked, elsewhere).
FILE_INDEXES = {"ops_inductor_sampler_h200_2026-11-29": "session 2's files; the write-up is SUMMARY.md, session 2"}


def test_every_results_readme_headline_table_matches_its_files():
    mod = _load("check_bench_readmes")
    rows = mod.run_all(ROOT)
    assert not _bad(rows), _explain(_bad(rows))
    folders = {p.parent.name for p in (ROOT / "results" / "benchmarks").glob("*/README.md")}
    covered = {r["where"].split("/")[2] for r in rows}
    assert folders - set(FILE_INDEXES) <= covered, f"results READMEs without a check: {sorted(folders - covered)}"
    for folder in FILE_INDEXES:  # an index writes no result: no ratio, percentage, rate or ms
        text = (ROOT / "results" / "benchmarks" / folder / "README.md").read_text()
        assert not re.search(r"\d\.\d+x|\d%|tok/s|\d ms", text), f"{folder}/README.md writes results: check them"


# ---------------------------------------------------------------- one number changed in a copy

def _changed(rel, old, new):
    text = (ROOT / rel).read_text()
    assert text.count(old) == 1, f"{old!r} is not once in {rel}: update this test with the README"
    return {rel: text.replace(old, new)}


@pytest.mark.parametrize("module, rel, old, new, claim", [
    # the population std the table used to show (ddof=0): the sample std is 0.05
    ("check_experiments", "results/experiments/grpo_h200_2026-11-29/README.md", "| 0.62 ± 0.05 | 0.66 | 1/3",
     "| 0.62 ± 0.04 | 0.66 | 1/3", "GRPO H200 table: qwen3-10m / aligned"),
    ("check_experiments", "results/experiments/grpo_h200_2026-11-29/README.md", "lowers step-0 k3 19x (qwen2-tiny)",
     "lowers step-0 k3 20x (qwen2-tiny)", "GRPO: step-0 k3 cut"),
    ("check_experiments", "results/experiments/demo_2k_h200_2026-11-29/README.md", "| all three | 1.75e-04 |",
     "| all three | 1.85e-04 |", "demo 2k H200 table: all three"),
    ("check_experiments", "results/experiments/dose_response_h200_2026-11-30/README.md", "| b2x0.7 | 5.00e-04 | 0/3 | 1/3 |",
     "| b2x0.7 | 5.00e-04 | 1/3 | 1/3 |", "dose 52M table: b2x0.7"),
    ("check_bench_readmes", "results/benchmarks/h200x2_2026-11-29_fsdp2/README.md", "| 31,510 | 40.15 |",
     "| 31,510 | 40.05 |", "FSDP2 throughput: aligned (rla.align, vllm)"),
])
def test_a_changed_number_is_a_mismatch_of_that_row_only(module, rel, old, new, claim):
    mod = _load(module)
    rows = mod.run_all(ROOT, _changed(rel, old, new))
    bad = _bad(rows)
    assert [r["claim"] for r in bad] == [claim], _explain(bad)
    assert bad[0]["status"] == "MISMATCH"


def test_a_row_the_files_do_not_produce_is_a_mismatch():
    mod = _load("check_experiments")
    rel = "results/experiments/grpo_h200_pilot_2026-11-29/README.md"
    row = "| fp16 trainer + fp16 engine | 3.7e-6 |"
    texts = _changed(rel, row, "| bf16 trainer, aligned engine | 3.7e-6 | 2.7e-6 | 0.0% | 0.59 (0.63) | 0/3 |\n" + row)
    bad = _bad(mod.run_all(ROOT, texts))
    assert [r["claim"] for r in bad] == ["GRPO pilot table: bf16 trainer, aligned engine"]
    assert "no recomputed row" in bad[0]["status"]


def test_the_command_exits_nonzero_on_a_changed_readme(tmp_path):
    """End to end: ``python lab/checks/check_experiments.py --root COPY`` where COPY's one README differs."""
    for entry in ROOT.iterdir():
        if entry.name != "results":
            (tmp_path / entry.name).symlink_to(entry)
    (tmp_path / "results").mkdir()
    for entry in (ROOT / "results").iterdir():
        if entry.name != "experiments":
            (tmp_path / "results" / entry.name).symlink_to(entry)
    exp = tmp_path / "results" / "experiments"
    exp.mkdir()
    for folder in (ROOT / "results" / "experiments").iterdir():
        if folder.name != "lr3e5_cpu_2026-11-29":
            (exp / folder.name).symlink_to(folder)
    lr = exp / "lr3e5_cpu_2026-11-29"
    lr.mkdir()
    for entry in (ROOT / "results" / "experiments" / "lr3e5_cpu_2026-11-29").iterdir():
        if entry.name != "README.md":
            (lr / entry.name).symlink_to(entry)
    rel = "results/experiments/lr3e5_cpu_2026-11-29/README.md"
    (lr / "README.md").write_text(_changed(rel, "| 3 | 0.031 | 0.047 |", "| 3 | 0.031 | 0.074 |")[rel])
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    cmd = [sys.executable, str(SCRIPTS / "check_experiments.py"), "--root"]
    bad = subprocess.run(cmd + [str(tmp_path)], capture_output=True, text=True, env=env)
    assert bad.returncode == 1, bad.stdout[-2000:] + bad.stderr[-2000:]
    assert "| lr 3e-5 probe table: 3 |" in bad.stdout and "MISMATCH" in bad.stdout
    good = subprocess.run(cmd + [str(ROOT)], capture_output=True, text=True, env=env)
    assert good.returncode == 0, good.stdout[-2000:] + good.stderr[-2000:]


# ---------------------------------------------------------------- reading and formatting numbers

def test_numbers_in_a_cell():
    t = _load("readme_tables")
    assert t.numbers("**0.60 ± 0.02**") == ["0.60", "0.02"]
    assert t.numbers("1/3 (seed 1, step 13)") == ["1", "3", "1", "13"]
    assert t.numbers("0.781 (bf16 saved: 0.766)") == ["0.781", "0.766"]   # no "16" from bf16
    assert t.numbers("0.276 / 0.283-0.297") == ["0.276", "0.283", "0.297"]  # a range dash is no minus
    assert t.numbers("qwen3-10m: -0.04, 1,239 MB, 2.5e-2") == ["-0.04", "1,239", "2.5e-2"]


def test_formatting_follows_the_written_number():
    t = _load("readme_tables")
    assert t.like(2.349e-4, "2.3e-4") == "2.3e-4"
    assert t.like(1.57e-4, "1.57e-04") == "1.57e-04"
    assert t.like(1.749e-4, "1.8e-4") == "1.7e-4"        # rounded from the value, not accepted as written
    assert t.like(31510.8, "31,510") == "31,511"
    assert t.like(0.0, "0") == "0" and t.like(4.1e-5, "4e-05") == "4e-05"


def test_the_cells_figure_draws_every_scored_run_of_the_four_reports(tmp_path):
    """lab/dose/cells_figure.py redraws results/experiments/dose_response_cells.png from the committed
    reports alone; its printed counts are the reports' own (every scored run of each cell)."""
    import json

    out = tmp_path / "cells.png"
    res = subprocess.run([sys.executable, str(FIGURE), "--root", str(ROOT), "--out", str(out)],
                         capture_output=True, text=True, check=True)
    assert out.stat().st_size > 50_000
    spec = importlib.util.spec_from_file_location("cells_figure", FIGURE)
    fig = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fig)
    for (size, length), sources in fig.CELLS.items():
        runs = [r for folder, model, _ in sources
                for r in json.loads((ROOT / "results" / "experiments" / folder / "dose_report.json").read_text())["runs"]
                if r["model"] == model and r["scored"]]
        collapsed = sum(bool(r["collapsed"]) for r in runs)
        assert f"{size}, {length}: {collapsed}/{len(runs)} runs collapsed" in res.stdout
