#!/usr/bin/env bash
# One device call: bash benchmarks/gpu_run.sh STAGE...   (stages: tests tune ops e2e e2e-1.5b)
# Run from the worktree root; logs and results go under $OUT (default /tmp/rla-out).
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/rla-out}
mkdir -p "$OUT"
for d in .whl ../.whl; do  # Liger Kernel, carried as a wheel (pure Python)
  if ls $d/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site $d/*.whl \
      && export PYTHONPATH=/tmp/site
  fi
done
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv
python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__)"
python3 -c "import liger_kernel, importlib.metadata as m; print('liger', m.version('liger-kernel'))" || true
for stage in "$@"; do
  echo "=== $stage $(date -u +%FT%TZ)"
  case $stage in
    tests) timeout 240 python3 -m pytest -q -p no:cacheprovider -s tests/test_fused_gpu.py > "$OUT/tests.txt" 2>&1
           echo "pytest rc=$?"; grep -E "passed|failed|Error|assert|FAILED" "$OUT/tests.txt" | tail -40 ;;
    tune)  timeout 120 python3 benchmarks/tune_fused.py 2>&1 | tee "$OUT/tune.txt" ;;
    ops)   timeout 200 python3 benchmarks/bench_ops.py --out "$OUT" 2>&1 | tail -60 ;;
    e2e)   timeout 420 python3 benchmarks/bench_e2e.py --out "$OUT" 2>&1 | tail -40 ;;
    e2e-1.5b) timeout 200 python3 benchmarks/bench_e2e.py --out "$OUT" --models qwen2.5-1.5b 2>&1 | tail -40 ;;
  esac
done
