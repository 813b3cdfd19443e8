"""vLLM's own ``topk_softmax``, ``grouped_topk`` and ``moe_sum`` (its ``_moe_C`` library, loaded at
run time) equal ``rla.ops.routing`` under the vLLM row's values, bit for bit: expert ids in slot
order and fp32 weights at expert counts the kernel fuses, with and without renormalisation, on
Gaussian logits and on coarse ones where exact ties are common; DeepSeek-V3's grouped sigmoid
router at 8 and 256 experts; the combined output (``fp32_slot_order``) at
top-k 2 to 8 through the vector and the scalar kernels, where ``lp_slot_order`` differs from it.
GPU only; skipped unless ``RLA_VLLM_MOE_LIB`` names the library file
(``vllm/_moe_C_stable_libtorch.abi3.so`` of the 0.26.0 wheel)."""

from __future__ import annotations

import os

import pytest
import torch

LIB = os.environ.get("RLA_VLLM_MOE_LIB")

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
              pytest.mark.skipif(not LIB, reason="RLA_VLLM_MOE_LIB (vLLM's _moe_C library file) not given")]


@pytest.mark.parametrize("experts", [8, 64, 128])
def test_vllm_topk_softmax_is_the_vllm_rows_definition(experts):
    from lab.bench import router_probe_h200 as probe

    probe.load(LIB)
    for k in (2, 3, 8):
        for renormalize in (True, False):
            for kind in ("gaussian", "coarse"):
                case = probe.topk_softmax_case(experts, k, renormalize, kind, tokens=2048, seed=experts + k)
                assert case["fused"]
                got = case["rows"]["vllm-0.33"]
                assert got["ids_equal_in_order"] == 1.0 and got["weights_bit_equal"] == 1.0, (k, renormalize, kind, got)


@pytest.mark.parametrize("shape", [(8, 2, 1, 3), (256, 8, 4, 8)])
def test_vllm_grouped_topk_is_the_vllm_rows_definition(shape):
    """DeepSeek-V3's router (the tests' tiny shape and the real one): ids in slot order and fp32
    weights bit for bit under sigmoid=tanh_half (CUDA's torch.tanh being the kernel's tanhf) and
    sigmoid_renorm=warp_fp64; each value changed alone must lose bits (the probe's variants)."""
    from lab.bench import router_probe_h200 as probe

    probe.load(LIB)
    for kind in ("gaussian", "coarse"):
        case = probe.grouped_case(*shape, tokens=2048, seed=shape[0], kind=kind)
        assert case["small_kernel"]
        got = case["rows"]["vllm-0.33"]
        assert got["ids_equal_in_order"] == 1.0 and got["weights_bit_equal"] == 1.0, (shape, kind, got)
        assert case["rows"]["vllm-0.33 sigmoid=torch"]["weights_bit_equal"] < 1.0, (shape, kind)
        if shape[3] > 2:  # the butterfly's order differs from slot order from k = 3 on
            assert case["rows"]["vllm-0.33 sigmoid_renorm=divide"]["weights_bit_equal"] < 1.0, (shape, kind)


def test_vllm_moe_sum_is_the_vllm_rows_combine():
    from lab.bench import router_probe_h200 as probe

    probe.load(LIB)
    for k in (2, 3, 4, 5, 8):
        for hidden in (2048, 100):
            case = probe.moe_sum_case(k, hidden, tokens=512, seed=k)
            assert case["rows"]["fp32_slot_order"]["outputs_bit_equal"] == 1.0, (k, hidden, case)
            if k >= 3:  # an lp accumulator rounds every add: it must tell the two apart
                assert case["rows"]["lp_slot_order"]["outputs_bit_equal"] < 1.0, (k, hidden, case)
