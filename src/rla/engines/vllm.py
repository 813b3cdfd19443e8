"""vLLM's own region code, loaded from its package or wheel at run time (never copied).

What runs, and why these functions:

- ``rms_norm`` / ``fused_add_rms_norm`` of ``vllm/ir/ops/layernorm.py``: the *native* IR ops.
  In vLLM's default mode (``-O2``) ``RMSNorm.forward_native`` calls them and Inductor compiles
  them into the model's graph; run eagerly they round after every bf16 op, under Inductor the
  chain is computed in fp32 and rounded once (that difference is what calibration measures).
- ``SiluAndMul.forward_native`` (``layers/activation.py``): ``F.silu(x[..., :d]) * x[..., d:]``.
- ``RotaryEmbedding.forward_static`` (``layers/rotary_embedding/base.py``) with
  ``ApplyRotaryEmb.forward_static`` (``common.py``), and the cos/sin cache builder
  ``RotaryEmbeddingBase._compute_inv_freq`` / ``_compute_cos_sin_cache`` (plus
  ``Llama3RotaryEmbedding._compute_inv_freq`` for llama3 scaling, which calls ``super()``).
  vLLM builds the cache while the model is constructed under ``with torch.device(gpu)``, so
  ``arange``/``pow``/``cos`` run on the GPU; ``cos_sin_cache(device=...)`` evaluates the same code
  under the same context manager. The cache reaches the kernels through
  ``_match_cos_sin_cache_dtype``, i.e. in the query's dtype.
- the compiled kernels ``torch.ops._C.*`` of ``vllm/_C_stable_libtorch.abi3.so`` (enforce_eager
  mode): loaded with ``torch.ops.load_library``; CUDA only. Call conventions follow
  ``vllm/_custom_ops.py``: ``rms_norm(out, input, weight, eps)``, ``fused_add_rms_norm(input,
  residual, weight, eps)`` in place, ``silu_and_mul(out, x)``, ``rotary_embedding(positions,
  query, key, head_size, cos_sin_cache, is_neox)`` in place.
"""

from __future__ import annotations

import lzma
import math
import os
import uuid
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from rla.engines.regions import RegionOps
from rla.engines import rotary
from rla.engines.rotary import SUPPORTED_ROPE_TYPES
from rla.engines.source import (
    EngineCodeError,
    EnginePackage,
    EngineUnavailable,
    cache_dir,
    cache_lock,
    extract_class,
    extract_function,
    locate,
)

__all__ = ["VllmEngine", "VllmKernels", "load", "SUPPORTED_ROPE_TYPES", "LIBRARY", "NAME", "MODES"]

#: The engine's name in profiles and reports.
NAME = "vllm"

#: ``default``: V1 at -O2, the native ops under Inductor; ``eager``: ``enforce_eager``, the kernels.
MODES = ("default", "eager")

_LAYERNORM = "vllm/ir/ops/layernorm.py"
_ACTIVATION = "vllm/model_executor/layers/activation.py"
_ROPE_COMMON = "vllm/model_executor/layers/rotary_embedding/common.py"
_ROPE_BASE = "vllm/model_executor/layers/rotary_embedding/base.py"
_ROPE_LLAMA3 = "vllm/model_executor/layers/rotary_embedding/llama3_rope.py"
_ROPE_DEEPSEEK = "vllm/model_executor/layers/rotary_embedding/deepseek_scaling_rope.py"
_LOGITS = "vllm/model_executor/layers/logits_processor.py"
_MODEL_CONFIG = "vllm/config/model.py"

#: The source text that states the LM head's default (``lm_head='lp'``): the logits processor
#: takes the model config's ``head_dtype``, which is the model dtype for a generation model.
_HEAD_FACTS = (
    (_LOGITS, "self.head_dtype = model_config.head_dtype", "LogitsProcessor.__init__"),
    (_MODEL_CONFIG, "Generation models default to the model dtype", "ModelConfig.head_dtype"),
)

