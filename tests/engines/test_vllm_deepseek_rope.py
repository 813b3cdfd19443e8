"""DeepSeek-V3's YaRN rotary as vLLM 0.33 builds it (``DeepseekScalingRotaryEmbedding``, loaded from
its wheel) against the aligned model's: the fp32 cos/sin tables the aligned rotary computes with HF's
own YaRN init (its attention factor included) are vLLM's cache rows, bit for bit, on the same device;
the released config's parameters at its rope head 64, and an ``mscale_all_dim`` whose factor is not 1.
What differs between the stacks is where the tables are rounded and how they are applied (the rows'
points; docs/families.md, DeepSeek-V3), not their values."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import rla
from deepseek_v3_spec import tiny_deepseek_v3


@pytest.mark.parametrize("name", ["yarn_released", "yarn_attention_factor_halves"])
def test_hfs_yarn_tables_are_vllms_cache(vllm_engine, vllm_wheel, name):
    model = tiny_deepseek_v3(name)
    cfg, rotary = model.config, model.model.rotary_emb
    rp = cfg.rope_parameters
    cache = vllm_engine.deepseek_yarn_cache(cfg.qk_rope_head_dim, rp["original_max_position_embeddings"],
                                            rp["rope_theta"], rp)
    assert cache.dtype == torch.float32 and cache.shape == (163840, cfg.qk_rope_head_dim)
    positions = torch.tensor([[0, 1, 2, 17, 1000, 4095, 4096, 65537, 163839]])
    rla.align(model, "hf")  # inv_freq on the host, as vLLM's cache here (the CPU)
    try:
        cos, sin = rotary(torch.zeros(1, dtype=torch.bfloat16), positions)  # fp32 half tables
    finally:
        rla.unalign(model)
    half = cfg.qk_rope_head_dim // 2
    assert cos.dtype == torch.float32 and cos.shape == (1, positions.shape[1], half)
    assert rotary.attention_scaling != 1.0 or name == "yarn_released"
    assert torch.equal(cos[0], cache[positions[0], :half]) and torch.equal(sin[0], cache[positions[0], half:])
    for prov in vllm_engine.deepseek_provenance.values():
        assert prov["file"].startswith(str(Path(vllm_wheel).resolve()) + "!vllm/")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("name", ["yarn_released", "yarn_attention_factor_halves"])
def test_on_cuda_the_device_rows_tables_are_vllms_device_cache(vllm_engine, name):
    """Under ``rope_inv_freq='device'`` the aligned rotary evaluates YaRN's formula on the GPU, ramp included
    (``rla.alignment.compat._yarn_rope_on``), as vLLM builds its cache under the model's device context: the
    fp32 tables are its cache rows bit for bit on CUDA too (HF's own init builds the ramp on the CPU)."""
    model = tiny_deepseek_v3(name).cuda()
    cfg, rotary = model.config, model.model.rotary_emb
    rp = cfg.rope_parameters
    cache = vllm_engine.deepseek_yarn_cache(cfg.qk_rope_head_dim, rp["original_max_position_embeddings"],
                                            rp["rope_theta"], rp, device="cuda")
    positions = torch.tensor([[0, 1, 2, 17, 1000, 4095, 4096, 65537, 163839]], device="cuda")
    row = rla.profiles.get("vllm-0.33-eager")
    assert row.rope_inv_freq == "device"
    rla.align(model, row)
    try:
        cos, sin = rotary(torch.zeros(1, dtype=torch.bfloat16, device="cuda"), positions)
    finally:
        rla.unalign(model)
    half = cfg.qk_rope_head_dim // 2
    assert torch.equal(cos[0], cache[positions[0], :half]) and torch.equal(sin[0], cache[positions[0], half:])
