"""The sigmoid router's values (``sigmoid``, ``sigmoid_renorm``) against independent expressions.

``tanh_half`` on every finite bf16 logit: equal, bit for bit, to an fp64 evaluation of
0.5 + 0.5 t rounded once (t the device's tanh of x / 2, the definition's input), and to the fully
fp64 expression (tanh in fp64 too) wherever torch's CPU tanh is itself correctly rounded.
``warp_fp64``: the warp's butterfly written per token with numpy float32 scalars, then a Python
(fp64) division rounded with numpy. The gradient of the grouped route's weights under both values
against fp64 autograd of the same formula.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rla.ops import routing
from rla.profiles import get


def _all_bf16() -> torch.Tensor:
    x = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
    return x[torch.isfinite(x.float())]


def _bits(t: torch.Tensor) -> np.ndarray:
    return t.contiguous().view(torch.int32).numpy().astype(np.int64)


def test_tanh_half_is_its_definition_on_every_bf16_value():
    x = _all_bf16()
    got = routing.sigmoid_scores(x, "tanh_half")
    assert got.dtype == torch.float32
    t = torch.tanh(x.float() * 0.5).numpy()  # the device's tanh: the definition's input
    want = (0.5 + 0.5 * t.astype(np.float64)).astype(np.float32)  # exact in fp64, rounded once
    assert np.array_equal(_bits(got), _bits(torch.from_numpy(want)))
    # the fully fp64 expression: equal wherever torch's tanh is the correctly rounded one, else
    # off by half an ulp of tanh (absolute: many ulps of a score near 0) and the score's rounding
    x64 = x.double().numpy()
    t_exact = np.tanh(x64 / 2).astype(np.float32)
    full = (0.5 + 0.5 * t_exact.astype(np.float64)).astype(np.float32)
    differ = _bits(got) != _bits(torch.from_numpy(full))
    assert not (differ & (t == t_exact)).any()
    bound = np.spacing(np.abs(t_exact)) + np.spacing(full)
    assert (np.abs(got.numpy().astype(np.float64) - full) <= bound).all()
    # the two points differ, and tanh_half's absolute accuracy: 0 once tanh(x / 2) rounds to -1
    hf = routing.sigmoid_scores(x, "torch")
    assert torch.equal(hf, x.float().sigmoid())
    assert (hf != got).any()
    deep = (x.float() <= -18.1) & (x.float() > -80)  # torch's sigmoid: ~1e-8 down to ~1e-35
    assert deep.any() and (got[deep] == 0).all() and (hf[deep] > 0).all()
    with pytest.raises(ValueError, match="sigmoid='exp' is not one of"):
        routing.sigmoid_scores(x, "exp")


def _warp_oracle(w: np.ndarray, eps: float) -> np.ndarray:
    out = np.empty_like(w)
    for r, row in enumerate(w):
        lanes = [np.float32(v) for v in row] + [np.float32(0)] * (32 - len(row))
        d = 16
        while d:
            lanes = [np.float32(lanes[i] + lanes[i ^ d]) for i in range(32)]
            d //= 2
        s = float(lanes[0]) + eps  # fp64
        out[r] = [np.float32(float(v) / s) for v in row]  # Python's division: IEEE fp64
    return out


@pytest.mark.parametrize("k", [2, 3, 8])
def test_warp_fp64_is_the_warps_butterfly_and_an_fp64_division(k):
    g = torch.Generator().manual_seed(k)
    w = torch.rand(384, k, generator=g) * torch.rand(384, 1, generator=g)  # sigmoid scores' range
    got = routing.renorm_weights(w, "warp_fp64", eps=1e-20)
    want = _warp_oracle(w.numpy(), 1e-20)
    assert np.array_equal(_bits(got), _bits(torch.from_numpy(want)))
    divide = routing.renorm_weights(w, "divide", eps=1e-20)
    if k == 2:  # one add: every order is slot order, and the fp64 quotient rounds as the fp32 one
        assert torch.equal(got, divide)
    else:  # k = 3: (w0 + w2) + w1; k = 8: a tree, not slot order
        assert not torch.equal(got, divide)
    # the division itself: an fp64 quotient of fp32 operands, rounded to fp32, is the fp32 quotient
    s = w.sum(dim=1, keepdim=True)
    assert torch.equal((w.double() / s.double()).float(), w / s)


def test_warp_fp64_refuses_more_than_a_warp():
    with pytest.raises(ValueError, match="k=33 weights do not fit one warp"):
        routing.renorm_weights(torch.rand(2, 33), "warp_fp64")
    with pytest.raises(ValueError, match="renorm='fp64' is not one of"):
        routing.renorm_weights(torch.rand(2, 3), "fp64")


@pytest.mark.parametrize("values", [("tanh_half", "warp_fp64"), ("torch", "torch")])
def test_grouped_route_gradient_is_the_formulas(values):
    sigmoid, renorm = values
    points = get("vllm-0.33").router.replace(sigmoid=sigmoid, sigmoid_renorm=renorm)
    g = torch.Generator().manual_seed(0)
    logits = (torch.randn(64, 8, generator=g) * 2).requires_grad_()
    bias = torch.randn(8, generator=g) * 0.05
    coef = torch.randn(64, 3, generator=g)
    w, ids = routing.sigmoid_grouped_route(logits, bias, 3, 2, 1, True, 1.0, points, torch.bfloat16, finish=False)
    (w * coef).sum().backward()
    l64 = logits.detach().double().requires_grad_()
    s64 = 0.5 + 0.5 * torch.tanh(l64 / 2) if sigmoid == "tanh_half" else torch.sigmoid(l64)
    w64 = s64.gather(1, ids)
    w64 = w64 / (w64.sum(dim=1, keepdim=True) + 1e-20)
    (w64 * coef.double()).sum().backward()
    assert logits.grad.abs().sum() > 0
    torch.testing.assert_close(logits.grad.double(), l64.grad, rtol=1e-5, atol=1e-7)


def test_grouped_topk_small_kernel_shapes():
    # the shapes of the kernel's instantiations in vLLM 0.26's _moe_C, and just past each limit
    assert routing.grouped_topk_small_kernel(256, 8, 4, 8)  # DeepSeek-V3
    assert routing.grouped_topk_small_kernel(8, 2, 1, 3)  # the tests' tiny model
    assert routing.grouped_topk_small_kernel(384, 1, 1, 8) and routing.grouped_topk_small_kernel(512, 1, 1, 22)
    assert not routing.grouped_topk_small_kernel(512, 1, 1, 16)
    assert not routing.grouped_topk_small_kernel(512, 8, 4, 8)  # 64 experts a group
    assert not routing.grouped_topk_small_kernel(256, 8, 5, 8)  # 5 groups kept
    assert not routing.grouped_topk_small_kernel(256, 8, 4, 9)
