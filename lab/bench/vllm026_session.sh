#!/usr/bin/env bash
# One device call of the live vLLM 0.26 session (after lab/bench/vllm026_device.sh part a|b, assemble,
# deps). STAGES, in order:
#   cli-eager / cli-default  `rla verify --live` then `rla calibrate --live` on the Qwen3 h2048 4-layer
#                            random-init checkpoint (q/k norms: every point has a say), that mode
#   gemma3-eager / gemma3-default  `rla verify --live --train-attention engine` on the Gemma 3 h2560
#                            4-layer random-init checkpoint (3 sliding-window layers, 1 full), that mode
#   fam-eager / fam-default  `rla verify --live` on the MoE families of live_family_configs (FAMS: name:attention:
#                            regions:env[:flags], e.g. deepseekv3-h2048:model:swiglu,router:VLLM_MLA_DISABLE=1, or
#                            qwen35-h2048:engine:::--gdn-prefill-backend+triton: flags with + for spaces), that mode;
#                            needs `vllm026_device.sh moe a|b` and `tf` first; with SAVED=<a folder holding
#                            verify-<name>-<mode>/engine.json> (an earlier call's OUT, or links to committed runs), re-scores
#                            those engine outputs with --engine-outputs (no engine started, no MoE library needed);
#                            REPLAY=1: --replay-routes (the engine's routes recorded, every side scored again routed to them)
#   famcal-eager / famcal-default  `rla calibrate --live` on the same FAMS (attention and env as fam-*; calibrate
#                            searches the default regions, so a family's regions field must be empty),
#                            that mode: the search from the mode's row, for a family whose row leaves much unremoved;
#                            with SAVED=<an earlier call's OUT on this warm machine>, from its verify-<name>-<mode> engine
#                            outputs (no engine started)
#   solo                     vllm_live_attribution.py engine-solo (each prompt alone, no chunked prefill)
#   attr                     vllm_live_attribution.py compare (the interventions, batched and solo)
#   twin                     vllm_live_attribution.py twin (the twin with the engine's attention vs live)
# NAMES (attribution models, default qwen2-h1536-L4), MODES (default eager,default). Results under $OUT.
set -o pipefail
source lab/bench/vllm026_device.sh env
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/rla-out}; M=/tmp/rla-live-models; mkdir -p "$OUT" "$M"
t0=$(date +%s); DEADLINE=${DEADLINE:-580}
cap() { local left=$(( DEADLINE - ($(date +%s) - t0) - 5 )); (( left < $1 )) && echo $(( left > 1 ? left : 1 )) || echo $1; }
has() { [[ " $STAGES " == *" $1 "* ]]; }
stamp() { echo "=== $1 at +$(( $(date +%s) - t0 ))s"; }
for mode in eager default; do
  has cli-$mode || continue
  stamp cli-$mode
  python3 lab/bench/vllm_live_h200.py checkpoint --out "$OUT/ckpt" --models $M --families qwen3-h2048 --layers 4 > "$OUT/checkpoint.log" 2>&1 || tail -5 "$OUT/checkpoint.log"
  timeout $(cap 300) python3 -m rla.cli verify --engine vllm --live --model $M/qwen3-h2048-L4 --mode $mode \
    --prompt-tokens 512,2048,4096 --responses 8 --max-new-tokens 128 --out "$OUT/verify-$mode" > "$OUT/verify-$mode.log" 2>&1
  echo "verify rc=$?"; grep -vE "^(INFO|WARNING|DEBUG)|it/s\]" "$OUT/verify-$mode.log" | tail -25 | cut -c1-220
  timeout $(cap 300) python3 -m rla.cli calibrate --engine vllm --live --model $M/qwen3-h2048-L4 --mode $mode \
    --out "$OUT/vllm-0.26$([[ $mode == eager ]] && echo -eager).json" > "$OUT/calibrate-$mode.log" 2>&1
  echo "calibrate rc=$?"; grep -vE "^(INFO|WARNING|DEBUG)|it/s\]" "$OUT/calibrate-$mode.log" | tail -25 | cut -c1-220
