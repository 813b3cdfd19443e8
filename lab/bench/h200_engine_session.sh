#!/usr/bin/env bash
# Device calls of the engine session (calibration, engine twin, arithmetic order), one H200.
# vLLM's kernel library (stripped, xz'd: 63 MB) does not fit in one call with the tree, so it
# travels in two pieces: call1 carries .engine/a, call2 .engine/b on the still-warm machine.
# Everything lands in $OUT/results.tgz (the tool returns at most 8 files).
set -u
CALL=$1
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 RLA_ENGINE_CACHE=$PWD/.engine/mini
W=$PWD/.engine/mini/vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl
R=$OUT/r; mkdir -p $R
finish() { tar czf $OUT/results.tgz -C $OUT r && rm -rf $R; }
trap finish EXIT
stamp() { echo "== $1 $(date -u +%FT%TZ)" | tee -a $R/commands.log; }
if [ "$CALL" = call5 ]; then  # after the reference-ops fix of the q/k chain
  L=/tmp/vllm_C.so.xz
  cat /tmp/vllm_a .engine/b > $L
  stamp "lab/bench/engine_twin_h200.py --stages twin --modes default eager --only qwen3-h2048 llama31-h2048 tiny-qwen2-trained"
  timeout 400 python3 lab/bench/engine_twin_h200.py --stages twin --modes default eager --only qwen3-h2048 llama31-h2048 tiny-qwen2-trained --wheel $W --library $L --out $R/call5 > $R/call5_twin.log 2>&1
elif [ "$CALL" = call4 ]; then  # device inv_freq for the default rope type on transformers 5.17
  L=/tmp/vllm_C.so.xz
  cat /tmp/vllm_a .engine/b > $L
  stamp "lab/bench/engine_twin_h200.py --stages tables twin --modes eager default --only qwen2-h1536 qwen3-h2048 tiny-qwen2-trained"
  timeout 400 python3 lab/bench/engine_twin_h200.py --stages tables twin --modes eager default --only qwen2-h1536 qwen3-h2048 tiny-qwen2-trained --wheel $W --library $L --out $R/call4 > $R/call4_twin.log 2>&1
elif [ "$CALL" = call3 ]; then  # after the engine-backed fused-add fix and the merges
  L=/tmp/vllm_C.so.xz
  cat /tmp/vllm_a .engine/b > $L && (cd /tmp && sha256sum vllm_C.so.xz) > $R/library_sha256.txt
  stamp "lab/bench/engine_twin_h200.py --stages twin --modes eager"
  timeout 200 python3 lab/bench/engine_twin_h200.py --stages twin --modes eager --wheel $W --library $L --out $R/eager > $R/call3_twin.log 2>&1
  stamp "pytest tests/ops/test_fused_gpu.py"
  timeout 130 python3 -m pytest -q -p no:cacheprovider -o addopts=-ra tests/ops/test_fused_gpu.py > $R/call3_fused_tests.log 2>&1
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl > /dev/null 2>&1
  mkdir -p /tmp/old && tar xzf .engine/old_src.tar.gz -C /tmp/old
  for side in new old new old; do
    src=$PWD/src; [ $side = old ] && src=/tmp/old/src
    stamp "rla bench e2e --variants hf-bf16 rla-vllm liger ($side code)"
    PYTHONPATH=$src:/tmp/site timeout 80 python3 -m rla.cli bench e2e --variants hf-bf16 rla-vllm liger --out $R/e2e_$side > $R/call3_e2e_$side.log 2>&1
    mv $R/e2e_$side $R/e2e_${side}_$(date +%s)
  done
elif [ "$CALL" = call1 ]; then
  nvidia-smi > $R/nvidia-smi.txt 2>&1
  python3 -c "import torch, triton, transformers; print(torch.__version__, torch.version.cuda, triton.__version__, transformers.__version__, torch.cuda.get_device_name())" > $R/env.txt 2>&1
  stamp "pytest tests/ops/test_fused_gpu.py"
  timeout 130 python3 -m pytest -q -p no:cacheprovider -o addopts=-ra tests/ops/test_fused_gpu.py > $R/call1_fused_tests.log 2>&1
  stamp "rla calibrate --engine vllm --mode default --device cuda --scale full"
  timeout 110 python3 -m rla.cli calibrate --engine vllm --mode default --device cuda --scale full --wheel $W --out $R/vllm-0.33-default.json > $R/call1_calibrate.log 2>&1
  stamp "lab/bench/inductor_norm_code.py"
  timeout 45 python3 lab/bench/inductor_norm_code.py --wheel $W > $R/inductor_norm_code.txt 2>&1
  stamp "lab/bench/engine_twin_h200.py --stages tables twin --modes default"
  timeout 250 python3 lab/bench/engine_twin_h200.py --stages tables twin --modes default --wheel $W --out $R/default > $R/call1_twin.log 2>&1
else
  L=/tmp/vllm_C.so.xz
  cat .engine/a .engine/b > $L && (cd /tmp && sha256sum vllm_C.so.xz) > $R/library_sha256.txt
  stamp "rla calibrate --engine vllm --mode eager --device cuda --scale full"
  timeout 110 python3 -m rla.cli calibrate --engine vllm --mode eager --device cuda --scale full --wheel $W --library $L --out $R/vllm-0.33-eager.json > $R/call2_calibrate.log 2>&1
  stamp "lab/bench/engine_twin_h200.py --stages order twin --modes eager"
  timeout 220 python3 lab/bench/engine_twin_h200.py --stages order twin --modes eager --wheel $W --library $L --out $R/eager > $R/call2_twin.log 2>&1
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl > /dev/null 2>&1
  mkdir -p /tmp/old && tar xzf .engine/old_src.tar.gz -C /tmp/old
  for side in new old; do
    src=$PWD/src; [ $side = old ] && src=/tmp/old/src
    stamp "rla bench e2e --variants hf-bf16 rla-vllm liger ($side code)"
    PYTHONPATH=$src:/tmp/site timeout 100 python3 -m rla.cli bench e2e --variants hf-bf16 rla-vllm liger --out $R/e2e_$side > $R/call2_e2e_$side.log 2>&1
  done
fi
stamp done
