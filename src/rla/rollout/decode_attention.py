"""The static decoder's attention: one query token, grouped K/V heads as they are, filled columns only.

HF's SDPA attention, given an explicit mask (which the static cache needs), repeats every grouped-query
K/V head of the *whole* cache before attending (``repeat_kv``; transformers 5.17 does, 5.24 packs the
query heads instead), and attends over all ``max_len`` columns however few are filled. In a small
model's decode step those copies and that attention are most of the GPU time (the profile is in
``results/benchmarks/h200_2026-12-01_decode_loop.md``). This function attends the same query to the
same keys with neither cost (the speed-up is in ``results/benchmarks/h200_2026-12-01_decode_attention.md``):

- the ``G = heads / kv_heads`` query heads that share a K/V head become ``G`` query rows of that head
  (``[b, heads, 1, d] -> [b, kv_heads, G, d]``), so no K/V is copied;
- only the first ``W`` cache columns are read, ``W`` being the mask's width: the decoder passes a mask of
  the columns filled so far, rounded up (``rla.rollout.static_decode.WINDOW``), and a graph per width.

Both are exact reformulations: every query row sees the same keys with the same mask, and masked columns
add exactly zero. The softmax and sums run in SDPA's kernel, as in HF's path, whose reduction order may
depend on the number of columns: a logprob can move in its last bits, not more (tests/rollout).

It is registered with transformers as :data:`NAME` and selected only for the decode step
(:func:`decode_attention_of`), so prefill and training keep the model's own attention.
"""

from __future__ import annotations

import contextlib
import functools

import torch
import torch.nn.functional as F

__all__ = ["NAME", "grouped_decode_attention", "decode_attention_of"]

NAME = "rla_grouped_decode"


def grouped_decode_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """transformers' attention-function signature -> (``[b, 1, heads, d]`` output, None).

    ``query`` ``[b, heads, 1, d]``; ``key``/``value`` the cache ``[b, kv_heads, max_len, d]``;
    ``attention_mask`` boolean ``[b, 1, 1, W]`` with ``W <= max_len`` (True = attend).
    """
    b, heads, q_len, d = query.shape
    kv_heads, width = key.shape[1], attention_mask.shape[-1]
    if q_len != 1 or attention_mask.dtype != torch.bool or attention_mask.shape[1:3] != (1, 1):
        raise ValueError(
            f"the grouped decode attention takes one query token and a boolean [b, 1, 1, W] mask; got "
            f"{q_len} query tokens and a {attention_mask.dtype} mask of {tuple(attention_mask.shape)}"
        )
    if width > key.shape[2] or heads % kv_heads:
        raise ValueError(f"mask of {width} columns for a cache of {key.shape[2]}, or {heads} heads "
                         f"not a multiple of {kv_heads} K/V heads")
    if dropout:
        raise ValueError("the grouped decode attention is for sampling: dropout must be 0")
    q = query.reshape(b, kv_heads, heads // kv_heads, d)
    out = F.scaled_dot_product_attention(q, key[:, :, :width], value[:, :, :width], attn_mask=attention_mask,
                                         scale=scaling)
    return out.reshape(b, heads, 1, d).transpose(1, 2).contiguous(), None


@functools.cache  # once per process: the eager decode path enters decode_attention_of every step
def _register() -> None:
    from transformers import AttentionInterface

    AttentionInterface.register(NAME, grouped_decode_attention)


@contextlib.contextmanager
def decode_attention_of(model):
    """Run ``model``'s attention as :func:`grouped_decode_attention` inside the block.

    Swaps the config's ``_attn_implementation`` (which HF's attention modules read at every call),
    and puts it back on exit; the block must pass its own 4D mask (HF's mask builders are not asked).
    """
    _register()
    config = model.config
    before = config._attn_implementation
    config._attn_implementation = NAME
    try:
        yield
    finally:
        config._attn_implementation = before
