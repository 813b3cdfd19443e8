"""SGLang 0.5.23's code for GPT-OSS, GLM-4 MoE and Qwen3.5 (``rla.engines.sglang_families``), from its
wheel, against what the ``sglang-0.5.23`` row and docs/families.md say of it.

- Every link the docs cite is in the wheel (``FACTS``), and one that moved is a clear error.
- GPT-OSS: SGLang's own YaRN cache builder gives the fp32 tables the aligned rotary hands RoPE under
  the row's ``rope_cos_sin='fp32'``, bit for bit on the same device; its Triton MoE runner's clamped
  SwiGLU, compiled by Inductor as SGLang compiles it, is ``rla.ops.swiglu_oai`` under the row's
  ``fused`` (run eagerly on bf16 tensors, the same expression is HF's ``per_op``).
- Qwen3.5: the fused q/k norm + partial RoPE + gate kernel, SGLang's Triton file run by Triton's
  interpreter on a CPU, is rla's aligned q/k norm and partial RoPE under the row's ``qwen3_5`` variant
  bit for bit at a head size outside the fused-RoPE sizes, where the row's head-size rule would round
  the tables; on a GPU the compiled kernel is compared the same way (FMA contraction allowed).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest
import torch

import rla
from rla import profiles
from rla.engines import EngineCodeError
from rla.engines import sglang_families as SF
from rla.engines.source import locate
from interpreted_env import interpreter_env

BF = torch.bfloat16


@pytest.fixture(scope="module")
def pkg(sglang_wheel):
    return locate("sglang", sglang_wheel)


@pytest.mark.parametrize("family", ["gpt_oss", "glm4_moe", "qwen3_5"])
def test_the_code_the_docs_read_is_in_the_wheel(pkg, sglang_wheel, family):
    prov = SF.check_facts(pkg, family)
    assert len(prov) >= 4
    assert all(p["file"].startswith(str(Path(sglang_wheel).resolve()) + "!sglang/") for p in prov.values())
    if family == "gpt_oss":  # the triton_kernels MoE runner needs a package SGLang's wheel does not require
        meta = pkg.read_text("sglang-0.5.23.dist-info/METADATA")
        requires = [line for line in meta.splitlines() if line.startswith("Requires-Dist:")]
        assert requires and not any("triton" in line.lower() for line in requires)


def test_a_moved_fact_is_a_clear_error(pkg, tmp_path):
    fact = next(f for f in SF.FACTS if f.function == "Qwen3_5AttentionDecoderLayer._prepare_qkv_gate")
    changed = tmp_path / "sglang-0.5.23-changed.whl"
    members = {f.file for f in SF.FACTS} | {"sglang-0.5.23.dist-info/METADATA"}
    with zipfile.ZipFile(pkg.location) as zin, zipfile.ZipFile(changed, "w") as zout:
        for name in sorted(members):
            text = zin.read(name).decode()
            if name == fact.file:
                assert "self.forward_prepare_cuda_fused(" in text
                text = text.replace("self.forward_prepare_cuda_fused(", "self.forward_prepare_native(")
            zout.writestr(name, text)
    SF.check_facts(locate("sglang", changed), "gpt_oss")  # the other families' facts still hold
    with pytest.raises(EngineCodeError, match=r"(?s)family evidence must be read again:.*_prepare_qkv_gate no longer "
                                              r"says .*fused q/k norm \+ RoPE kernel"):
        SF.check_facts(locate("sglang", changed))
    with pytest.raises(ValueError, match="no SGLang facts for family 'llama'"):
        SF.check_facts(pkg, "llama")


# -- GPT-OSS ------------------------------------------------------------------------------------

RELEASED_ROPE = {"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0, "original_max_position_embeddings": 4096,
                 "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False}  # gpt-oss-20b / -120b's config.json


@pytest.mark.parametrize("shape", ["tiny", "released"])
def test_gpt_oss_yarn_cache_is_the_aligned_rotary_tables(pkg, shape):
    import transformers
    from gpt_oss_spec import tiny_gpt_oss

    model = tiny_gpt_oss()
    if shape == "released":  # the released head size and rope parameters on the tiny body
        cfg = model.config
        cfg.head_dim, cfg.rope_parameters, cfg.max_position_embeddings = 64, dict(RELEASED_ROPE), 131072
        model = transformers.GptOssForCausalLM(cfg).eval()
    cfg, rotary = model.config, model.model.rotary_emb
    rp = cfg.rope_parameters
    cache, prov = SF.yarn_cache(pkg, cfg.head_dim, cfg.head_dim, rp["rope_theta"], rp)
    assert cache.dtype == torch.float32
    assert cache.shape == (rp["original_max_position_embeddings"] * int(rp["factor"]), cfg.head_dim)
    assert {"YaRNScalingRotaryEmbedding.__init__", "YaRNScalingRotaryEmbedding._compute_cos_sin_cache"} <= set(prov)
    n = cache.shape[0]
    positions = torch.tensor([[0, 1, 2, 17, 63, 64, n // 2 + 3, n - 1]])
    rla.align(model, "hf")  # inv_freq on the host, as the cache here (the CPU)
    try:
        cos, sin = rotary(torch.zeros(1, dtype=BF), positions)  # the aligned rotary's fp32 half tables
    finally:
        rla.unalign(model)
    half = cfg.head_dim // 2
    assert cos.dtype == torch.float32 and rotary.attention_scaling > 1.0  # the factor is in both, and not 1
    assert torch.equal(cos[0], cache[positions[0], :half]) and torch.equal(sin[0], cache[positions[0], half:])
    with pytest.raises(ValueError, match=r"builds a yarn rope_scaling's cache, got \{'rope_type': 'default'\}"):
        SF.yarn_cache(pkg, cfg.head_dim, cfg.head_dim, rp["rope_theta"], {"rope_type": "default"})


def _gate_up(seed=0, rows=257, inter=96):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(rows, 2 * inter, generator=g) * 4).to(BF)  # past the clamp limit (7) on both sides
    x[0, :10] = torch.tensor([8.0, -8.0, 7.0, 6.99, -7.5, 100.0, -100.0, 0.0, -0.0, 1e-3]).to(BF)
    return x


def _compiler() -> str | None:
    return shutil.which(os.environ.get("CXX", "g++")) or shutil.which("c++")


def test_gpt_oss_clamped_swiglu_as_sglang_compiles_it_is_the_rows_fused(pkg):
    """SGLang wraps it in ``torch.compile`` (Inductor): fp32 throughout, one rounding. Inductor's CPU code
    is checked here; on CUDA it is Triton's, :func:`test_gpt_oss_clamped_swiglu_compiled_on_cuda`."""
    if _compiler() is None:
        pytest.skip("Inductor's CPU backend needs a C++ compiler (g++ or c++ on PATH)")
    fn, prov = SF.gpt_oss_swiglu(pkg)
    assert prov["file"].endswith("!sglang/srt/layers/moe/moe_runner/triton_utils/fused_moe.py")
    x, alpha, limit = _gate_up(), 1.702, 7.0  # GPT-OSS's hidden_act_alpha default and swiglu_limit
    gate, up = x[..., ::2], x[..., 1::2]  # gate_up_interleaved, as GPT-OSS's checkpoint and HF lay it out
    row, hf = profiles.get("sglang-0.5.23"), profiles.get("hf")
    torch._dynamo.reset()
    got = torch.compile(fn)(x, alpha, limit)
    assert got.dtype == BF and got.shape == gate.shape
    fused, per_op = rla.ops.swiglu_oai(gate, up, alpha, limit, row), rla.ops.swiglu_oai(gate, up, alpha, limit, hf)
    assert row.swiglu == "fused" and torch.equal(got, fused)
    assert (got == per_op).float().mean() < 0.8  # the two choices differ here
    assert torch.equal(fn(x, alpha, limit), per_op)  # the same expression on bf16 tensors, uncompiled: HF's


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpt_oss_clamped_swiglu_compiled_on_cuda(pkg):
    """Inductor's Triton kernel for it on the GPU against rla's reference (run on the CPU): its exp may
    differ from the CPU's in the last bit, so a fraction is asserted, not equality."""
    fn, _ = SF.gpt_oss_swiglu(pkg)
    x = _gate_up(rows=4096)
    torch._dynamo.reset()
    got = torch.compile(fn)(x.cuda(), 1.702, 7.0).cpu()
    fused = rla.ops.swiglu_oai(x[..., ::2], x[..., 1::2], 1.702, 7.0, "sglang-0.5.23")
    per_op = rla.ops.swiglu_oai(x[..., ::2], x[..., 1::2], 1.702, 7.0, "hf")
    matched = (got == fused).float().mean().item()
    print(f"compiled on CUDA: fused {matched:.6f}, per_op {(got == per_op).float().mean().item():.6f}")
    assert matched >= 0.999 and matched > (got == per_op).float().mean().item() + 0.1


