#!/usr/bin/env bash
# Second device call: the SFT warm-start recipe on Qwen3 and Llama 10M models (records only).
set -u
B=${B:-55}
L=$(python3 -c "print(int($B*1.3)+1)")
export PYTHONPATH=src PYTHONUNBUFFERED=1 HF_HUB_DISABLE_PROGRESS_BARS=1 TQDM_DISABLE=1
W=${1:-$OUT}
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; python3 -c "import sys, torch, transformers; print(sys.version.split()[0], torch.__version__, transformers.__version__, torch.cuda.is_available())"; } > $W/env.txt 2>&1
run() { name=$1; shift; mkdir -p $W/$name; python3 lab/tools/train_tiny_model.py --time-budget $B --time-limit $L --evals 2 --no-weights --out $W/$name "$@" > $W/$name/log.txt 2>&1; echo "$name rc=$?" >> $W/env.txt; }
run qwen3-10m-add12 --arch qwen3 --size 10m --task addition --difficulty 12 --lr 1.5e-3 &
run llama-10m-add12 --arch llama --size 10m --task addition --difficulty 12 --lr 1.5e-3 &
wait
cat $W/env.txt; grep -h "params;\|ms/step\|eval step\|wrote\|Error" $W/*/log.txt
