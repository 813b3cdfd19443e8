#!/usr/bin/env bash
# One device call on 2 GPUs of one host (kind nvidia-h200-x2, NCCL), run from the repo root, OUT set:
#     bash lab/bench/fsdp2_x2.sh
# Stages, in order (STAGES picks; default all three):
#   env    GPUs, NVLink topology, driver, python / torch / NCCL / transformers / triton versions
#   check  lab/bench/fsdp2_check.py under torchrun, 2 ranks, Qwen2.5-1.5B shapes: the aligned (vllm)
#          model sharded by FSDP2 vs the unsharded aligned bf16 model on rank 0 (rope / swiglu outputs,
#          cos/sin dtype, logits, loss), baseline vs aligned tokens/s and peak memory per GPU, and
#          what the default cast_forward_inputs=True does
#   train  torchrun -m rla.cli train configs/grpo_fsdp2_1p5b.yaml fsdp=true: GRPO with the aligned
#          training side under FSDP2 at the 1.5b size, a few steps under a time limit
# Every stage's timeout is cut to what is left of DEADLINE seconds (the call's limit less the tar);
# everything lands in $OUT/r and comes back as $OUT/results.tgz. r/commands.txt holds the exact
# commands as run. To commit: r/check/fsdp2_check.{json,md}, r/train/{log.jsonl,summary.json,
# config.yaml} and r/commands.txt under results/benchmarks/ with a date/GPU stem.
# CPU dry run of this script (gloo, micro shapes):
#     DEVICE=cpu SHAPE=micro TRAIN_OVERRIDES="size=micro device=cpu" OUT=/tmp/o bash lab/bench/fsdp2_x2.sh
set -o pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
# NVLink multicast stays off on these machines (it can take the host's shared GPUs out of service)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-8}  # torchrun would set 1; the trainer builds its model on CPU
OUT=${OUT:-/tmp/rla-out}; mkdir -p "$OUT/r"
STAGES=${STAGES:-env check train}
DEVICE=${DEVICE:-cuda}; SHAPE=${SHAPE:-1.5b}; TRAIN_OVERRIDES=${TRAIN_OVERRIDES:-}
TRAIN_DIR=${TRAIN_DIR:-/tmp/grpo_fsdp2}   # checkpoints (~16 GB at 1.5b) stay on the machine
t0=$(date +%s); stamp() { echo "=== $1 at +$(( $(date +%s) - t0 ))s"; }
has() { [[ " $STAGES " == *" $1 "* ]]; }
# every stage's timeout is cut to what is left of DEADLINE seconds (9 minutes less the tar)
DEADLINE=${DEADLINE:-530}
cap() { local left=$(( DEADLINE - ($(date +%s) - t0) - 5 )); (( left < $1 )) && echo $(( left > 1 ? left : 1 )) || echo $1; }
TORCHRUN="python3 -m torch.distributed.run --standalone --nproc_per_node 2"
# run NAME LIMIT CMD...: the command goes to commands.txt, its output to r/NAME.log
run() {
  local name=$1 limit=$2; shift 2
  echo "$*" >> "$OUT/r/commands.txt"
  timeout -k 20 "$limit" "$@" > "$OUT/r/$name.log" 2>&1; local rc=$?
  echo "$name rc=$rc (limit ${limit}s, +$(( $(date +%s) - t0 ))s)"; return $rc
}
rev=$(git rev-parse --short HEAD 2>/dev/null) && { git diff --quiet HEAD 2>/dev/null || rev="$rev+changes"; } || rev="no git"
echo "# $(date -u +%FT%TZ), repo root, commit $rev; env NCCL_NVLS_ENABLE=$NCCL_NVLS_ENABLE TORCH_SYMM_MEM_DISABLE_MULTICAST=$TORCH_SYMM_MEM_DISABLE_MULTICAST NVSHMEM_DISABLE_NVLS=$NVSHMEM_DISABLE_NVLS OMP_NUM_THREADS=$OMP_NUM_THREADS PYTHONPATH=src" > "$OUT/r/commands.txt"

if has env; then
  stamp env
  { nvidia-smi --query-gpu=index,name,driver_version,memory.total,clocks.max.sm --format=csv,noheader
    nvidia-smi topo -m
    python3 -c "import sys, torch, transformers; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, 'nccl', torch.cuda.nccl.version() if torch.cuda.is_available() else None, 'transformers', transformers.__version__, 'gpus', torch.cuda.device_count())"
    python3 -c "import triton; print('triton', triton.__version__)"
    nproc; free -g | head -2; df -h /tmp | tail -1
  } > "$OUT/r/env.txt" 2>&1
  cat "$OUT/r/env.txt"
fi

if has check; then
  stamp check
  run check $(cap 240) $TORCHRUN lab/bench/fsdp2_check.py --out "$OUT/r/check" --shape "$SHAPE" --device "$DEVICE"
  rc=$?
  if [[ -f "$OUT/r/check/fsdp2_check.md" ]]; then
    sed -n '/^## Checks/,$p' "$OUT/r/check/fsdp2_check.md" | grep -v '^$' | cut -c1-400
  fi
  (( rc == 0 )) || tail -25 "$OUT/r/check.log" | cut -c1-300
fi

if has train; then
  stamp train
  T=$(cap 270)
  # stop stepping early enough for the final checkpoint (the last step is always checkpointed);
  # setup (model built on CPU, the sampler's copy, NCCL) and that checkpoint take the rest
  LIMIT=$(( T > 200 ? T - 170 : 30 ))
  rm -rf "$TRAIN_DIR"
  run train $T $TORCHRUN -m rla.cli train configs/grpo_fsdp2_1p5b.yaml fsdp=true out_dir="$TRAIN_DIR" \
      time_limit_s=$LIMIT $TRAIN_OVERRIDES
  rc=$?
  mkdir -p "$OUT/r/train"
  cp "$TRAIN_DIR"/config.yaml "$TRAIN_DIR"/log.jsonl "$TRAIN_DIR"/summary.json "$OUT/r/train/" 2>/dev/null
  ls "$TRAIN_DIR"/checkpoints 2>/dev/null | sed 's/^/checkpoint: /'
  python3 - "$OUT/r/train/log.jsonl" <<'EOF' || true
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
for r in rows:
    print(f"step {r['step']}: reward {r['reward/mean']:.3f} k3 {r.get('mismatch/k3', float('nan')):.3g} "
          f"ratio [{r['train/ratio/min']:.4f}, {r['train/ratio/max']:.4f}] seqs {r.get('mismatch/n_seqs')} "
          f"rollout {r['time/rollout_s']:.1f}s train {r['time/train_s']:.1f}s sync {r['time/sync_s']:.1f}s "
          f"peak {r['memory/peak_mb'] / 1024:.1f} GiB")
print(len(rows), "steps logged")
EOF
  (( rc == 0 )) || tail -25 "$OUT/r/train.log" | cut -c1-300
  tail -3 "$OUT/r/train.log" | cut -c1-300
fi

stamp done
(cd "$OUT" && tar czf results.tgz r) && rm -rf "$OUT/r"; ls -la "$OUT"
