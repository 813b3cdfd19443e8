"""SGLang 0.5.23's code for GPT-OSS, GLM-4 MoE and Qwen3.5, read from its wheel (never copied).

The ``sglang-0.5.23`` row was calibrated on SGLang's Llama/Qwen path (``rla.engines.sglang``). What
it says for three more families rests on their own files, read for docs/families.md; this module
holds that reading as code, so a version that changed it fails loudly instead of leaving the row's
family values standing on nothing:

- :data:`FACTS`: each link of a family's default CUDA path the docs cite (which function calls
  which kernel, where a kernel rounds), checked by :func:`check_facts` against the package in hand;
- :func:`yarn_cache`: GPT-OSS's YaRN cos/sin cache, built by SGLang's own
  ``YaRNScalingRotaryEmbedding.__init__`` / ``_compute_cos_sin_cache`` (``rotary_embedding/yarn.py``);
- :func:`gpt_oss_swiglu`: GPT-OSS's clamped SwiGLU as SGLang's Triton MoE runner computes it between
  its two GEMMs (``swiglu_gpt_oss_sigmoid_alpha``, which SGLang wraps in ``torch.compile``);
- :func:`qwen3_5_qk_norm_rope_gate`: Qwen3.5's fused q/k norm + partial RoPE + gate-split Triton
  kernel (``kernels/ops/attention/fused_qk_rmsnorm_rope_gate.py``), imported from a file extracted
  from the wheel (Triton reads a kernel's source from its file).

Nothing here starts SGLang: each function is compiled alone (``rla.engines.source``), with what its
body names supplied, and ``__init__``s that build SGLang's op machinery are replaced by what they set.
"""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import torch

from rla.engines.facts import Fact, check
from rla.engines.source import (
    EnginePackage,
    EngineUnavailable,
    extract_class,
    extract_function,
    file_provenance,
)

__all__ = ["Fact", "FACTS", "check_facts", "yarn_cache", "gpt_oss_swiglu", "qwen3_5_qk_norm_rope_gate"]

_M = "sglang/srt/models/"
_ROPE = "sglang/srt/layers/rotary_embedding/"
_MOE = "sglang/srt/layers/moe/"
_FUSED_MOE = _MOE + "moe_runner/triton_utils/fused_moe.py"
_YARN = _ROPE + "yarn.py"
_QWEN3_5_KERNEL = "sglang/kernels/ops/attention/fused_qk_rmsnorm_rope_gate.py"


