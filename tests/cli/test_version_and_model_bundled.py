"""``rla --version`` and ``--model bundled`` wherever ``--model PATH`` is taken (issue 37)."""

import os
import subprocess
import sys
import tomllib

import pytest

from rla.cli import build_parser
from rla.models import bundled_path

from repo_root import ROOT


def test_version_prints_the_projects_version_and_its_torch_and_transformers():
    from importlib.metadata import version

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    run = subprocess.run([sys.executable, "-m", "rla.cli", "--version"], env=env, capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stderr
    want = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    line = run.stdout.strip()
    assert line.startswith(f"rla {want}") and "\n" not in line
    assert f"torch {version('torch')}" in line and f"transformers {version('transformers')}" in line


@pytest.mark.parametrize("argv", [
    ["diagnose", "--model", "bundled", "--rollouts", "r.jsonl"],
    ["verify", "--model", "bundled"],
    ["doctor", "--model", "bundled"],
])
def test_model_bundled_is_the_bundled_models_folder(argv):
    args = build_parser(argv).parse_args(argv)
    assert args.model == str(bundled_path())
    other = [a if a != "bundled" else "./bundled" for a in argv]  # a folder of that name stays a path
    assert build_parser(other).parse_args(other).model == "./bundled"


def test_every_model_flag_takes_bundled():
    """No command's --model misses it: each parser that has --model maps 'bundled'."""
    from rla.cli import COMMANDS

    found = []
    for name in COMMANDS:
        parser = build_parser([name])
        sub = next(a for a in parser._actions if a.dest == "command").choices[name]
        for action in sub._actions:
            if "--model" in action.option_strings:
                found.append(name)
                assert action.type is not None and action.type("bundled") == str(bundled_path()), name
                assert "bundled" in action.help, name
    assert sorted(found) == ["calibrate", "diagnose", "doctor", "triage", "verify"]  # calibrate: --live
