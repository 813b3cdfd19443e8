"""Build SGLang's JIT region kernels on this machine and write what happened as one JSON.

The first step of ``lab/bench/h200_sglang_session.sh``: the versions that matter (torch, CUDA,
nvcc, tvm-ffi, ninja), what the adapter finds missing, then SGLang's own ``load_jit`` builds of the
variants calibration reaches (in parallel), each with its time or its compiler error, and what the
norms run through here. The builds land in SGLang's JIT cache (``$SGLANG_JIT_CACHE_DIR``), so a
later ``rla calibrate --engine sglang`` in the same machine reuses them.

    python lab/bench/sglang_jit_build.py --wheel sglang-0.5.23-....whl --out build.json
    python lab/bench/sglang_jit_build.py --wheel ... --arch 9.0   # compile only, no GPU needed
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import time
import traceback


def _run(cmd: list[str]) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=60).stdout.strip()
    except (OSError, subprocess.SubprocessError) as e:
        return f"unavailable ({e})"


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--wheel", default=None, help="sglang wheel (or a zip of its members); default: installed sglang")
    ap.add_argument("--arch", default=None, help="compile for this compute capability (e.g. 9.0) without a GPU")
    ap.add_argument("--out", default=None, help="JSON to write (default: print only)")
    args = ap.parse_args(argv)

    import torch

    from rla.engines import sglang

    home = os.environ.get("CUDA_HOME", "")
    info = {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "CUDA_HOME": home or None,
        "nvcc": _run([os.path.join(home, "bin", "nvcc") if home else "nvcc", "--version"]).splitlines()[-1:],
        "ninja": _run(["ninja", "--version"]) if shutil.which("ninja") else "not on PATH",
        "c++": _run([os.environ.get("CXX", "c++"), "--version"]).splitlines()[:1],
        "apache-tvm-ffi": _version("apache-tvm-ffi"),
        "triton": _version("triton"),
    }
    ok = False
    try:
        eng = sglang.load(args.wheel)
        info["sglang"] = eng.version
        need_device = args.arch is None
        info["missing"] = eng.missing_requirements(need_device)
        t = time.perf_counter()
        kernels = eng.kernels(need_device)
        info["import_seconds"] = round(time.perf_counter() - t, 2)
        arch = tuple(int(v) for v in args.arch.split(".")) if args.arch else None
        t = time.perf_counter()
        built = kernels.build(arch=arch)
        info["build_seconds"] = round(time.perf_counter() - t, 2)
        info["built"] = {op: {"ok": b, "seconds": round(s, 2), "error": err} for op, (b, err, s) in built.items()}
        info["jit_cache"] = str(kernels.cache_root())
        ok = all(b for b, _, _ in built.values())
        if need_device:
            try:
                info["norms"] = kernels.norm_backend()
            except sglang.EngineUnavailable as e:
                info["norms"] = f"not run here: {e}"
    except Exception:  # the point of this script is to say what failed, whatever it was
        info["error"] = traceback.format_exc()
    text = json.dumps(info, indent=2)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
