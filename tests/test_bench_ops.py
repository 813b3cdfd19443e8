"""The per-op benchmark's isolated mode: each measurement in its own process, failures reported.

The timing itself needs a GPU (benchmarks/results); what runs here is the process plumbing: a
worker that cannot measure hands its error back to the row instead of the row going missing.
"""

import pytest
import torch

from rla.bench import ops


def test_worker_error_comes_back_in_the_row():
    r = ops._measure_isolated("rope", "nope", tokens=16, reps=1, timeout_s=120)
    assert set(r) == {"error"}
    assert "rope has no implementation 'nope'" in r["error"] and "rla" in r["error"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the worker measures (h200_session.sh)")
def test_worker_without_cuda_reports_why():
    r = ops._measure_isolated("swiglu", "rla", tokens=16, reps=1, timeout_s=120)
    assert "worker exited with 1" in r["error"] and "CUDA" in r["error"]
