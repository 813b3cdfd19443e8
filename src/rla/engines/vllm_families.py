"""vLLM's code for Qwen3.5's gated attention, read from its wheel (never copied).

The ``vllm-0.26`` / ``vllm-0.33`` rows were measured on the Llama/Qwen3 path (``rla.engines.vllm``).
Qwen3.5's full-attention layers (``models/qwen3_5.py`` builds ``Qwen3NextAttention`` of
``models/qwen3_next.py``) run other code for the q/k norms and the partial RoPE: one Triton kernel,
``fused_qk_rmsnorm_rope_gate`` (``layers/fused_qk_norm_rope.py``). This module holds that reading as
code, so a version that changed it fails loudly instead of leaving the rows' ``qwen3_5`` variant
standing on nothing:

- :data:`FACTS`: each link the docs and the rows' evidence cite, per vLLM version, checked by
  :func:`check_facts` against the package in hand;
- :func:`qwen3_5_qk_norm_rope_gate`: the kernel's file extracted from the wheel and imported alone
  (Triton reads a kernel's source from its file), called with the weights as that version's
  ``Qwen3NextAttention._project_qkv_gate`` hands them over.

Nothing here starts vLLM or imports its package.
"""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path

import torch

from rla.engines.facts import Fact, check
from rla.engines.source import EngineCodeError, EnginePackage, EngineUnavailable, file_provenance

__all__ = ["Fact", "FACTS", "check_facts", "qwen3_5_qk_norm_rope_gate"]

_NEXT = "vllm/model_executor/models/qwen3_next.py"
_KERNEL = "vllm/model_executor/layers/fused_qk_norm_rope.py"
_ROPE = "vllm/model_executor/layers/rotary_embedding/"


def _fact(file: str, function: str, text: str, meaning: str) -> Fact:
    """A fact of Qwen3.5's attention (:class:`rla.engines.facts.Fact`, family ``qwen3_5``)."""
    return Fact("qwen3_5", file, function, text, meaning)


_COMMON = (
    _fact("vllm/model_executor/models/qwen3_5.py", "Qwen3_5DecoderLayer.__init__",
         "self.self_attn = Qwen3NextAttention( config, model_config=model_config,",
         "Qwen3.5's full-attention layers are Qwen3-Next's attention, handed the model config"),
    _fact(_NEXT, "", "GemmaRMSNorm as Qwen3NextRMSNorm", "its q/k norms, where the kernel is not used, are GemmaRMSNorm"),
    _fact(_NEXT, "Qwen3NextAttention.__init__", "text_only = mm_config is None or mm_config.language_model_only",
         "text only: a text architecture (no multimodal config) or language_model_only"),
    _fact(_NEXT, "Qwen3NextAttention._project_qkv_gate",
         "if self.use_fused_qk_norm_rope_gate: q_gate, k, v = qkv.split(",
         "with the flag set the gated split, q/k norms and RoPE are the one kernel, in both modes (no mode test)"),
    _fact(_NEXT, "Qwen3NextAttention._project_qkv_gate", "q, k = self.rotary_emb(positions, q, k)",
         "otherwise the q/k norm modules, then the rotary embedding module"),
    _fact(_NEXT, "Qwen3NextAttention.forward", "if gate is not None: attn_output = attn_output * torch.sigmoid(gate)",
         "the output gate is two PyTorch ops after the attention: HF's two roundings run eagerly (attn_gate=per_op), "
         "one Inductor kernel in the compiled piece after the attention (attn_gate=fused, the engine twin)"),
    _fact(_ROPE + "__init__.py", "get_rope", "dtype = torch.get_default_dtype()",
         "the rotary's dtype is the default dtype, the model's (bf16) while vLLM builds it"),
    _fact(_ROPE + "base.py", "RotaryEmbeddingBase.__init__", "cache = cache.to(dtype)",
         "the cos/sin cache is stored in that dtype: the kernel reads RN(cos), RN(sin) (rope_cos_sin=round)"),
    _fact(_KERNEL, "_fused_qk_rmsnorm_rope_gate_kernel", "var = tl.sum(x * x, axis=0) / head_dim",
         "the mean of squares is tl.sum's order over the head (norm_reduction unpinned)"),
    _fact(_KERNEL, "_fused_qk_rmsnorm_rope_gate_kernel",
         "x_rot1 = (x_rot1 * inv_rms * w_rot1).to(INPUT_DTYPE).to(tl.float32)",
         "the norm's output is rounded to bf16 before the rotation reads it (qk_norm_out=round)"),
    _fact(_KERNEL, "_fused_qk_rmsnorm_rope_gate_kernel", "o1 = x_rot1 * cos - x_rot2 * sin",
         "the rotation in fp32, rounded once at the store (rope_apply=fused)"),
    _fact(_KERNEL, "_fused_qk_rmsnorm_rope_gate_kernel", "tl.store(out_base + head_offs, x_norm, mask=pass_mask)",
         "the dims past rotary_dim are the rounded norm"),
)