FACTS = (
    # GPT-OSS (srt/models/gpt_oss.py)
    Fact("gpt_oss", _M + "gpt_oss.py", "GptOssDecoderLayer.__init__",
         "self.input_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)",
         "its norms are the plain RMSNorm the row was measured on (FlashInfer's kernels on CUDA)"),
    Fact("gpt_oss", _M + "gpt_oss.py", "GptOssDecoderLayer.__init__",
         "self.attn_boundary, self.ffn_boundary = append_stages(",
         "its adds and norms run through the layer boundaries Llama's and Qwen3's layers use"),
    Fact("gpt_oss", _M + "gpt_oss.py", "GptOssAttention.__init__",
         "self.rotary_emb = get_rope( self.head_dim, rotary_dim=self.head_dim, max_position=max_position_embeddings, "
         "base=rope_theta, rope_scaling=rope_scaling, )",
         "no dtype is passed: the cache is the default RotaryEmbedding's, fp32 on CUDA (vLLM passes fp32 and casts)"),
    Fact("gpt_oss", _ROPE + "factory.py", "get_rope", "rotary_emb = YaRNScalingRotaryEmbedding(",
         "a yarn rope_scaling builds YaRNScalingRotaryEmbedding"),
    Fact("gpt_oss", _YARN, "", "class YaRNScalingRotaryEmbedding(RotaryEmbedding):",
         "a RotaryEmbedding: its forward_cuda, fp32 cache and fused kernel at head sizes 64/128/256/512"),
    Fact("gpt_oss", _YARN, "YaRNScalingRotaryEmbedding._compute_cos_sin_cache",
         "cos = freqs.cos() * self.mscale", "the attention factor scales the fp32 table, before any cast"),
    Fact("gpt_oss", _M + "gpt_oss.py", "GptOssSparseMoeBlock.__init__",
         "activation=self.activation, gemm1_alpha=self.gemm1_alpha, gemm1_clamp_limit=self.gemm1_clamp_limit, "
         "with_bias=True,", "the experts' SwiGLU is the MoE runner's, with GPT-OSS's alpha and limit"),
    Fact("gpt_oss", "sglang/srt/arg_groups/model_overrides/gpt_oss.py", "_gpt_oss_overrides",
         'overrides["moe_runner_backend"] = "triton_kernel"',
         "with the triton_kernels package importable (the wheel does not require it), ep_size 1 and no "
         "quantization, the runner is triton_kernels' matmul with the SwiGLU fused into its epilogue"),
    Fact("gpt_oss", "sglang/srt/layers/quantization/unquant.py", "UnquantizedFusedMoEMethod.create_moe_runner",
         "backend = MoeRunnerBackend.TRITON", "otherwise a bf16 model's runner is SGLang's Triton fused MoE"),
    Fact("gpt_oss", _FUSED_MOE, "", "@torch.compile def swiglu_gpt_oss_sigmoid_alpha(x, gemm1_alpha, gemm1_limit):",
         "the Triton runner's clamped SwiGLU is compiled by Inductor: fp32 throughout, one rounding (fused)"),
    Fact("gpt_oss", _FUSED_MOE, "_fused_moe_kernel_sequence",
         "intermediate_cache2 = swiglu_gpt_oss_sigmoid_alpha( intermediate_cache1.view(-1, N), gemm1_alpha, gemm1_limit, )",
         "it runs between the two expert GEMMs, on the bf16 gate_up (interleaved: gate_up_interleaved)"),
    Fact("gpt_oss", "sglang/kernels/ops/moe/fused_moe_triton_kernels.py", "fused_moe_kernel",
         "accumulator += bias", "the expert GEMMs add their bias to the fp32 accumulator, rounded once (HF: twice)"),
    Fact("gpt_oss", _MOE + "fused_moe_triton/triton_kernels_moe.py", "triton_kernel_fused_experts_with_bias",
         'FnSpecs("swiglu", swiglu_fn, ("alpha", "limit"), reduction_n=2)',
         "under triton_kernels the SwiGLU reads the GEMM's fp32 accumulator (bias added), not a rounded gate_up"),
    # GLM-4 MoE (srt/models/glm4_moe.py)
    Fact("glm4_moe", _M + "glm4_moe.py", "Glm4MoeMLP.__init__", "self.act_fn = SiluAndMul()",
         "the shared experts' (and dense layers') SwiGLU is the row's JIT activation kernel"),
    Fact("glm4_moe", _FUSED_MOE, "_fused_moe_kernel_sequence",
         "silu_and_mul( intermediate_cache1.view(-1, N), intermediate_cache2, **row_filter )",
         "the routed experts' SwiGLU is the same JIT kernel (sglang.kernels.ops.activation.activation)"),
    Fact("glm4_moe", _M + "glm4_moe.py", "Glm4MoeDecoderLayer.__init__",
         "self.input_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)", "plain RMSNorm: the row's"),
    Fact("glm4_moe", _M + "glm4_moe.py", "Glm4MoeAttention.__init__",
         "self.q_norm = RMSNorm(self.head_dim, eps=rms_norm_eps)", "its q/k norms (with use_qk_norm) are RMSNorm"),
    Fact("glm4_moe", _M + "glm4_moe.py", "Glm4MoeAttention.forward_prepare",
         "q, k = apply_qk_norm( q=q, k=k, q_norm=self.q_norm, k_norm=self.k_norm, head_dim=self.head_dim, "
         "alt_stream=self.alt_stream, ) q, k = self.rotary_emb(positions, q, k)",
         "Qwen3's q/k norm (the row's qk_norm_out, measured there), then the rotary"),
    Fact("glm4_moe", _ROPE + "factory.py", "get_rope", "rotary_dim = int(rotary_dim * partial_rotary_factor)",
         "partial rotary: rotary_dim is a part of the head"),
    Fact("glm4_moe", _ROPE + "base.py", "RotaryEmbedding.forward_cuda",
         "if self.head_size != self.rotary_dim: q_rope = q_rope[..., : self.rotary_dim]",
         "the fused kernel rotates the first rotary_dim dims; which kernel runs is chosen by the head size"),
    Fact("glm4_moe", _M + "glm4_moe.py", "Glm4MoeGate.__init__", "dtype=torch.float32",
         "its router's weight and logits are fp32 (the router region, left as is for GLM-4 MoE)"),
    Fact("glm4_moe", _M + "glm4_moe.py", "Glm4MoeSparseMoeBlock.forward_normal",
         "torch.add(final_hidden_states, shared_output, out=final_hidden_states_out)",
         "the shared + routed sum is an eager bf16 add, stored before the next fused add + norm reads it "
         "(the row's moe_out='round')"),
    # Qwen3.5 dense (srt/models/qwen3_5.py)
    Fact("qwen3_5", _M + "qwen3_5.py", "Qwen3_5AttentionDecoderLayer._prepare_qkv_gate",
         "if _is_cuda and self.attn_output_gate: return self.forward_prepare_cuda_fused(",
         "on CUDA the gated attention takes the fused q/k norm + RoPE kernel"),
    Fact("qwen3_5", _M + "qwen3_5.py", "Qwen3_5AttentionDecoderLayer.forward_prepare_cuda_fused",
         "q_out, k_out, gate_out = fused_qk_gemma_rmsnorm_rope_gate( q_gate, k, self.q_norm.weight.data, "
         "self.k_norm.weight.data, self.rotary_emb.cos_sin_cache,",
         "the kernel reads the rotary's cache as stored: fp32 on CUDA at every head size (RotaryEmbedding.__init__); "
         "forward_cuda, which casts it for other head sizes, is not called"),
    Fact("qwen3_5", _M + "qwen3_5.py", "Qwen3_5AttentionDecoderLayer.self_attention",
         "attn_output = fused_sigmoid_mul(attn_output, gate, inplace=True)",
         "the output gate attn * sigmoid(gate) is one Triton kernel (the qwen3_5 variant's attn_gate)"),
    Fact("qwen3_5", "sglang/kernels/ops/elementwise/elementwise.py", "_fused_sigmoid_mul_kernel",
         "result = attn * tl.sigmoid(g)", "in fp32, rounded once at the store: attn_gate=fused (HF rounds sigmoid(g) "
         "first)"),
    Fact("qwen3_5", "sglang/kernels/ops/elementwise/elementwise.py", "_fused_sigmoid_mul_kernel",
         "tl.store(output_ptr + attn_off, result, mask=mask)",
         "the fp32 result stored once into the output (inplace: the bf16 attention output)"),
    Fact("qwen3_5", _M + "qwen3_5.py", "Qwen3_5AttentionDecoderLayer.__init__",
         "self.input_layernorm = GemmaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)",
         "its layers' norms are GemmaRMSNorm: the zero_centred_norm kind"),
    Fact("qwen3_5", "sglang/srt/layers/layernorm.py", "GemmaRMSNorm._forward_impl",
         "out = gemma_rmsnorm(x, self.weight.data, self.variance_epsilon)",
         "FlashInfer's Gemma norm kernels (1 + w in fp32 inside), 3-D inputs reshaped to 2-D first"),
    Fact("qwen3_5", _M + "qwen2_moe.py", "Qwen2MoeMLP.__init__", "self.act_fn = SiluAndMul()",
         "its MLP (Qwen2MoeMLP) is the row's SiluAndMul"),
    Fact("qwen3_5", _M + "qwen3_5.py", "Qwen3_5GatedDeltaNet.__init__", "self.norm = RMSNormGated(",
         "the linear-attention mixer's gated norm is FLA's Triton layer norm (left as is)"),
    Fact("qwen3_5", "sglang/kernels/ops/attention/fla/layernorm_gated.py", "",
         "y = x_hat * w[None, :] + b[None, :] if HAS_BIAS else x_hat * w[None, :]",
         "that norm multiplies weight and gate in fp32 and rounds once (HF rounds x * rstd first)"),
)


