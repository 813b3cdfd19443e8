#!/usr/bin/env bash
# The live vLLM 0.26 rows and their table, one device call per STAGES list (after
# lab/bench/vllm026_device.sh part a|b, assemble, deps). Every engine run is `rla verify --live`
# with vLLM's own attention on the training side; everything after it re-scores the saved run
# (`--engine-outputs`), so the engine starts once per model and mode.
#   op            `rla calibrate --engine vllm` (op level, from the installed 0.26 package), both modes
#                 -> rows/op/vllm-0.26-op.json, vllm-0.26-eager-op.json
#   calib         Qwen3 h2048 x 4 layers (q/k norms: every point has a say), per mode: verify --live,
#                 calibrate --live on its outputs -> rows/live/vllm-0.26[-eager].json, then the saved run
#                 re-scored with both rows (engine attention, then the model's own)
#   table         MODELS (default the other five of Qwen2 / Qwen3 / Llama-3.1 at 4 and 28 layers), per
#                 MODES: verify --live with both rows as sides, re-scored with the model's own attention
# Results under $OUT/<model>-<mode>/ (report.json, report.md, engine.json, rollouts.jsonl) and *.log; the rows
# are kept in /tmp/rla-rows while the machine is warm (a later call's table uses them) and copied to $OUT/rows.
set -o pipefail
source lab/bench/vllm026_device.sh env
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/rla-out}; M=/tmp/rla-live-models; ROWS=/tmp/rla-rows; mkdir -p "$OUT" "$ROWS/op" "$ROWS/live" "$M"
t0=$(date +%s); DEADLINE=${DEADLINE:-585}
cap() { local left=$(( DEADLINE - ($(date +%s) - t0) - 5 )); (( left < $1 )) && echo $(( left > 1 ? left : 1 )) || echo $1; }
has() { [[ " $STAGES " == *" $1 "* ]]; }
stamp() { echo "=== $1 at +$(( $(date +%s) - t0 ))s"; }
RLA="python3 -m rla.cli"
show() { grep -vE "^(INFO|WARNING|DEBUG|\[rank)|it/s\]|FutureWarning|inv_freq, scaling" "$1" | grep -E "^\||^\[rla|rc=|Error|error" | tail -${2:-14} | cut -c1-200; }
sfx() { [[ $1 == eager ]] && echo -eager; }
# the rows that exist so far, as --profile's comma list
rows_of() { local m=$1 r=""; for f in "$ROWS/op/vllm-0.26$(sfx $m)-op.json" "$ROWS/live/vllm-0.26$(sfx $m).json"; do
  [[ -f $f ]] && r="$r${r:+,}$f"; done; echo "$r"; }
ckpt() { python3 lab/bench/vllm_live_h200.py checkpoint --out "$OUT/ckpt" --models $M --families "$1" --layers "$2" \
  >> "$OUT/checkpoint.log" 2>&1 || tail -3 "$OUT/checkpoint.log"; }
# one engine run and its re-scorings: verify_run MODEL MODE PROMPTS
verify_run() {
  local model=$1 mode=$2 prompts=$3 R="$OUT/$1-$2" p; p=$(rows_of $mode)
  timeout $(cap 240) $RLA verify --live --model $M/$model --mode $mode --train-attention engine --prompt-tokens $prompts \
    --responses 4 --max-new-tokens 128 ${p:+--profile $p} --out $R/engine-attention > $R.verify.log 2>&1
  echo "verify $model $mode rc=$?"; show $R.verify.log 10
}
rescore() {
  local model=$1 mode=$2 attn=$3 R="$OUT/$1-$2" p; p=$(rows_of $mode)
  [[ -f $R/engine-attention/engine.json ]] || { echo "no engine outputs for $model $mode"; return; }
  timeout $(cap 120) $RLA verify --live --engine-outputs $R/engine-attention --model $M/$model --train-attention $attn \
    ${p:+--profile $p} --out $R/rescored-$attn-attention > $R.rescore-$attn.log 2>&1
  echo "rescore $model $mode $attn rc=$?"; show $R.rescore-$attn.log 8
}
if has op; then
  for mode in default eager; do
    stamp op-$mode
    timeout $(cap 150) $RLA calibrate --engine vllm --mode $mode --device cuda --scale full \
      $([[ $mode == eager ]] && echo --library /tmp/site/vllm/_C_stable_libtorch.abi3.so) \
      --name vllm-0.26$(sfx $mode)-op --out "$ROWS/op/vllm-0.26$(sfx $mode)-op.json" > "$ROWS/op/calibrate-$mode.log" 2>&1
    echo "op $mode rc=$?"; grep -E "^\| \`" "$ROWS/op/calibrate-$mode.log" | cut -c1-160
  done
fi
if has calib; then
  ckpt qwen3-h2048 4
  for mode in ${MODES:-eager default}; do
    stamp calib-$mode; R="$OUT/qwen3-h2048-L4-$mode"; mkdir -p $R
    verify_run qwen3-h2048-L4 $mode 512,2048,4096,33000
    [[ -f $R/engine-attention/engine.json ]] || continue
    timeout $(cap 200) $RLA calibrate --live --engine-outputs $R/engine-attention --model $M/qwen3-h2048-L4 \
      --out "$ROWS/live/vllm-0.26$(sfx $mode).json" > $R.calibrate.log 2>&1
    echo "calibrate $mode rc=$?"; show $R.calibrate.log 16
    rescore qwen3-h2048-L4 $mode engine; rescore qwen3-h2048-L4 $mode model
  done
fi
if has table; then
  for model in ${MODELS:-qwen2-h1536-L4 llama31-h2048-L4 qwen2-h1536-L28 llama31-h2048-L28 qwen3-h2048-L28}; do
    ckpt ${model%-L*} ${model##*-L}
    for mode in ${MODES:-eager default}; do
      stamp "table $model $mode"; mkdir -p "$OUT/$model-$mode"
      verify_run $model $mode ${PROMPTS:-512,4096,33000}; rescore $model $mode model
    done
  done
fi
cp -r "$ROWS" "$OUT/rows"
stamp done
