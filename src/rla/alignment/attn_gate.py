"""The gated attention's output gate through ``rla.ops.attn_gate``: the attention forward rebuilt from
HF's own source at run time, as ``rla.alignment.qk_chain`` rebuilds Qwen3's.

HF 5.24's ``Qwen3_5Attention.forward`` (dense; the MoE model's ``Qwen3_5MoeAttention`` is the same code)
ends with::

    attn_output = attn_output * torch.sigmoid(gate)
    attn_output = self.o_proj(attn_output)

two PyTorch ops on bf16 tensors, RN(attn * RN(sigmoid(gate))). The rewrite changes that one product,
``X * torch.sigmoid(G)`` -> ``_rla_attn_gate(X, G)`` (the source from the installed transformers,
``inspect.getsource``, never a copy in this repository; compiled under HF's file name and line numbers
by :func:`rla.alignment.qk_chain.rewritten_code`), and ``patch.with_globals`` binds ``_rla_attn_gate``
to ``rla.ops.attn_gate`` under the row's variant (the ``attn_gate`` point), beside any other
replacement (the rope region's ``apply_rotary_pos_emb``): one function per class.

Refused, with a clear error and nothing patched, unless the source has exactly one ``torch.sigmoid``
call, taking one positional argument, the right operand of a product, and ``torch`` in the modeling
module is torch.
"""

from __future__ import annotations

import ast
import sys
import types

import torch

from rla import ops
from rla.alignment import compat
from rla.alignment.patch import defined_in, with_globals
from rla.alignment.qk_chain import Refused, rewritten_code

__all__ = ["GATE_NAME", "gated_forward", "make_attn_gate"]

#: The global the rebuilt forward calls for the output gate.
GATE_NAME = "_rla_attn_gate"


def make_attn_gate(profile):
    """``(attn, gate) -> rla.ops.attn_gate(attn, gate, profile)``: what the rebuilt forward calls."""
    def _rla_attn_gate(attn, gate):
        return ops.attn_gate(attn, gate, profile)

    return _rla_attn_gate


def _is_sigmoid(node) -> bool:
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "sigmoid"
            and isinstance(node.func.value, ast.Name) and node.func.value.id == "torch")


def _rewrite(func: ast.FunctionDef) -> None:
    calls = [n for n in ast.walk(func) if _is_sigmoid(n)]
    if len(calls) != 1:
        raise Refused(f"torch.sigmoid(...) is called {len(calls)} times, not once")
    call = calls[0]
    if len(call.args) != 1 or call.keywords or isinstance(call.args[0], ast.Starred):
        raise Refused("torch.sigmoid(...) does not take exactly one positional argument")
    products = [n for n in ast.walk(func)
                if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Mult) and n.right is call]
    if len(products) != 1:
        raise Refused("torch.sigmoid(...) is not the right operand of a product X * torch.sigmoid(G)")
    product = products[0]

    class Gate(ast.NodeTransformer):
        def visit_BinOp(self, node):
            self.generic_visit(node)
            if node is not product:
                return node
            return ast.copy_location(ast.Call(func=ast.Name(id=GATE_NAME, ctx=ast.Load()),
                                              args=[node.left, call.args[0]], keywords=[]), node)

    Gate().visit(func)
    ast.fix_missing_locations(func)


def gated_forward(klass: type, profile, replacements: dict) -> types.FunctionType:
    """``klass.forward`` rebuilt with its output gate through ``rla.ops.attn_gate`` under ``profile``
    (a row's variant: its ``attn_gate``) and ``replacements`` for other globals; raises
    ``NotImplementedError`` naming what differs where the source has another shape."""
    modeling = sys.modules[klass.__module__]
    inner = defined_in(klass.forward, modeling.__dict__)
    try:
        if inner is None:
            raise Refused("no function in its __wrapped__ chain is defined in its modeling module")
        if modeling.__dict__.get("torch") is not torch:
            raise Refused("its modeling module's 'torch' is not torch")
        code = rewritten_code(inner, _rewrite)
    except Refused as e:
        raise NotImplementedError(
            f"rla.align 'swiglu' region: {klass.__name__}.forward's output gate cannot be routed through "
            f"rla.ops.attn_gate: {e}. transformers {compat.TRANSFORMERS_VERSION} may write the gate differently "
            "from 5.24 (src/rla/alignment/attn_gate.py); align without 'swiglu'") from None
    return with_globals(klass.forward, modeling.__dict__, {**replacements, GATE_NAME: make_attn_gate(profile)},
                        code=code)
