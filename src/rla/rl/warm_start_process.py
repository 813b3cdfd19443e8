"""``python -m rla.rl.warm_start_process CONFIG FOLDER``: one model's SFT warm start as its own process.

``rla experiment`` launches this through its scheduler, so a warm start runs, times out and is
stopped like any training run. Not a user command: ``rla train`` with ``init: sft`` does the same
inside one run.
"""

from __future__ import annotations

import sys


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m rla.rl.warm_start_process CONFIG FOLDER", file=sys.stderr)
        return 2
    from rla.rl.config import load_config
    from rla.rl.trainer import resolve_device
    from rla.rl.warm_start import warm_start

    cfg = load_config(argv[0])
    warm_start(cfg, argv[1], resolve_device(cfg.device))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
