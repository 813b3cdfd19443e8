"""Every results file carries its stamp: GPU, versions, date and command.

What a *results file* is (the rule this test enforces; ``results/README.md`` states it
for people):

* Results folders: ``results/benchmarks/`` and everything below it, every ``results/experiments/<name>/``
  and every other folder directly under ``results/`` (``results/demo/``). New folders added there are
  covered without editing this file.
* Results files: every ``*.json`` in a results folder, except the per-run internals of a
  training run or experiment (anything below a ``runs/``, ``init/``, ``train_*/`` or ``check/``
  folder: logs, configs and checkpoints metadata that the folder's stamped summary reads) and
  the ``*.stamp.json`` sidecars themselves.
* The stamp of a JSON results file is a mapping found at its ``environment`` key, its ``env`` key,
  or its top level, or in a sidecar ``<stem>.stamp.json`` (for files another tool reads with a
  fixed schema, like a launch configuration) under ``environment``. It has non-empty ``gpu``,
  ``torch``, ``transformers``, ``date`` and ``command``. A CPU machine writes ``gpu`` as
  ``"none (CPU...)"``; a value that cannot be recovered is written ``"unknown: <why>"``, never left
  out or guessed.
* A results folder without any JSON (a write-up of runs kept elsewhere) has a ``README.md`` that
  names the machine (``GPU`` or ``CPU``), ``torch``, the date (``20YY-MM-DD``) and the command.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from repo_root import ROOT

STAMP_KEYS = ("gpu", "torch", "transformers", "date", "command")
INTERNAL = re.compile(r"(^|/)(runs|init|check|train_[^/]*)/")


def results_folders(root: Path) -> list[Path]:
    out = []
    res = root / "results" / "benchmarks"
    if res.is_dir():
        out += [res, *(p for p in res.rglob("*") if p.is_dir() and not INTERNAL.search(p.relative_to(root).as_posix() + "/"))]
    exp = root / "results" / "experiments"
    if exp.is_dir():
        out += [p for p in exp.iterdir() if p.is_dir()]
    top = root / "results"
    if top.is_dir():  # results/demo and any other folder of its own
        out += [p for p in top.iterdir() if p.is_dir() and p.name not in ("benchmarks", "experiments")]
    return sorted(set(out))


def results_files(root: Path) -> list[Path]:
    files = []
    for folder in results_folders(root):
        for p in folder.rglob("*.json"):
            rel = p.relative_to(root).as_posix()
            if INTERNAL.search(rel) or p.name.endswith(".stamp.json"):
                continue
            files.append(p)
    return sorted(set(files))


def stamp_problems(path: Path) -> list[str]:
    """What is missing from ``path``'s stamp (empty when it is complete)."""
    try:
        data = json.loads(path.read_text())
    except ValueError as err:
        return [f"not valid JSON ({err})"]
    sidecar = path.with_name(path.stem + ".stamp.json")
    if sidecar.is_file():
        stamp = json.loads(sidecar.read_text()).get("environment")
    elif isinstance(data, dict):
        stamp = data.get("environment") or data.get("env") or data
    else:
        stamp = None
    if not isinstance(stamp, dict):
        return ["no stamp (environment / env mapping, top-level keys or a .stamp.json sidecar)"]
    return [f"stamp lacks {k!r}" for k in STAMP_KEYS if not (isinstance(stamp.get(k), str) and stamp[k].strip())]


def readme_problems(folder: Path) -> list[str]:
    readme = folder / "README.md"
    if not readme.is_file():
        return ["no JSON results and no README.md"]
    text = readme.read_text()
    checks = {"machine (GPU or CPU)": r"\b(GPU|CPU)\b", "torch version": r"torch \d", "date": r"20\d\d-\d\d-\d\d",
              "command": r"(?i)command"}
    return [f"README.md names no {what}" for what, pat in checks.items() if not re.search(pat, text)]


def all_problems(root: Path) -> dict[str, list[str]]:
    problems = {}
    for p in results_files(root):
        if bad := stamp_problems(p):
            problems[p.relative_to(root).as_posix()] = bad
    for folder in results_folders(root):
        has_json = any(folder.rglob("*.json"))
        has_results = any(folder.glob("*.md")) or any(folder.iterdir())
        if has_results and not has_json and folder.name not in ("logs",):
            if bad := readme_problems(folder):
                problems[folder.relative_to(root).as_posix() + "/"] = bad
    return problems


def test_every_results_file_is_stamped():
    files = results_files(ROOT)
    assert len(files) > 20, "the discovery rule finds (almost) no results files: it is broken"
    problems = all_problems(ROOT)
    assert not problems, "results files without a complete stamp:\n" + "\n".join(f"{k}: {v}" for k, v in problems.items())


def _tree(tmp_path: Path, files: dict[str, object]) -> Path:
    for rel, content in files.items():
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(content if isinstance(content, str) else json.dumps(content))
    return tmp_path


GOOD = {"gpu": "NVIDIA H200", "torch": "2.11.0", "transformers": "5.17.0", "date": "2026-11-29", "command": "rla bench ops"}


@pytest.mark.parametrize("missing", STAMP_KEYS)
def test_a_file_without_one_stamp_field_fails(tmp_path, missing):
    stamp = {k: v for k, v in GOOD.items() if k != missing}
    root = _tree(tmp_path, {"results/benchmarks/new_calibration_folder/calib.json": {"environment": stamp, "rows": []},
                            "results/benchmarks/ok.json": {"env": GOOD}})
    problems = all_problems(root)
    assert problems == {"results/benchmarks/new_calibration_folder/calib.json": [f"stamp lacks {missing!r}"]}


def test_well_stamped_new_folders_and_sidecars_pass(tmp_path):
    root = _tree(tmp_path, {
        "results/benchmarks/engine_twin_2026-12-01/twin.json": {"environment": {**GOOD, "gpu": "unknown: lost with the machine"}},
        "results/benchmarks/engine_twin_2026-12-01/twin.md": "# twin\n",
        "results/benchmarks/tuned.json": {"rla.ops._triton_rope": {"BLOCK": 4}},
        "results/benchmarks/tuned.stamp.json": {"environment": GOOD},
        "results/experiments/grpo_new/summary.json": {"environment": {**GOOD, "gpu": "none (CPU)"}},
        "results/experiments/grpo_new/runs/a__b__s0/summary.json": {"step": 3},  # a run's internals
        "results/experiments/writeup/README.md": "On the CPU, torch 2.13, 2026-11-29. Command: `rla train x`.\n",
    })
    assert all_problems(root) == {}


def test_null_gpu_and_a_bare_writeup_fail(tmp_path):
    root = _tree(tmp_path, {
        "results/experiments/grpo_x/summary.json": {"environment": {**GOOD, "gpu": None}},
        "results/experiments/writeup/README.md": "Some numbers.\n",
    })
    problems = all_problems(root)
    assert problems["results/experiments/grpo_x/summary.json"] == ["stamp lacks 'gpu'"]
    assert set(problems["results/experiments/writeup/"]) == {
        "README.md names no machine (GPU or CPU)", "README.md names no torch version", "README.md names no date",
        "README.md names no command"}
