"""The gated products ``swiglu`` (silu(gate) * up), ``geglu`` (gelu_tanh(gate) * up) and ``attn_gate``
(attn * sigmoid(gate)), bit for bit on CPU, forward and backward, under both values of their point
(``swiglu``, ``attn_gate``).

The expected bits are written here from the spec (docs/rounding.md; the backward of
``rla/ops/reference.py``'s docstring), independently of ``rla.ops``:

- forward ``per_op``: eager PyTorch on the lp tensors (HF's ``ACT2FN['silu'](gate) * up``,
  ``ACT2FN['gelu_pytorch_tanh'](gate) * up`` and ``attn * torch.sigmoid(gate)``: the activation computed in
  fp32 and rounded, then the product rounded);
  ``fused``: the activation and the product in fp32 of the lp inputs, one ``.to(lp)``;
- backward (both values: the per_op rounding is straight-through): with s = sigmoid(g) in fp32 of the lp
  input, each gradient one fp32 expression rounded once to its input's dtype:
  swiglu  d_up = dy * (g * s), d_gate = (dy * up) * (s * (1 + g * (1 - s)));
  attn    d_attn = dy * s,     d_gate = (dy * attn) * (s * sigmoid(-g));
  geglu (no s)  d_up = dy * gelu_tanh(g), d_gate = (dy * up) * gelu_tanh'(g), the derivative of
  0.5 g (1 + tanh(b (g + k g^3))) written as 0.5 (1 + t) + 0.5 g (1 - t^2) (b (1 + 3 k g^2)).

fp32 inputs (nothing rounded) expose the fp32 expressions' own bits; ``test_the_pin_can_fail`` shows
that the nearby expressions of the same derivative (F.silu for g * s, s * (1 - s) for s * sigmoid(-g),
another association) give other bits on these inputs, so the pin tells them apart.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import rla.ops as ops
from rla import profiles

DTYPES = [torch.bfloat16, torch.float16, torch.float32]
SHAPES = [(3, 5, 64), (7, 33), (2, 1031), (1,)]


def _row(value):
    return profiles.get("hf").replace(name=f"gated-{value}", swiglu=value, attn_gate=value)


def _inputs(shape, dtype, seed, strided=False):
    """(x, g, dy): x and dy ~ N(0, 1), g ~ N(0, 16) (sigmoid saturates at both ends); ``strided``:
    every second column of a wider tensor, the layout of an interleaved gate_up."""
    gen = torch.Generator().manual_seed(seed)
    wide = (*shape[:-1], 2 * shape[-1]) if strided else shape
    x, g, dy = (torch.randn(wide, generator=gen) * s for s in (1.0, 4.0, 1.0))
    if strided:
        x, g, dy = x[..., ::2], g[..., 1::2], dy[..., ::2]
    return x.to(dtype), g.to(dtype), dy.to(dtype)


def _swiglu_spec(gate, up, dy, value):
    lp = gate.dtype
    gf, uf, dyf = gate.float(), up.float(), dy.float()
    if value == "per_op":
        out = F.silu(gate) * up
    else:
        out = (F.silu(gf) * uf).to(lp)
    s = torch.sigmoid(gf)
    dgate = ((dyf * uf) * (s * (1.0 + gf * (1.0 - s)))).to(lp)
    dup = (dyf * (gf * s)).to(lp)
    return out, (dgate, dup)


def _attn_gate_spec(attn, gate, dy, value):
    lp = attn.dtype
    af, gf, dyf = attn.float(), gate.float(), dy.float()
    if value == "per_op":
        out = attn * torch.sigmoid(gate)
    else:
        out = (af * torch.sigmoid(gf)).to(lp)
    s = torch.sigmoid(gf)
    dattn = (dyf * s).to(lp)
    dgate = ((dyf * af) * (s * torch.sigmoid(-gf))).to(lp)
    return out, (dattn, dgate)


_BETA, _KAPPA = 0.7978845608028654, 0.044715  # sqrt(2 / pi) as PyTorch's kernels write it; HF's 0.044715


def _geglu_spec(gate, up, dy, value):
    lp = gate.dtype
    gf, uf, dyf = gate.float(), up.float(), dy.float()
    if value == "per_op":
        out = F.gelu(gate, approximate="tanh") * up
    else:
        out = (F.gelu(gf, approximate="tanh") * uf).to(lp)
    t = torch.tanh(_BETA * (gf + _KAPPA * gf * gf * gf))
    slope = 0.5 * (1.0 + t) + 0.5 * gf * (1.0 - t * t) * (_BETA * (1.0 + 3.0 * _KAPPA * gf * gf))
    dgate = ((dyf * uf) * slope).to(lp)
    dup = (dyf * F.gelu(gf, approximate="tanh")).to(lp)
    return out, (dgate, dup)


def _geglu_op(gate, up, value):
    return ops.geglu(gate, up, _row(value))


def _swiglu_op(gate, up, value):
    return ops.swiglu(gate, up, _row(value))


def _attn_gate_op(attn, gate, value):
    return ops.attn_gate(attn, gate, _row(value))


# (op, spec, order of the op's arguments as (activated, other) -> positional)
CASES = {
    "swiglu": (_swiglu_op, _swiglu_spec, lambda g, x: (g, x)),
    "geglu": (_geglu_op, _geglu_spec, lambda g, x: (g, x)),
    "attn_gate": (_attn_gate_op, _attn_gate_spec, lambda g, x: (x, g)),
}


def _run(op, args, dy, value, needs=(True, True)):
    # detach, not clone: the op sees the spec's layout (torch's CPU sigmoid of a strided fp32 tensor
    # is not bit-equal to that of a dense copy; clone makes a strided tensor dense)
    leaves = [a.detach().requires_grad_(n) for a, n in zip(args, needs)]
    out = op(*leaves, value)
    out.backward(dy)
    return out.detach(), tuple(leaf.grad for leaf in leaves)


def _int(dtype):
    return {torch.bfloat16: torch.int16, torch.float16: torch.int16, torch.float32: torch.int32}[dtype]


def _same_bits(got, want, what):
    assert got.dtype == want.dtype and got.shape == want.shape, what
    g, w = got.contiguous().view(-1).view(_int(got.dtype)), want.contiguous().view(-1).view(_int(want.dtype))
    n = int((g != w).sum())
    assert n == 0, f"{what}: {n} of {g.numel()} elements differ in their bits"


@pytest.mark.parametrize("strided", [False, True], ids=["dense", "strided"])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("value", ["per_op", "fused"])
@pytest.mark.parametrize("name", list(CASES))
def test_bits_are_the_spec(name, value, dtype, shape, strided):
    op, spec, order = CASES[name]
    x, g, dy = _inputs(shape, dtype, seed=len(shape) + shape[-1], strided=strided)
    args = order(g, x)
    out, grads = _run(op, args, dy, value)
    want_out, want_grads = spec(*args, dy, value)
    _same_bits(out, want_out, f"{name} {value} {dtype} out")
    for i, (got, want) in enumerate(zip(grads, want_grads)):
        _same_bits(got, want, f"{name} {value} {dtype} grad of argument {i}")
    # one gradient asked for at a time: the same bits, and the other not formed
    for i in range(2):
        needs = (i == 0, i == 1)
        _, only = _run(op, args, dy, value, needs)
        _same_bits(only[i], want_grads[i], f"{name} {value} {dtype} grad of argument {i} alone")
        assert only[1 - i] is None


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("name", list(CASES))
def test_the_two_values_differ(name, dtype):
    """The forward pin tells per_op from fused on these inputs (their gradients are the same by the spec)."""
    op, _, order = CASES[name]
    x, g, _ = _inputs((2, 1031), dtype, seed=5)
    assert not torch.equal(op(*order(g, x), "per_op"), op(*order(g, x), "fused"))


def test_the_pin_can_fail():
    """Each backward expression above against its nearest other spelling, on the fp32 inputs of the
    test: every pair differs in some element, so a refactor that swapped one for the other fails."""
    x, g, dy = _inputs((2, 1031), torch.float32, seed=1 + 1031)
    s = torch.sigmoid(g)
    pairs = {
        "swiglu d_up: g * s vs F.silu(g)": (dy * (g * s), dy * F.silu(g)),
        "swiglu d_gate: (dy * up) * slope vs dy * (up * slope)": (
            (dy * x) * (s * (1.0 + g * (1.0 - s))), dy * (x * (s * (1.0 + g * (1.0 - s))))),
        "attn d_gate: s * sigmoid(-g) vs s * (1 - s)": ((dy * x) * (s * torch.sigmoid(-g)), (dy * x) * (s * (1.0 - s))),
    }
    t = torch.tanh(_BETA * (g + _KAPPA * g * g * g))
    pairs["geglu d_gate: 0.5 g (1 - t^2) vs 0.5 g (1 - t) (1 + t)"] = (
        (dy * x) * (0.5 * (1.0 + t) + 0.5 * g * (1.0 - t * t) * (_BETA * (1.0 + 3.0 * _KAPPA * g * g))),
        (dy * x) * (0.5 * (1.0 + t) + 0.5 * g * (1.0 - t) * (1.0 + t) * (_BETA * (1.0 + 3.0 * _KAPPA * g * g))))
    for what, (a, b) in pairs.items():
        assert not torch.equal(a, b), what


@pytest.mark.parametrize("name, names", [("swiglu", ("gate", "up")), ("geglu", ("gate", "up")),
                                         ("attn_gate", ("attn", "gate"))])
def test_errors_name_the_callers_arguments(name, names):
    """One pair check serves the three ops; each error names the op's own arguments, in its order."""
    op = CASES[name][0]
    a, b = torch.ones(3, 4, dtype=torch.bfloat16), torch.ones(3, 4, dtype=torch.bfloat16)
    first, second = names
    with pytest.raises(TypeError, match=f"^{first} must be a torch.Tensor"):
        op([1.0], b, "fused")
    with pytest.raises(TypeError, match=f"^{second} has dtype torch.int64"):
        op(a, b.long(), "fused")
    with pytest.raises(TypeError, match=f"^{first} and {second} must share one dtype"):
        op(a, b.float(), "fused")
    with pytest.raises(ValueError, match=f"^{first} and {second} must be on one device, got cpu, meta"):
        op(a, b.to("meta"), "fused")
    with pytest.raises(ValueError, match=rf"^{first} and {second} must have the same shape, got \(3, 4\) and \(3, 2\)"):
        op(a, b[:, :2], "fused")
