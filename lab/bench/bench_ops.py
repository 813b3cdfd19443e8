"""Per-op benchmark (GPU). Same as ``rla bench ops``; see ``rla.bench.ops``.

``--config tuned.json`` (from ``tune_fused.py``) sets kernel launch parameters for the run (also in
``--isolate`` workers); the values used are recorded in the results.
"""

import sys

from rla.commands.bench import add_arguments, run


def main(kind: str) -> int:
    """``python bench_<kind>.py ARGS``: ``rla bench KIND ARGS``."""
    import argparse

    p = argparse.ArgumentParser(description=__doc__)
    add_arguments(p)
    return run(p.parse_args([kind, *sys.argv[1:]]))


if __name__ == "__main__":
    sys.exit(main("ops"))
