"""End-to-end training-step benchmark (GPU). Same as ``rla bench e2e``; see ``rla.bench.e2e``.

``--config tuned.json`` applies kernel launch parameters first (see ``bench_ops.py``).
"""

import sys

from bench_ops import apply_config

from rla.commands.bench import add_arguments, run

if __name__ == "__main__":
    import argparse

    argv = sys.argv[1:]
    if "--config" in argv:
        i = argv.index("--config")
        apply_config(argv[i + 1])
        del argv[i : i + 2]
    p = argparse.ArgumentParser(description=__doc__)
    add_arguments(p)
    sys.exit(run(p.parse_args(["e2e", *argv])))
