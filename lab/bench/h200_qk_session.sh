# Device call of 2026-11-30 (night) for issue #14's fused q/k-norm -> RoPE (rla.ops.qk_norm_rope):
# the GPU tests (the fused kernel against the two-op chain, bit for bit; all of test_fused_gpu.py;
# tests/alignment on CUDA), then one training step per variant on a Qwen3-1.7B shape (the chain runs)
# and a Qwen2.5-1.5B shape (no q/k norm: the no-regression check of the shared norm helpers), beside
# HF eager and Liger, and the Qwen3 step with the two-op chain (rla.alignment.rope.FUSE_QK_NORM_ROPE
# = False). Carries .whl (liger-kernel). Everything lands in $OUT/results_qk.tgz.
#   run: bash lab/bench/h200_qk_session.sh            (call 1)
#        bash lab/bench/h200_qk_session.sh call2      (call 2: the GPU tests call 1's time limit cut off,
#        then the Qwen3 step alternating fused / two-op chain in four processes, rla-vllm only, 10 steps)
set -u
CALL=${1:-call1}
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
R=$OUT/r; mkdir -p $R
finish() { tar czf $OUT/results_qk_$CALL.tgz -C $OUT r; }
trap finish EXIT
stamp() { echo "== $1 $(date -u +%FT%TZ)" | tee -a $R/commands.log; }
nvidia-smi > $R/nvidia-smi.txt 2>&1
python3 -c "import torch, triton, transformers; print(torch.__version__, torch.version.cuda, triton.__version__, transformers.__version__, torch.cuda.get_device_name())" > $R/env.txt 2>&1
if [ "$CALL" = call2 ]; then
  stamp "pytest -k aligned_model_fused_chain tests/ops/test_fused_gpu.py; tests/ops/test_qk_norm_rope_triton.py tests/alignment"
  timeout -s INT 170 python3 -m pytest -q -p no:cacheprovider -o addopts=-ra -ra --junitxml=$R/junit2.xml tests/ops/test_qk_norm_rope_triton.py \
      "tests/ops/test_fused_gpu.py::test_aligned_model_fused_chain_equals_two_op_chain_on_gpu" tests/alignment > $R/pytest2.log 2>&1
  echo "pytest rc=$?" | tee -a $R/commands.log
  grep -E "passed|failed|FAILED|ERROR" $R/pytest2.log | tail -20
  for i in 1 2 3 4; do
    F=$([ $((i % 2)) = 1 ] && echo True || echo False)
    stamp "e2e qwen3-1.7b rla-vllm --steps 10, FUSE_QK_NORM_ROPE = $F (process $i)"
    timeout 75 python3 -c "
import sys, rla.alignment.rope as r
r.FUSE_QK_NORM_ROPE = $F
from rla.cli import main
sys.exit(main(['bench', 'e2e', '--models', 'qwen3-1.7b', '--variants', 'rla-vllm', '--steps', '10', '--out', '$R/alt_$i']))
" > $R/alt_$i.log 2>&1
    echo "process $i rc=$?" | tee -a $R/commands.log
  done
  grep -h "qwen3-1.7b | rla-vllm" $R/alt_*/*.md
  exit 0
fi
stamp "pytest tests/alignment/test_align_qk_chain.py tests/ops/test_qk_norm_rope_triton.py tests/ops/test_fused_gpu.py tests/alignment"
timeout -s INT 240 python3 -m pytest -q -p no:cacheprovider -o addopts=-ra -ra --junitxml=$R/junit.xml tests/alignment/test_align_qk_chain.py \
    tests/ops/test_qk_norm_rope_triton.py tests/ops/test_fused_gpu.py tests/alignment > $R/pytest.log 2>&1
echo "pytest rc=$?" | tee -a $R/commands.log
grep -E "passed|failed|FAILED|ERROR" $R/pytest.log | tail -30
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl > /dev/null 2>&1
stamp "rla bench e2e --models qwen3-1.7b qwen2.5-1.5b --variants hf-bf16 rla-vllm liger"
PYTHONPATH=$PWD/src:/tmp/site timeout 200 python3 -m rla.cli bench e2e --models qwen3-1.7b qwen2.5-1.5b \
    --variants hf-bf16 rla-vllm liger --out $R/e2e > $R/e2e.log 2>&1
echo "e2e rc=$?" | tee -a $R/commands.log
stamp "the same, qwen3-1.7b, hf-bf16 and rla-vllm with the two-op chain (FUSE_QK_NORM_ROPE = False)"
PYTHONPATH=$PWD/src:/tmp/site timeout 120 python3 -c "
import sys, rla.alignment.rope as r
r.FUSE_QK_NORM_ROPE = False
from rla.cli import main
sys.exit(main(['bench', 'e2e', '--models', 'qwen3-1.7b', '--variants', 'hf-bf16', 'rla-vllm', '--out', '$R/e2e_two_op']))
" > $R/e2e_two_op.log 2>&1
echo "e2e two-op rc=$?" | tee -a $R/commands.log
tail -5 $R/e2e.log $R/e2e_two_op.log
