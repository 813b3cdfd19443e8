# Device call of 2026-11-30 (night) for issue #14's fused q/k-norm -> RoPE (rla.ops.qk_norm_rope):
# the GPU tests (the fused kernel against the two-op chain, bit for bit; all of test_fused_gpu.py;
# tests/alignment on CUDA), then one training step per variant on a Qwen3-1.7B shape (the chain runs)
# and a Qwen2.5-1.5B shape (no q/k norm: the no-regression check of the shared norm helpers), beside
# HF eager and Liger, and the Qwen3 step with the two-op chain (rla.alignment.rope.FUSE_QK_NORM_ROPE
# = False). Carries .whl (liger-kernel). Everything lands in $OUT/results_qk.tgz.
#   run: bash benchmarks/h200_qk_session.sh
set -u
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
R=$OUT/r; mkdir -p $R
finish() { tar czf $OUT/results_qk.tgz -C $OUT r; }
trap finish EXIT
stamp() { echo "== $1 $(date -u +%FT%TZ)" | tee -a $R/commands.log; }
nvidia-smi > $R/nvidia-smi.txt 2>&1
python3 -c "import torch, triton, transformers; print(torch.__version__, torch.version.cuda, triton.__version__, transformers.__version__, torch.cuda.get_device_name())" > $R/env.txt 2>&1
stamp "pytest tests/alignment/test_align_qk_chain.py tests/ops/test_qk_norm_rope_triton.py tests/ops/test_fused_gpu.py tests/alignment"
timeout -s INT 240 python3 -m pytest -q -p no:cacheprovider -ra --junitxml=$R/junit.xml tests/alignment/test_align_qk_chain.py \
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
