#!/usr/bin/env bash
# One device call: bash lab/bench/gpu_run.sh STAGE...   (stages: tests tests-norm tests-gated tune ops e2e e2e-1.5b)
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
    tests) timeout 240 python3 -m pytest -q -p no:cacheprovider -o addopts=-ra -s tests/ops/test_fused_gpu.py > "$OUT/tests.txt" 2>&1
           echo "pytest rc=$?"; grep -E "passed|failed|Error|assert|FAILED" "$OUT/tests.txt" | tail -40 ;;
    tests-norm) timeout 120 python3 -m pytest -q -p no:cacheprovider -o addopts=-ra -s tests/ops/test_fused_gpu.py \
             -k "norms or fp32_sum or gradients or saves or opcheck or cuda_graph" > "$OUT/tests.txt" 2>&1
           echo "pytest rc=$?"; grep -E "passed|failed|FAILED" "$OUT/tests.txt" | tail -20 ;;
    tests-gated)  # the fused GeGLU / clamped SwiGLU bitwise tests, the family ops and the aligned families on CUDA, the ops' opcheck: < 200 s
           timeout 120 python3 -m pytest -q -p no:cacheprovider -o addopts=-ra -s --durations=5 tests/ops/test_gated_triton.py \
             tests/ops/test_ops_families.py tests/alignment/test_align_families_gpu.py > "$OUT/tests-gated.txt" 2>&1
           echo "pytest rc=$?"; grep -E "passed|failed|FAILED|differ|skipped" "$OUT/tests-gated.txt" | tail -30
           timeout 75 python3 -m pytest -q -p no:cacheprovider -o addopts=-ra -s tests/ops/test_fused_gpu.py -k opcheck \
             > "$OUT/tests-opcheck.txt" 2>&1
           echo "pytest rc=$?"; grep -E "passed|failed|FAILED|skipped" "$OUT/tests-opcheck.txt" | tail -10 ;;
    tune)  timeout 150 python3 lab/bench/tune_fused.py --out "$OUT/tuned.json" --only ${TUNE_ONLY:-swiglu rope norm} > "$OUT/tune.txt" 2>&1
           grep -E "BEST|bandwidth|failed" "$OUT/tune.txt" ;;
    profile) timeout 90 python3 lab/bench/profile_ops.py > "$OUT/profile.txt" 2>&1; head -14 "$OUT/profile.txt" ;;
    ops)   CFG=; [ -f "$OUT/tuned.json" ] && CFG="--config $OUT/tuned.json"
           (cd lab/bench && timeout ${OPS_TIMEOUT:-200} python3 bench_ops.py $CFG --out "$OUT") 2>&1 | grep -v "^- " | tail -70 ;;
    e2e)   CFG=; [ -f "$OUT/tuned.json" ] && CFG="--config $OUT/tuned.json"
           (cd lab/bench && timeout 300 python3 bench_e2e.py $CFG --out "$OUT") 2>&1 | grep -v "^- " | tail -30 ;;
  esac
done
