"""``import rla`` gives its subpackages as attributes, imported on first use (issue 37)."""

import os
import subprocess
import sys

from repo_root import ROOT


def _run(code: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    return run.stdout


def test_subpackages_are_reachable_after_a_bare_import():
    path = ROOT / "src" / "rla" / "profiles" / "data" / "vllm-0.33.json"
    out = _run(
        "import sys, rla\n"
        "assert 'torch' not in sys.modules and 'rla.profiles' not in sys.modules\n"
        f"p = rla.profiles.load({str(path)!r})\n"
        "assert p.points() == rla.profiles.get('vllm-0.33').points(), p\n"
        "import torch\n"
        "m = rla.metrics.mismatch(torch.zeros(1, 3), torch.zeros(1, 3), torch.ones(1, 3, dtype=torch.bool))\n"
        "assert m['mismatch/k3'] == 0.0 and m['mismatch/bitwise/equal'] == 1.0\n"
        "assert callable(rla.ops.rope) and rla.ops is sys.modules['rla.ops']\n"
        "for name in rla._MODULES:\n"
        "    assert getattr(rla, name) is sys.modules['rla.' + name]\n"
        "try:\n"
        "    rla.no_such_thing\n"
        "except AttributeError as e:\n"
        "    print(e)\n"
    )
    assert "module 'rla' has no attribute 'no_such_thing'" in out
