"""Per-op benchmark (GPU). Same as ``rla bench ops``; see ``rla.bench.ops``.

``--config tuned.json`` (from ``tune_fused.py``) sets kernel launch parameters before the run; the
values used are recorded in the results.
"""

import importlib
import json
import sys

from rla.commands.bench import add_arguments, run


def apply_config(path):
    with open(path) as f:
        cfg = json.load(f)
    for module, attrs in cfg.items():
        mod = importlib.import_module(module)
        for k, v in attrs.items():
            setattr(mod, k, v)
    print("launch config:", json.dumps(cfg))
    return cfg


def main(kind: str) -> int:
    """``python bench_<kind>.py [--config tuned.json] ARGS``: rla bench KIND, launch config first."""
    import argparse

    argv = sys.argv[1:]
    if "--config" in argv:
        i = argv.index("--config")
        apply_config(argv[i + 1])
        del argv[i : i + 2]
    p = argparse.ArgumentParser(description=__doc__)
    add_arguments(p)
    return run(p.parse_args([kind, *argv]))


if __name__ == "__main__":
    sys.exit(main("ops"))
