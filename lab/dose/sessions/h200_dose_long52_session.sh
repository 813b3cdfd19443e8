# Device calls of the 52M long-response dose cell (issue #19) on one H200, warm machine between calls:
#   bash lab/dose/sessions/h200_dose_long52_session.sh first LIMIT    # GPU rollout tests, the decode-attention bench,
#                                                              # then the grid (warm start + runs) until LIMIT s
#   bash lab/dose/sessions/h200_dose_long52_session.sh resume LIMIT   # the grid again: runs resume from /tmp checkpoints
# Grid: results/experiments/dose_response_long52_h200_2026-12-01/grid.yaml -> /tmp/dl52, 21 processes on GPU 0.
# The grid only starts if the grouped decode attention's GPU tests pass (first call).
# What comes back ($OUT): commands.log, env.txt, CALL_gpu_util.csv, tests.log (first), h200_decode_attention.json
# (first), CALL_experiment.log, CALL_d52.tgz (the experiment folder without checkpoints and weights).
set -u
CALL=$1 LIMIT=$2 START=$(date +%s)
G=results/experiments/dose_response_long52_h200_2026-12-01/grid.yaml  # (ran as results/experiments/dose_response_long_h200_2026-12-01/grid_52m_40steps.yaml, the same file) D=/tmp/dl52
export PYTHONPATH=$PWD/src:$PWD PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
log() { echo "== $* ($(( $(date +%s) - START )) s, $(date -u +%FT%TZ))" >> $OUT/commands.log; }
python3 -c "import sys,torch,triton,transformers;print('python',sys.version.split()[0],'torch',torch.__version__,'cuda',torch.version.cuda,'triton',triton.__version__,'transformers',transformers.__version__,'gpus',torch.cuda.device_count(),torch.cuda.get_device_name())" > $OUT/env.txt 2>&1
echo "cores $(nproc)" >> $OUT/env.txt
(nvidia-smi --query-gpu=timestamp,index,utilization.gpu,memory.used --format=csv -l 10 > $OUT/${CALL}_gpu_util.csv 2>&1 &)
if [ "$CALL" = first ]; then
  log "tests: python3 -m pytest -q tests/rollout"
  timeout 150 python3 -m pytest -q -p no:cacheprovider tests/rollout > $OUT/tests.log 2>&1
  log "tests exit $?"
  log "gate: python3 -m pytest -q tests/rollout/test_decode_attention.py"
  timeout 60 python3 -m pytest -q -p no:cacheprovider tests/rollout/test_decode_attention.py >> $OUT/tests.log 2>&1
  GATE=$?
  log "gate exit $GATE"
  log "bench: python3 lab/bench/h200_decode_attention.py --out \$OUT --reps 2"
  timeout 150 python3 lab/bench/h200_decode_attention.py --out $OUT --reps 2 > /tmp/bench.log 2>&1
  log "bench exit $?"
  cat /tmp/bench.log >> $OUT/tests.log
  [ $GATE = 0 ] || { log "gate failed: no grid"; exit 0; }
fi
T=$(( LIMIT - ($(date +%s) - START) - 40 ))
log "$CALL: lab.dose.experiment $G --out $D --gpus 0 --parallel 21 --time-limit $T --grace 30"
timeout $((T + 60)) python3 -m lab.dose.experiment $G --out $D --gpus 0 --parallel 21 --time-limit $T --grace 30 \
    > $OUT/${CALL}_experiment.log 2>&1
log "$CALL exit $?"
tar czf $OUT/${CALL}_d52.tgz -C $D --exclude=checkpoints --exclude='*.safetensors' --exclude='*.pt' .
ls -la $OUT
