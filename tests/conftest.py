"""Fixtures shared by several test files (this file stays at the top of ``tests/``, so they are
visible in every folder). The layout of ``tests/`` is described in ``docs/README.md``, "Tests"."""

import os
import sys

import pytest

from engine_versions import SGLANG_VERSION, VLLM_UNCALIBRATED_VERSION, VLLM_VERSION


def _cached_wheel(name: str, version: str, size: str) -> str:
    """``name==version``'s wheel from the engine cache (``$RLA_ENGINE_CACHE``, else
    ``~/.cache/rla/engines``), downloaded there once when absent (``rla.engines.source.download_wheel``:
    parallel-safe, as pytest-xdist's workers each ask)."""
    from rla.engines.source import cache_dir, cached_wheel, download_wheel

    found = cached_wheel(name, version)
    if found is None:
        print(f"\n[rla tests] downloading {name}=={version} ({size}, once) into {cache_dir()}", file=sys.stderr)
        found = download_wheel(name, version)
    return str(found)


@pytest.fixture(scope="session")
def sglang_wheel():
    """SGLang 0.5.23's wheel (39 MB; its Python files and kernel sources, read in place), the
    code the SGLang adapter tests check. SGLang pins torch 2.14 and a server's worth of
    dependencies, so it is never installed; cached like vLLM's wheel. ``$RLA_SGLANG_WHEEL`` names
    another file holding its members (the GPU session carries one without the server's compiled
    extensions)."""
    import os

    return os.environ.get("RLA_SGLANG_WHEEL") or _cached_wheel("sglang", SGLANG_VERSION, "39 MB")


@pytest.fixture(scope="session")
def vllm_wheel():
    """vLLM 0.33.0's wheel (336 MB), the engine code the calibration and twin tests run.

    Looked up in the engine cache (``$RLA_ENGINE_CACHE``, else ``~/.cache/rla/engines``) and
    downloaded there once with ``pip download --no-deps`` when absent: vLLM pins torch 2.14, so it
    is never installed; its Python files are read from the wheel (nothing of it is vendored).
    """
    return _cached_wheel("vllm", VLLM_VERSION, "336 MB")


@pytest.fixture(scope="session")
def vllm_wheel_if_cached(request):
    """For the tests that never download vLLM 0.33's wheel themselves (they skip without it):
    ``$RLA_ENGINE_WHEEL``, else the engine cache's wheel, else None. When this session also runs a
    test that downloads it (one using ``vllm_wheel``), it is that download's wheel: under
    pytest-xdist another worker may be downloading it right now, and waiting for it keeps what a
    serial run of the same tests runs."""
    import os

    from rla.engines.source import cache_dir

    if os.environ.get("RLA_ENGINE_WHEEL"):
        return os.environ["RLA_ENGINE_WHEEL"]
    if any("vllm_wheel" in item.fixturenames for item in request.session.items):
        return request.getfixturevalue("vllm_wheel")
    return next(iter(sorted(cache_dir().glob(f"vllm-{VLLM_VERSION}-*.whl"))), None)


@pytest.fixture(scope="session")
def vllm_uncalibrated_wheel():
    """vLLM 0.26.0's wheel (304 MB), a real release with no calibrated row: the profile-version
    tests install its metadata as an installed vLLM would have it. Cached and downloaded like
    vLLM 0.33's wheel (once, ``pip download --no-deps``, into the engine cache)."""
    return _cached_wheel("vllm", VLLM_UNCALIBRATED_VERSION, "304 MB")


@pytest.fixture(scope="session")
def vllm_engine(vllm_wheel):
    from rla.engines import vllm

    return vllm.load(vllm_wheel)


def pytest_configure(config):
    """A pytest-xdist worker takes its share of the cores as torch intra-op threads (one each for the two
    workers on the 2-core CI machine), it and the processes its tests start (``OMP_NUM_THREADS``, read by
    torch at import): two workers of one file each running as many OpenMP threads as the machine has cores
    make four busy threads on two cores, and OpenMP's waiting threads spin (tiny ops ~10x slower). Runs in
    one process (``-n 0``) and a ``OMP_NUM_THREADS`` set before pytest keep theirs."""
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if workers is None or "OMP_NUM_THREADS" in os.environ:
        return
    import torch

    share = max(1, len(os.sched_getaffinity(0)) // int(workers))
    os.environ["OMP_NUM_THREADS"] = str(share)
    torch.set_num_threads(share)


def pytest_terminal_summary(terminalreporter):
    """The CPU the run was made on, in every run's summary (``-q`` included): the suite's bit-level
    tests measure the CPU's behaviour at run time, so a CI log says which behaviour it measured."""
    from rla.environment import cpu_model

    terminalreporter.write_line(f"rla tests ran on: {cpu_model()}")
