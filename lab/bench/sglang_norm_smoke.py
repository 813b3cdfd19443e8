"""Which kernel FlashInfer 0.7.2's rmsnorm / fused_add_rmsnorm run here, and do they run: one JSON.

Run by lab/bench/sglang_norm_carry.sh before ``rla calibrate`` (same environment). FlashInfer
falls back to its JIT norm.cuh *silently* when ``from .kernels import ...`` (the CuTe-DSL kernels)
raises ImportError/AttributeError, so this re-raises that import to show the exact error, and
reads the CuTe kernels' compile caches after a call to show which path ran.

    python3 sglang_norm_smoke.py OUT.json
"""

from __future__ import annotations

import importlib.metadata as md
import json
import os
import sys
import time
import traceback


def _v(dist):
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return "not installed"


def main(out_path: str) -> int:
    rep: dict = {"env": {k: os.environ.get(k) for k in (
        "PYTHONPATH", "CUTE_DSL_CACHE_DIR", "CUTE_DSL_ARCH", "FLASHINFER_USE_CUDA_NORM",
        "FLASHINFER_WORKSPACE_BASE", "CUDA_HOME")}}
    rep["versions"] = {d: _v(d) for d in (
        "torch", "flashinfer-python", "nvidia-cutlass-dsl", "nvidia-cutlass-dsl-libs-base",
        "nvidia-cutlass-dsl-libs-core", "nvidia-cutlass-dsl-libs-cu13", "apache-tvm-ffi", "cuda-bindings",
        "cuda-python", "cuda-core", "cuda-pathfinder", "protobuf", "typing_extensions", "numpy")}
    ok = True

    def step(name, fn):
        nonlocal ok
        t = time.perf_counter()
        try:
            rep[name] = {"ok": True, "value": fn()}
        except BaseException as e:  # noqa: BLE001 -- report whatever it was
            ok = False
            rep[name] = {"ok": False, "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}
        rep[name]["seconds"] = round(time.perf_counter() - t, 3)
        print(f"[smoke] {name}: {'ok' if rep[name]['ok'] else 'FAILED ' + rep[name]['error']}"
              f" ({rep[name]['seconds']} s)", flush=True)
        return rep[name]["ok"]

    import torch

    dev = torch.device("cuda")
    rep["gpu"] = torch.cuda.get_device_name(dev) if torch.cuda.is_available() else "no CUDA device"

    def imp_cutlass():
        import cutlass
        import cutlass.cute  # noqa: F401
        from cutlass._mlir import _mlir_libs  # noqa: F401
        so = sys.modules.get("cutlass._mlir._mlir_libs._cutlass_ir")
        return {"cutlass": cutlass.__file__, "cutlass_ir": getattr(so, "__file__", None),
                "CUTE_DSL_LIBS": os.environ.get("CUTE_DSL_LIBS")}

    step("import_cutlass", imp_cutlass)

    def imp_flashinfer():
        import flashinfer
        import flashinfer.norm as n
        return {"file": flashinfer.__file__, "version": flashinfer.__version__,
                "_USE_CUDA_NORM": n._USE_CUDA_NORM, "_use_cuda_norm(cuda)": n._use_cuda_norm(dev)}

    have_fi = step("import_flashinfer", imp_flashinfer)

    def imp_cute_kernels():  # what flashinfer.norm swallows
        from flashinfer.norm.kernels import fused_add_rmsnorm_cute, rmsnorm_cute  # noqa: F401
        return "flashinfer.norm.kernels imports (the CuTe-DSL path is available)"

    step("import_cute_norm_kernels", imp_cute_kernels)
    if not have_fi:
        json.dump(rep, open(out_path, "w"), indent=1)
        return 1

    import flashinfer.norm as n

    rep["path"] = "JIT norm.cuh (FLASHINFER_USE_CUDA_NORM or no CuTe DSL)" if n._use_cuda_norm(dev) else "CuTe-DSL kernels"
    print(f"[smoke] flashinfer.norm takes: {rep['path']}", flush=True)

    def run_norms():
        g = torch.Generator(device=dev).manual_seed(0)
        res = {}
        for t, h in ((4096, 3584), (64, 4096), (4096 * 16, 128), (17, 1536)):
            x = torch.randn(t, h, device=dev, generator=g).bfloat16()
            r = torch.randn(t, h, device=dev, generator=g).bfloat16()
            w = (1 + 0.1 * torch.randn(h, device=dev, generator=g)).bfloat16()
            t0 = time.perf_counter()
            y = n.rmsnorm(x, w, 1e-6)
            torch.cuda.synchronize()
            first = time.perf_counter() - t0
            ref = (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6) * w.float()).bfloat16()
            xo, ro = x.clone(), r.clone()
            n.fused_add_rmsnorm(xo, ro, w, 1e-6)
            torch.cuda.synchronize()
            s = x.float() + r.float()
            ref2 = (s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + 1e-6) * w.float()).bfloat16()
            res[f"{t}x{h}"] = {
                "rmsnorm_first_call_s": round(first, 3),
                "rmsnorm_equal_to_fp32_fused_ref": float((y == ref).float().mean()),
                "add_rmsnorm_equal_to_fp32_sum_ref": float((xo == ref2).float().mean()),
                "residual_equal_to_rounded_sum": float((ro == s.bfloat16()).float().mean()),
            }
        return res

    step("run_norms", run_norms)

    def which_ran():
        out = {}
        try:
            from flashinfer.norm.kernels import fused_add_rmsnorm as fa, rmsnorm as rm
            out["cute_rmsnorm_compiled_variants"] = rm._get_compiled_rmsnorm_kernel.cache_info().currsize
            out["cute_fused_add_rmsnorm_compiled_variants"] = fa._get_compiled_fused_add_rmsnorm_kernel.cache_info().currsize
        except Exception as e:  # noqa: BLE001
            out["cute"] = f"{type(e).__name__}: {e}"
        out["jit_norm_module_loaded"] = n.get_norm_module.cache_info().currsize
        return out

    step("which_ran", which_ran)
    json.dump(rep, open(out_path, "w"), indent=1, default=str)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "norm_smoke.json"))
