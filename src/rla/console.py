"""The rich console every command prints through: never narrower than its numbers outside a terminal.

rich sizes its output to the terminal, and to 80 columns (or ``$COLUMNS``) when it writes to a file,
a pipe or a CI log; a table wider than that has its cells cut (``2.37e-…``). Outside a terminal this
console is :data:`WIDE` columns wide, and a table takes only the width its cells need, so every
number is printed whole. In a terminal rich's own sizing is kept.
"""

from __future__ import annotations

__all__ = ["WIDE", "console"]

WIDE = 1000
"""Columns of a console that does not write to a terminal."""


def console(**kwargs):
    """A ``rich.console.Console(**kwargs)``, :data:`WIDE` columns wide when it does not write to a terminal
    (and no ``width`` is given)."""
    from rich.console import Console

    c = Console(**kwargs)
    if "width" not in kwargs and not c.is_terminal:
        c = Console(width=WIDE, **kwargs)
    return c
