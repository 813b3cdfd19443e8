"""``rla profiles``: the rounding-profile table, versioned rows with their evidence, and aliases."""

from __future__ import annotations


def add_arguments(parser) -> None:
    parser.add_argument("--json", action="store_true", help="print JSON (every row with its calibration) instead of tables")
    parser.add_argument("--evidence", action="store_true", help="also print, per row, each point's evidence and fraction matched")


def run(args) -> int:
    import json

    from rla.console import console as make_console
    from rich.table import Table

    from rla import profiles

    rows = list(profiles.all_profiles().values())
    aliases = profiles.aliases()
    if args.json:
        print(json.dumps({"profiles": [profiles.to_dict(p) for p in rows], "aliases": aliases}, indent=2))
        return 0
    console = make_console()
    # one row per point, one column per profile: fits an 80-column terminal (a column per point did not)
    from rich import box

    table = Table(title="Rounding profiles (docs/rounding.md): where each stack rounds fp32 to bf16",
                  box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("point", no_wrap=True)
    for p in rows:  # a version on a line of its own keeps the columns narrow
        table.add_column(p.name.replace("-", "-\n", 1), no_wrap=True)
    table.add_row("[dim]calibrated[/]", *[f"[dim]{p.calibration.mode}[/]" if p.calibration else "[dim]-[/]" for p in rows])
    values = [p.points() for p in rows]
    for point in profiles.POINTS:
        table.add_row(point, *[v[point] for v in values])
    for point in profiles.ROUTER_POINTS:  # MoE router points; "model" = HF's own module's values
        table.add_row(f"router.{point}", *[getattr(p.router, point) if p.router else "model" for p in rows])
    console.print(table)
    console.print("aliases (the newest calibrated row of each engine and mode): "
                  + ", ".join(f"{a} -> {t}" for a, t in aliases.items()), highlight=False)
    for p in rows:
        cal = p.calibration
        measured = f" Measured on {cal.gpu}, torch {cal.torch}, {cal.date[:10]} ({cal.results})." if cal and cal.gpu else ""
        console.print(f"  [bold]{p.name}[/]: {p.description}.{measured}", highlight=False)
    variants = [(p.name, kind, point, value) for p in rows for kind, points in p.variants.items()
                for point, value in points.items()]
    if variants:  # other kinds of modules whose engine code rounds otherwise (docs/families.md)
        console.print("variants (docs/families.md): "
                      + "; ".join(f"{n} {kind}: {point}={value}" for n, kind, point, value in variants), highlight=False)
    conditions = [(p.name, c) for p in rows for c in p.conditions]
    if conditions:  # points that hold at some head sizes only (docs/rounding.md)
        console.print("conditions (docs/rounding.md): " + "; ".join(
            f"{n} at {key.replace('_', ' ')} {list(sizes)}: " + ", ".join(f"{k}={v}" for k, v in c.points.items())
            for n, c in conditions for key, sizes in c.when.items()), highlight=False)
    if args.evidence:
        for p in rows:
            if p.calibration is None:
                continue
            ev = Table(title=f"{p.name}: evidence per point")
            for col in ("point", "choice", "evidence", "matched", "note"):
                ev.add_column(col)
            for point, e in p.calibration.points.items():
                matched = "-" if e.matched is None else f"{e.matched:.6%}"
                ev.add_row(point, getattr(p, point), e.evidence, matched, e.note)
            for kind, points in p.variant_evidence.items():
                for point, e in points.items():
                    matched = "-" if e.matched is None else f"{e.matched:.6%}"
                    ev.add_row(f"{point} ({kind})", p.variants[kind][point], e.evidence, matched, e.note)
            for c in p.conditions:
                (key, sizes), = c.when.items()
                for point, e in c.evidence.items():
                    matched = "-" if e.matched is None else f"{e.matched:.6%}"
                    ev.add_row(f"{point} ({key} {list(sizes)})", c.points[point], e.evidence, matched, e.note)
            for point, e in (p.router.evidence if p.router else {}).items():
                matched = "-" if e.matched is None else f"{e.matched:.6%}"
                ev.add_row(f"router.{point}", getattr(p.router, point), e.evidence, matched, e.note)
            console.print(ev)
    return 0
