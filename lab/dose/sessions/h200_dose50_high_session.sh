# Device calls of the 52M high-dose cell (issue #19; lab/dose/configs/experiment_dose_h200_50m_high.yaml).
#
#   bash lab/dose/sessions/h200_dose50_high_session.sh call1 [0,1]   # warm start + probe + pick + the runs until 560 s
#   bash lab/dose/sessions/h200_dose50_high_session.sh call2 [0,1] T # the still-warm machine: resume the runs, limit T s
#
# Call 1 makes the SFT warm start and measures every arm's step-0 k3 (3 seeds) in /tmp/d50h, picks per
# target k3 (1e-3 .. 1e-1) the nearest dose arm into /tmp/d50h/picked_grid.yaml, and runs its 21 runs
# (bf16, aligned, 5 doses x 3 seeds) with what is left of a 560 s budget. Runs stopped by the time limit
# checkpoint in /tmp/d50h (kept while the machine is warm) and resume in call 2. The second argument
# spreads the runs over GPUs (0,1 on nvidia-h200-x2). What comes back ($OUT): commands.log, env.txt,
# CALL_gpu_util.csv, CALL_experiment.log, probe.log (call 1) and CALL_d50h.tgz (the folder without
# checkpoints and weights).
set -u
CALL=$1 GPUS=${2:-} T=${3:-}
START=$(date +%s)
export PYTHONPATH=$PWD/src:$PWD PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
G=lab/dose/configs/experiment_dose_h200_50m_high.yaml D=/tmp/d50h
GA=${GPUS:+--gpus $GPUS}
nvidia-smi > $OUT/nvidia-smi.txt 2>&1
python3 -c "import sys,torch,triton,transformers;print('python',sys.version.split()[0],'torch',torch.__version__,'cuda',torch.version.cuda,'triton',triton.__version__,'transformers',transformers.__version__,'gpus',torch.cuda.device_count(),torch.cuda.get_device_name())" > $OUT/env.txt 2>&1
echo "cores $(nproc)" >> $OUT/env.txt
(nvidia-smi --query-gpu=timestamp,index,utilization.gpu,memory.used --format=csv -l 15 > $OUT/${CALL}_gpu_util.csv 2>&1 &)
if [ "$CALL" = call1 ]; then
  echo "== call1 lab.dose.experiment $G --out $D --probe --pick-doses 1e-3,3e-3,1e-2,3e-2,1e-1 $GA $(date -u +%FT%TZ)" >> $OUT/commands.log
  timeout 300 python3 -m lab.dose.experiment $G --out $D --probe --pick-doses 1e-3,3e-3,1e-2,3e-2,1e-1 $GA > $OUT/probe.log 2>&1
  echo "== probe exit $? after $(( $(date +%s) - START )) s" >> $OUT/commands.log
  cp $D/probe.md $D/probe.json $D/picked_grid.yaml $OUT/ 2>/dev/null
  T=$(( 560 - ($(date +%s) - START) ))
fi
[ -f $D/picked_grid.yaml ] || { echo "no picked grid" >> $OUT/commands.log; exit 1; }
echo "== $CALL lab.dose.experiment $D/picked_grid.yaml --out $D --parallel 21 $GA --time-limit $T --grace 20 $(date -u +%FT%TZ)" >> $OUT/commands.log
timeout $((T + 60)) python3 -m lab.dose.experiment $D/picked_grid.yaml --out $D --parallel 21 $GA --time-limit $T --grace 20 \
    > $OUT/${CALL}_experiment.log 2>&1
echo "== $CALL exit $? $(date -u +%FT%TZ)" >> $OUT/commands.log
tar czf $OUT/${CALL}_d50h.tgz -C $D --exclude=checkpoints --exclude='*.safetensors' --exclude='*.pt' .
ls -la $OUT
