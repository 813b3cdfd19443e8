"""End-to-end training-step benchmark (GPU). Same as ``rla bench e2e``; see ``rla.bench.e2e``.

``--config tuned.json`` applies kernel launch parameters first (see ``bench_ops.py``).
"""

import sys

from bench_ops import main

if __name__ == "__main__":
    sys.exit(main("e2e"))
