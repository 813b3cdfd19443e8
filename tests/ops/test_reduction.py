"""The ``norm_reduction`` point: rla's order of a norm's sum of squares, pinned on the CPU.

``rla.ops.reduction`` writes vLLM's CUDA norm reduction as whole-tensor fp32 adds; ``spec.py``
writes the same order as the kernel runs it, one float32 scalar at a time with cub's warp shuffles.
They must agree bit for bit at every launch shape vLLM uses; and the order must matter on these
rows (else the comparison could not fail). Bit equality with vLLM's own kernels is measured on the
H200 (``lab/bench/engine_twin_h200.py --stages reduction``).
"""

from __future__ import annotations

import pytest
import torch

from rla import ops, profiles
from rla.ops.reduction import block_sum_squares, vllm_block_tree
from spec import vllm_mean_square

#: (row length, rows in the call, add + norm kernel): the launch shapes of real models.
SHAPES = [
    (128, 4096 * 16, False),  # Qwen3 q/k norms: 16 threads, a partial warp
    (896, 1, False), (896, 1, True),  # Qwen2-0.5B decode
    (1536, 17, False), (1536, 300, True),  # 1.5B: 192 vectors, 1024 or 256 threads
    (2048, 256, False), (2048, 255, True),
    (3584, 4096, False), (3584, 4096, True),  # 7B prefill: 256 threads, two reads each
    (3584, 64, False), (3584, 64, True),  # 7B decode: 448 threads
    (5120, 1024, False), (5120, 1024, True),  # three reads per thread
    (92, 1269, False), (92, 1269, True),  # hidden % 8 != 0: vectors of 4 / single elements
    (100, 3, False),
]


def _rows(n: int, kind: str, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if kind == "normal":
        v = torch.randn(3, n, generator=g)
    else:  # magnitudes over 2^-8 .. 2^8: where the order of fp32 adds shows
        v = torch.randn(3, n, generator=g) * torch.exp2(torch.randint(-8, 9, (3, n), generator=g).float())
    return v.to(torch.bfloat16).float()


@pytest.mark.parametrize("n,call_rows,after_add", SHAPES, ids=str)
@pytest.mark.parametrize("kind", ["normal", "wide"])
def test_reduction_equals_the_kernel_written_out(n, call_rows, after_add, kind):
    v = _rows(n, kind, seed=n + call_rows)
    tree = vllm_block_tree(n, call_rows, after_add)
    got = block_sum_squares(v, tree) / n
    want = vllm_mean_square(v, call_rows, after_add)[:, 0]
    assert torch.equal(got, want)


def test_the_order_matters_on_these_rows():
    """Two other orders give other sums on the same rows: the test above can fail."""
    differs_from_torch = differs_from_other_block = 0
    for n, call_rows, after_add in SHAPES:
        v = _rows(n, "wide", seed=n + call_rows)
        mine = block_sum_squares(v, vllm_block_tree(n, call_rows, after_add))
        differs_from_torch += int((mine != v.pow(2).sum(-1)).sum())
        other = vllm_block_tree(n, 0 if call_rows >= 256 else 4096, not after_add)
        if n % other.vec == 0:
            differs_from_other_block += int((mine != block_sum_squares(v, other)).sum())
    assert differs_from_torch >= 10 and differs_from_other_block >= 5


def test_launch_shapes_follow_vllms_rules():
    """Block sizes as vLLM's launchers pick them (16-byte vectors; 1024 threads below 256 rows)."""
    t = vllm_block_tree
    assert (t(3584, 4096, False).threads, t(3584, 4096, False).rounds(3584)) == (256, 2)
    assert (t(3584, 64, False).threads, t(3584, 64, False).rounds(3584)) == (448, 1)
    assert t(1536, 17, True).threads == 1024 and t(1536, 17, True).pairwise
    assert t(1536, 256, True).threads == 256
    assert (t(128, 10**6, False).threads, t(128, 10**6, False).vec) == (16, 8)
    assert (t(92, 5, False).vec, t(92, 5, False).threads) == (4, 23)
    assert (t(92, 5, True).vec, t(92, 5, True).threads, t(92, 5, True).pairwise) == (1, 92, False)
    with pytest.raises(ValueError, match="at least one element"):
        t(0, 1, False)


def test_reference_ops_read_the_point():
    """rla.ops under vllm-0.33-eager reduce in vLLM's order (plain vs add + norm differ), and
    under a profile that differs only in that point they do not."""
    eager = profiles.get("vllm-0.33-eager")
    assert eager.norm_reduction == "vllm_block"
    unpinned = eager.replace(name="eager-unpinned", norm_reduction="unpinned")
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(512, 1536, generator=g) * torch.exp2(torch.randint(-6, 7, (512, 1536), generator=g).float()))
    x = x.to(torch.bfloat16)
    w = (1 + 0.1 * torch.randn(1536, generator=g)).to(torch.bfloat16)
    plain = ops.rms_norm(x, w, 1e-6, eager)
    after = ops.rms_norm(x, w, 1e-6, eager, after_add=True)
    other = ops.rms_norm(x, w, 1e-6, unpinned)
    assert not torch.equal(plain, other) and not torch.equal(plain, after)
    # the add + norm with a zero residual is the after-add norm of x
    assert torch.equal(ops.add_rms_norm(x, torch.zeros_like(x), w, 1e-6, eager)[0], after)
