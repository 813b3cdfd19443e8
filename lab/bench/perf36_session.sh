#!/usr/bin/env bash
# One H200 call for issue #36's second round (the fp32-carry fusions and the narrow norm backward tile),
# from the repository root, carrying .whl (Liger's wheel); everything lands in $OUT/perf36b.tgz.
#   STAGES="tests tiles e2e saved" bash lab/bench/perf36_session.sh
#   tests  the GPU tests of the new ops and of every kernel they touch (compiled vs the code they replace, opcheck,
#          aligned Qwen2/Qwen3 on CUDA with the changes on and off; torch.compile of the reference ops and of each
#          region alone, the two torch-2.11 compile bugs); -v, so the log names every test
#   tiles  lab/bench/qk_bwd_tiles.py: the q/k norm backward under the one-row, narrow and tall tiles
#   e2e    lab/bench/e2e_breakdown.py parts b-d (peaks, kernels, host/GPU time, alternating passes), HF eager,
#          Liger, rla's vllm and vllm-eager rows, and both with Liger's fused linear cross-entropy
#   kernels e2e_breakdown.py part c alone (one profiled step per variant: the kernel time by op kind), the same variants
#   saved  e2e_breakdown.py part a (saved bytes per op, full depth) for hf-bf16, liger, rla-vllm, rla-vllm-eager
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/rla-out}; P="$OUT/perf36b"; mkdir -p "$P"
STAGES=${STAGES:-tests tiles e2e saved}
has() { [[ " $STAGES " == *" $1 "* ]]; }
t0=$(date +%s); stamp() { echo "=== $1 at +$(( $(date +%s) - t0 ))s" | tee -a "$P/stages.txt"; }
run() { echo "$*" >> "$P/commands.txt"; "$@"; }
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site2 .whl/liger_kernel-*.whl 2>&1 | tail -1
export PYTHONPATH=$PWD/src:$PWD/tests:$PWD
if has tests; then
  stamp tests
  run timeout ${TESTS_TIMEOUT:-330} python3 -m pytest -v -p no:cacheprovider -o addopts=-ra -rs tests/ops/test_rms_norm_and_round.py \
    tests/ops/test_add_rms_norm_normed.py tests/alignment/test_align_residual_traffic.py tests/ops/test_norm_bwd_tiles.py \
    tests/ops/test_residual_source.py tests/ops/test_carry_add_grad.py tests/ops/test_qk_norm_rope_triton.py \
    tests/ops/test_fused_gpu.py tests/ops/test_reference_compile.py tests/alignment/test_align_compile_regions.py > "$P/gpu_tests.log" 2>&1
  echo "tests rc=$?" | tee -a "$P/gpu_tests.log"; tail -4 "$P/gpu_tests.log" | cut -c1-300
fi
if has tiles; then
  stamp tiles
  run timeout 90 python3 lab/bench/qk_bwd_tiles.py > "$P/qk_bwd_tiles.txt" 2>&1; echo "tiles rc=$?"; tail -12 "$P/qk_bwd_tiles.txt"
fi
export PYTHONPATH=$PYTHONPATH:/tmp/site2
if has e2e; then
  stamp e2e
  run timeout ${E2E_TIMEOUT:-300} python3 lab/bench/e2e_breakdown.py --warmup 1 --reps 4 --parts bcd --out "$P/e2e_breakdown" \
    > "$P/e2e_breakdown.log" 2>&1; echo "e2e rc=$?"; grep -A22 "^## Host and GPU" "$P/e2e_breakdown.log" | tail -20
fi
if has kernels; then
  stamp kernels
  run timeout ${KERNELS_TIMEOUT:-300} python3 lab/bench/e2e_breakdown.py --warmup 1 --parts c --out "$P/kernels" \
    > "$P/kernels.log" 2>&1; echo "kernels rc=$?"; grep -A14 "^## Time per op kind" "$P/kernels.log" | head -16 | cut -c1-200
fi
if has saved; then
  stamp saved
  run timeout ${SAVED_TIMEOUT:-200} python3 lab/bench/e2e_breakdown.py --parts a --variants hf-bf16 liger rla-vllm rla-vllm-eager \
    --out "$P/saved" > "$P/saved.log" 2>&1; echo "saved rc=$?"; grep -E "left_allocated|per element|^\| qwen" "$P/saved.log" | head -20 | cut -c1-200
fi
stamp done
nvidia-smi > "$P/nvidia-smi.txt" 2>&1
tar -czf "$OUT/perf36b.tgz" -C "$OUT" perf36b && ls -la "$OUT/perf36b.tgz"