def check_facts(pkg: EnginePackage, family: str | None = None) -> dict[str, dict]:
    """Check every :data:`FACTS` entry (of ``family``, or all) in ``pkg``; -> provenance per fact
    (``"<file>:<function>"``). Raises :class:`EngineCodeError` naming each one that no longer holds."""
    return check(pkg, FACTS, family, "SGLang", "SGLang's family code", "the sglang row's family evidence")


class _RotaryAttributes:
    """What ``RotaryEmbedding.__init__`` (``rotary_embedding/base.py``) sets before it computes its
    cache, standing in for it as the base of SGLang's YaRN class: the rest of it builds SGLang's op
    dispatch, and the cache is computed by the caller under the device SGLang builds it on."""

    def __init__(self, head_size, rotary_dim, max_position_embeddings, base, is_neox_style, dtype):
        self.head_size, self.rotary_dim = head_size, rotary_dim
        self.max_position_embeddings, self.base = max_position_embeddings, base
        self.is_neox_style, self.dtype = is_neox_style, dtype


_YARN_KWARGS = ("extrapolation_factor", "attn_factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim")


def yarn_cache(pkg: EnginePackage, head_size: int, rotary_dim: int, base: float, rope_scaling: dict,
               device="cpu") -> tuple[torch.Tensor, dict]:
    """GPT-OSS's cos/sin cache, fp32 [original_max_position * factor, rotary_dim] = cat(cos, sin) * mscale,
    as SGLang builds it: ``get_rope`` (``factory.py``) hands a yarn ``rope_scaling``'s ``factor``,
    ``original_max_position_embeddings``, the keys of ``_YARN_KWARGS`` and ``truncate`` (default True) to
    ``YaRNScalingRotaryEmbedding.__init__`` (run here, its own mscale rule), whose
    ``_compute_cos_sin_cache`` runs under ``with torch.device(device)``. On CUDA SGLang keeps it fp32.
    -> (cache, provenance)."""
    scaling = rope_scaling or {}
    if scaling.get("rope_type", scaling.get("type")) != "yarn":
        raise ValueError(f"yarn_cache builds a yarn rope_scaling's cache, got {rope_scaling!r}")
    ns, provenance = {"torch": torch, "math": math}, {}
    for name in ("yarn_find_correction_dim", "yarn_find_correction_range", "yarn_linear_ramp_mask",
                 "yarn_get_mscale", "yarn_get_mscale_simple"):
        ns[name], prov = extract_function(pkg, _YARN, name, ns)
        provenance[name] = prov.as_dict()
    cls, provs = extract_class(pkg, _YARN, "YaRNScalingRotaryEmbedding",
                               ["__init__", "_compute_inv_freq", "_compute_cos_sin_cache"], ns, _RotaryAttributes)
    provenance.update({k: v.as_dict() for k, v in provs.items()})
    kwargs = {k: v for k, v in rope_scaling.items() if k in _YARN_KWARGS}
    kwargs["truncate"] = rope_scaling.get("truncate", True)
    obj = cls(head_size, rotary_dim, rope_scaling["original_max_position_embeddings"], base, True,
              rope_scaling.get("factor", 1.0), torch.float32, **kwargs)
    with torch.device(device):
        return obj._compute_cos_sin_cache(), provenance


