"""Per-op benchmark (GPU). Same as ``rla bench ops``; see ``rla.bench.ops``."""

import sys

from rla.commands.bench import add_arguments, run

if __name__ == "__main__":
    import argparse

    p = argparse.ArgumentParser(description=__doc__)
    add_arguments(p)
    sys.exit(run(p.parse_args(["ops", *sys.argv[1:]])))
