# One device call of the 4M long-response dose cell (issue #19), from a carried warm start:
#   bash lab/dose/sessions/h200_dose_long4_session.sh T [GRID] [GPUS] [PARALLEL]     # with carry: [".carry"]
# .carry/init4.tgz is the warm start that the probe call of lab/dose/sessions/h200_dose_long_pair_session.sh made and
# brought back (its sha256 is in results/experiments/dose_response_long_h200_2026-12-01/logs/commands_probe.log).
# Runs GRID (default: the picked grid, grid_4m_40steps.yaml) one process per run over GPUS (default 0,1),
# PARALLEL at once (default 21), time limit T s. What comes back ($OUT): commands.log, env.txt, gpu_util.csv,
# experiment.log, d4.tgz (the experiment folder without checkpoints and weights).
#   2026-12-01 call 3 (nvidia-h200-x2):  bash lab/dose/sessions/h200_dose_long4_session.sh 530
#   2026-12-01 call 4 (nvidia-h200):     bash lab/dose/sessions/h200_dose_long4_session.sh 480 \
#       results/experiments/dose_response_long_h200_2026-12-01/grid_4m_40steps_top.yaml 0 9
set -u
T=$1 START=$(date +%s)
G=${2:-results/experiments/dose_response_long_h200_2026-12-01/grid_4m_40steps.yaml} GPUS=${3:-0,1} P=${4:-21}
export PYTHONPATH=$PWD/src:$PWD PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
D=/tmp/dl4
log() { echo "== $* ($(( $(date +%s) - START )) s, $(date -u +%FT%TZ))" >> $OUT/commands.log; }
python3 -c "import sys,torch,triton,transformers;print('python',sys.version.split()[0],'torch',torch.__version__,'cuda',torch.version.cuda,'triton',triton.__version__,'transformers',transformers.__version__,'gpus',torch.cuda.device_count(),torch.cuda.get_device_name())" > $OUT/env.txt 2>&1
echo "cores $(nproc)" >> $OUT/env.txt
(nvidia-smi --query-gpu=timestamp,index,utilization.gpu,memory.used --format=csv -l 10 > $OUT/gpu_util.csv 2>&1 &)
mkdir -p $D && log "init4.tgz sha256 $(sha256sum .carry/init4.tgz | cut -d' ' -f1)" && tar xzf .carry/init4.tgz -C $D
log "lab.dose.experiment $G --out $D --gpus $GPUS --parallel $P --time-limit $T --grace 30"
timeout $((T + 90)) python3 -m lab.dose.experiment $G --out $D --gpus $GPUS --parallel $P --time-limit $T --grace 30 \
    > $OUT/experiment.log 2>&1
log "exit $?"
tar czf $OUT/d4.tgz -C $D --exclude=checkpoints --exclude='*.safetensors' --exclude='*.pt' .
ls -la $OUT
