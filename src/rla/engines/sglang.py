"""SGLang's own region kernels, built from its package or wheel at run time (never copied).

What SGLang 0.5.23's default CUDA path runs for Qwen2 / Qwen3 / Llama (bf16, one GPU, no
quantization, no ``--enable-torch-compile``, deterministic and ``rl_on_policy_target`` off), read
from its code; every link below is checked against the source when the adapter loads
(``DISPATCH``, ``SOURCE_FACTS``, ``JIT_KERNELS``), so a version that moved one fails loudly:

- RMSNorm and residual-add + RMSNorm: ``RMSNorm.forward_cuda`` (``srt/layers/layernorm.py``)
  calls ``sgl_kernel.rmsnorm`` / ``sgl_kernel.fused_add_rmsnorm`` (the ``sglang-kernel`` wheel,
  an AOT library built against torch 2.14's C++ ABI). For fp16/bf16 those hand the work to
  FlashInfer (``flashinfer.norm.rmsnorm`` / ``fused_add_rmsnorm``, flashinfer-python 0.7.2), whose
  default with ``nvidia-cutlass-dsl`` installed (SGLang pins it) is its CuTe-DSL kernels
  (``flashinfer/norm/kernels/{rmsnorm,fused_add_rmsnorm}.py``), else its JIT CUDA kernels
  (``include/flashinfer/norm.cuh``). The JIT kernel ``FusedAddRMSNormKernel``
  (``fused_add_rmsnorm.cuh``) runs only with ``cast_x_before_out_mul`` (the rl_on_policy path).
- SiLU-and-mul: ``SiluAndMul.forward_cuda`` (``srt/layers/activation.py``) -> JIT
  ``sglang.kernels.ops.activation.activation.silu_and_mul`` -> ``ActivationKernel``
  (``kernels/jit/csrc/elementwise/activation.cuh``, built with ``--use_fast_math``) when the row
  is a multiple of the vector width (16 bytes below SM100, 32 from SM100), else sgl_kernel's AOT
  ``silu_and_mul``. (On SM100, decode batches of <= 16 tokens take a fused GEMM + SwiGLU instead.)
- RoPE: ``RotaryEmbedding.forward_cuda`` (``srt/layers/rotary_embedding/base.py``), head sizes
  64/128/256/512 -> JIT ``sglang.kernels.ops.attention.rope.apply_rope_with_cos_sin_cache_inplace``
  -> ``FusedRopeKernel`` (``rope.cuh``) reading the fp32 cos/sin cache; other head sizes -> JIT
  ``rotary_embedding`` -> ``RotaryEmbeddingKernel`` (``pos_enc.cuh``) with the cache in the
  query's dtype. The cache is built by ``RotaryEmbedding._compute_cos_sin_cache`` on the GPU
  (``Llama3RotaryEmbedding._compute_inv_freq`` for llama3 scaling) and kept fp32 on CUDA.
- Qwen3's q/k norm: ``apply_qk_norm`` (``srt/models/utils.py``) -> JIT
  ``sglang.kernels.ops.layernorm.norm.fused_inplace_qknorm`` -> ``QKNormKernel`` (``qknorm.cuh``)
  for head dims 64..1024; otherwise a per-head ``RMSNorm`` (FlashInfer, as above).

The JIT kernels are compiled by SGLang's own loader (``sglang.kernels.jit.utils.load_jit``:
nvcc + ninja, loaded through tvm-ffi's DLPack ABI, so they load into any torch), from the
``.cuh`` files of the package in hand. Only what those kernels need is imported: ``sglang`` and
``sglang.srt.utils`` are made bare packages (their ``__init__`` starts SGLang's runtime / needs
pyzmq), everything below them is SGLang's real module. The norms need ``sgl_kernel`` (or
FlashInfer) importable in this torch; where they are not, calibration keeps the checked-in
``sglang-0.5.23`` row's evidence for the norm points and says so.
"""

from __future__ import annotations

