"""Every tracked generated file lives under ``results/``; the library never reads or writes there.

A *generated file* is one a run writes rather than a person: data (``.json``, ``.jsonl``, ``.csv``,
compressed logs), logs and terminal captures, plots and archives. Outside ``results/`` the only
ones allowed are the installed package's own data, which ships with it: the calibrated profile
files (``src/rla/profiles/data/``) and the bundled model (``src/rla/assets/``). Run configs are
YAML and stay beside the code that runs them (``configs/``, ``lab/*/configs/``).

The file list is ``git ls-files`` (what is tracked), or, without git, every file of the tree but
ignored folders.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from repo_root import ROOT

GENERATED = (".json", ".jsonl", ".csv", ".gz", ".tgz", ".log", ".out", ".png", ".jpg", ".svg", ".pdf",
             ".safetensors", ".pt", ".npz")
#: The package's own data: shipped with it, not results.
PACKAGE_DATA = ("src/rla/profiles/data/", "src/rla/assets/")


def tracked(root: Path) -> list[str]:
    try:
        out = subprocess.run(["git", "-C", str(root), "ls-files"], capture_output=True, text=True, check=True).stdout
        return [line for line in out.splitlines() if line]
    except (OSError, subprocess.CalledProcessError):
        skip = {".git", ".venv", ".venv-low", "__pycache__", ".pytest_cache"}
        return [p.relative_to(root).as_posix() for p in root.rglob("*")
                if p.is_file() and not skip.intersection(p.relative_to(root).parts)]


def generated_outside_results(files: list[str]) -> list[str]:
    return sorted(f for f in files
                  if f.lower().endswith(GENERATED) and not f.startswith("results/") and not f.startswith(PACKAGE_DATA))


def test_no_generated_file_outside_results():
    files = tracked(ROOT)
    assert any(f.startswith("results/") for f in files), "no results/ files found: the listing is broken"
    bad = generated_outside_results(files)
    assert not bad, "generated files outside results/ (move them there with git mv):\n" + "\n".join(bad)


def test_a_planted_generated_file_is_found():
    files = ["README.md", "results/demo/report.json", "src/rla/profiles/data/vllm-0.33.json",
             "src/rla/assets/tiny-qwen2/model.safetensors", "docs/demo/report.json", "lab/dose/plot.png",
             "experiments/x/runs/a/log.jsonl.gz"]
    assert generated_outside_results(files) == ["docs/demo/report.json", "experiments/x/runs/a/log.jsonl.gz",
                                                "lab/dose/plot.png"]
