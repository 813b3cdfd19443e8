#!/usr/bin/env bash
# One device call on one H200 for issue #35's two GPU items, from the repo root, OUT set:
#     bash lab/bench/trl_verl_gpu_session.sh
# carrying .carry/trl and .carry/verl (lab/bench/trl_verl_carry.sh makes them, ~4.4 MB), on the warm
# machine where lab/bench/vllm026_device.sh part a, part b, assemble and deps have run (vLLM 0.26.0's
# tree in /tmp/site, its wheels in /tmp/deps). Stages (STAGES picks; default all three, in order):
#   env   GPU, driver, python / torch / transformers / pyarrow versions
#   trl   lab/bench/trl_vllm_colocate.py: TRL 1.16 GRPOTrainer(use_vllm=True, vllm_mode="colocate") with
#         the real vLLM 0.26 in this process (TRITON_ATTN, VLLM_ENABLE_V1_MULTIPROCESSING=0), attach,
#         3 GRPO steps on the bundled tiny Qwen2: r/trl/trl_vllm_colocate.json (per-step metrics, KL,
#         mismatch/*, checks) and r/trl/log.txt
#   verl  tests/integrations/test_integration_verl_fsdp_gpu.py on one GPU: verl 0.9.1's own
#         FSDPEngine.initialize() under torchrun with NCCL, strategy fsdp (FSDP1, verl's default) and
#         fsdp2, tied and untied head, actor (logits + every gradient) and reference (logits), each
#         bit for bit against the unsharded aligned model: r/verl/cases/<case>/rank0.json,
#         r/verl/junit.xml, r/verl/pytest.txt. verl is installed --no-deps beside the image's
#         transformers 5.17 (outside verl's pin <5.11; the CPU tests pass at 5.17), without TRL on
#         the path (verl's monkey_patch imports TRL's value-head class when TRL is importable; TRL 1.16
#         has none) and without Ray (lab/bench/verl_without_ray)
# Every stage's timeout is cut to what is left of DEADLINE seconds; everything lands in $OUT/r and comes
# back as $OUT/results.tgz, r/commands.txt holding the exact commands as run.
set -o pipefail
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
# NVLink multicast stays off on these machines
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/rla-out}; R=$OUT/r; mkdir -p "$R"
STAGES=${STAGES:-env trl verl}
DEADLINE=${DEADLINE:-480}
t0=$(date +%s); left() { echo $(( DEADLINE - ($(date +%s) - t0) )); }
stamp() { echo "=== $1 at +$(( $(date +%s) - t0 ))s"; }
has() { [[ " $STAGES " == *" $1 "* ]]; }
run() { echo "$*" >> "$R/commands.txt"; "$@"; }
PY=${PY:-python3}
TRL_DEPS=/tmp/rla_trl; VERL_DEPS=/tmp/rla_verl

if has env; then
  stamp env
  { nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
    $PY -c "import sys, torch, transformers, pyarrow; print(sys.version.split()[0], torch.__version__, torch.version.cuda, transformers.__version__, 'pyarrow', pyarrow.__version__)"
    $PY -m pip list 2>/dev/null | grep -i -E "^(accelerate|huggingface.hub|peft|fsspec|xxhash) "
  } > "$R/env.txt" 2>&1
  cat "$R/env.txt"
fi

if has trl; then
  stamp trl
  mkdir -p "$R/trl"
  if [ ! -f /tmp/site/vllm/_C_stable_libtorch.abi3.so ] || [ ! -d /tmp/deps ]; then
    echo "trl: vLLM 0.26 is not assembled on this machine; run lab/bench/vllm026_device.sh part a, part b, assemble, deps first" | tee "$R/trl/log.txt"
  else
    run $PY -m pip install -q --no-index --no-deps --no-compile --target $TRL_DEPS .carry/trl/*.whl 2>&1 | tail -2
    ( export PYTHONPATH=/tmp/site:/tmp/deps:$TRL_DEPS:$PWD/src:$PWD/tests:$PWD VLLM_LOGGING_LEVEL=INFO \
             VLLM_ENABLE_V1_MULTIPROCESSING=0 VLLM_USE_FLASHINFER_SAMPLER=0
      T=$(( $(left) - 150 )); [ $T -gt 300 ] && T=300
      echo "PYTHONPATH=$PYTHONPATH timeout $T $PY lab/bench/trl_vllm_colocate.py $R/trl --steps 3" >> "$R/commands.txt"
      timeout $T $PY lab/bench/trl_vllm_colocate.py "$R/trl" --steps 3 > "$R/trl/log.txt" 2>&1
      echo "trl rc=$?" | tee -a "$R/trl/log.txt" )
    grep -E "^rla.integrations.trl|^policy:|^reference:|^metrics:|^\{\"step|^\{\"steps" "$R/trl/log.txt" | cut -c1-400
    tail -n 25 "$R/trl/log.txt" | grep -E "Error|error|rc=" | cut -c1-400
  fi
fi

if has verl; then
  stamp verl
  mkdir -p "$R/verl/cases"
  run $PY -m pip install -q --no-index --no-deps --no-compile --target $VERL_DEPS .carry/verl/*.whl \
    .carry/trl/datasets-*.whl .carry/trl/dill-*.whl .carry/trl/multiprocess-*.whl 2>&1 | tail -2
  ( export PYTHONPATH=$VERL_DEPS:$PWD/lab/bench/verl_without_ray:$PWD/src:$PWD/tests:$PWD \
           RLA_VERL_FSDP_OUT=$R/verl/cases RLA_ENGINE_VERSION=0.26.0
    T=$(( $(left) - 15 ))
    echo "PYTHONPATH=$PYTHONPATH RLA_VERL_FSDP_OUT=$RLA_VERL_FSDP_OUT RLA_ENGINE_VERSION=0.26.0 timeout $T $PY -m pytest -q -p no:cacheprovider -o addopts=-ra -rA tests/integrations/test_integration_verl_fsdp_gpu.py --junitxml $R/verl/junit.xml" >> "$R/commands.txt"
    timeout $T $PY -m pytest -q -p no:cacheprovider -o addopts=-ra -rA tests/integrations/test_integration_verl_fsdp_gpu.py \
      --junitxml "$R/verl/junit.xml" > "$R/verl/pytest.txt" 2>&1
    echo "verl rc=$?" | tee -a "$R/verl/pytest.txt" )
  grep -E "^(PASSED|FAILED|SKIPPED|ERROR)|passed|failed" "$R/verl/pytest.txt" | cut -c1-300 | tail -n 20
fi

stamp done
tar -czf "$OUT/results.tgz" -C "$OUT" r && ls -la "$OUT/results.tgz"
