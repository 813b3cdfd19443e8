"""vLLM's region code for the families beyond the Llama shape, loaded from its package at run time.

:mod:`rla.engines.vllm` extracts the region functions the calibrated rows were measured on (the
plain RMSNorm IR ops, SiluAndMul, the rotary kernels' interface). The engine twin of Gemma 3, Gemma 4,
GLM-4 MoE and GPT-OSS (``rla.engines.vllm_twin_families``) also needs, from the same files:

- ``GemmaRMSNorm.forward_native`` (``vllm/model_executor/layers/layernorm.py``): the weight
  ``self.weight.float() + 1.0`` (fp32) handed to the IR ops ``rms_norm`` / ``fused_add_rms_norm``
  of ``vllm/ir/ops/layernorm.py`` (the native implementations :mod:`rla.engines.vllm` extracts).
  Its ``forward_cuda`` *is* ``forward_native``, and ``vllm/kernels/vllm_c.py`` registers the CUDA
  norm kernels only for a weight of the input's dtype, so this is what runs in every mode.
- ``GeluAndMul.forward_native`` (``layers/activation.py``): ``F.gelu(x[..., :d], approximate) *
  x[..., d:]``, Gemma 3's ``gelu_pytorch_tanh`` as ``get_act_and_mul_fn`` maps it. It reads
  ``current_platform.is_rocm()``: the twin models vLLM on CUDA, where that is False.
- ``SwigluOAIAndMul.forward_native`` (``layers/activation.py``): GPT-OSS's clamped SwiGLU on the
  interleaved gate/up (``x[..., ::2]``, ``x[..., 1::2]``), ``alpha`` and ``limit``.
- the cos/sin caches ``get_rope`` builds for Gemma 3's full-attention layers
  (``LinearScalingRotaryEmbedding._compute_cos_sin_cache``, ``rotary_embedding/linear_scaling_rope.py``)
  and for GPT-OSS (``YaRNScalingRotaryEmbedding._compute_inv_freq`` / ``_compute_cos_sin_cache``,
  ``yarn_scaling_rope.py``, with ``yarn_find_correction_range`` / ``yarn_linear_ramp_mask`` /
  ``yarn_get_mscale`` of ``common.py``), built under ``with torch.device(device)`` as vLLM builds
  them while it constructs the model, on an instance holding what each ``__init__`` sets.
- ``MRotaryEmbedding.forward_native`` (``rotary_embedding/mrope.py``, with its ``apply_interleaved_rope`` and
  ``ApplyRotaryEmb.forward_native`` / ``forward_static`` of ``common.py``): the partial (m)RoPE that Qwen3.5's
  attention runs where vLLM's fused q/k norm + RoPE kernel is off (``Qwen3NextAttention._project_qkv_gate``'s
  unfused path: not CUDA/XPU), on [T] or [3, T] positions.
- the cache ``get_rope`` builds for Gemma 4's full-attention layers (``rope_type='proportional'``):
  ``Gemma4RotaryEmbedding._compute_inv_freq`` (``rotary_embedding/gemma4_rope.py``: the rotated
  angles' frequencies over the whole head size, zeros for the rest), with the base class's
  ``_compute_cos_sin_cache``, on an instance holding what its ``__init__`` sets (``rotary_dim`` the
  head size: the whole head rotated).
- ``RotaryEmbeddingBase._match_cos_sin_cache_dtype`` (``base.py``) on a cache object: GPT-OSS's
  ``get_rope(..., dtype=torch.float32)`` keeps its cache fp32, and every forward casts it to the
  query's dtype through this method (inside the compiled graph in default mode: then
  ``torch.compiler.is_compiling()`` and the cast is an op of the graph).

Nothing of vLLM is imported or copied: each function is compiled alone from its file
(:func:`rla.engines.source.extract_class`), and ``provenance`` names file, line and sha256.
"""

from __future__ import annotations

import math
import types
from typing import Any

import torch
import torch.nn.functional as F

from rla.engines.source import extract_class, extract_function

__all__ = ["VllmFamilyOps"]

_LAYERNORM = "vllm/model_executor/layers/layernorm.py"
_ACTIVATION = "vllm/model_executor/layers/activation.py"
_ROPE_COMMON = "vllm/model_executor/layers/rotary_embedding/common.py"
_ROPE_LINEAR = "vllm/model_executor/layers/rotary_embedding/linear_scaling_rope.py"
_ROPE_YARN = "vllm/model_executor/layers/rotary_embedding/yarn_scaling_rope.py"
_ROPE_MROPE = "vllm/model_executor/layers/rotary_embedding/mrope.py"
_ROPE_GEMMA4 = "vllm/model_executor/layers/rotary_embedding/gemma4_rope.py"