# -- Qwen3.5 ------------------------------------------------------------------------------------

# The kernel's body under Triton's interpreter, with one repair (interpreter_compat.round_bf16_casts): the
# interpreter's fp32 -> bf16 cast rounds to nearest even, as the compiled kernel's does.
SCRIPT = textwrap.dedent('''
    import json, sys
    import interpreter_compat
    interpreter_compat.fix_scalar_index()
    interpreter_compat.round_bf16_casts()
    from qwen3_5_kernel_case import run
    print(json.dumps(run(sys.argv[1], sys.argv[2], "cpu")))
''')



@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs Triton (its interpreter)")
def test_qwen3_5_attention_kernel_is_rla_under_the_qwen3_5_variant(sglang_wheel, tmp_path):
    run = subprocess.run([sys.executable, "-c", SCRIPT, str(sglang_wheel), str(tmp_path)], env=interpreter_env(),
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-4000:]
    cases = json.loads(run.stdout.strip().splitlines()[-1])
    small, released = cases["32/8"], cases["64/16"]
    # head size 32: outside the fused-RoPE sizes, where the row's rule rounds the tables per op
    assert small["row"]["points"] == ["round", "per_op", "round"]
    assert small["variant"]["points"] == ["fp32", "fused", "round"]
    assert small["variant"]["q"] == small["variant"]["k"] == 1.0 and small["gate"] and released["gate"]
    assert max(small["row"]["q"], small["row"]["k"]) < 0.97
    # head size 64 (one of them): row and variant agree, and both are the kernel
    assert released["row"]["points"] == released["variant"]["points"] == ["fp32", "fused", "round"]
    assert released["variant"]["q"] == released["variant"]["k"] == 1.0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_qwen3_5_attention_kernel_compiled_on_cuda(sglang_wheel, tmp_path):
    """The compiled kernel on the GPU against rla on the CPU: Triton may contract a RoPE product into
    an FMA (a last-bit difference, the row's rope_apply note), so a fraction is asserted."""
    from qwen3_5_kernel_case import run

    cases = run(str(sglang_wheel), str(tmp_path), "cuda")
    print(cases)
    small = cases["32/8"]
    assert min(small["variant"]["q"], small["variant"]["k"]) >= 0.999
    assert max(small["row"]["q"], small["row"]["k"]) < min(small["variant"]["q"], small["variant"]["k"])
    assert min(cases["64/16"]["variant"]["q"], cases["64/16"]["variant"]["k"]) >= 0.999