import importlib
import importlib.util
import math
import os
import re
import shutil
import sys
import time
import types
import zipfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from rla.engines import rotary
from rla.engines.regions import RegionOps
from rla.engines.source import (
    EngineCodeError,
    EnginePackage,
    EngineUnavailable,
    cache_dir,
    cache_lock,
    extract_class,
    file_provenance,
    function_source,
    locate,
)

__all__ = ["SglangEngine", "SglangKernels", "load", "NAME", "MODES", "BASELINE", "DISPATCH",
           "SOURCE_FACTS", "JIT_KERNELS", "FUSED_ROPE_HEAD_SIZES"]

NAME = "sglang"
#: SGLang has one CUDA path; ``default`` is it.
MODES = ("default",)
#: The checked-in row whose evidence is kept for points whose kernels cannot run here.
BASELINE = "sglang-0.5.23"

_LAYERNORM = "sglang/srt/layers/layernorm.py"
_ACTIVATION = "sglang/srt/layers/activation.py"
_ROPE_BASE = "sglang/srt/layers/rotary_embedding/base.py"
_ROPE_VARIANT = "sglang/srt/layers/rotary_embedding/rope_variant.py"
_MODEL_UTILS = "sglang/srt/models/utils.py"
_CSRC = "sglang/kernels/jit/csrc/"
_LOGITS = "sglang/srt/layers/logits_processor.py"
_EXEC_ARGS = "sglang/srt/arg_groups/fields/exec_.py"

#: Head sizes whose RoPE takes ``FusedRopeKernel`` with the fp32 cache (checked in the source).
FUSED_ROPE_HEAD_SIZES = (64, 128, 256, 512)


@dataclass(frozen=True)
class Dispatch:
    """One link of SGLang's default path: ``function`` in ``file`` contains ``calls``."""

    op: str
    file: str
    function: str
    calls: str


DISPATCH = (
    Dispatch("rms_norm", _LAYERNORM, "RMSNorm.forward_cuda", "result = rmsnorm(x, self.weight.data, self.variance_epsilon)"),
    Dispatch("fused_add_rms_norm", _LAYERNORM, "RMSNorm.forward_cuda",
             "fused_add_rmsnorm(x, residual, self.weight.data, self.variance_epsilon)"),
    Dispatch("silu_and_mul", _ACTIVATION, "SiluAndMul.forward_cuda", "silu_and_mul(x, out)"),
    Dispatch("rope", _ROPE_BASE, "RotaryEmbedding.forward_cuda", "apply_rope_with_cos_sin_cache_inplace("),
    Dispatch("qk_norm", _MODEL_UTILS, "apply_qk_norm", "fused_inplace_qknorm("),
)

#: Facts of the same files that decide which kernel a call reaches: (file, text, what it means).
SOURCE_FACTS = (
    (_LAYERNORM, "from sgl_kernel import (", "RMSNorm's rmsnorm / fused_add_rmsnorm come from sgl_kernel"),
    (_ACTIVATION, "return _act_and_mul(_jit_silu_and_mul, _sgl_silu_and_mul, input, out)",
     "silu_and_mul takes the JIT kernel, sgl_kernel's only for unaligned rows"),
    (_ACTIVATION, "_jit_act_max_vec_bytes = 32 if major >= 10 else 16", "the JIT activation's vector width"),
    (_ROPE_BASE, "self.head_size not in [64, 128, 256, 512]", "the head sizes of the fused RoPE kernel"),
    (_ROPE_BASE, "if not (_is_cuda or _is_hip or _is_xpu or envs.SGLANG_ROPE_CACHE_FP32.get()):",
     "on CUDA the cos/sin cache stays fp32"),
    (_ROPE_BASE, "create the cache on GPU", "the cos/sin cache is computed on the GPU"),
    (_LOGITS, "hidden_states.to(lm_head.weight.dtype), lm_head.weight.T",
     "without the fp32 switch the LM head is a GEMM in the weight's dtype (bf16 logits)"),
    (_EXEC_ARGS, "If set, the LM head outputs (logits) are in FP32.\",\n    ] = False",
     "enable_fp32_lm_head is off unless the run sets it"),
)


