#!/usr/bin/env bash
# One device call that gathers this session's GPU evidence (run from the repo root, OUT set):
#   aligned models on CUDA take the fused path; rollout throughput; the demo at ~2k-token
#   responses; a GRPO pilot of the H200 grid. Every stage has its own timeout and writes under $OUT.
set -o pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src:$PWD/tests
OUT=${OUT:-/tmp/rla-out}; mkdir -p "$OUT/r"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__)"
t0=$(date +%s); stamp() { echo "=== $1 at +$(( $(date +%s) - t0 ))s"; }
stamp align-check
timeout 60 python3 benchmarks/gpu_align_check.py --out "$OUT/r" > "$OUT/r/align_cuda.log" 2>&1; echo rc=$?; tail -3 "$OUT/r/align_cuda.log"
stamp demo-2k
timeout 110 python3 -m rla.cli demo --device cuda -n 64 --max-new-tokens 2048 --ignore-eos --out "$OUT/r/demo-2k" > "$OUT/r/demo-2k.log" 2>&1; echo rc=$?; tail -12 "$OUT/r/demo-2k.log"
stamp sampler
timeout 120 python3 benchmarks/bench_sampler.py --out "$OUT/r" --batch 64 --new 128 > "$OUT/r/sampler.log" 2>&1; echo rc=$?; tail -6 "$OUT/r/sampler.log"
stamp grpo
if [ -n "${GRPO_GRID:-}" ]; then
  timeout ${GRPO_TIMEOUT:-200} python3 -m rla.cli experiment "$GRPO_GRID" --out /tmp/grpo --parallel ${GRPO_PARALLEL:-12} --time-limit $(( ${GRPO_TIMEOUT:-200} - 20 )) > "$OUT/r/grpo.log" 2>&1; echo rc=$?; tail -20 "$OUT/r/grpo.log"
  (cd /tmp && tar czf "$OUT/grpo.tgz" --exclude='*.safetensors' --exclude='*.pt' --exclude='*.bin' grpo) || true
fi
stamp done
(cd "$OUT" && tar czf results.tgz r) && rm -rf "$OUT/r"; ls -la "$OUT"
