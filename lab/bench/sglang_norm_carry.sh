#!/usr/bin/env bash
# SGLang 0.5.23's RMSNorm / fused add+RMSNorm from their own code on the H200 (issue #14): FlashInfer
# 0.7.2's CuTe-DSL norm kernels (what sgl_kernel.rmsnorm hands bf16 to; sgl_kernel itself is built
# for torch 2.14 and does not load) with nvidia-cutlass-dsl 4.8.0 (cu13), then
# `rla calibrate --engine sglang` with every region kernel SGLang runs.
#
# The pieces (made here by lab/bench/sglang_norm_pack.sh into the git-ignored .sgl/norm/) do not
# fit one call, so it takes three calls on one warm machine (it is given back 30 s after a call:
# make them back to back). Each call carries .sgl/norm/bin and one piece, and runs the same line:
#   bash .sgl/norm/bin/sglang_norm_carry.sh p1     carry [".sgl/norm/bin", ".sgl/norm/p1"]
#   bash .sgl/norm/bin/sglang_norm_carry.sh p2     carry [".sgl/norm/bin", ".sgl/norm/p2"]
#   bash .sgl/norm/bin/sglang_norm_carry.sh p3     carry [".sgl/norm/bin", ".sgl/norm/p3"]
# Each call stashes its piece in /tmp/sglnorm (kept while the machine stays warm) and then does
# whatever is possible: once all three are there it unpacks, installs, runs the smoke test and
# calibrates. A call whose machine came fresh says which pieces are missing (send them again).
# `... sglang_norm_carry.sh run` re-runs the last step on a warm machine with nothing carried.
# RUN_JIT_NORM=1 also calibrates with FLASHINFER_USE_CUDA_NORM=1 (FlashInfer 0.7.2's JIT norm.cuh,
# nvcc ~1-2 min); =auto (default) does so only when the CuTe-DSL path is not taken.
# Results: $OUT/results.tgz (r/: commands.log, env.txt, norm_smoke.json, calibration profile and
# reports, logs) and, for a quick look, $OUT/sglang-0.5.23.report.md and $OUT/norm_smoke.json.
set -u
export PYTHONUNBUFFERED=1
STEP=${1:-run}
BIN=$(cd "$(dirname "$0")" && pwd)
NORM=$(dirname "$BIN")                       # .sgl/norm in the tree that travelled
D=/tmp/sglnorm; mkdir -p "$D/parts" "$D/whl"
echo "== $STEP $(date -u +%FT%TZ) host=$(hostname) warm_state: $(ls $D/parts 2>/dev/null | tr '\n' ' ')$( [ -f $D/installed ] && echo installed)"

