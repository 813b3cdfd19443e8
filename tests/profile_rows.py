"""The built-in rows that round differently, for the tests that run an op or a model under every row.

Two rows can round identically: ``vllm-0.26-eager`` and ``vllm-0.33-eager`` were calibrated on
different vLLM versions and found the same at every point (``vllm-0.26`` and ``vllm-0.33`` too, but
for the GPT-OSS variant the live 0.26 engine gave the default row). A test parametrized over
the rows gains nothing from the second of such a pair but its time, so those tests take
:data:`DISTINCT`: each set of rows with the same points, router points, variants and conditions once,
by the newest name (the one the aliases resolve to). ``tests/profiles/test_profiles.py`` checks that
every row left out rounds as its representative, so nothing goes untested.
"""

from rla import profiles

__all__ = ["DISTINCT", "SAME_AS", "rounding_key"]


def rounding_key(row) -> tuple:
    """Everything of a row that decides where it rounds (its name, description and evidence do not)."""
    router = tuple(row.router.points().items()) if row.router is not None else None
    variants = tuple(sorted((k, tuple(sorted(v.items()))) for k, v in row.variants.items()))
    return tuple(row.points().items()), router, variants, repr(row.conditions)


def _distinct() -> tuple[tuple[str, ...], dict[str, str]]:
    kept: dict[tuple, str] = {}
    same: dict[str, str] = {}
    for name in reversed(profiles.names()):  # the newest of equal rows is listed last
        key = rounding_key(profiles.get(name))
        if key in kept:
            same[name] = kept[key]
        else:
            kept[key] = name
    return tuple(n for n in profiles.names() if n not in same), same


DISTINCT, SAME_AS = _distinct()
"""The rows once per way of rounding, in :func:`rla.profiles.names` order; and each row left out ->
the row that stands for it."""
