"""``.ci/run`` runs exactly the README's test command, and every test path that command names exists
(a moved or renamed test file would otherwise drop out of the second environment's run silently:
pytest exits 4 on a missing path, but a glob that matches nothing is passed to it verbatim)."""

import re

from repo_root import ROOT


def _readme_test_command() -> list[str]:
    blocks = re.findall(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    return blocks[1].strip().splitlines()  # the second command: set up and run the tests


def test_ci_runs_the_readme_test_command():
    lines = (ROOT / ".ci" / "run").read_text().splitlines()
    commands = [line for line in lines if line and not line.startswith(("#", "set ", "cd "))]
    assert commands == _readme_test_command()


def test_every_test_path_of_the_command_exists():
    named = [path for line in _readme_test_command() for run in re.findall(r"-m pytest -q([^&|;]*)", line)
             for path in run.split()]
    assert named, "the README's test command names no test paths (the second environment's run)"
    for path in named:
        found = sorted(ROOT.glob(path))
        tests = [f for p in found for f in ([p] if p.is_file() else p.rglob("test_*.py"))]
        assert tests, f"{path} (in the README's test command) matches no test file"
