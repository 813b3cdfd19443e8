"""``softmax='reciprocal'``'s denominator: vLLM's fused top-k softmax sums a row per thread, then
by an xor butterfly; ``rla.ops.routing.kernel_row_sum`` equals that order written out per thread
(``router_spec.kernel_sum``), bit for bit, and the layouts are the kernel's own instantiations."""

from __future__ import annotations

import torch

from rla.ops.routing import kernel_row_sum, topk_softmax_layout

import router_spec

# (experts) -> (values per thread, bytes per load) of vLLM 0.26's topkGating<..., __nv_bfloat16, SOFTMAX>,
# read from the kernel names in its _moe_C library
BF16_INSTANTIATIONS = {1: (1, 2), 2: (2, 4), 4: (4, 8), 8: (8, 16), 16: (8, 16), 32: (8, 16), 64: (8, 16),
                       128: (8, 16), 192: (6, 4), 256: (8, 16), 320: (10, 4), 384: (12, 4), 448: (14, 4),
                       512: (16, 16), 576: (18, 4)}


def test_layouts_are_the_kernels_instantiations():
    for experts, (vpt, nbytes) in BF16_INSTANTIATIONS.items():
        got_vpt, elts, threads = topk_softmax_layout(experts, 2)
        assert (got_vpt, elts * 2, threads) == (vpt, nbytes, experts // vpt), experts
    assert topk_softmax_layout(60, 2) is None and topk_softmax_layout(96, 4) is None  # the unfused fallback


def test_kernel_row_sum_is_the_per_thread_order():
    g = torch.Generator().manual_seed(0)
    differs = False
    for experts in (8, 64, 192, 512):
        for itemsize in (2, 4):
            e = torch.rand(6, experts, generator=g) ** 4  # spread magnitudes: orders round differently
            got = kernel_row_sum(e, topk_softmax_layout(experts, itemsize))
            want = torch.tensor([[float(router_spec.kernel_sum(r, itemsize))] for r in e.tolist()])
            assert torch.equal(got, want), (experts, itemsize)
            seq = e[:, :1].clone()
            for j in range(1, experts):
                seq = seq + e[:, j:j + 1]
            differs |= not torch.equal(got, seq)
    assert differs  # the butterfly is not the plain in-order sum: the comparison above can fail
