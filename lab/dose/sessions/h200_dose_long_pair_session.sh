# Device calls of the two long-response dose cells (issue #19) on nvidia-h200-x2, both at once:
#   4M  lab/dose/configs/experiment_dose_h200_long_high.yaml      -> /tmp/dlong4
#   52M lab/dose/configs/experiment_dose_h200_50m_long_high.yaml  -> /tmp/dlong52
#
#   bash lab/dose/sessions/h200_dose_long_pair_session.sh probe        # warm starts + probes + picks; then the
#                                                                # run-group throughput check on GPU 0
#   bash lab/dose/sessions/h200_dose_long_pair_session.sh run K T      # both picked grids, K runs per process,
#                                                                # time limit T s (again to resume, warm machine)
# probe: the GPU test of rla.rl.run_group (tests/rl/test_run_group.py -k gpu); each cell's SFT warm start, step-0 probe of every arm (3 seeds) and pick of five doses, the 4M
# cell on GPU 0 and the 52M cell on GPU 1 side by side. Then, on GPU 0, the 4M picked grid's seed-0
# runs (7 runs, 3 steps) twice: as 7 processes, and as one process of 7 threads
# (--runs-per-process 7), each timed.
# run: both picked grids over both GPUs; runs stopped by the time limit checkpoint in /tmp (kept while
# the machine is warm) and resume in the next call.
# What comes back ($OUT): commands.log, env.txt, CALL_gpu_util.csv, CALL_logs.tgz (every command's
# output), CALL_d4.tgz and CALL_d52.tgz (the folders without checkpoints and weights), init4.tgz (the 4M
# warm start's weights, ~16 MB; the 52M one, 200 MB, stays on the machine).
set -u
CALL=$1 K=${2:-1} T=${3:-}
START=$(date +%s)
export PYTHONPATH=$PWD/src:$PWD PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
G4=lab/dose/configs/experiment_dose_h200_long_high.yaml D4=/tmp/dlong4
G52=lab/dose/configs/experiment_dose_h200_50m_long_high.yaml D52=/tmp/dlong52
PICK=1e-3,3e-3,1e-2,3e-2,1e-1
L=/tmp/session_logs/$CALL; mkdir -p $L
log() { echo "== $* ($(( $(date +%s) - START )) s, $(date -u +%FT%TZ))" >> $OUT/commands.log; }
python3 -c "import sys,torch,triton,transformers;print('python',sys.version.split()[0],'torch',torch.__version__,'cuda',torch.version.cuda,'triton',triton.__version__,'transformers',transformers.__version__,'gpus',torch.cuda.device_count(),torch.cuda.get_device_name())" > $OUT/env.txt 2>&1
echo "cores $(nproc)" >> $OUT/env.txt
(nvidia-smi --query-gpu=timestamp,index,utilization.gpu,memory.used --format=csv -l 10 > $OUT/${CALL}_gpu_util.csv 2>&1 &)
if [ "$CALL" = probe ]; then
  log "probe 4M: CUDA_VISIBLE_DEVICES=0 lab.dose.experiment $G4 --out $D4 --probe --pick-doses $PICK"
  (CUDA_VISIBLE_DEVICES=0 timeout 420 python3 -m lab.dose.experiment $G4 --out $D4 --probe --pick-doses $PICK \
      > $L/probe4.log 2>&1; log "probe 4M exit $?") &
  P4=$!
  log "probe 52M: CUDA_VISIBLE_DEVICES=1 lab.dose.experiment $G52 --out $D52 --probe --pick-doses $PICK"
  (CUDA_VISIBLE_DEVICES=1 timeout 540 python3 -m lab.dose.experiment $G52 --out $D52 --probe --pick-doses $PICK \
      > $L/probe52.log 2>&1; log "probe 52M exit $?") &
  P52=$!
  log "gpu test: CUDA_VISIBLE_DEVICES=0 python3 -m pytest -q tests/rl/test_run_group.py -k gpu"
  CUDA_VISIBLE_DEVICES=0 timeout 200 python3 -m pytest -q -p no:cacheprovider tests/rl/test_run_group.py -k gpu \
      > $L/gpu_test.log 2>&1
  log "gpu test exit $?"
  wait $P4
  if [ -f $D4/picked_grid.yaml ] && [ $(( $(date +%s) - START )) -lt 420 ]; then
    B=/tmp/rg_bench; rm -rf $B; mkdir -p $B/proc/init $B/group/init
    python3 - "$D4/picked_grid.yaml" "$B/grid.yaml" <<'EOF'