class _CudaPlatform:
    """What ``GeluAndMul.forward_native`` asks of ``vllm.platforms.current_platform``: the twin
    models vLLM on CUDA (``is_rocm()`` False: the tanh approximation is kept)."""

    @staticmethod
    def is_rocm() -> bool:
        return False


class VllmFamilyOps:
    """The functions above, from ``engine``'s package (a :class:`rla.engines.vllm.VllmEngine`)."""

    def __init__(self, engine):
        pkg = engine.package
        self.version = engine.version
        self.provenance: dict[str, dict[str, Any]] = {}
        ns = {"torch": torch, "F": F, "math": math, "Tensor": torch.Tensor}

        def cls(relpath, name, methods, namespace=ns, base=None):
            c, provs = extract_class(pkg, relpath, name, methods, namespace, base)
            self.provenance.update({k: v.as_dict() for k, v in provs.items()})
            return c

        ir = types.SimpleNamespace(ops=types.SimpleNamespace(
            rms_norm=engine.rms_norm_native, fused_add_rms_norm=engine.fused_add_rms_norm_native))
        gemma = cls(_LAYERNORM, "GemmaRMSNorm", ["forward_native"], dict(ns, ir=ir))
        self._GemmaNorm = type("GemmaRMSNorm", (gemma,), {"__init__": _norm_init})
        gelu = cls(_ACTIVATION, "GeluAndMul", ["forward_native"], dict(ns, current_platform=_CudaPlatform()))
        self._Gelu = type("GeluAndMul", (gelu,), {"__init__": _attrs_init("approximate")})
        oai = cls(_ACTIVATION, "SwigluOAIAndMul", ["forward_native"])
        self._SwigluOAI = type("SwigluOAIAndMul", (oai,), {"__init__": _attrs_init("alpha", "limit")})
        self._rope_base = engine._RopeCache  # _compute_inv_freq, _compute_cos_sin_cache, _match_cos_sin_cache_dtype
        self._Linear = cls(_ROPE_LINEAR, "LinearScalingRotaryEmbedding", ["_compute_cos_sin_cache"], ns,
                           self._rope_base)
        self._Proportional = cls(_ROPE_GEMMA4, "Gemma4RotaryEmbedding", ["_compute_inv_freq"], ns, self._rope_base)
        yarn_ns = dict(ns)
        for name in ("yarn_find_correction_dim", "yarn_find_correction_range", "yarn_linear_ramp_mask",
                     "yarn_get_mscale"):
            yarn_ns[name], prov = extract_function(pkg, _ROPE_COMMON, name, yarn_ns)
            self.provenance[name] = prov.as_dict()
        self._yarn_mscale = yarn_ns["yarn_get_mscale"]
        self._Yarn = cls(_ROPE_YARN, "YaRNScalingRotaryEmbedding", ["_compute_inv_freq", "_compute_cos_sin_cache"],
                         yarn_ns, self._rope_base)
        self._ApplyRotary = cls(_ROPE_COMMON, "ApplyRotaryEmb", ["forward_static", "forward_native"])
        mrope_ns = dict(ns)
        mrope_ns["apply_interleaved_rope"], prov = extract_function(pkg, _ROPE_MROPE, "apply_interleaved_rope",
                                                                    mrope_ns)
        self.provenance["apply_interleaved_rope"] = prov.as_dict()
        self._MRope = cls(_ROPE_MROPE, "MRotaryEmbedding", ["forward_native"], mrope_ns, self._rope_base)

    def __repr__(self) -> str:
        return f"VllmFamilyOps(vllm {self.version})"

    # -- norms and activations ---------------------------------------------------------------

    def gemma_rms_norm(self, x, weight, eps: float, residual=None):
        """``GemmaRMSNorm.forward_native``: ``rms_norm(x, w.float() + 1, eps)``, or with
        ``residual`` the fused add + norm -> ``(out, new_residual)``."""
        return self._GemmaNorm(weight, eps).forward_native(x, residual)

    def gelu_and_mul(self, x, approximate: str = "tanh"):
        """``GeluAndMul(approximate).forward_native``: gelu(gate) * up, ``x = cat(gate, up)``."""
        return self._Gelu(approximate).forward_native(x)

    def swigluoai_and_mul(self, x, alpha: float, limit: float):
        """``SwigluOAIAndMul(alpha, limit).forward_native`` on interleaved gate/up."""
        return self._SwigluOAI(alpha, limit).forward_native(x)

    # -- rotary caches -------------------------------------------------------------------------

    def linear_cache(self, rotary_dim: int, max_position: int, base: float, factor: float,
                     dtype=torch.bfloat16, device="cpu") -> torch.Tensor:
        """``get_rope``'s cache for ``rope_type='linear'`` (one scaling factor, offset 0):
        [max_position * factor, rotary_dim] = cat(cos, sin) of ``arange(max_len) / factor`` times
        the frequencies, in ``dtype`` (vLLM's ``RotaryEmbeddingBase.__init__`` casts it)."""
        obj = self._instance(self._Linear, rotary_dim, max_position, base)
        obj.scaling_factors = [float(factor)]
        with torch.device(device):
            cache = obj._compute_cos_sin_cache()
        return cache.to(dtype)

    def proportional_cache(self, head_size: int, partial_rotary_factor: float, max_position: int, base: float,
                           dtype=torch.bfloat16, device="cpu") -> torch.Tensor:
        """``get_rope``'s cache for ``rope_type='proportional'`` (Gemma 4's full attention):
        ``Gemma4RotaryEmbedding`` with ``get_rope``'s ``rotary_dim = int(head_size *
        partial_rotary_factor)``, i.e. ``rotary_dim // 2`` rotated angles and zero frequencies for
        the rest of the half; its cache [max_position, head_size] = cat(cos, sin) in ``dtype``. No
        ``factor`` is read (``get_rope`` passes none to this class)."""
        rotary_dim = int(head_size * partial_rotary_factor)
        obj = self._instance(self._Proportional, head_size, max_position, base)
        obj.rope_angles = rotary_dim // 2
        obj.nope_angles = head_size // 2 - obj.rope_angles
        with torch.device(device):
            cache = obj._compute_cos_sin_cache()
        return cache.to(dtype)

    def yarn_cache_module(self, rotary_dim: int, original_max_position: int, base: float, factor: float,
                          beta_fast: float = 32, beta_slow: float = 1, truncate: bool = True,
                          dtype=torch.float32, device="cpu"):
        """A cache object as ``get_rope`` builds it for ``rope_type='yarn'`` without ``mscale`` /
        ``attention_factor`` (what ``models/gpt_oss.py`` passes): its ``cos_sin_cache`` in
        ``dtype`` (GPT-OSS: fp32), and :meth:`match_cache` casts it the way every forward does."""
        obj = self._instance(self._Yarn, rotary_dim, original_max_position, base)
        obj.scaling_factor, obj.beta_fast, obj.beta_slow, obj.truncate = factor, beta_fast, beta_slow, truncate
        obj.mscale = float(self._yarn_mscale(obj.scaling_factor))  # __init__'s branch without the two keys
        with torch.device(device):
            obj.cos_sin_cache = obj._compute_cos_sin_cache().to(dtype)
        return obj

    def mrope_module(self, cos_sin_cache, head_size: int, rotary_dim: int, mrope_section, interleaved: bool = True):
        """A rotary object as ``get_rope`` builds it for ``rope_type='default'`` with ``mrope_section``
        (``MRotaryEmbedding``, NeoX style) holding ``cos_sin_cache`` as stored (the model's dtype); its
        ``forward_native(positions, q, k)`` is vLLM's, ``positions`` [T] or [3, T], q/k [T, heads * head_size]."""
        obj = object.__new__(self._MRope)
        obj.head_size, obj.rotary_dim, obj.is_neox_style = head_size, rotary_dim, True
        obj.cos_sin_cache, obj.use_aiter, obj.use_flashinfer = cos_sin_cache, False, False
        obj.mrope_section, obj.mrope_interleaved = list(mrope_section), interleaved
        apply = object.__new__(self._ApplyRotary)
        apply.is_neox_style, apply.enable_fp32_compute = True, False  # RotaryEmbeddingBase.__init__'s
        obj.apply_rotary_emb = apply
        return obj

    @staticmethod
    def match_cache(cache_module, query):
        """``RotaryEmbeddingBase._match_cos_sin_cache_dtype``: the cache in the query's dtype (cast
        in the graph while compiling; cast once and kept otherwise)."""
        return cache_module._match_cos_sin_cache_dtype(query)

    def _instance(self, klass, rotary_dim, max_position, base):
        obj = object.__new__(klass)
        obj.head_size = obj.rotary_dim = rotary_dim
        obj.max_position_embeddings, obj.base, obj.is_neox_style = max_position, base, True
        obj.use_aiter, obj.use_flashinfer = False, False
        return obj


def _norm_init(self, weight, eps):
    self.weight, self.variance_epsilon = weight, eps


def _attrs_init(*names):
    def __init__(self, *values):
        for name, value in zip(names, values):
            setattr(self, name, value)

    return __init__
