"""The repository root, for tests that read or run what lies outside ``src/`` (README, scripts,
benchmarks, results, ``.ci``).

Found by what marks it (``pyproject.toml`` beside ``src/rla``), not by counting a test file's
parents, so test files can move between the folders of ``tests/``. ``tests/`` is on ``sys.path``
(``pythonpath`` in ``pyproject.toml``): ``from repo_root import ROOT``.
"""

from pathlib import Path


def find_root(start: Path) -> Path:
    """The nearest folder at or above ``start`` that holds ``pyproject.toml`` and ``src/rla``."""
    for folder in (start, *start.parents):
        if (folder / "pyproject.toml").is_file() and (folder / "src" / "rla").is_dir():
            return folder
    raise RuntimeError(f"no repository root (pyproject.toml beside src/rla) at or above {start}")


ROOT = find_root(Path(__file__).resolve().parent)
