"""``rla.engines.vllm_attention`` without vLLM: what it hands vLLM's ``unified_attention`` for Gemma 3
(sliding window, ``query_pre_attn_scalar`` scale) and GPT-OSS (attention sinks).

vLLM's kernel runs on CUDA only, so here a reference of its contract stands in for it, written from
``vllm/v1/attention/ops/triton_unified_attention.py`` (vLLM 0.26): keys read from the paged cache
through ``block_table``; query head ``h`` reads KV head ``h // (H / KVH)``; ``S = scale * q.k``,
``softcap * tanh(S / softcap)`` when ``softcap > 0``; a key at distance ``dist = q_pos - k_pos`` is
visible when ``0 <= dist`` and, with ``window_size[0] >= 0``, ``dist < 1 + window_size[0]``
(``SLIDING_WINDOW = 1 + window_size[0]``); with ``sinks``, each query head's sink logit starts the
running max and the denominator (``init_softmax_M``, ``L = 1``): one more logit in the softmax whose
value is dropped; softmax in fp32. With it in place, tiny Gemma 3 and GPT-OSS models in fp32 must give
HF's own eager attention's logits, and each piece of the wiring is shown to matter.
The real kernel: ``tests/engines/test_live_commands.py::test_the_real_commands_on_a_gpu`` and the
GPU command lines in docs/engines.md."""

from __future__ import annotations

import types

import pytest
import torch

from gemma_spec import tiny_gemma3
from rla.engines import vllm_attention


def reference_unified_attention(*, q, k, v, out, cu_seqlens_q, max_seqlen_q, seqused_k, max_seqlen_k, softmax_scale,
                                causal, window_size, block_table, softcap, q_descale, k_descale, v_descale, sinks=None):
    assert causal and q_descale is None and cu_seqlens_q.tolist() == [0, q.shape[0]]
    assert bool((k_descale == 1).all()) and bool((v_descale == 1).all())
    s, heads, d = q.shape
    n = int(seqused_k[0])
    keys = k[block_table[0].long()].reshape(-1, k.shape[2], d)[:n].float()
    values = v[block_table[0].long()].reshape(-1, v.shape[2], d)[:n].float()
    group = heads // k.shape[2]
    keys, values = keys.repeat_interleave(group, dim=1), values.repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.float(), keys) * softmax_scale
    if softcap > 0:
        scores = softcap * torch.tanh(scores / softcap)
    dist = (torch.arange(s)[:, None] + (n - s)) - torch.arange(n)[None, :]
    visible = dist >= 0
    if window_size[0] >= 0:
        visible &= dist < 1 + window_size[0]
    scores = scores.masked_fill(~visible, float("-inf"))
    if sinks is not None:
        sink = sinks.float()[:, None, None].expand(heads, s, 1)
        scores = torch.cat([scores, sink], -1).softmax(-1)[..., :-1]
    else:
        scores = scores.softmax(-1)
    out.copy_(torch.einsum("hqk,khd->qhd", scores, values).to(out.dtype))


@pytest.fixture()
def gemma(monkeypatch):
    monkeypatch.setattr(vllm_attention, "_kernel", lambda: reference_unified_attention)
    model = tiny_gemma3(layers=3, dtype=torch.float32)
    for layer in model.model.layers:  # a query_pre_attn_scalar other than head_dim: the scale is visible
        layer.self_attn.scaling = 40.0 ** -0.5
    return model


def _logits(model, ids):
    with torch.no_grad():
        return model(ids).logits


def test_gemma3_through_the_engine_attention_is_hfs_attention(gemma, monkeypatch):
    ids = torch.randint(0, 128, (1, 24), generator=torch.Generator().manual_seed(0))  # 3x the window of 8
    assert [layer.self_attn.sliding_window for layer in gemma.model.layers] == [8, 8, None]
    hf = _logits(gemma, ids)
    with vllm_attention.swapped(gemma):
        assert gemma.config._attn_implementation == "rla_vllm_triton_attn"
        ours = _logits(gemma, ids)
    assert gemma.config._attn_implementation == "eager"
    torch.testing.assert_close(ours, hf, rtol=0, atol=2e-5)
    # each part of the wiring decides the result: the window's W - 1, the module's scale
    for window in ((-1, -1), (8, 0)):
        monkeypatch.setattr(vllm_attention, "window_of", lambda module, kw, w=window: w if module.sliding_window
                            else (-1, -1))
        with vllm_attention.swapped(gemma):
            assert (_logits(gemma, ids) - hf).abs().max() > 1e-3, window
    monkeypatch.undo()
    monkeypatch.setattr(vllm_attention, "_kernel", lambda: reference_unified_attention)
    for layer in gemma.model.layers:
        layer.self_attn.scaling = 16 ** -0.5
    with vllm_attention.swapped(gemma):
        assert (_logits(gemma, ids) - hf).abs().max() > 1e-3


def test_window_size_is_vllms_convention():
    sliding, full = types.SimpleNamespace(sliding_window=1024), types.SimpleNamespace(sliding_window=None)
    assert vllm_attention.window_of(sliding, {"sliding_window": 1024}) == (1023, 0)
    assert vllm_attention.window_of(full, {}) == (-1, -1)
    assert vllm_attention.window_of(types.SimpleNamespace(), {"sliding_window": 4096}) == (4095, 0)  # Mistral's call
    with pytest.raises(ValueError, match="passes sliding_window=512 but its module has 1024"):
        vllm_attention.window_of(sliding, {"sliding_window": 512})
    with pytest.raises(ValueError, match="a number of keys >= 1"):
        vllm_attention.window_of(types.SimpleNamespace(sliding_window=0), {})


def test_gpt_oss_sinks_through_the_engine_attention_are_hfs(monkeypatch):
    from gpt_oss_spec import tiny_gpt_oss

    monkeypatch.setattr(vllm_attention, "_kernel", lambda: reference_unified_attention)
    model = tiny_gpt_oss(dtype=torch.float32)
    assert all(layer.self_attn.sinks.abs().sum() > 0 for layer in model.model.layers)
    ids = torch.randint(0, 128, (1, 20), generator=torch.Generator().manual_seed(1))
    hf = _logits(model, ids)
    with vllm_attention.swapped(model):
        ours = _logits(model, ids)
    torch.testing.assert_close(ours, hf, rtol=0, atol=2e-5)
    # the sinks decide the result: the kernel without them is another attention
    drop = lambda **kw: reference_unified_attention(**{**kw, "sinks": None})
    monkeypatch.setattr(vllm_attention, "_kernel", lambda: drop)
    with vllm_attention.swapped(model):
        assert (_logits(model, ids) - hf).abs().max() > 1e-3


def test_attention_sinks_of_the_wrong_shape_are_refused(monkeypatch):
    monkeypatch.setattr(vllm_attention, "_kernel", lambda: pytest.fail("the kernel must not run"))
    q = torch.zeros(1, 4, 8, 16)
    for module, kwargs in ((types.SimpleNamespace(sinks=torch.zeros(3), sliding_window=None), {}),
                           (types.SimpleNamespace(sliding_window=None), {"s_aux": torch.zeros(2, 2)})):
        with pytest.raises(ValueError, match="attention sinks of shape .* one per query head .4."):
            vllm_attention.attention_forward(module, q, q[:, :2], q[:, :2], None, scaling=0.25, **kwargs)