@dataclass(frozen=True)
class JitKernel:
    """A JIT region kernel: ``entry`` (what SGLang's layer calls) in ``module``, built by
    ``builder`` (a ``load_jit`` call) from ``csrc/<source>``, C++ class ``kernel``."""

    op: str
    module: str
    entry: str
    builder: str
    source: str
    kernel: str

    @property
    def file(self) -> str:
        return self.module.replace(".", "/") + ".py"


JIT_KERNELS = (
    JitKernel("silu_and_mul", "sglang.kernels.ops.activation.activation", "silu_and_mul", "activation_module",
              "elementwise/activation.cuh", "ActivationKernel"),
    JitKernel("rope", "sglang.kernels.ops.attention.rope", "apply_rope_with_cos_sin_cache_inplace",
              "_jit_fused_rope_module", "elementwise/rope.cuh", "FusedRopeKernel"),
    JitKernel("rope_fallback", "sglang.kernels.ops.attention.rope", "rotary_embedding",
              "_jit_rotary_embedding_module", "elementwise/pos_enc.cuh", "RotaryEmbeddingKernel"),
    JitKernel("qk_norm", "sglang.kernels.ops.layernorm.norm", "fused_inplace_qknorm", "_jit_qknorm_module",
              "elementwise/qknorm.cuh", "QKNormKernel"),
)

#: Third-party modules the JIT kernels' import closure needs (SGLang 0.5.23, measured), with pip
#: names where they differ; tvm_ffi's pin is read from SGLang's metadata.
IMPORT_NEEDS = {"tvm_ffi": "apache-tvm-ffi", "msgspec": "msgspec", "orjson": "orjson", "pybase64": "pybase64",
                "starlette": "starlette", "requests": "requests", "PIL": "pillow", "triton": "triton",
                "psutil": "psutil", "numpy": "numpy", "packaging": "packaging"}

#: Packages imported bare (their ``__init__`` not run), and the module a bare one forwards
#: names to (``sglang.srt.utils`` is ``from common import *`` plus ``network``, which needs pyzmq).
_BARE = {"sglang": None, "sglang.srt.utils": "sglang.srt.utils.common"}


def _cuda_home() -> str:
    """The CUDA root as SGLang's JIT toolchain resolves it (``toolchain.cuda_home``): CUDA_HOME,
    CUDA_PATH, the directory above ``nvcc`` on PATH, else /usr/local/cuda."""
    configured = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if configured:
        return configured
    nvcc = shutil.which("nvcc")
    return os.path.dirname(os.path.dirname(nvcc)) if nvcc else "/usr/local/cuda"


