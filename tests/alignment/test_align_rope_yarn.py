"""YaRN's frequencies on the device (``rla.alignment.compat._yarn_rope_on``): transformers'
``_compute_yarn_parameters`` builds its ramp on the CPU whatever device it is told, the engines build
theirs on the device (vLLM's ``yarn_linear_ramp_mask`` under the model's device context), where PyTorch's
CUDA division by a Python scalar multiplies by its reciprocal. Under ``rope_inv_freq='device'`` the aligned
rotary evaluates every op of the formula where the model runs. Here, on the CPU, the expression is HF's op
for op: bit for bit its init for the released configs that use YaRN (GPT-OSS, DeepSeek-V3, a Qwen long
context), truncated or not, partial rotary, a factor from the lengths; and the one op that moves on CUDA is
named: dividing the ramp by the reciprocal's product changes GPT-OSS's frequencies in 2 of 32, one fp32 ulp
(what the H200 showed: results/benchmarks/gptoss_quotient_h200_2026-12-04/). The CUDA side against vLLM's
own cache: tests/engines/test_vllm_deepseek_rope.py."""

from __future__ import annotations

import math

import pytest
import torch
import transformers
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

from rla.alignment import compat

GPT_OSS = dict(rope_type="yarn", rope_theta=150000.0, factor=32.0, original_max_position_embeddings=4096,
               beta_fast=32.0, beta_slow=1.0, truncate=False)
DEEPSEEK = dict(rope_type="yarn", rope_theta=10000.0, factor=40.0, original_max_position_embeddings=4096,
                beta_fast=32, beta_slow=1, mscale=1.0, mscale_all_dim=1.0)
QWEN_LONG = dict(rope_type="yarn", rope_theta=1000000.0, factor=4.0, original_max_position_embeddings=32768)


def _config(rope, head_dim=64, partial=None, max_positions=131072):
    rp = {**rope, **({"partial_rotary_factor": partial} if partial else {})}
    return transformers.LlamaConfig(hidden_size=8 * head_dim, num_attention_heads=8, head_dim=head_dim,
                                    max_position_embeddings=max_positions, rope_parameters=rp)


CASES = {"gpt_oss": _config(GPT_OSS), "deepseek_v3_rope_head": _config(DEEPSEEK),
         "qwen_long_context": _config(QWEN_LONG, head_dim=128),
         "partial_rotary": _config({**QWEN_LONG, "truncate": False}, head_dim=128, partial=0.5),
         "factor_from_lengths": _config({**GPT_OSS, "factor": None}, max_positions=65536),
         "narrow_range": _config({**GPT_OSS, "beta_fast": 2.0, "beta_slow": 1.9, "truncate": True}, head_dim=16)}


@pytest.mark.parametrize("name", CASES)
def test_on_the_cpu_the_device_expression_is_hfs_yarn_init(name):
    cfg = CASES[name]
    want, _ = ROPE_INIT_FUNCTIONS["yarn"](cfg, device=torch.device("cpu"))
    got = compat._yarn_rope_on(cfg, torch.device("cpu"))
    assert got.dtype == torch.float32 and got.shape == want.shape
    assert torch.equal(got, want), name


def test_the_ramp_divided_by_a_reciprocal_moves_two_of_gpt_osss_frequencies_one_ulp():
    """The CUDA behaviour written on the CPU: the ramp's ``/ (high - low)`` as a product with the
    reciprocal, everything else HF's. Two of the 32 frequencies move by one fp32 ulp (the H200's table);
    so evaluating the ramp where the model runs is a point, not a no-op."""
    cfg = CASES["gpt_oss"]
    rp, dim = cfg.rope_parameters, 64

    def correction_dim(rotations):
        return (dim * math.log(rp["original_max_position_embeddings"] / (rotations * 2 * math.pi))) / (
            2 * math.log(rp["rope_theta"]))

    low, high = max(correction_dim(32.0), 0), min(correction_dim(1.0), dim - 1)
    pos = rp["rope_theta"] ** (torch.arange(0, dim, 2).float() / dim)
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) * torch.tensor(1.0 / (high - low)), 0, 1)
    keep = 1 - ramp
    moved = (1.0 / (32.0 * pos)) * (1 - keep) + (1.0 / pos) * keep
    hf, _ = ROPE_INIT_FUNCTIONS["yarn"](cfg, device=torch.device("cpu"))
    assert int((moved != hf).sum()) == 2
    assert float((moved - hf).abs().max()) == 2.0 ** -31  # one ulp of the frequencies near 2**-8


@pytest.mark.parametrize("name", CASES)
def test_off_the_cpu_the_attention_factor_is_the_modules_own_and_hfs_init_is_not_run_again(name, monkeypatch):
    """``compat.rope_init`` on a device other than the CPU (the meta device here: the formula's ops run there,
    shapes only) takes YaRN's attention factor from the module's ``__init__``, which HF's init gave it from the
    same config; on the CPU it is HF's init, factor and all."""
    cfg = CASES[name]
    rotary = LlamaRotaryEmbedding(cfg)
    hf = ROPE_INIT_FUNCTIONS["yarn"]
    want = hf(cfg)[1]
    calls = []
    monkeypatch.setitem(ROPE_INIT_FUNCTIONS, "yarn", lambda *a, **k: calls.append(1) or hf(*a, **k))
    inv_freq, scaling = compat.rope_init(rotary, torch.device("meta"))
    assert scaling == want and calls == []
    assert inv_freq.is_meta and inv_freq.dtype == torch.float32 and inv_freq.shape == rotary.inv_freq.shape
    cpu_freq, cpu_scaling = compat.rope_init(rotary)
    assert cpu_scaling == want and torch.equal(cpu_freq, hf(cfg)[0]) and calls == [1]
