#!/usr/bin/env bash
# One device call for issue #33's GPU items, from the repository root (carry .whl: Liger's wheel):
#   1. gpu_run.sh tests-gated: the fused GeGLU / clamped SwiGLU bitwise tests, the family ops and the
#      aligned families on CUDA, the ops' opcheck cases (< 200 s)
#   2. gelu_probe_h200.py: PyTorch's CUDA tanh-gelu against the candidate expressions (< 40 s)
#   3. rla bench e2e --models gemma3-4b: the training step of Gemma 3 4B's text shape under HF eager,
#      rla (the vllm row) and Liger Kernel (alone and with its fused linear cross-entropy) (< 200 s)
# Everything lands in one tarball, $OUT/families_h200.tgz; the summary is printed.
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/rla-out}; P="$OUT/families_h200"; mkdir -p "$P"
t0=$(date +%s)
stamp() { echo "=== $1 at +$(( $(date +%s) - t0 ))s"; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/liger_kernel-*.whl \
  || echo "Liger's wheel did not install (carry .whl): the liger rows will say so"
stamp tests-gated
OUT="$P" timeout 200 bash lab/bench/gpu_run.sh tests-gated 2>&1 | tee "$P/gpu_run.log" | tail -45
export PYTHONPATH=/tmp/site:$PWD/src
stamp gelu-probe
timeout 60 python3 lab/bench/gelu_probe_h200.py --out "$P/gelu_probe.json" > "$P/gelu_probe.log" 2>&1
echo "gelu probe rc=$?"; tail -8 "$P/gelu_probe.log"
stamp e2e-gemma3
timeout 200 python3 -m rla.cli bench e2e --models gemma3-4b --variants hf-bf16 rla-vllm liger liger-flce \
  --out "$P/e2e" > "$P/e2e.log" 2>&1
echo "e2e rc=$?"; grep -E "^gemma3-4b|^\| gemma3|Error|error" "$P/e2e.log" | tail -20 | cut -c1-240
stamp done
tar czf "$OUT/families_h200.tgz" -C "$OUT" families_h200 && rm -rf "$P"
ls -la "$OUT"