class SglangEngine:
    """SGLang's region code from one version's files: the dispatch checked, the rotary cache
    builder extracted, the JIT kernels' entry points located (built on demand by ``kernels()``).

    ``provenance`` maps each function, dispatch link and kernel source to its file and sha256.
    Implements :class:`rla.engines.adapter.RegionEngine` (checked by ``tests/engines/test_engine_adapter.py``).
    """

    name = NAME
    modes = MODES
    baseline = BASELINE

    def __init__(self, package: EnginePackage):
        self.package = package
        self.version = package.version
        self.profile_name = f"{NAME}-{package.version}"  # SGLang's patch releases change kernels
        self.provenance: dict[str, dict[str, Any]] = {}
        self._check_dispatch()
        self._check_jit_kernels()
        ns = {"torch": torch, "math": math}

        def cls(relpath, name, methods, base=None):
            c, provs = extract_class(package, relpath, name, methods, ns, base)
            self.provenance.update({k: v.as_dict() for k, v in provs.items()})
            return c

        self._RopeCache = cls(_ROPE_BASE, "RotaryEmbedding", ["_compute_inv_freq", "_compute_cos_sin_cache"])
        self._Llama3Cache = cls(_ROPE_VARIANT, "Llama3RotaryEmbedding", ["_compute_inv_freq"], self._RopeCache)
        self.pins = self._pins()

    def __repr__(self) -> str:
        return f"SglangEngine(sglang {self.version}, {self.package.origin}: {self.package.location})"

    # -- what the source says ------------------------------------------------------------------

    def _changed(self, what: str, relpath: str) -> EngineCodeError:
        return EngineCodeError(f"sglang {self.version}: {what} ({self.package.label(relpath)}); this version "
                               "changed its default path, and rla's SGLang adapter must be updated for it")

    def _check_dispatch(self) -> None:
        for d in DISPATCH:
            text, prov = function_source(self.package, d.file, d.function)
            if d.calls not in text:
                raise self._changed(f"{d.function} no longer calls {d.calls!r} for {d.op}", d.file)
            self.provenance[f"{d.function} ({d.op})"] = prov.as_dict()
        for relpath, phrase, meaning in SOURCE_FACTS:
            if phrase not in self.package.read_text(relpath):
                raise self._changed(f"{relpath} no longer says {phrase!r} ({meaning})", relpath)

    def _check_jit_kernels(self) -> None:
        for k in JIT_KERNELS:
            _, prov = function_source(self.package, k.file, k.entry)
            self.provenance[f"{k.module}.{k.entry}"] = prov.as_dict()
            builder, prov = function_source(self.package, k.file, k.builder)
            if k.source not in builder or k.kernel not in builder:
                raise self._changed(f"{k.builder} no longer builds {k.kernel} from {k.source}", k.file)
            self.provenance[f"{k.module}.{k.builder}"] = prov.as_dict()
            cuh = _CSRC + k.source
            if not re.search(rf"\b(struct {k.kernel}|using {k.kernel} =)", self.package.read_text(cuh)):
                raise self._changed(f"{k.source} no longer defines {k.kernel}", cuh)
            self.provenance[k.kernel] = file_provenance(self.package, cuh).as_dict()

    def _pins(self) -> dict[str, str]:
        """SGLang's pins of the packages its kernel path needs, from its METADATA."""
        meta = self.package.read_text(f"sglang-{self.version}.dist-info/METADATA")
        pins = {}
        for line in meta.splitlines():
            if line.startswith("Requires-Dist:") and "extra ==" not in line:
                spec = line.split(":", 1)[1].split(";")[0].strip()
                name = spec.split("=")[0].split("[")[0].split("<")[0].split(">")[0].strip().lower().replace("_", "-")
                pins[name] = spec
        return pins

    def source_fact(self, point: str) -> dict[str, str]:
        """``rope_inv_freq``: SGLang says in ``RotaryEmbedding._compute_inv_freq`` that it creates
        the cache on the GPU; ``lm_head``: ``LogitsProcessor._compute_lm_head`` is a GEMM in the
        weight's dtype unless ``--enable-fp32-lm-head`` (off by default) is set (both checked at
        load, ``SOURCE_FACTS``)."""
        if point == "lm_head":
            where = (f"{self.package.label(_LOGITS)}, LogitsProcessor._compute_lm_head: 'torch.matmul(hidden_states.to("
                     f"lm_head.weight.dtype), lm_head.weight.T)'; {self.package.label(_EXEC_ARGS)}, ExecFeatures."
                     "enable_fp32_lm_head = False")
            return {"choice": "lp", "why": f"source (the default; --enable-fp32-lm-head makes it fp32): {where}",
                    "where": where}
        if point != "rope_inv_freq":
            raise KeyError(f"no source fact for {point!r} in rla's SGLang adapter")
        where = f"{self.package.label(_ROPE_BASE)}, RotaryEmbedding._compute_inv_freq: 'create the cache on GPU'"
        return {"choice": "device", "why": f"source: {where}", "where": where}

    # -- the rotary cache ----------------------------------------------------------------------

    def _rope_module(self, rotary_dim, max_position, base, rope_scaling, head_size=None):
        """The extracted builder with the attributes SGLang's ``__init__`` sets on its default path
        (``_force_native`` is the rl_on_policy switch, off)."""
        return rotary.builder(self._RopeCache, self._Llama3Cache, "SGLang", rotary_dim, max_position, base,
                                  rope_scaling, head_size, position_start=0, _force_native=False)

    def inv_freq(self, rotary_dim: int, base: float, rope_scaling: dict | None = None, device="cpu"):
        """SGLang's fp32 ``inv_freq``, evaluated on ``device`` (the model's device, as SGLang builds it)."""
        obj = self._rope_module(rotary_dim, 1, base, rope_scaling)
        with torch.device(device):
            return obj._compute_inv_freq(base)

    def cos_sin_cache(self, head_size, rotary_dim, max_position, base, rope_scaling=None,
                      dtype: torch.dtype = torch.float32, device="cpu") -> torch.Tensor:
        """SGLang's cos/sin cache [max_position, rotary_dim] = cat(cos, sin), computed by its own
        ``_compute_cos_sin_cache`` under ``with torch.device(device)`` (SGLang builds its layers on
        the GPU), in ``dtype`` (fp32 is the table itself; SGLang keeps it fp32 on CUDA)."""
        obj = self._rope_module(rotary_dim, max_position, base, rope_scaling, head_size)
        with torch.device(device):
            cache = obj._compute_cos_sin_cache()
        return cache.to(dtype)

    def rope_cache(self, head_size, rotary_dim, max_position, base, rope_scaling, query_dtype, device):
        """The cache as SGLang's RoPE kernel reads it: fp32 for the fused kernel's head sizes, the
        query's dtype for the fallback kernel (``RotaryEmbedding.forward_cuda``)."""
        cache = self.cos_sin_cache(head_size, rotary_dim, max_position, base, rope_scaling, torch.float32, device)
        return cache if head_size in FUSED_ROPE_HEAD_SIZES else cache.to(query_dtype)

    # -- the kernels ---------------------------------------------------------------------------

    def missing_requirements(self, need_device: bool = True) -> list[str]:
        """What this machine lacks to build and run SGLang's JIT kernels, one line each (empty:
        nothing). ``need_device=False`` checks what a compile alone needs."""
        out = []
        if need_device and not torch.cuda.is_available():
            out.append(f"CUDA: this torch ({torch.__version__}) sees no CUDA device; SGLang's region "
                       "kernels are CUDA kernels (calibrate on a GPU machine, --device cuda)")
        home = _cuda_home()
        if not os.path.isfile(os.path.join(home, "bin", "nvcc")):
            out.append(f"nvcc: not found at {home}/bin/nvcc (SGLang's JIT takes CUDA_HOME, CUDA_PATH, nvcc on "
                       "PATH, else /usr/local/cuda): install the CUDA toolkit or set CUDA_HOME to it")
        elif not any(os.path.exists(os.path.join(home, "lib64", n)) for n in ("libcudart.so", "libcudart.so.13", "libcudart.so.12")):
            out.append(f"libcudart: {home}/lib64 has no libcudart.so, which the JIT link step uses "
                       f"(-L{home}/lib64 -lcudart); set CUDA_HOME to the toolkit root (e.g. /usr/local/cuda)")
        if shutil.which("ninja") is None:
            out.append("ninja: not on PATH (pip install ninja)")
        cxx = os.environ.get("CXX", "c++")
        if shutil.which(cxx) is None:
            out.append(f"host C++ compiler: {cxx!r} not found (install g++, or set CXX)")
        absent = [m for m in IMPORT_NEEDS if importlib.util.find_spec(m) is None]
        if absent:
            names = [self.pins.get(IMPORT_NEEDS[m], IMPORT_NEEDS[m]) for m in absent]
            out.append(f"python modules SGLang's kernel code imports: {', '.join(absent)} "
                       f"(pip install {' '.join(repr(n) if '=' in n or '<' in n else n for n in names)})")
        return out

    def _import_root(self) -> Path:
        """A directory holding SGLang's Python files: the installed package, or the wheel's
        Python files (its compiled extensions, the server's, left out) unpacked once into the
        engine cache."""
        if self.package.origin == "installed":
            return Path(self.package.location)
        dest = cache_dir() / f"sglang-{self.version}-py"
        wheel = Path(self.package.location)
        stamp = f"{wheel.name} {wheel.stat().st_size}\n"
        marker = dest / ".rla-unpacked"
        if marker.is_file() and marker.read_text() == stamp:
            return dest
        with cache_lock(dest.name):  # another process may be unpacking (or reading) the same folder
            if marker.is_file() and marker.read_text() == stamp:
                return dest
            staging = dest.with_name(dest.name + f".part{os.getpid()}")
            shutil.rmtree(staging, ignore_errors=True)
            with zipfile.ZipFile(wheel) as zf:
                members = [n for n in zf.namelist() if n.startswith("sglang/") and not n.endswith(".so")]
                zf.extractall(staging, members)
            (staging / ".rla-unpacked").write_text(stamp)
            shutil.rmtree(dest, ignore_errors=True)
            os.replace(staging, dest)
        return dest

    def kernels(self, need_device: bool = True) -> "SglangKernels":
        """SGLang's JIT kernel modules, imported from this package (nothing compiled yet)."""
        missing = self.missing_requirements(need_device)
        if missing:
            raise EngineUnavailable("cannot build SGLang's JIT region kernels here:\n  - " + "\n  - ".join(missing))
        return SglangKernels(self, self._import_root())

    def region_ops(self, mode: str, device: torch.device, library: str | None = None) -> RegionOps:
        """SGLang's default CUDA path on ``device``: its JIT kernels (evidence ``kernel``), built
        here in parallel; the norms through ``sgl_kernel`` / FlashInfer where they load. A kernel
        that fails to build, or a norm library that does not load, is listed in ``unavailable``."""
        if mode != "default":
            raise ValueError(f"SGLang has one mode here, 'default' (its CUDA path); got {mode!r}")
        if library is not None:
            raise ValueError("--library names vLLM's kernel library; SGLang's kernels are built from its sources")
        if device.type != "cuda":
            missing = self.missing_requirements()
            raise EngineUnavailable("SGLang's region kernels run on CUDA; --device cpu cannot run them. "
                                    + ("Missing here too: " + "; ".join(missing) if missing else ""))
        k = self.kernels()
        built = k.build()
        ops, unavailable = {}, {}
        for op in ("silu_and_mul", "rope", "qk_norm"):
            if built[op][0]:
                ops[op] = getattr(k, op)
            else:
                unavailable[op] = f"its JIT kernel did not build: {built[op][1]}"
        try:
            norm = k.norm_backend()
            ops["rms_norm"], ops["fused_add_rms_norm"] = k.rms_norm, k.fused_add_rms_norm
        except EngineUnavailable as e:
            norm = None
            unavailable["rms_norm"] = unavailable["fused_add_rms_norm"] = str(e)
        if not ops:
            raise EngineUnavailable("none of SGLang's region kernels could run here: "
                                    + "; ".join(f"{o}: {w}" for o, w in unavailable.items()))
        notes = ["SGLang's JIT kernels, compiled here by its own loader from "
                 f"{self.package.label(_CSRC)} (JIT cache {k.cache_root()}): "
                 + ", ".join(f"{op} {'built' if ok else 'FAILED'} in {sec:.1f} s" for op, (ok, _, sec) in built.items())]
        if norm:
            notes.append(f"the norms ran through {norm}")
        return RegionOps(ops, dict.fromkeys(ops, "kernel"), notes=notes, unavailable=unavailable)


