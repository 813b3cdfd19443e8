#!/usr/bin/env bash
# Device session of 2026-11-30 (evening) for issue #20's engine-backed default mode
# (rla.engines.vllm_forward): the twin stage in vLLM's default mode with the new side `vllm-pieces`,
# then one training step per variant beside HF eager, rla's kernels and Liger. Carries .engine/mini
# (vLLM's Python files as a 108 KB wheel: no kernel library is needed in default mode) and .whl
# (liger-kernel). Everything lands in $OUT/results.tgz.
#   run: bash lab/bench/h200_engine_forward_session.sh twin|e2e
set -u
CALL=$1
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 RLA_ENGINE_CACHE=$PWD/.engine/mini
W=$PWD/.engine/mini/vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl
R=$OUT/r; mkdir -p $R
finish() { tar czf $OUT/results_$CALL.tgz -C $OUT r && rm -rf $R; }
trap finish EXIT
stamp() { echo "== $1 $(date -u +%FT%TZ)" | tee -a $R/commands.log; }
nvidia-smi > $R/nvidia-smi.txt 2>&1
python3 -c "import torch, triton, transformers; print(torch.__version__, torch.version.cuda, triton.__version__, transformers.__version__, torch.cuda.get_device_name())" > $R/env.txt 2>&1
if [ "$CALL" = twin ]; then
  stamp "lab/bench/engine_twin_h200.py --stages twin --modes default --only qwen2-h1536 qwen3-h2048 llama31-h2048"
  timeout 250 python3 lab/bench/engine_twin_h200.py --stages twin --modes default --only qwen2-h1536 qwen3-h2048 llama31-h2048 --wheel $W --out $R/default > $R/twin_default.log 2>&1
elif [ "$CALL" = e2e ]; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl > /dev/null 2>&1
  export RLA_ENGINE_WHEEL=$W
  stamp "rla bench e2e --variants hf-bf16 rla-vllm liger rla-vllm-pieces"
  PYTHONPATH=$PWD/src:/tmp/site timeout 230 python3 -m rla.cli bench e2e --variants hf-bf16 rla-vllm liger rla-vllm-pieces --out $R/e2e > $R/e2e.log 2>&1
fi
