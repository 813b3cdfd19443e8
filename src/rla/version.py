"""rla's version: the installed distribution's, else the source tree's ``pyproject.toml`` (a checkout
on ``PYTHONPATH``); ``rla --version`` prints it with torch's and transformers'."""

from __future__ import annotations

from pathlib import Path

__all__ = ["version", "versions_line"]


def version() -> str:
    from importlib.metadata import PackageNotFoundError, version as dist_version

    pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
    if pyproject.is_file():  # a source tree: its own version, whatever else is installed
        import tomllib

        project = tomllib.loads(pyproject.read_text()).get("project", {})
        if project.get("name") == "rla" and "version" in project:
            return f"{project['version']} (source tree {pyproject.parent})"
    try:
        return dist_version("rla")
    except PackageNotFoundError:
        return "unknown (neither installed nor in its source tree)"


def versions_line() -> str:
    """``rla X (...); torch Y; transformers Z``, read from the distributions' metadata (nothing imported)."""
    from importlib.metadata import PackageNotFoundError, version as dist_version

    parts = [f"rla {version()}"]
    for dist in ("torch", "transformers"):
        try:
            parts.append(f"{dist} {dist_version(dist)}")
        except PackageNotFoundError:
            parts.append(f"{dist} not installed")
    return "; ".join(parts)
