"""End-to-end training-step benchmark (GPU). Same as ``rla bench e2e``; see ``rla.bench.e2e``."""

import sys

from rla.commands.bench import add_arguments, run

if __name__ == "__main__":
    import argparse

    p = argparse.ArgumentParser(description=__doc__)
    add_arguments(p)
    sys.exit(run(p.parse_args(["e2e", *sys.argv[1:]])))