def gpt_oss_swiglu(pkg: EnginePackage):
    """``swiglu_gpt_oss_sigmoid_alpha(x, gemm1_alpha, gemm1_limit)`` of the Triton MoE runner
    (``moe_runner/triton_utils/fused_moe.py``), without its ``@torch.compile`` (dropped with every
    decorator: the caller compiles it, as SGLang does, or runs it eagerly). -> (function, provenance)."""
    fn, prov = extract_function(pkg, _FUSED_MOE, "swiglu_gpt_oss_sigmoid_alpha", {"torch": torch})
    return fn, prov.as_dict()


def qwen3_5_qk_norm_rope_gate(pkg: EnginePackage, extract_to: Path):
    """``fused_qk_gemma_rmsnorm_rope_gate`` (``kernels/ops/attention/fused_qk_rmsnorm_rope_gate.py``):
    the file extracted under ``extract_to`` and imported as a module of its own (it imports torch and
    Triton only). Triton decides at import whether the kernel is compiled or interpreted
    (``TRITON_INTERPRET=1``, set before this call). -> (function, provenance)."""
    if importlib.util.find_spec("triton") is None:
        raise EngineUnavailable(f"sglang {pkg.version}'s Qwen3.5 q/k norm + RoPE kernel is Triton code: "
                                "pip install triton (its interpreter runs it on a CPU with TRITON_INTERPRET=1)")
    path = pkg.file_path(_QWEN3_5_KERNEL, extract_to=Path(extract_to))
    spec = importlib.util.spec_from_file_location(f"rla_sglang_{pkg.version.replace('.', '_')}_qwen3_5_qk", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.fused_qk_gemma_rmsnorm_rope_gate, file_provenance(pkg, _QWEN3_5_KERNEL).as_dict()
