# Device calls of the dose-response grid's qwen2-50m cell (issue #19).
#
#   bash lab/dose/sessions/h200_dose50_session.sh call1 500 [0,1]   # warm start + the 21 runs, time limit 500 s
#   bash lab/dose/sessions/h200_dose50_session.sh call2 T [0,1]     # the same command on the still-warm machine:
#                                                            # resumes the unfinished runs from /tmp/dose50
# As run on 2026-11-30: `call1 500`, then `call2 440`, both on one H200 (no GPU list).
# The third argument spreads the runs over GPUs (--gpus 0,1 on `nvidia-h200-x2`); without it every
# run sees the one GPU (`nvidia-h200`: the x2 kind was not lent when these calls were made).
#
# The device runs the lead's checkout, not this branch, so each call passed this file's body inline
# as the tool's command (with CALL and T filled in); this file records it. --only qwen2-50m__ selects
# the cell's 21 runs (the trailing __ excludes qwen2-50m-long); all share one SFT warm start
# (/tmp/dose50/init/qwen2-50m, made in call 1). The scheduler gives each of the 21 runs
# OMP_NUM_THREADS = cores // 21 and the warm start all cores (rla.rl.scheduler), so OMP_NUM_THREADS is
# left unset here. Runs stopped by the time limit checkpoint (weights + AdamW state in /tmp/dose50,
# which stays on a warm machine) and resume in call 2. What comes back ($OUT, at most 8 files):
# commands.log, nvidia-smi.txt, env.txt, CALL_gpu_util.csv, CALL_experiment.log and CALL_dose50.tgz
# (the experiment folder without checkpoints and weights).
set -u
CALL=$1 T=$2 GPUS=${3:+--gpus $3}
export PYTHONPATH=$PWD/src:$PWD PYTHONUNBUFFERED=1
NOTE=
if [ "$CALL" = call2 ]; then  # added after 9 runs of call 1 died out of GPU memory (21 processes on one H200)
  export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
  NOTE="(PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True) "
fi
echo "== $CALL lab.dose.experiment lab/dose/configs/experiment_dose_h200.yaml --only qwen2-50m__ --out /tmp/dose50 --parallel 21 $GPUS --time-limit $T --grace 20 $NOTE$(date -u +%FT%TZ)" >> $OUT/commands.log
nvidia-smi > $OUT/nvidia-smi.txt 2>&1
[ "$CALL" = call1 ] && python3 -c "import sys,torch,triton,transformers;print('python',sys.version.split()[0],'torch',torch.__version__,'cuda',torch.version.cuda,'triton',triton.__version__,'transformers',transformers.__version__,'gpus',torch.cuda.device_count(),torch.cuda.get_device_name())" > $OUT/env.txt 2>&1
echo "cores $(nproc)" >> $OUT/env.txt
(nvidia-smi --query-gpu=timestamp,index,utilization.gpu,memory.used --format=csv -l 15 > $OUT/${CALL}_gpu_util.csv 2>&1 &)
timeout $((T + 70)) python3 -m lab.dose.experiment lab/dose/configs/experiment_dose_h200.yaml --only qwen2-50m__ --out /tmp/dose50 \
    --parallel 21 $GPUS --time-limit $T --grace 20 > $OUT/${CALL}_experiment.log 2>&1
echo "== $CALL exit $? $(date -u +%FT%TZ)" >> $OUT/commands.log
tar czf $OUT/${CALL}_dose50.tgz -C /tmp/dose50 --exclude=checkpoints --exclude='*.safetensors' --exclude='*.pt' .
ls -la $OUT
