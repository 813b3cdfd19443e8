"""``rla.alignment.attn_gate``: the attention forward's ``X * torch.sigmoid(G)`` rewritten from its own source
into ``rla.ops.attn_gate(X, G, row)``, and the shapes it refuses, on small modeling modules written here
(HF's own forward is rewritten in tests/alignment/test_align_qwen3_5.py)."""

from __future__ import annotations

import importlib.util
import sys
import textwrap

import pytest
import torch

from rla import profiles
from rla.alignment.attn_gate import gated_forward

GOOD = '''
import torch

class Attention(torch.nn.Module):
    def forward(self, x, gate):
        out = x * 2
        out = out * torch.sigmoid(gate)
        return out
'''


def _module(tmp_path, monkeypatch, name, source):
    path = tmp_path / f"{name}.py"
    path.write_text(textwrap.dedent(source))
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, mod)  # inspect.getsource finds the file through it
    spec.loader.exec_module(mod)
    return mod


def _row(value):
    return profiles.get("hf").replace(name=f"gate-{value}", attn_gate=value)


def test_the_product_becomes_the_op(tmp_path, monkeypatch):
    mod = _module(tmp_path, monkeypatch, "rla_gate_good", GOOD)
    x = torch.randn(4, 32).bfloat16()
    gate = (4 * torch.randn(4, 32)).bfloat16()
    m = mod.Attention()
    assert torch.equal(m.forward(x, gate), (x * 2) * torch.sigmoid(gate))  # HF's two roundings
    for value, want in (("per_op", (x * 2) * torch.sigmoid(gate)),
                        ("fused", ((x * 2).float() * torch.sigmoid(gate.float())).bfloat16())):
        fn = gated_forward(mod.Attention, _row(value), {})
        assert torch.equal(fn(m, x, gate), want), value
        assert fn.__code__.co_filename == str(tmp_path / "rla_gate_good.py")  # HF's file, for tracebacks
    assert mod.Attention.forward.__code__.co_names.count("_rla_attn_gate") == 0  # the class keeps its own


@pytest.mark.parametrize("body, why", [
    ("out = x * torch.nn.functional.sigmoid(gate)", r"torch.sigmoid\(...\) is called 0 times, not once"),
    ("out = x * torch.sigmoid(gate) + torch.sigmoid(x)", r"is called 2 times"),
    ("out = torch.sigmoid(gate) * x", r"not the right operand of a product"),
    ("out = x * torch.sigmoid(input=gate)", r"does not take exactly one positional argument"),
])
def test_another_shape_is_refused_naming_it(tmp_path, monkeypatch, body, why):
    source = f'''
import torch

class Attention(torch.nn.Module):
    def forward(self, x, gate):
        {body}
        return out
'''
    mod = _module(tmp_path, monkeypatch, "rla_gate_bad", source)
    with pytest.raises(NotImplementedError, match=r"Attention.forward's output gate cannot be routed through "
                                                  r"rla.ops.attn_gate: .*" + why):
        gated_forward(mod.Attention, _row("fused"), {})