done
for mode in eager default; do
  has gemma3-$mode || continue
  stamp gemma3-$mode
  python3 lab/bench/vllm_live_h200.py checkpoint --out "$OUT/ckpt" --models $M --families gemma3-h2560 --layers 4 > "$OUT/checkpoint-gemma3.log" 2>&1 || tail -5 "$OUT/checkpoint-gemma3.log"
  timeout $(cap 400) python3 -m rla.cli verify --engine vllm --live --model $M/gemma3-h2560-L4 --mode $mode \
    --train-attention engine --prompt-tokens 512,2048,4096 --responses 8 --max-new-tokens 128 \
    --out "$OUT/verify-gemma3-$mode" > "$OUT/verify-gemma3-$mode.log" 2>&1
  echo "verify gemma3 rc=$?"; grep -vE "^(INFO|WARNING|DEBUG)|it/s\]" "$OUT/verify-gemma3-$mode.log" | tail -25 | cut -c1-220
done
FAMS=${FAMS:-"glm4moe-h2048:engine:: gptoss-h2880:engine:: deepseekv3-h2048:model:swiglu,router:VLLM_MLA_DISABLE=1"}
# one family of FAMS in one mode: its checkpoint (built once per warm machine), then `rla $1` (verify or calibrate)
# on a fresh engine run, or on SAVED's engine outputs when SAVED holds them (no engine started)
fam() {
  local cmd=$1 mode=$2 spec=$3 name att regions envs flags saved run
  IFS=: read -r name att regions envs flags <<< "$spec"; flags=${flags//+/ }
  stamp "$cmd $mode $name"
  [ -d $M/$name-L4 ] || python3 lab/bench/vllm_live_h200.py checkpoint --out "$OUT/ckpt" --models $M --families $name --layers 4 > "$OUT/checkpoint-$name.log" 2>&1 || tail -5 "$OUT/checkpoint-$name.log"
  saved=${SAVED:+$SAVED/verify-$name-$mode}  # SAVED: a folder holding verify-<name>-<mode>/engine.json
  if [ -n "$saved" ] && [ -f "$saved/engine.json" ]; then run="--engine-outputs $saved"
  else run="$flags --prompt-tokens 512,2048,4096 --responses 8 --max-new-tokens 128 --mode $mode"; fi
  if [ $cmd = verify ]; then
    env $envs timeout $(cap ${FAM_CAP:-240}) python3 -m rla.cli verify --engine vllm --live --model $M/$name-L4 \
      --train-attention $att ${regions:+--regions $regions} ${REPLAY:+--replay-routes} $run --out "$OUT/verify-$name-$mode" > "$OUT/verify-$name-$mode.log" 2>&1
    echo "verify $name $mode rc=$?"; grep -vE "^(INFO|WARNING|DEBUG)|it/s\]" "$OUT/verify-$name-$mode.log" | tail -14 | cut -c1-220
  else  # calibrate searches the default regions, so the spec's regions field must be empty
    env $envs timeout $(cap ${FAM_CAP:-400}) python3 -m rla.cli calibrate --engine vllm --live --model $M/$name-L4 \
      --train-attention $att $run --name "live-$name-$mode" --out "$OUT/calibrate-$name-$mode.json" > "$OUT/calibrate-$name-$mode.log" 2>&1
    echo "calibrate $name $mode rc=$?"; grep -vE "^(INFO|WARNING|DEBUG)|it/s\]" "$OUT/calibrate-$name-$mode.log" | tail -20 | cut -c1-220
  fi
}
for stage in fam famcal; do
  for mode in eager default; do
    has $stage-$mode || continue
    for spec in $FAMS; do fam $([[ $stage == fam ]] && echo verify || echo calibrate) $mode $spec; done
  done
done
A="python3 lab/bench/vllm_live_attribution.py --out /tmp/attr --models $M --names ${NAMES:-qwen2-h1536-L4} --modes ${MODES:-eager,default}"
if has solo; then stamp solo; timeout $(cap 300) $A engine-solo > "$OUT/solo.log" 2>&1; echo "rc=$?"; grep -E "solo:|Error|error" "$OUT/solo.log" | tail -8; fi
if has attr; then stamp attr; timeout $(cap 300) $A compare > "$OUT/attr.log" 2>&1; echo "rc=$?"; grep -E "prefill eq|batched vs solo|FAILED|Error" "$OUT/attr.log" | cut -c1-200; fi
if has twin; then stamp twin; timeout $(cap 300) $A twin > "$OUT/twin.log" 2>&1; echo "rc=$?"; grep -E "prefill eq|FAILED|Error" "$OUT/twin.log" | cut -c1-200; fi
# /tmp/attr stays while the machine is warm (a later call's compare reads the solo runs); copy what it holds
if ls /tmp/attr/*.json >/dev/null 2>&1; then mkdir -p "$OUT/attr" && cp /tmp/attr/*.json "$OUT/attr/"; fi
stamp done