import sys, yaml
g = yaml.safe_load(open(sys.argv[1]))
g.setdefault("overrides", {}).update(steps=3, checkpoint_every=1000)
for m in g["models"].values():
    m["steps"] = 3
yaml.safe_dump(g, open(sys.argv[2], "w"), sort_keys=False)
EOF
    ln -s $D4/init/qwen2-tiny-long $B/proc/init/qwen2-tiny-long
    ln -s $D4/init/qwen2-tiny-long $B/group/init/qwen2-tiny-long
    log "bench processes: CUDA_VISIBLE_DEVICES=0 lab.dose.experiment $B/grid.yaml --out $B/proc --only __s0 --parallel 7"
    CUDA_VISIBLE_DEVICES=0 timeout 150 python3 -m lab.dose.experiment $B/grid.yaml --out $B/proc --only __s0 --parallel 7 \
        > $L/bench_proc.log 2>&1
    log "bench processes exit $?"
    log "bench group: CUDA_VISIBLE_DEVICES=0 lab.dose.experiment $B/grid.yaml --out $B/group --only __s0 --parallel 1 --runs-per-process 7"
    CUDA_VISIBLE_DEVICES=0 timeout 150 python3 -m lab.dose.experiment $B/grid.yaml --out $B/group --only __s0 --parallel 1 \
        --runs-per-process 7 > $L/bench_group.log 2>&1
    log "bench group exit $?"
    tar czf $L/rg_bench.tgz -C $B --exclude=checkpoints --exclude='*.safetensors' --exclude=init .
  fi
  wait $P52
  tar czf $OUT/init4.tgz -C $D4 init && log "init4.tgz sha256 $(sha256sum $OUT/init4.tgz | cut -d' ' -f1)"
else
  for D in $D4 $D52; do
    [ -f $D/picked_grid.yaml ] || { log "no $D/picked_grid.yaml"; }
  done
  log "$CALL 4M: lab.dose.experiment $D4/picked_grid.yaml --out $D4 --gpus 0,1 --parallel 21 --runs-per-process $K --time-limit $T --grace 30"
  (timeout $((T + 90)) python3 -m lab.dose.experiment $D4/picked_grid.yaml --out $D4 --gpus 0,1 --parallel 21 \
      --runs-per-process $K --time-limit $T --grace 30 > $L/run4.log 2>&1; log "$CALL 4M exit $?") &
  P4=$!
  log "$CALL 52M: lab.dose.experiment $D52/picked_grid.yaml --out $D52 --gpus 0,1 --parallel 21 --runs-per-process $K --time-limit $T --grace 30"
  (timeout $((T + 90)) python3 -m lab.dose.experiment $D52/picked_grid.yaml --out $D52 --gpus 0,1 --parallel 21 \
      --runs-per-process $K --time-limit $T --grace 30 > $L/run52.log 2>&1; log "$CALL 52M exit $?") &
  P52=$!
  wait $P4 $P52
fi
tar czf $OUT/${CALL}_d4.tgz -C $D4 --exclude=checkpoints --exclude='*.safetensors' --exclude='*.pt' .
tar czf $OUT/${CALL}_d52.tgz -C $D52 --exclude=checkpoints --exclude='*.safetensors' --exclude='*.pt' .
tar czf $OUT/${CALL}_logs.tgz -C $L .
log "$CALL done"
ls -la $OUT
