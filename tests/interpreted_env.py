"""The environment of a subprocess that runs an engine's own Triton kernel under Triton's interpreter
(tests/engines/test_sglang_families.py, test_vllm_families.py): ``TRITON_INTERPRET=1`` and, before what was
on ``PYTHONPATH``, the repository's ``src``, ``tests`` (the kernel cases) and ``tests/ops``
(``interpreter_compat``, whose repairs the subprocess's script installs)."""

from __future__ import annotations

import os

from repo_root import ROOT


def interpreter_env() -> dict:
    path = [str(ROOT / "src"), str(ROOT / "tests"), str(ROOT / "tests" / "ops")]
    return dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=os.pathsep.join(
        [*path, *filter(None, [os.environ.get("PYTHONPATH")])]))
