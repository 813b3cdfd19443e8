"""Fixtures shared by several test files (this file stays at the top of ``tests/``, so they are
visible in every folder). The layout of ``tests/`` is described in ``docs/README.md``, "Tests"."""

import subprocess
import sys

import pytest

VLLM_VERSION = "0.33.0"


@pytest.fixture(scope="session")
def vllm_wheel():
    """vLLM 0.33.0's wheel (336 MB), the engine code the calibration and twin tests run.

    Looked up in the engine cache (``$RLA_ENGINE_CACHE``, else ``~/.cache/rla/engines``) and
    downloaded there once with ``pip download --no-deps`` when absent: vLLM pins torch 2.14, so it
    is never installed; its Python files are read from the wheel (nothing of it is vendored).
    """
    from rla.engines.source import cache_dir

    folder = cache_dir()
    found = sorted(folder.glob(f"vllm-{VLLM_VERSION}-*.whl"))
    if not found:
        folder.mkdir(parents=True, exist_ok=True)
        print(f"\n[rla tests] downloading vllm=={VLLM_VERSION} (336 MB, once) into {folder}", file=sys.stderr)
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "--no-deps", f"vllm=={VLLM_VERSION}", "-d", str(folder)],
            check=True,
        )
        found = sorted(folder.glob(f"vllm-{VLLM_VERSION}-*.whl"))
    assert found, f"no vllm-{VLLM_VERSION} wheel in {folder}"
    return str(found[-1])


@pytest.fixture(scope="session")
def vllm_engine(vllm_wheel):
    from rla.engines import vllm

    return vllm.load(vllm_wheel)
