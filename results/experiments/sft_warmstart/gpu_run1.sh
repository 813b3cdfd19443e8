#!/usr/bin/env bash
# One device call: the bundled-model candidates and the Qwen3/Llama warm-start demos, in parallel
# on one GPU. usage (from the repo root): B=<train seconds> bash gpu_run.sh <outdir>
set -u
OUTD=${1:-$OUT}
B=${B:-100}
L=$(python3 -c "print(int($B*1.3)+1)")
EXTRA=${EXTRA:-}
export PYTHONPATH=src PYTHONUNBUFFERED=1 HF_HUB_DISABLE_PROGRESS_BARS=1 TQDM_DISABLE=1
W=/tmp/rla_runs; rm -rf $W; mkdir -p $W
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; python3 -c "import sys, torch, transformers; print(sys.version.split()[0], torch.__version__, transformers.__version__, torch.cuda.is_available())"; } > $W/env.txt 2>&1
run() { name=$1; shift; python3 lab/tools/train_tiny_model.py --time-budget $B --time-limit $L --evals 3 --out $W/$name "$@" $EXTRA > $W/$name.log 2>&1; echo "$name rc=$?" >> $W/rc.txt; }
run tiny-qwen2-d12 --arch qwen2 --size tiny --task addition --difficulty 12 --lr 2e-3 --max-mb 10 &
run tiny-qwen2-d15 --arch qwen2 --size tiny --task addition --difficulty 15 --lr 2e-3 --max-mb 10 &
run tiny-qwen2-d18 --arch qwen2 --size tiny --task addition --difficulty 18 --lr 2e-3 --max-mb 10 &
run qwen3-10m-add30 --arch qwen3 --size 10m --task addition --difficulty 30 --lr 1e-3 --no-weights &
run llama-10m-sort32 --arch llama --size 10m --task sorting --difficulty 32 --lr 1e-3 --no-weights &
wait
cd $W
for d in tiny-qwen2-d12 tiny-qwen2-d15 tiny-qwen2-d18; do tar cf $OUTD/$d.tar $d; done
tar cf $OUTD/warmstart.tar qwen3-10m-add30 llama-10m-sort32
for f in env.txt rc.txt *.log */TRAINING.md; do echo "=== $f"; cat $f; done > $OUTD/logs.txt
cat env.txt rc.txt; grep -h "params;\|calibration\|ms/step\|saved bf16\|eval step\|wrote" *.log
