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


def test_rope_case_tables_give_every_implementation_the_same_rotation():
    """rope_case hands each implementation different tables (rla: fp32 half, as rla.align's rotary
    returns them; HF/Liger: HF's bf16 table; naive: fp32 full): rla's vllm numbers must equal the
    naive fp32 expression of the vllm profile bit for bit, and HF eager must rotate the same q."""
    case = ops.rope_case(2, 24, 4, 2, 64)
    data = case.make(torch.device("cpu"))
    q, k = data["inputs"]
    assert data["consts"][0].shape[-1] == 32 and data["consts"][2].shape[-1] == 64
    assert data["consts"][4].dtype == torch.bfloat16
    rla, naive, hf = (case.impls[name](q, k, *data["consts"]) for name in ("rla", "naive", "hf"))
    for a, b in zip(rla, naive):
        assert torch.equal(a, b)
    for a, b in zip(rla, hf):  # per-op rounding in HF: close, not equal
        assert (a.float() - b.float()).abs().max() < 0.05 * b.float().abs().max()
        assert not torch.equal(a, b)
