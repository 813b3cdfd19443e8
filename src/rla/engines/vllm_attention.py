"""vLLM's own attention kernel in an HF model's forward, for scoring against a live engine.

Why it exists: against a live engine, most of what the mode's row leaves of the prefill mismatch is
the attention kernel, not a rounding point (the attribution is in
``results/benchmarks/vllm026_attribution_h200_2026-12-02``). A model-level calibration that scores
rows with HF's attention searches the points under noise far larger than what the points decide;
with the engine's kernel in its place, the rows are compared on the rounding points alone.

:func:`engine_attention` swaps the model's attention function, for the duration of a ``with``, for
vLLM's ``unified_attention`` (the Triton kernel of its ``TRITON_ATTN`` backend, the backend the live
adapter starts by default), imported from the installed vllm at run time: q/k/v laid out as vLLM's
attention layer receives them ([tokens, heads, head_dim]), K/V written to a paged bf16 cache of
:data:`BLOCK`-token blocks as the engine keeps it, one sequence per call (its prefill launch; a
prefill of one sequence attends the same way whether the engine chunked it or batched it with
others: every key tile in order, a fully masked tile a no-op). The engine's decode launches
(split-KV for small decode batches) are another reduction and are not reproduced: a training
forward is a prefill.

What an HF attention module hands the interface is passed on as vLLM's attention layer passes it
(``vllm/v1/attention/backends/triton_attn.py``, ``TritonAttentionImpl``): the module's ``scaling``
as ``softmax_scale`` (Gemma 3's ``query_pre_attn_scalar ** -0.5`` included); a sliding window
of ``W`` keys (HF's ``module.sliding_window``, Gemma 3's sliding layers) as
``window_size=(W - 1, 0)``, which the kernel reads as ``dist < W`` -- the same ``W`` keys, the
query's own among them, as HF's sliding mask; a logit ``softcap`` as is (0: none); attention
sinks (GPT-OSS's ``s_aux``, one logit per query head that joins each row's softmax denominator)
as ``sinks``, the tensor itself: vLLM's ``GptOssAttention`` (``models/gpt_oss.py``) hands its
``sinks`` parameter (one per head, the model's dtype) to the layer, which passes it to the kernel
unchanged (``TritonAttentionImpl.forward``), and HF's module holds the same checkpoint values.

Forward only (no backward; vLLM's kernel has none): it scores, it does not train.

Importing vLLM disables cuDNN's SDPA for the whole process (``vllm/platforms/cuda.py``:
``torch.backends.cuda.enable_cudnn_sdp(False)``), so HF's own attention picks another kernel
afterwards; :func:`engine_attention` leaves that setting as it found it.
"""

from __future__ import annotations

import contextlib

import torch

__all__ = ["engine_attention", "swapped", "attention_forward", "window_of", "BLOCK", "BACKENDS"]

BLOCK = 16
"""The KV-cache block size of the paged cache (vLLM's default for ``TRITON_ATTN``)."""

BACKENDS = ("TRITON_ATTN",)
"""The engine attention backends whose kernel :func:`engine_attention` runs."""

_NAME = "rla_vllm_triton_attn"


def _kernel():
    try:
        from vllm.v1.attention.ops.triton_unified_attention import unified_attention
    except ImportError as e:
        raise RuntimeError(
            "the engine's attention needs vLLM's Triton attention kernel "
            f"(vllm.v1.attention.ops.triton_unified_attention): {e}; score with the model's own attention instead"
        ) from None
    return unified_attention


def window_of(module, kwargs) -> tuple[int, int]:
    """vLLM's ``window_size`` for ``module``: ``(W - 1, 0)`` for a sliding window of ``W`` keys
    (``TritonAttentionImpl.__init__``), ``(-1, -1)`` for full causal attention. ``W`` is what the
    HF call passes (``sliding_window=``; Mistral passes its config's and keeps no attribute), else
    the module's ``sliding_window``; where both are given they must agree."""
    window = getattr(module, "sliding_window", None)
    passed = kwargs.get("sliding_window", window)
    if hasattr(module, "sliding_window") and passed != window:
        raise ValueError(f"the attention call passes sliding_window={passed!r} but its module has {window!r}")
    window = passed
    if window is None:
        return (-1, -1)
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ValueError(f"sliding_window={window!r}: expected a number of keys >= 1")
    return (window - 1, 0)


def attention_forward(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """HF attention interface -> ``unified_attention`` over a paged cache (one causal sequence)."""
    b, h, s, d = query.shape
    kvh = key.shape[1]
    if b != 1:
        raise ValueError(f"the engine's attention scores one sequence per forward, got a batch of {b}")
    sinks = kwargs.get("s_aux")
    if sinks is None:
        sinks = getattr(module, "sinks", None)
    if sinks is not None and tuple(sinks.shape) != (query.shape[1],):
        raise ValueError(f"attention sinks of shape {tuple(sinks.shape)}: expected one per query head ({query.shape[1]})")
    window = window_of(module, kwargs)
    softcap = kwargs.get("softcap") or 0
    if scaling is None:
        scaling = d ** -0.5  # what HF's own attention functions take for None
    nb = (s + BLOCK - 1) // BLOCK
    q = query[0].transpose(0, 1).contiguous()
    kc = query.new_zeros(nb * BLOCK, kvh, d)
    vc = query.new_zeros(nb * BLOCK, kvh, d)
    kc[:s] = key[0].transpose(0, 1)
    vc[:s] = value[0].transpose(0, 1)
    out = torch.empty_like(q)
    dev = q.device
    ones = torch.ones(1, kvh, dtype=torch.float32, device=dev)  # bf16 cache: the kernel's unit descales
    _kernel()(
        q=q, k=kc.view(nb, BLOCK, kvh, d), v=vc.view(nb, BLOCK, kvh, d), out=out,
        cu_seqlens_q=torch.tensor([0, s], dtype=torch.int32, device=dev), max_seqlen_q=s,
        seqused_k=torch.tensor([s], dtype=torch.int32, device=dev), max_seqlen_k=s,
        softmax_scale=scaling, causal=True, window_size=window,
        block_table=torch.arange(nb, dtype=torch.int32, device=dev)[None], softcap=softcap,
        q_descale=None, k_descale=ones, v_descale=ones, sinks=sinks)
    return out[None], None


@contextlib.contextmanager
def engine_attention(model, backend: str = "TRITON_ATTN"):
    """Within the block, ``model`` attends with the engine's kernel for ``backend`` (module doc)."""
    if backend not in BACKENDS:
        raise ValueError(f"the engine's attention is wired for {BACKENDS}, not {backend!r}; start the engine with "
                         "--attention-backend TRITON_ATTN or score with the model's own attention")
    if not torch.cuda.is_available():
        raise RuntimeError("the engine's attention runs vLLM's Triton kernel on CUDA; this torch sees no GPU")
    cudnn = torch.backends.cuda.cudnn_sdp_enabled()
    _kernel()
    try:
        with swapped(model):
            yield model
    finally:
        torch.backends.cuda.enable_cudnn_sdp(cudnn)


@contextlib.contextmanager
def swapped(model):
    """Within the block, ``model``'s attention modules call :func:`attention_forward` (registered
    with transformers' attention and mask interfaces); :func:`engine_attention` checks the backend
    and the device around it."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(_NAME, attention_forward)
    AttentionMaskInterface.register(_NAME, sdpa_mask)
    old = model.config._attn_implementation
    model.config._attn_implementation = _NAME
    try:
        yield model
    finally:
        model.config._attn_implementation = old
