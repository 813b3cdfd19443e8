"""The vLLM 0.33.0 wheel for the engine tests: found in the engine cache, downloaded once if absent.

The wheel is never vendored: ``$RLA_ENGINE_CACHE`` (or ``~/.cache/rla/engines``) holds it, and
``pip download --no-deps vllm==0.33.0`` fetches it there the first time (336 MB).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from rla.engines.source import cache_dir

VERSION = "0.33.0"


def find_or_download() -> Path:
    cache = cache_dir()
    found = sorted(cache.glob(f"vllm-{VERSION}-*.whl"))
    if found:
        return found[0]
    cache.mkdir(parents=True, exist_ok=True)
    print(f"\n[rla tests] downloading the vLLM {VERSION} wheel (336 MB, once) into {cache}", file=sys.stderr)
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", f"vllm=={VERSION}", "-d", str(cache)],
        capture_output=True, text=True,
    )
    found = sorted(cache.glob(f"vllm-{VERSION}-*.whl"))
    if proc.returncode != 0 or not found:
        pytest.fail(f"could not download vllm=={VERSION} into {cache}: {proc.stderr[-2000:]}")
    return found[0]


@pytest.fixture(scope="session")
def vllm_wheel() -> Path:
    return find_or_download()


@pytest.fixture(scope="session")
def vllm_engine(vllm_wheel):
    from rla.engines import vllm

    return vllm.load(str(vllm_wheel))
