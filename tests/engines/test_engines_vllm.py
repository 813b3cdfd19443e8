"""vLLM 0.33's own region code, loaded from its wheel (never from the repository), on the CPU.

Each native op is checked against an independent expression of what its eager bf16 arithmetic
does, so the test proves the extracted function is vLLM's and runs; the cos/sin cache built by
vLLM's builder is checked against HF's rotary init on the same device, plain and llama3-scaled.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest
import torch

from rla.engines import EngineCodeError, EngineUnavailable
from rla.engines import vllm as V

BF = torch.bfloat16
LLAMA31 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
           "original_max_position_embeddings": 8192}


def _rn(v):
    return v.to(BF).float()


def test_loads_from_the_wheel_with_provenance(vllm_engine, vllm_wheel):
    assert vllm_engine.version == "0.33.0"
    expected = {
        "rms_norm", "fused_add_rms_norm", "SiluAndMul.forward_native", "ApplyRotaryEmb.forward_static",
        "RotaryEmbedding.forward_static", "RotaryEmbeddingBase._compute_inv_freq",
        "RotaryEmbeddingBase._compute_cos_sin_cache", "RotaryEmbeddingBase._match_cos_sin_cache_dtype",
        "Llama3RotaryEmbedding._compute_inv_freq",
    }
    assert set(vllm_engine.provenance) == expected
    for prov in vllm_engine.provenance.values():
        assert prov["file"].startswith(str(Path(vllm_wheel).resolve()) + "!vllm/") and len(prov["sha256"]) == 64


def test_native_ops_match_their_eager_arithmetic(vllm_engine):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(8, 256, generator=g).to(BF)
    r = torch.randn(8, 256, generator=g).to(BF)
    w = (1 + 0.1 * torch.randn(256, generator=g)).to(BF)
    eps = 1e-6
    # rms_norm run eagerly: fp32 x*rstd, rounded to the weight's dtype, times w rounded again
    rstd = torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps)
    expect = (_rn(x.float() * rstd) * w.float()).to(BF)
    out = vllm_engine.rms_norm_native(x, w, eps)
    assert torch.equal(out, expect)
    # fused_add_rms_norm: the norm reads the fp32 sum; the residual handed on is RN(x + r)
    s = x.float() + r.float()
    rstd = torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + eps)
    out, res = vllm_engine.fused_add_rms_norm_native(x, r, w, eps)
    assert torch.equal(res, s.to(BF)) and torch.equal(out, (_rn(s * rstd) * w.float()).to(BF))
    # SiluAndMul.forward_native: silu in fp32 rounded to bf16, then the bf16 product rounded
    gu = (3 * torch.randn(8, 64, generator=g)).to(BF)
    gate, up = gu[:, :32].float(), gu[:, 32:].float()
    assert torch.equal(vllm_engine.silu_and_mul_native(gu), (_rn(torch.nn.functional.silu(gate)) * up).to(BF))
    assert not torch.equal(vllm_engine.silu_and_mul_native(gu), (torch.nn.functional.silu(gate) * up).to(BF))


def test_rope_native_matches_neox_rotation_on_the_bf16_cache(vllm_engine):
    d, t = 64, 6
    cache = vllm_engine.cos_sin_cache(d, d, 4096, 1e4, None, BF, "cpu")
    assert cache.dtype == BF and cache.shape == (4096, d)
    g = torch.Generator().manual_seed(1)
    q = torch.randn(t, 2 * d, generator=g).to(BF)
    k = torch.randn(t, d, generator=g).to(BF)
    pos = torch.tensor([0, 1, 7, 100, 2048, 4095])
    q_out, k_out = vllm_engine.rope_native(pos, q, k, d, cache)
    cos, sin = cache[pos].float().chunk(2, dim=-1)

    def rot(x):  # bf16 eager: each product and the difference rounded
        x = x.view(t, -1, d).float()
        x1, x2 = x[..., : d // 2], x[..., d // 2 :]
        c, s = cos[:, None], sin[:, None]
        o1 = _rn(_rn(x1 * c) - _rn(x2 * s))
        o2 = _rn(_rn(x2 * c) + _rn(x1 * s))
        return torch.cat((o1, o2), -1).to(BF).reshape(t, -1)

    assert torch.equal(q_out, rot(q)) and torch.equal(k_out, rot(k))
    assert torch.equal(q_out[0], q[0])  # position 0: cos 1, sin 0


@pytest.mark.parametrize("base,scaling,max_pos", [(1e6, None, 32768), (5e5, LLAMA31, 131072)])
def test_cache_equals_hf_rotary_init_on_the_same_device(vllm_engine, base, scaling, max_pos):
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    d = 128
    params = {"rope_type": "default", "rope_theta": base} if scaling is None else {**scaling, "rope_theta": base}
    cfg = LlamaConfig(hidden_size=d, num_attention_heads=1, head_dim=d, max_position_embeddings=max_pos,
                      rope_parameters=params)
    hf = LlamaRotaryEmbedding(cfg)
    inv = vllm_engine.inv_freq(d, base, scaling, "cpu")
    assert inv.dtype == torch.float32 and torch.equal(inv, hf.inv_freq)
    cache = vllm_engine.cos_sin_cache(d, d, max_pos, base, scaling, torch.float32, "cpu")
    cos, sin = hf(torch.zeros(1), torch.arange(max_pos)[None])
    assert torch.equal(cache, torch.cat((cos[0, :, : d // 2], sin[0, :, : d // 2]), -1))
    # the bf16 cache the kernels read is that table rounded once
    assert torch.equal(vllm_engine.cos_sin_cache(d, d, max_pos, base, scaling, BF, "cpu"), cache.to(BF))
    if scaling is not None:  # llama3 scaling changed the low frequencies
        assert not torch.equal(inv, vllm_engine.inv_freq(d, base, None, "cpu"))


def test_rope_scaling_errors(vllm_engine):
    with pytest.raises(ValueError, match=r"'yarn' is not supported .*\(supported: default, llama3\)"):
        vllm_engine.cos_sin_cache(64, 64, 16, 1e4, {"rope_type": "yarn", "factor": 4.0}, BF, "cpu")
    with pytest.raises(ValueError, match="missing 'low_freq_factor'"):
        vllm_engine.inv_freq(64, 1e4, {"rope_type": "llama3", "factor": 8.0})


def test_kernels_need_cuda(vllm_engine):
    if torch.cuda.is_available():
        pytest.skip("CUDA present: the kernels are exercised by the GPU calibration")
    with pytest.raises(EngineUnavailable, match="run on CUDA.*sees no CUDA device"):
        vllm_engine.c_ops()


def test_source_fact_is_read_from_the_source(vllm_engine):
    fact = vllm_engine.source_fact("rope_inv_freq")
    assert fact["choice"] == "device" and "rotary_embedding/base.py" in fact["where"]


def test_moved_function_is_a_clear_error(vllm_wheel, tmp_path):
    """A vLLM whose layernorm.py no longer defines rms_norm: the error names file, name, version."""
    changed = tmp_path / "vllm-0.99.0-cp38-abi3-linux_x86_64.whl"
    with zipfile.ZipFile(vllm_wheel) as src, zipfile.ZipFile(changed, "w") as dst:
        dst.writestr("vllm-0.99.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: vllm\nVersion: 0.99.0\n")
        for name in ("vllm/ir/ops/layernorm.py",):
            dst.writestr(name, src.read(name).decode().replace("def rms_norm(", "def rms_norm_v2("))
    with pytest.raises(EngineCodeError, match=r"vllm 0\.99\.0: rms_norm is not defined in .*!vllm/ir/ops/layernorm\.py"):
        V.load(str(changed))