#: Per vLLM version: the links that version's rows' ``qwen3_5`` variant rests on.
FACTS: dict[str, tuple[Fact, ...]] = {
    "0.26.0": _COMMON + (
        _fact(_NEXT, "Qwen3NextAttention.__init__",
             "self.attn_output_gate and getattr(self.rotary_emb, \"is_neox_style\", False) and "
             "current_platform.is_cuda() and text_only",
             "the kernel runs on CUDA for the gated, NeoX-rotary, text-only attention, at every head size"),
        _fact(_NEXT, "Qwen3NextAttention._project_qkv_gate",
             "self.q_norm.weight.float() + 1.0, self.k_norm.weight.float() + 1.0, self.rotary_emb.cos_sin_cache,",
             "1 + w formed in fp32 from the bf16 weight (norm_weight=fused); the cache as stored"),
        _fact(_KERNEL, "_fused_qk_rmsnorm_rope_gate_kernel", "x_norm = (x * inv_rms * w).to(INPUT_DTYPE).to(tl.float32)",
             "x * rstd * (1 + w) in fp32, one rounding"),
        _fact(_NEXT, "Qwen3NextAttention._project_qkv_gate", "pos = positions[0] if positions.ndim == 2 else positions",
             "mRoPE's [3, T] positions: the first row (text only, where the three are equal)"),
    ),
    "0.33.0": _COMMON + (
        _fact(_NEXT, "Qwen3NextAttention.__init__",
             "self.attn_output_gate and getattr(self.rotary_emb, \"is_neox_style\", False) and "
             "(current_platform.is_cuda() or current_platform.is_xpu()) and supports_dtype and "
             "(text_only or supports_mrope)",
             "the kernel runs on CUDA/XPU for the gated, NeoX-rotary attention with a bf16/fp16 rotary, text only or "
             "with Qwen3.5's interleaved mRoPE, at every head size"),
        _fact(_NEXT, "Qwen3NextAttention._project_qkv_gate",
             "self.q_norm.weight, self.k_norm.weight, self.rotary_emb.cos_sin_cache,",
             "the bf16 weights and the cache as stored"),
        _fact(_NEXT, "Qwen3NextAttention._project_qkv_gate", "norm_beta=1.0,", "the zero-centred offset, inside the kernel"),
        _fact(_NEXT, "Qwen3NextAttention._project_qkv_gate",
             'mrope_section=(getattr(self.rotary_emb, "mrope_section", None) if positions.ndim == 2 else None',
             "mRoPE's [3, T] positions are passed on with the rotary's sections"),
        _fact(_KERNEL, "_fused_qk_rmsnorm_rope_gate_kernel",
             "w = tl.load(w_ptr + head_offs, mask=head_mask, other=0.0).to(tl.float32) + norm_beta",
             "1 + w formed in fp32 from the bf16 weight (norm_weight=fused)"),
        _fact(_KERNEL, "_fused_qk_rmsnorm_rope_gate_kernel", "x_norm = (x * inv_rms * w).to(INPUT_DTYPE).to(tl.float32)",
             "x * rstd * (1 + w) in fp32, one rounding"),
    ),
}


def _facts(pkg: EnginePackage) -> tuple[Fact, ...]:
    if pkg.version not in FACTS:
        raise EngineCodeError(f"vllm {pkg.version}'s Qwen3.5 attention was not read; read versions are "
                              f"{sorted(FACTS)} (rla.engines.vllm_families)")
    return FACTS[pkg.version]