#: The stable-ABI kernel library inside the wheel (loads into torches other than vLLM's pin).
LIBRARY = "vllm/_C_stable_libtorch.abi3.so"

def _base_namespace() -> dict[str, Any]:
    return {"torch": torch, "F": F, "math": math, "Tensor": torch.Tensor}


class VllmEngine:
    """vLLM's region functions, extracted from one vLLM version's files.

    Implements :class:`rla.engines.adapter.RegionEngine` (checked by ``tests/engines/test_engine_adapter.py``).

    ``version`` is the engine's version string; ``provenance`` maps each function's qualified name
    to ``{"file", "sha256", "line"}`` of the source that runs.
    """

    name = NAME
    modes = MODES
    #: The default profile name is ``vllm-<major.minor>[-<mode>]`` (``rla.engines.conformance``).
    profile_name = ""
    #: vLLM's ops never go missing (without CUDA, eager mode falls back to the native ops), so no
    #: baseline profile is needed for points nothing ran for.
    baseline = None

    def __init__(self, package: EnginePackage):
        self.package = package
        self.version = package.version
        self.provenance: dict[str, dict[str, Any]] = {}
        ns = _base_namespace()

        def fn(relpath, qualname):
            f, prov = extract_function(package, relpath, qualname, ns)
            self.provenance[qualname] = prov.as_dict()
            return f

        def cls(relpath, name, methods, namespace=ns, base=None):
            c, provs = extract_class(package, relpath, name, methods, namespace, base)
            self.provenance.update({k: v.as_dict() for k, v in provs.items()})
            return c

        self._rms_norm = fn(_LAYERNORM, "rms_norm")
        self._fused_add_rms_norm = fn(_LAYERNORM, "fused_add_rms_norm")
        self._SiluAndMul = cls(_ACTIVATION, "SiluAndMul", ["forward_native"])
        apply_rotary = cls(_ROPE_COMMON, "ApplyRotaryEmb", ["forward_static"])
        rope_ns = dict(ns, ApplyRotaryEmb=apply_rotary)
        self._RotaryEmbedding = cls(_ROPE_BASE, "RotaryEmbedding", ["forward_static"], rope_ns)
        self._RopeCache = cls(
            _ROPE_BASE,
            "RotaryEmbeddingBase",
            ["_compute_inv_freq", "_compute_cos_sin_cache", "_match_cos_sin_cache_dtype"],
        )
        self._Llama3Cache = cls(_ROPE_LLAMA3, "Llama3RotaryEmbedding", ["_compute_inv_freq"], ns, self._RopeCache)

    def __repr__(self) -> str:
        return f"VllmEngine(vllm {self.version}, {self.package.origin}: {self.package.location})"

    # -- native ops ----------------------------------------------------------------------------

    def rms_norm_native(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        """vLLM's native ``rms_norm`` IR op (``vllm/ir/ops/layernorm.py``)."""
        return self._rms_norm(x, weight, eps)

    def fused_add_rms_norm_native(self, x, residual, weight, eps):
        """vLLM's native ``fused_add_rms_norm`` -> ``(out, new_residual)`` (not in place)."""
        return self._fused_add_rms_norm(x, residual, weight, eps)

    def silu_and_mul_native(self, x: torch.Tensor) -> torch.Tensor:
        """``SiluAndMul.forward_native``: silu(gate) * up with ``x = cat(gate, up)`` on the last dim."""
        return self._SiluAndMul.forward_native(x)

    def rope_native(self, positions, q, k, head_size: int, cos_sin_cache, is_neox: bool = True):
        """``RotaryEmbedding.forward_static``: q/k are [tokens, heads*head_size] (or
        [tokens, heads, head_size]); the rotary dim is the cache's width (cat(cos, sin))."""
        return self._RotaryEmbedding.forward_static(
            positions, q, k, head_size, cos_sin_cache.shape[-1], cos_sin_cache, is_neox
        )

    # -- the rotary cache ----------------------------------------------------------------------

    def _rope_module(self, rotary_dim, max_position, base, rope_scaling, head_size=None):
        """An instance of the extracted cache builder with the attributes vLLM's ``__init__``
        sets (``__init__`` itself is never run: it builds vLLM's CustomOp machinery)."""
        return rotary.builder(self._RopeCache, self._Llama3Cache, "vLLM", rotary_dim, max_position, base,
                                  rope_scaling, head_size, use_aiter=False, use_flashinfer=False)

    def inv_freq(self, rotary_dim: int, base: float, rope_scaling: dict | None = None, device="cpu"):
        """The engine's fp32 ``inv_freq`` (``_compute_inv_freq``), evaluated on ``device``."""
        obj = self._rope_module(rotary_dim, 1, base, rope_scaling)
        with torch.device(device):
            return obj._compute_inv_freq(base)

    def cos_sin_cache(
        self,
        head_size: int,
        rotary_dim: int,
        max_position: int,
        base: float,
        rope_scaling: dict | None = None,
        dtype: torch.dtype = torch.bfloat16,
        device="cpu",
    ) -> torch.Tensor:
        """The engine's cos/sin cache [max_position, rotary_dim] = cat(cos, sin), as its kernels
        read it: built by ``_compute_cos_sin_cache`` under ``with torch.device(device)`` (vLLM
        builds it on the GPU while constructing the model), then brought to ``dtype`` by
        ``_match_cos_sin_cache_dtype`` (vLLM hands its kernels the cache in the query's dtype).
        ``dtype=torch.float32`` returns the fp32 table itself."""
        obj = self._rope_module(rotary_dim, max_position, base, rope_scaling, head_size)
        with torch.device(device):
            obj.cos_sin_cache = obj._compute_cos_sin_cache()
        query = torch.empty(0, dtype=dtype, device=device)
        return obj._match_cos_sin_cache_dtype(query)

    def deepseek_yarn_cache(self, rotary_dim: int, max_position: int, base: float, rope_parameters: dict,
                            device="cpu") -> torch.Tensor:
        """DeepSeek's YaRN cos/sin cache, fp32 [max_position * factor, rotary_dim] = cat(cos, sin):
        ``DeepseekScalingRotaryEmbedding._compute_cos_sin_cache`` (``rotary_embedding/deepseek_scaling_rope.py``;
        MLA's rotary for a YaRN config), built under ``with torch.device(device)``, on an instance with
        the attributes its ``__init__`` sets from ``rope_parameters`` (``factor``, ``beta_fast``,
        ``beta_slow``, ``mscale``, ``mscale_all_dim``, with ``__init__``'s defaults; ``self.mscale`` by the
        file's own ``yarn_get_mscale``). ``max_position`` is the original length, as ``get_rope`` passes
        it. Before any cast: vLLM casts it to the model's dtype unless FlashInfer's kernel reads it.
        What ran is in ``deepseek_provenance`` (extracted on the first call; ``provenance`` stays the
        region functions')."""
        if not hasattr(self, "_DeepseekYarn"):
            pkg, ns, provenance = self.package, _base_namespace(), {}
            for name in ("yarn_find_correction_dim", "yarn_find_correction_range", "yarn_linear_ramp_mask"):
                ns[name], prov = extract_function(pkg, _ROPE_COMMON, name, ns)
                provenance[name] = prov.as_dict()
            self._deepseek_mscale, prov = extract_function(pkg, _ROPE_DEEPSEEK, "yarn_get_mscale", ns)
            provenance["deepseek_scaling_rope.yarn_get_mscale"] = prov.as_dict()
            self._DeepseekYarn, provs = extract_class(pkg, _ROPE_DEEPSEEK, "DeepseekScalingRotaryEmbedding",
                                                      ["_compute_inv_freq", "_compute_cos_sin_cache"], ns)
            self.deepseek_provenance = {**provenance, **{k: v.as_dict() for k, v in provs.items()}}
        rp = rope_parameters
        obj = object.__new__(self._DeepseekYarn)
        obj.head_size = obj.rotary_dim = rotary_dim
        obj.max_position_embeddings, obj.base, obj.is_neox_style = max_position, base, False
        obj.scaling_factor = rp["factor"]
        obj.beta_fast, obj.beta_slow = rp.get("beta_fast", 32), rp.get("beta_slow", 1)
        obj.extrapolation_factor = obj.attn_factor = 1  # 0.26's __init__ arguments, at their defaults
        mscale = self._deepseek_mscale
        obj.mscale = float(mscale(obj.scaling_factor, float(rp.get("mscale", 1)))
                           / mscale(obj.scaling_factor, float(rp.get("mscale_all_dim", 0))))
        with torch.device(device):
            return obj._compute_cos_sin_cache()

    def family_ops(self):
        """vLLM's region code for Gemma 3, GLM-4 MoE and GPT-OSS (the zero-centred norm, GeluAndMul,
        SwigluOAIAndMul, the linear and YaRN rotary caches): :class:`rla.engines.vllm_family_ops.VllmFamilyOps`,
        extracted on the first call; its ``provenance`` says what runs."""
        if not hasattr(self, "_family_ops"):
            from rla.engines.vllm_family_ops import VllmFamilyOps

            self._family_ops = VllmFamilyOps(self)
        return self._family_ops

    def rope_cache(self, head_size, rotary_dim, max_position, base, rope_scaling, query_dtype, device):
        """The cos/sin cache as vLLM's rope code reads it: in the query's dtype (see
        :meth:`cos_sin_cache`)."""
        return self.cos_sin_cache(head_size, rotary_dim, max_position, base, rope_scaling, query_dtype, device)

    # -- what calibration runs -----------------------------------------------------------------

    def region_ops(self, mode: str, device: torch.device, library: str | None = None) -> RegionOps:
        """vLLM's region functions as ``mode`` runs them on ``device``.

        - ``default`` (V1, -O2): the native ops compiled with Inductor (``fullgraph``), evidence
          ``native_compiled``; a chain is compiled as one graph around the native functions.
        - ``eager`` on CUDA: the compiled kernels ``torch.ops._C`` (evidence ``kernel``), one
          after the other in a chain.
        - ``eager`` without CUDA: the kernels cannot run; every op falls back to the native
          functions run eagerly (``native_eager``), which are NOT the kernels, and a note says so.
        """
        native = {
            "rms_norm": self.rms_norm_native,
            "fused_add_rms_norm": self.fused_add_rms_norm_native,
            "silu_and_mul": self.silu_and_mul_native,
            "rope": lambda pos, q, k, hd, cache: self.rope_native(pos, q, k, hd, cache, True),
        }
        if mode == "default":
            compiled = {n: torch.compile(f, backend="inductor", fullgraph=True, dynamic=False) for n, f in native.items()}
            return RegionOps(compiled, dict.fromkeys(compiled, "native_compiled"), chain_ops=native, compile_chains=True)
        if device.type == "cuda":
            kernels = self.c_ops(library)
            ops = {
                "rms_norm": kernels.rms_norm,
                "fused_add_rms_norm": kernels.fused_add_rms_norm,
                "silu_and_mul": kernels.silu_and_mul,
                "rope": lambda pos, q, k, hd, cache: kernels.rotary_embedding(pos, q, k, hd, cache, True),
            }
            return RegionOps(ops, dict.fromkeys(ops, "kernel"),
                             notes=[f"eager mode: vLLM's compiled kernels from {kernels.path}"])
        return RegionOps(native, dict.fromkeys(native, "native_eager"), notes=[
            "eager mode on a machine without CUDA: vLLM's enforce_eager runs its CUDA kernels "
            "(torch.ops._C), which cannot run here; every point fell back to vLLM's native ops "
            "run eagerly (evidence native_eager), which are NOT the kernels (e.g. the native "
            "norm run eagerly rounds x*rstd before the weight, the 0.33 kernels do not). "
            "Calibrate eager mode on a GPU for a profile row."
        ])

    # -- facts read from the source -----------------------------------------------------------

    def source_fact(self, point: str) -> dict[str, str]:
        """A point's value as this vLLM version's source states it, for when running its code
        cannot decide (evidence ``source``). Each fact is checked against the source text that
        states it, so a version whose source no longer says so gets an error, not a stale fact.

        ``rope_inv_freq``: ``_compute_inv_freq`` says, in vLLM's own comment, that the cache is
        created on the GPU (vLLM builds its layers under the model's device context), not on the
        CPU as HF does. ``lm_head``: the logits processor's ``head_dtype`` is the model dtype for a
        generation model (bf16 logits) unless the run sets ``hf_overrides={"head_dtype": "float32"}``.
        """
        if point == "lm_head":
            for relpath, phrase, function in _HEAD_FACTS:
                if phrase not in self.package.read_text(relpath):
                    raise EngineCodeError(f"vllm {self.version}: {self.package.label(relpath)} no longer says "
                                          f"{phrase!r} ({function}); lm_head cannot be read from the source")
            where = "; ".join(f"{self.package.label(r)}, {f}: '{ph}'" for r, ph, f in _HEAD_FACTS)
            return {"choice": "lp", "why": f"source (the default; hf_overrides={{'head_dtype': 'float32'}} makes it "
                    f"fp32): {where}", "where": where}
        if point != "rope_inv_freq":
            raise KeyError(f"no source fact for {point!r} in rla's vLLM adapter")
        text = self.package.read_text(_ROPE_BASE)
        phrase = "create the cache on GPU"
        if phrase not in text:
            raise EngineCodeError(
                f"vllm {self.version}: {self.package.label(_ROPE_BASE)} no longer says {phrase!r} "
                "in RotaryEmbeddingBase._compute_inv_freq; rope_inv_freq cannot be read from the source"
            )
        where = f"{self.package.label(_ROPE_BASE)}, RotaryEmbeddingBase._compute_inv_freq: '{phrase}'"
        return {"choice": "device", "why": f"source: {where}", "where": where}

    # -- compiled kernels ----------------------------------------------------------------------

    def c_ops(self, library: str | None = None) -> "VllmKernels":
        """vLLM's compiled CUDA kernels (``torch.ops._C``) from ``library`` (a path to
        ``_C_stable_libtorch.abi3.so``, or an ``.xz`` of it), else from this engine's package
        (the installed file, or the wheel's member extracted to the engine cache)."""
        if not torch.cuda.is_available():
            raise EngineUnavailable(
                f"vLLM's compiled kernels ({LIBRARY}) run on CUDA, and this torch "
                f"({torch.__version__}) sees no CUDA device; eager-mode points need a GPU, or "
                "fall back to weaker evidence (rla calibrate --mode eager on CPU says which)"
            )
        if library is not None:
            path = _decompressed(Path(library).expanduser())
        else:
            path = self.package.file_path(LIBRARY)
        return VllmKernels(path)


def _decompressed(path: Path) -> Path:
    """``path`` itself, or for an ``.xz`` its content in ``cache_dir()/libraries/`` (decompressed again when the
    ``.xz`` is newer). Parallel-safe: under :func:`cache_lock`, into a temporary file of a name no other
    process uses, in the same folder, then renamed into place, so no process loads a half-written library."""
    if not path.is_file():
        raise EngineUnavailable(f"kernel library {path} does not exist")
    if path.suffix != ".xz":
        return path
    dest = cache_dir() / "libraries" / path.stem

    def fresh() -> bool:
        return dest.is_file() and dest.stat().st_mtime >= path.stat().st_mtime

    if fresh():
        return dest
    with cache_lock(f"library-{path.stem}"):
        if fresh():  # another process decompressed it while this one waited
            return dest
        dest.parent.mkdir(parents=True, exist_ok=True)
        for stale in dest.parent.glob(f".{dest.name}.*.part"):  # a killed writer's: every writer holds the lock
            stale.unlink(missing_ok=True)
        tmp = dest.with_name(f".{dest.name}.{uuid.uuid4().hex}.part")
        try:
            with lzma.open(path) as src, open(tmp, "xb") as out:  # "x": created here, the umask's mode as before
                while chunk := src.read(1 << 20):
                    out.write(chunk)
            os.replace(tmp, dest)
        finally:
            tmp.unlink(missing_ok=True)
    return dest


_LOADED: dict[str, Path] = {}


class VllmKernels:
    """vLLM's ``torch.ops._C`` region kernels, called on clones so callers' tensors are untouched
    (``fused_add_rms_norm`` and ``rotary_embedding`` work in place)."""

    def __init__(self, path: Path):
        path = Path(path).resolve()
        if "_C" not in _LOADED:
            try:
                torch.ops.load_library(str(path))
            except OSError as e:
                raise EngineUnavailable(f"cannot load vLLM's kernel library {path}: {e}") from None
            _LOADED["_C"] = path
        elif _LOADED["_C"] != path:
            raise EngineUnavailable(
                f"vLLM's kernels are already loaded from {_LOADED['_C']}; a second copy ({path}) "
                "cannot be registered in the same process"
            )
        self.path = _LOADED["_C"]
        ops = torch.ops._C
        for name in ("rms_norm", "fused_add_rms_norm", "silu_and_mul", "rotary_embedding"):
            if not hasattr(ops, name):
                raise EngineUnavailable(f"{self.path} does not register torch.ops._C.{name}")
        self._ops = ops

    def rms_norm(self, x, weight, eps):
        out = torch.empty_like(x)
        self._ops.rms_norm(out, x.contiguous(), weight, eps)
        return out

    def fused_add_rms_norm(self, x, residual, weight, eps):
        """-> ``(out, new_residual)``: the kernel overwrites its input with the normed output and
        the residual with RN(x + residual); it runs on clones."""
        out, res = x.clone(), residual.clone()
        self._ops.fused_add_rms_norm(out, res, weight, eps)
        return out, res

    def silu_and_mul(self, x):
        d = x.shape[-1] // 2
        out = torch.empty(x.shape[:-1] + (d,), dtype=x.dtype, device=x.device)
        self._ops.silu_and_mul(out, x.contiguous())
        return out

    def rotary_embedding(self, positions, q, k, head_size, cos_sin_cache, is_neox=True):
        q, k = q.clone(), k.clone()
        self._ops.rotary_embedding(positions, q, k, head_size, cos_sin_cache, is_neox)
        return q, k

    def gelu_tanh_and_mul(self, x):
        """``gelu_tanh_and_mul(out, input)``: ``GeluAndMul(approximate="tanh").forward_cuda``."""
        return self._act_and_mul("gelu_tanh_and_mul", x)

    def swigluoai_and_mul(self, x, alpha: float = 1.702, limit: float = 7.0):
        """``swigluoai_and_mul(out, input, alpha, limit)``: ``SwigluOAIAndMul.forward_cuda`` and the fused
        MoE's activation (``fused_moe/activation.py apply_moe_activation``), interleaved gate/up."""
        return self._act_and_mul("swigluoai_and_mul", x, alpha, limit)

    def _act_and_mul(self, name, x, *args):
        if not hasattr(self._ops, name):
            raise EngineUnavailable(f"{self.path} does not register torch.ops._C.{name}")
        out = torch.empty(x.shape[:-1] + (x.shape[-1] // 2,), dtype=x.dtype, device=x.device)
        getattr(self._ops, name)(out, x.contiguous(), *args)
        return out


def load(wheel: str | None = None) -> VllmEngine:
    """vLLM's region code from ``wheel`` if given, else from the installed ``vllm`` package.

    Nothing of vLLM is imported: the needed functions are compiled alone from its files.
    """
    return VllmEngine(locate("vllm", wheel))