# 1. stash what this call carried (checked against the manifest)
check() { (cd "$NORM" && grep " $1\$" "$BIN/MANIFEST.sha256" | sha256sum -c --quiet -) ; }
for p in p1 p2 p3; do
  [ -d "$NORM/$p" ] || continue
  for f in "$NORM/$p"/payload.part* "$NORM/$p"/sglang-0.5.23-pyfiles.zip "$NORM/$p"/whl/*.whl; do
    [ -f "$f" ] || continue
    rel=${f#$NORM/}
    if check "$rel"; then
      case $rel in */whl/*) cp "$f" "$D/whl/";; *.zip) cp "$f" "$D/";; *) cp "$f" "$D/parts/";; esac
      case $rel in */whl/*) ;; *) echo "stashed $rel ($(du -m "$f" | cut -f1) MB)";; esac
    else echo "BAD CHECKSUM: $rel (not stashed)"; fi
  done
  [ -d "$NORM/$p/whl" ] && echo "stashed $(ls "$D"/whl/*.whl | wc -l) wheels of $p/whl"
done
missing=""
for i in 1 2 3; do [ -f "$D/parts/payload.part$i" ] || [ -f "$D/installed" ] || missing="$missing p$i"; done
[ -f "$D/sglang-0.5.23-pyfiles.zip" ] || missing="$missing p3(zip)"
ls "$D"/whl/apache_tvm_ffi-*.whl > /dev/null 2>&1 || missing="$missing p1(whl)"
if [ -n "$missing" ]; then
  echo "waiting for:$missing -- next call: bash .sgl/norm/bin/sglang_norm_carry.sh <piece> with carry [\".sgl/norm/bin\", \".sgl/norm/<piece>\"]"
  exit 0
fi

# 2. unpack + install once (the site tree: flashinfer 0.7.2, nvidia-cutlass-dsl 4.8.0 cu13; pip: tvm-ffi & co)
R=$OUT/r; mkdir -p "$R"
finish() { cp "$D"/*.log "$R/" 2>/dev/null; tar czf "$OUT/results.tgz" -C "$OUT" r; }
trap finish EXIT
stamp() { echo "== $1 $(date -u +%FT%TZ)" | tee -a "$R/commands.log"; }
if [ ! -f "$D/installed" ]; then
  stamp "assemble + check + unpack the payload"
  cat "$D"/parts/payload.part1 "$D"/parts/payload.part2 "$D"/parts/payload.part3 > "$D/payload.tar.xz"
  want=$(awk '$2=="payload.tar.xz"{print $1}' "$BIN/MANIFEST.sha256")
  have=$(sha256sum "$D/payload.tar.xz" | cut -d' ' -f1)
  [ "$want" = "$have" ] || { echo "payload sha256 $have != manifest $want: send p1-p3 again"; rm -f "$D"/parts/*; exit 1; }
  tar xJf "$D/payload.tar.xz" -C "$D" || { echo "unpack failed"; exit 1; }
  rm -f "$D/payload.tar.xz" "$D"/parts/*
  stamp "pip install --target $D/pip (SGLang's kernel closure: tvm-ffi 0.1.11, ninja, ...)"
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$D/pip" "$D"/whl/*.whl > "$D/pip.log" 2>&1 \
    || { echo "pip failed:"; tail -20 "$D/pip.log"; exit 1; }
  touch "$D/installed"
fi

# 3. environment: the .pth that pip --target does not run is the dsl_packages entry on PYTHONPATH
SRC=$PWD
[ -f "$SRC/src/rla/engines/sglang.py" ] || { echo "this tree has no src/rla/engines/sglang.py"; exit 1; }
export PYTHONPATH=$SRC/src:$D/site:$D/site/nvidia_cutlass_dsl/dsl_packages:$D/pip PATH=$PATH:$D/pip/bin
export RLA_ENGINE_CACHE=/tmp/rlacache SGLANG_JIT_CACHE_DIR=/tmp/sgljit TVM_FFI_CACHE_DIR=/tmp/tvmffi
export CUTE_DSL_CACHE_DIR=$D/cute_cache FLASHINFER_WORKSPACE_BASE=$D/fiws
mkdir -p "$CUTE_DSL_CACHE_DIR" "$FLASHINFER_WORKSPACE_BASE"
if [ -z "${CUDA_HOME:-}" ]; then
  for c in /usr/local/cuda /usr/local/cuda-13.0 "$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")"; do
    if [ -x "$c/bin/nvcc" ] && ls $c/lib64/libcudart.so > /dev/null 2>&1; then export CUDA_HOME=$c; break; fi
  done
fi
W=$D/sglang-0.5.23-pyfiles.zip
{ nvidia-smi --query-gpu=name,driver_version --format=csv; echo "CUDA_HOME=${CUDA_HOME:-unset} nvcc=$(command -v nvcc)"
  python3 -m pip list 2>/dev/null | grep -i -E "^(torch|cuda-|nvidia-cuda-nvrtc|protobuf|typing.extensions|numpy|apache|flashinfer|nvidia-cutlass)"
  ls /usr/local/nvidia/lib64/libcuda.so* 2>/dev/null; python3 -c "import ctypes; ctypes.CDLL('libcuda.so.1'); print('libcuda.so.1 loads')"
  sha256sum "$W" "$D"/whl/*.whl; cat "$D/site/WHEELS.sha256"; } > "$R/env.txt" 2>&1

stamp "smoke: import flashinfer / cutlass, which norm path, run rmsnorm + fused_add_rmsnorm"
timeout 150 python3 "$BIN/sglang_norm_smoke.py" "$R/norm_smoke.json" 2>&1 | tee "$R/smoke.log" | grep '^\[smoke\]'
cute=$(python3 -c "import json;print(json.load(open('$R/norm_smoke.json')).get('path',''))" 2>/dev/null)
[ -f "$R/norm_smoke.json" ] || { echo "--- smoke wrote no JSON; its log ends:"; tail -25 "$R/smoke.log"; }
echo "smoke path: ${cute:-none}" | tee -a "$R/commands.log"
grep -q '^\[smoke\] import_cutlass: FAILED\|^\[smoke\] import_cute_norm_kernels: FAILED' "$R/smoke.log" && {
  echo "--- the CuTe import error (FlashInfer swallows it):"; python3 -c "
import json; r=json.load(open('$R/norm_smoke.json'))
for k in ('import_cutlass','import_cute_norm_kernels'):
    if not r.get(k,{}).get('ok',True): print(k, r[k]['traceback'][-2500:])"; }

calibrate() {  # $1: out dir, $2: time limit (s); in-process, so it can say which FlashInfer kernels ran
  mkdir -p "$1"
  timeout "$2" python3 - "$W" "$1/sglang-0.5.23.json" <<'EOF'
import sys
w, out = sys.argv[1], sys.argv[2]
sys.argv = ["rla", "calibrate", "--engine", "sglang", "--device", "cuda", "--scale", "full", "--wheel", w, "--out", out]
from rla.cli import main
rc = main(sys.argv[1:])
try:
    import flashinfer.norm as n
    from flashinfer.norm.kernels import fused_add_rmsnorm as fa, rmsnorm as rm
    print(f"[which] CuTe rmsnorm variants compiled: {rm._get_compiled_rmsnorm_kernel.cache_info().currsize}, "
          f"fused_add: {fa._get_compiled_fused_add_rmsnorm_kernel.cache_info().currsize}; "
          f"JIT norm module loaded: {n.get_norm_module.cache_info().currsize}")
except Exception as e:
    print(f"[which] {type(e).__name__}: {e}")
sys.exit(rc)
EOF
}
stamp "rla calibrate --engine sglang --device cuda --scale full --wheel $W (norms through flashinfer.norm: ${cute:-?})"
calibrate "$R" $((570 - SECONDS)) > "$R/calibrate.log" 2>&1; rc=$?
echo "calibrate exit $rc" | tee -a "$R/commands.log"
grep -E '^\| `(norm_|residual_stream)|^\[which\]|norms ran through|did not run here' "$R/calibrate.log" | cut -c1-400
[ $rc -eq 0 ] || tail -30 "$R/calibrate.log"
cp "$R/sglang-0.5.23.report.md" "$R/norm_smoke.json" "$OUT/" 2>/dev/null

J=${RUN_JIT_NORM:-auto}
if [ $SECONDS -gt 420 ]; then echo "no time left for the JIT-norm cross-check (${SECONDS} s used): run again with RUN_JIT_NORM=1 ... run"
elif [ "$J" = 1 ] || { [ "$J" = auto ] && [ "$cute" != "CuTe-DSL kernels" ]; }; then
  stamp "cross-check: FLASHINFER_USE_CUDA_NORM=1 (FlashInfer 0.7.2's JIT norm.cuh, nvcc) -> r/jitnorm/"
  mkdir -p "$R/jitnorm"; FLASHINFER_USE_CUDA_NORM=1 calibrate "$R/jitnorm" $((570 - SECONDS)) > "$R/jitnorm/calibrate.log" 2>&1
  echo "jit-norm calibrate exit $?" | tee -a "$R/commands.log"
  grep -E '^\| `(norm_|residual_stream)|^\[which\]' "$R/jitnorm/calibrate.log" | cut -c1-400
  cp -r "$FLASHINFER_WORKSPACE_BASE/.cache/flashinfer" "$R/jitnorm/fi_cache_ninja" 2>/dev/null; find "$R/jitnorm/fi_cache_ninja" \( -name '*.so' -o -name '*.o' \) -delete 2>/dev/null
fi
stamp done
