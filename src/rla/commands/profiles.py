"""``rla profiles``: the rounding-profile table."""

from __future__ import annotations


def add_arguments(parser) -> None:
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")


def run(args) -> int:
    import json

    from rich.console import Console
    from rich.table import Table

    from rla import profiles

    rows = [profiles.get(n) for n in profiles.names()]
    if args.json:
        print(json.dumps([{"name": p.name, **p.points(), "description": p.description} for p in rows], indent=2))
        return 0
    table = Table(title="Rounding profiles (docs/rounding.md): where each stack rounds fp32 to bf16")
    for col in ("profile", "rope.cos_sin", "rope.apply", "swiglu", "norm.weight", "norm.residual"):
        table.add_column(col, no_wrap=True)
    for p in rows:
        table.add_row(p.name, *p.points().values())
    console = Console()
    console.print(table)
    for p in rows:
        console.print(f"  [bold]{p.name}[/]: {p.description}", highlight=False)
    return 0