def _bare_import_root(root: Path) -> None:
    """Make ``sglang.*`` importable from ``root`` without running ``_BARE``'s ``__init__``s."""
    have = sys.modules.get("sglang")
    pkg = (root / "sglang").resolve()
    if have is not None:
        where = Path(list(getattr(have, "__path__", [""]))[0]).resolve()
        if where != pkg:
            raise EngineUnavailable(f"another sglang ({where}) is already imported in this process; "
                                    f"cannot load SGLang's kernels from {pkg} beside it")
        return
    for name, forward in _BARE.items():
        mod = types.ModuleType(name, "rla: a bare package (its __init__ not run), for SGLang's kernel modules")
        mod.__path__ = [str(root.joinpath(*name.split(".")))]
        mod.__package__ = name
        if forward:
            mod.__getattr__ = lambda attr, _f=forward: getattr(importlib.import_module(_f), attr)
        sys.modules[name] = mod


class SglangKernels:
    """SGLang's region kernels in this process: its JIT modules imported from its files, built by
    its own ``load_jit``; every op runs on clones (the kernels work in place)."""

    def __init__(self, engine: SglangEngine, root: Path):
        self.engine, self.root = engine, root
        _bare_import_root(root)
        self.modules, self.import_errors = {}, {}
        for k in JIT_KERNELS:  # one module that does not import (in this torch) leaves the others
            try:
                self.modules[k.op] = importlib.import_module(k.module)
            except ModuleNotFoundError as e:
                self.import_errors[k.op] = (f"SGLang's {k.module} needs the module {e.name!r}, not installed "
                                            "here (pip install it; see rla.engines.sglang.IMPORT_NEEDS)")
            except Exception as e:
                self.import_errors[k.op] = f"SGLang's {k.module} does not import here ({type(e).__name__}: {e})"
        if not self.modules:
            raise EngineUnavailable("none of SGLang's JIT kernel modules imports here: "
                                    + "; ".join(sorted(set(self.import_errors.values()))))
        self._utils = importlib.import_module("sglang.kernels.jit.utils")
        self._norm = None

    def cache_root(self) -> Path:
        return importlib.import_module("sglang.kernels.jit.utils.compile.cache").cache_root()

    def builders(self, dtype: torch.dtype = torch.bfloat16, rope_dims=(64, 128), qk_head_dims=(128,)):
        """SGLang's own module builders for the variants calibration's probes reach."""
        act, rope, norm = (self.modules.get(o) for o in ("silu_and_mul", "rope", "qk_norm"))
        out: dict[str, list[Callable]] = {}
        if act is not None:
            out["silu_and_mul"] = [lambda: act.activation_module(dtype)]
        if rope is not None:
            out["rope"] = [lambda d=d: rope._jit_fused_rope_module(True, d, dtype, dtype) for d in rope_dims]
        if norm is not None:
            out["qk_norm"] = [lambda d=d: norm._jit_qknorm_module(d, dtype) for d in qk_head_dims]
        return out

    def build(self, arch: tuple[int, int] | None = None, **variants) -> dict[str, tuple[bool, str, float]]:
        """Build every variant in parallel -> ``{op: (ok, error, seconds)}``; one kernel failing
        leaves the others built. ``arch=(9, 0)`` compiles for a GPU that is not here (SGLang's
        ``override_jit_cuda_arch``): a compile check without a device."""
        jobs = [(op, b) for op, bs in self.builders(**variants).items() for b in bs]

        def run(job):
            op, b = job
            t = time.perf_counter()
            try:
                b()
                return op, "", time.perf_counter() - t
            except Exception as e:  # a compiler error is a RuntimeError; report whatever it was
                return op, f"{type(e).__name__}: {e}", time.perf_counter() - t

        if arch is not None:
            with self._utils.override_jit_cuda_arch(*arch):
                results = self._run_all(run, jobs)
        else:
            results = self._run_all(run, jobs)
        out: dict[str, tuple[bool, str, float]] = {
            op: (False, why, 0.0) for op, why in self.import_errors.items() if op != "rope_fallback"}
        for op, err, sec in results:
            ok0, err0, sec0 = out.get(op, (True, "", 0.0))
            out[op] = (ok0 and not err, err0 or err, max(sec0, sec))
        return out

    @staticmethod
    def _run_all(run, jobs):
        with ThreadPoolExecutor(max_workers=max(1, min(len(jobs), os.cpu_count() or 1))) as ex:
            return list(ex.map(run, jobs))

    # -- the region ops ------------------------------------------------------------------------

    def silu_and_mul(self, x: torch.Tensor) -> torch.Tensor:
        """``SiluAndMul.forward_cuda``: the JIT ``silu_and_mul`` into a fresh output."""
        d = x.shape[-1] // 2
        out = torch.empty(x.shape[:-1] + (d,), dtype=x.dtype, device=x.device)
        width = 32 if torch.cuda.get_device_capability(x.device)[0] >= 10 else 16
        if d % (width // x.element_size()):
            raise EngineUnavailable(f"silu_and_mul with {d} columns: SGLang runs sgl_kernel's AOT kernel there, not the JIT one")
        self.modules["silu_and_mul"].silu_and_mul(x.contiguous(), out)
        return out

    def rope(self, positions, q, k, head_size: int, cache: torch.Tensor):
        """``RotaryEmbedding.forward_cuda`` (neox, rotary dim = head size): the fused kernel on
        [tokens, heads, head_size] views for its head sizes, else the fallback kernel."""
        t = positions.shape[0]
        q, k = q.clone(), k.clone()
        mod = self.modules["rope"]
        if head_size in FUSED_ROPE_HEAD_SIZES:
            mod.apply_rope_with_cos_sin_cache_inplace(
                positions=positions, q=q.view(t, -1, head_size), k=k.view(t, -1, head_size),
                cos_sin_cache=cache, is_neox=True)
        else:
            mod.rotary_embedding(positions, q, k, head_size, cache, True)
        return q, k

    def qk_norm(self, q, k, q_weight, k_weight, eps: float, head_size: int):
        """``apply_qk_norm``: SGLang's fused in-place q/k RMSNorm over [tokens, heads, head_size]."""
        mod = self.modules["qk_norm"]
        if not mod.can_use_fused_inplace_qknorm(head_size, q.dtype):
            raise EngineUnavailable(f"SGLang's fused q/k norm does not take head size {head_size} ({q.dtype})")
        t = q.shape[0]
        q, k = q.clone(), k.clone()
        mod.fused_inplace_qknorm(q=q.view(t, -1, head_size), k=k.view(t, -1, head_size), q_weight=q_weight,
                                 k_weight=k_weight, head_dim=head_size, eps=eps)
        return q, k

    def norm_backend(self) -> str:
        """Find what ``sgl_kernel.rmsnorm`` runs here: ``sgl_kernel`` itself if it loads into this
        torch, else FlashInfer's ``flashinfer.norm`` (what sgl_kernel calls for fp16/bf16).
        Returns a description; raises ``EngineUnavailable`` saying why neither loads."""
        pins = self.engine.pins
        why = []
        for name in ("sgl_kernel", "flashinfer.norm"):
            if importlib.util.find_spec(name.split(".")[0]) is None:
                why.append(f"{name} is not installed")
                continue
            try:
                mod = importlib.import_module(name)
            except Exception as e:  # an AOT library built for another torch fails in many ways
                why.append(f"{name} does not load into torch {torch.__version__} ({type(e).__name__}: {e})")
                continue
            self._norm = mod
            top = sys.modules[name.split(".")[0]]
            desc = f"{name} {getattr(top, '__version__', '?')}"
            if name == "sgl_kernel" and not getattr(sys.modules.get("sgl_kernel.elementwise"), "_has_flashinfer", False):
                desc += " (its own AOT kernels: flashinfer did not import)"
            elif name == "flashinfer.norm":
                desc += " (called directly, as sgl_kernel.rmsnorm does for fp16/bf16; sgl_kernel: " + why[0] + ")"
            return desc
        raise EngineUnavailable(
            "SGLang's RMSNorm calls sgl_kernel.rmsnorm / fused_add_rmsnorm "
            f"({pins.get('sglang-kernel', 'sglang-kernel')}), which hand fp16/bf16 to FlashInfer "
            f"({pins.get('flashinfer-python', 'flashinfer-python')}: its CuTe-DSL norm kernels with "
            f"{pins.get('nvidia-cutlass-dsl', 'nvidia-cutlass-dsl')} installed, else its JIT norm.cuh); "
            "here " + "; ".join(why))

    def rms_norm(self, x, weight, eps):
        return self._norm.rmsnorm(x.contiguous(), weight, eps)

    def fused_add_rms_norm(self, x, residual, weight, eps):
        """-> ``(out, new_residual)``: in place on clones, as ``fused_add_rmsnorm`` works."""
        out, res = x.clone(), residual.clone()
        self._norm.fused_add_rmsnorm(out, res, weight, eps)
        return out, res


def load(wheel: str | None = None) -> SglangEngine:
    """SGLang's region code from ``wheel`` if given, else from the installed ``sglang`` package.

    Loading reads and checks files only; ``SglangEngine.kernels()`` imports SGLang's kernel
    modules and builds them (CUDA, nvcc, ninja and tvm-ffi needed)."""
    return SglangEngine(locate("sglang", wheel))
