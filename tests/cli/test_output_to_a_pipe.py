"""Output to a file, pipe or CI log is not cut at 80 columns (issue 37): rich sizes a console that
does not write to a terminal to 80 columns (or ``$COLUMNS``) and cuts the cells of a wider table."""

import io
import os
import re
import subprocess
import sys

from rich.table import Table

from rla import profiles
from rla.console import WIDE, console

from repo_root import ROOT


def _wide_table():
    t = Table(title="numbers")
    for i in range(12):
        t.add_column(f"column {i}", justify="right")
    t.add_row(*(f"{(i + 1) * 1.234567e-4:.6e}" for i in range(12)))
    return t


def test_a_console_that_writes_to_a_file_prints_every_cell_whole():
    buf = io.StringIO()
    console(file=buf).print(_wide_table())
    out = buf.getvalue()
    assert "…" not in out and all(f"{(i + 1) * 1.234567e-4:.6e}" in out for i in range(12))
    # the control: rich's own console, writing to the same kind of file, cuts them
    from rich.console import Console

    plain = io.StringIO()
    Console(file=plain).print(_wide_table())
    assert "…" in plain.getvalue()
    assert console(file=io.StringIO()).width == WIDE and console(file=io.StringIO(), width=60).width == 60


def test_check_ops_through_a_pipe_prints_whole_names_and_numbers():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]),
           "COLUMNS": "80"}  # as a CI runner may set it
    run = subprocess.run([sys.executable, "-m", "rla.cli", "check-ops", "--tokens", "8"], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    assert "…" not in run.stdout
    rows = [[c.strip() for c in line.split("│")[1:-1]] for line in run.stdout.splitlines() if line.startswith("│")]
    assert len(rows) == 4 * len(profiles.names())
    for _, name, differs, max_err, mean_err in rows:
        assert name in profiles.names()
        assert re.fullmatch(r"\d+\.\d%", differs), differs
        assert re.fullmatch(r"\d\.\d{3}e[-+]\d\d", max_err) and re.fullmatch(r"\d\.\d{3}e[-+]\d\d", mean_err)
