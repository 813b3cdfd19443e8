"""The gated attention's output gate, ``attn * sigmoid(gate)`` (Qwen3.5's full-attention layers), under
the variant point ``attn_gate`` (``rla.profiles.variant_points``).

- ``per_op``: RN(attn * RN(sigmoid(g))), HF's ``attn_output * torch.sigmoid(gate)`` on bf16 tensors
  (PyTorch's bf16 sigmoid computes in fp32 and rounds, then the product rounds);
- ``fused``: RN(attn * sigmoid(g)), the sigmoid and the product in fp32 of the lp inputs, one rounding
  (SGLang's ``fused_sigmoid_mul`` kernel, vLLM's compiled graph).

``sigmoid`` is PyTorch's fp32 ``torch.sigmoid`` on the device the tensors are on. The backward is
every reference op's (``rla.ops.reference``): the rounding straight-through, with s = sigmoid(g)
unrounded, d_attn = dy * s and d_gate = dy * attn * s * sigmoid(-g) (= s * (1 - s), without the
cancellation of 1 - s where s is near 1) in fp32, each rounded once to its input's dtype: the gated
product of ``rla.ops._gated``, the Function of ``reference.swiglu``. Saved for backward: the two
inputs (HF's two ops keep attn and RN(sigmoid(g)): the same bytes); s is recomputed. The same
PyTorch ops on every device: one elementwise op with no reduction, which a compiled model fuses
into one kernel of its own.
"""

from __future__ import annotations

from rla.ops._gated import gated_product

__all__ = ["attn_gate"]


def attn_gate(attn, gate, per_op: bool):
    """``attn * sigmoid(gate)``, the sigmoid rounded first when ``per_op`` (inputs already checked)."""
    return gated_product(attn, gate, "sigmoid", 1, per_op)
