#!/usr/bin/env bash
# Device calls of the reduction-order session (norm_reduction='vllm_block', the fp32_carry add
# kernel, the fp32 q/k-norm kernel), one H200. vLLM's kernel library (stripped, xz'd: 63 MB)
# travels in two pieces: callA carries .engine/a (and runs the GPU tests meanwhile), callB
# .engine/b on the still-warm machine; callC reuses the library left in /tmp. callD/callE need no
# kernel library: the fp32 q/k chain's GPU tests and default-mode twin rows; the dose grid.
# Everything lands in $OUT/results.tgz (the tool returns at most 8 files).
set -u
CALL=$1
export PYTHONPATH=$PWD/src:$PWD PYTHONUNBUFFERED=1 RLA_ENGINE_CACHE=$PWD/.engine/mini
W=$PWD/.engine/mini/vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl
L=/tmp/vllm_C.so.xz
R=$OUT/r; mkdir -p $R
finish() { tar czf $OUT/results.tgz -C $OUT r && rm -rf $R; }
trap finish EXIT
stamp() { echo "== $1 $(date -u +%FT%TZ)" | tee -a $R/commands.log; }
if [ "$CALL" = callA ]; then
  cp .engine/a /tmp/vllm_a
  nvidia-smi > $R/nvidia-smi.txt 2>&1
  python3 -c "import torch, triton, transformers; print(torch.__version__, torch.version.cuda, triton.__version__, transformers.__version__, torch.cuda.get_device_name())" > $R/env.txt 2>&1
  stamp "pytest tests/test_fused_gpu.py tests/test_reduction.py tests/test_ops.py"
  timeout 400 python3 -m pytest -q -p no:cacheprovider -o addopts=-ra tests/test_fused_gpu.py tests/test_reduction.py tests/test_ops.py > $R/callA_gpu_tests.log 2>&1
elif [ "$CALL" = callB ]; then
  cat /tmp/vllm_a .engine/b > $L && (cd /tmp && sha256sum vllm_C.so.xz) > $R/library_sha256.txt
  stamp "rla calibrate --engine vllm --mode eager --device cuda --scale full"
  timeout 120 python3 -m rla.cli calibrate --engine vllm --mode eager --device cuda --scale full --wheel $W --library $L --out $R/vllm-0.33-eager.json > $R/callB_calibrate.log 2>&1
  stamp "lab/bench/engine_twin_h200.py --stages order twin --modes eager"
  timeout 400 python3 lab/bench/engine_twin_h200.py --stages order twin --modes eager --wheel $W --library $L --out $R/eager > $R/callB_twin.log 2>&1
elif [ "$CALL" = callC ]; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl > /dev/null 2>&1
  mkdir -p /tmp/old && tar xzf .engine/old_src.tar.gz -C /tmp/old
  export RLA_ENGINE_WHEEL=$W RLA_ENGINE_LIBRARY=$L
  for side in new old new; do
    src=$PWD/src; [ $side = old ] && src=/tmp/old/src
    variants="hf-bf16 rla-vllm rla-vllm-eager liger rla-vllm-eager-kernels"; [ $side = old ] && variants="hf-bf16 rla-vllm"
    stamp "rla bench e2e --variants $variants ($side code)"
    PYTHONPATH=$src:/tmp/site timeout 150 python3 -m rla.cli bench e2e --variants $variants --out $R/e2e_$side > $R/callC_e2e_$side.log 2>&1
    mv $R/e2e_$side $R/e2e_${side}_$(date +%s)
  done
elif [ "$CALL" = callD ]; then  # the fp32 q/k chain through the kernels; default-mode twin rows with it
  nvidia-smi > $R/nvidia-smi.txt 2>&1
  stamp "pytest tests/test_fused_gpu.py"
  timeout 200 python3 -m pytest -q -p no:cacheprovider -o addopts=-ra tests/test_fused_gpu.py > $R/callD_gpu_tests.log 2>&1
  stamp "lab/bench/engine_twin_h200.py --stages twin --modes default --only qwen3-h2048 qwen2-h1536"
  timeout 300 python3 lab/bench/engine_twin_h200.py --stages twin --modes default --only qwen3-h2048 qwen2-h1536 --wheel $W --out $R/default > $R/callD_twin.log 2>&1
elif [ "$CALL" = callE ]; then  # the dose-response small grid (issue #19), 21 runs at once
  stamp "python -m lab.dose.experiment lab/dose/configs/experiment_dose_h200_small.yaml --out /tmp/dose --parallel 21 --time-limit 480 --grace 15"
  timeout 570 python3 -m lab.dose.experiment lab/dose/configs/experiment_dose_h200_small.yaml --out /tmp/dose --parallel 21 --time-limit 480 --grace 15 > $R/callE_experiment.log 2>&1
  tar czf $R/dose_runs.tgz -C /tmp/dose --exclude='*.pt' --exclude='*.safetensors' --exclude='checkpoints' --exclude='ckpt*' .
elif [ "$CALL" = callF ]; then  # the long-response cell of the tiny model, seed 0 only (what the budget left holds)
  stamp "python -m lab.dose.experiment lab/dose/configs/experiment_dose_h200.yaml --only qwen2-tiny-long__,__s0 --out /tmp/dose_long --parallel 7 --time-limit 330 --grace 15"
  timeout 450 python3 -m lab.dose.experiment lab/dose/configs/experiment_dose_h200.yaml --only qwen2-tiny-long__,__s0 --out /tmp/dose_long --parallel 7 --time-limit 330 --grace 15 > $R/callF_experiment.log 2>&1
  tar czf $R/dose_long_runs.tgz -C /tmp/dose_long --exclude='*.pt' --exclude='*.safetensors' --exclude='checkpoints' --exclude='ckpt*' --exclude='model.safetensors' .
fi
