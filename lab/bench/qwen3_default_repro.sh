#!/usr/bin/env bash
# One device call (after lab/bench/vllm026_device.sh part a|b, assemble, deps): is vLLM 0.26's
# default mode reproducible on Qwen3, and does the twin (what engine_forward runs) match it once the
# q/k norm's autotuned reduction config is out of the way? lab/bench/qwen3_default_repro.py says why.
# Every run is its own process with empty Inductor / Triton / vLLM caches (so each autotunes afresh).
# RUNS (default: all, in this order) picks a subset; results under $OUT/repro (compare.json, *.json, *.log).
set -o pipefail
source lab/bench/vllm026_device.sh env
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/rla-out}; M=/tmp/rla-live-models; R=$OUT/repro; C=/tmp/repro-caches; mkdir -p "$R" "$M" "$C"
t0=$(date +%s); DEADLINE=${DEADLINE:-580}
cap() { local left=$(( DEADLINE - ($(date +%s) - t0) - 5 )); (( left < $1 )) && echo $(( left > 1 ? left : 1 )) || echo $1; }
RUNS=${RUNS:-"e1 t1 t-warm e-det t-det t-vllm e2 q2"}
py() { python3 lab/bench/qwen3_default_repro.py "$@"; }
python3 lab/bench/vllm_live_h200.py checkpoint --out "$OUT/ckpt" --models $M --families qwen3-h2048,qwen2-h1536 --layers 4 \
  > "$R/checkpoint.log" 2>&1 || tail -5 "$R/checkpoint.log"
Q3=$M/qwen3-h2048-L4; Q2=$M/qwen2-h1536-L4
fresh() {  # $1: run name -> env with empty caches of its own
  rm -rf "$C/$1"; mkdir -p "$C/$1"
  echo TORCHINDUCTOR_CACHE_DIR=$C/$1/inductor TRITON_CACHE_DIR=$C/$1/triton VLLM_CACHE_ROOT=$C/$1/vllm
}
run() {  # $1: name, rest: the stage's arguments
  local name=$1; shift
  echo "=== $name at +$(( $(date +%s) - t0 ))s"
  env $(fresh $name) timeout $(cap 200) python3 lab/bench/qwen3_default_repro.py "$@" --out "$R/$name.json" --label $name \
    > "$R/$name.log" 2>&1
  echo "rc=$?"; grep -vE "^(INFO|WARNING|DEBUG)|it/s\]|Warning|warn" "$R/$name.log" | tail -12 | cut -c1-200
}
for r in $RUNS; do
  case $r in
    e1)     run e1 engine --model $Q3 ;;                                    # the live engine, fresh caches
    e2)     run e2 engine --model $Q3 ;;                                    # again: reproducible across starts?
    e-det)  run e-det engine --model $Q3 --compilation-config '{"inductor_compile_config": {"deterministic": true}}' ;;
    t1)     run t1 twin --model $Q3 ;;                                      # = engine_forward's pieces
    t-warm) run t-warm twin --model $Q3 --warm 16384 ;;                     # first launch on vLLM's profiling size
    t-det)  run t-det twin --model $Q3 --vllm-opts --merged --deterministic ;;
    t-vllm) run t-vllm twin --model $Q3 --vllm-opts --merged ;;             # vLLM's Inductor options (combo kernels)
    q2)     run q2 twin --model $Q2 ;;                                      # control: Qwen2, 92.2% on 2026-12-02
  esac
done
mkdir -p /tmp/repro-old && tar -xzf results/benchmarks/vllm026_live_h200_2026-12-01/engine_outputs_l4.tgz -C /tmp/repro-old
mkdir -p /tmp/repro-0602 && tar -xzf results/benchmarks/vllm026_rows_h200_2026-12-02/engine_outputs.tgz -C /tmp/repro-0602
E0=/tmp/repro-0602/engine-forward-qwen3-h2048-L4-default/engine.json  # the 2026-12-02 06:01 engine run (engine-forward 2.585% against it)
ls $R/*.json | grep -v compare.json > /tmp/repro-files
py compare --out "$R/compare.json" /tmp/repro-old/engine-qwen3-h2048-L4-default.json $E0 $(grep -v /q2.json /tmp/repro-files) 2>&1 | tail -40
[ -f $R/q2.json ] && py compare --out "$R/compare-qwen2.json" /tmp/repro-old/engine-qwen2-h1536-L4-default.json $R/q2.json
echo "=== done at +$(( $(date +%s) - t0 ))s"