def check_facts(pkg: EnginePackage) -> dict[str, dict]:
    """Check every :data:`FACTS` entry of ``pkg``'s version in ``pkg`` (:func:`rla.engines.facts.check`);
    -> provenance per fact (``"<file>:<function>"``). Raises :class:`EngineCodeError` naming each one that
    no longer holds, or naming the versions read when ``pkg``'s is not one of them."""
    return check(pkg, _facts(pkg), None, "vllm", "vLLM's Qwen3.5 attention", "the vllm rows' qwen3_5 evidence")


def _import_kernel_module(pkg: EnginePackage, extract_to: Path):
    """The kernel file as a module of its own. It imports ``tl, triton`` from ``vllm.triton_utils``,
    which with Triton installed is ``import triton; import triton.language as tl``
    (``vllm/triton_utils/__init__.py``): that name is bound to Triton's own modules while the file
    runs, and put back after."""
    import triton
    import triton.language as tl

    path = pkg.file_path(_KERNEL, extract_to=Path(extract_to) / f"vllm-{pkg.version}")  # one folder per version
    spec = importlib.util.spec_from_file_location(f"rla_vllm_{pkg.version.replace('.', '_')}_qwen3_5_qk", path)
    module = importlib.util.module_from_spec(spec)
    shim = types.ModuleType("vllm.triton_utils")
    shim.triton, shim.tl = triton, tl
    before = sys.modules.get("vllm.triton_utils")
    sys.modules["vllm.triton_utils"] = shim
    try:
        spec.loader.exec_module(module)
    finally:
        if before is None:
            del sys.modules["vllm.triton_utils"]
        else:
            sys.modules["vllm.triton_utils"] = before
    return module


def qwen3_5_qk_norm_rope_gate(pkg: EnginePackage, extract_to: Path):
    """vLLM's ``fused_qk_rmsnorm_rope_gate`` (``layers/fused_qk_norm_rope.py``) as
    ``fn(q_gate, k, q_norm_weight, k_norm_weight, cos_sin_cache, positions, eps, heads, kv_heads,
    head_dim, rotary_dim, mrope_section=None) -> (q, k, gate)``, called as
    ``Qwen3NextAttention._project_qkv_gate`` of ``pkg``'s version calls it (:data:`FACTS` checked
    first): the norms' weights are the checkpoint's bf16 ``w``, handed over as 0.26 ``w.float() + 1.0``,
    0.33 ``w`` with ``norm_beta=1.0``; ``positions`` [T] or mRoPE's [3, T], of which 0.26 takes the first
    row and 0.33 passes both shapes on (the rotary's ``mrope_section`` with the 2-D one). Triton decides
    at import whether the kernel is compiled or interpreted (``TRITON_INTERPRET=1``, set before this
    call). -> (function, provenance)."""
    if importlib.util.find_spec("triton") is None:
        raise EngineUnavailable(f"vllm {pkg.version}'s Qwen3.5 q/k norm + RoPE kernel is Triton code: "
                                "pip install triton (its interpreter runs it on a CPU with TRITON_INTERPRET=1)")
    check_facts(pkg)
    kernel = _import_kernel_module(pkg, extract_to).fused_qk_rmsnorm_rope_gate
    v026 = pkg.version == "0.26.0"

    def fn(q_gate, k, q_weight, k_weight, cos_sin_cache, positions, eps, heads, kv_heads, head_dim, rotary_dim,
           mrope_section=None):
        if (positions.ndim == 2) != (mrope_section is not None):
            raise ValueError("mRoPE positions [3, T] come with the rotary's mrope_section, text positions [T] without")
        if v026:
            pos = positions[0] if positions.ndim == 2 else positions
            return kernel(q_gate, k, q_weight.float() + 1.0, k_weight.float() + 1.0, cos_sin_cache, pos, eps,
                          heads, kv_heads, head_dim, rotary_dim)
        return kernel(q_gate, k, q_weight, k_weight, cos_sin_cache, positions, eps, heads, kv_heads, head_dim,
                      rotary_dim, norm_beta=1.0, mrope_section=mrope_section)

    return fn, file_provenance(pkg, _KERNEL).as_dict()
