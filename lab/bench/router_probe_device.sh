#!/usr/bin/env bash
# The router probe (issue #32) on the GPU machine, in two device calls while it stays warm.
#
# vLLM 0.26.0's MoE kernel library (vllm/_moe_C_stable_libtorch.abi3.so of the PyPI wheel
# vllm-0.26.0-cp38-abi3-manylinux_2_28_x86_64, 47.5 MB) is carried, never committed: on the CPU
# machine `strip --strip-unneeded` (44.4 MB), `xz -9e` (40.3 MB), `split -b 20200000` into
# .carry/moe/a/partaa and .carry/moe/b/partab (b also holds sha256.txt of the .xz and of the
# library), one part per call so each call's tree + carry stays under 64 MiB.
#   call 1, carry .carry/moe/a:  bash lab/bench/router_probe_device.sh part
#   call 2, carry .carry/moe/b:  bash lab/bench/router_probe_device.sh run
# `run` unpacks the library to /tmp/moe, then runs the GPU router tests and the probe with
# LIB=/tmp/moe/_moe_C_stable_libtorch.abi3.so, writing under $OUT.
set -o pipefail
OUT=${OUT:-/tmp/rla-out}
LIB=/tmp/moe/_moe_C_stable_libtorch.abi3.so
case "${1:-}" in
  part)
    mkdir -p /tmp/moe && cp .carry/moe/a/partaa /tmp/moe/ && ls -la /tmp/moe ;;
  run)
    set -e
    cat /tmp/moe/partaa .carry/moe/b/partab > /tmp/moe/_moe_C_stable_libtorch.abi3.so.xz
    xz -dc /tmp/moe/_moe_C_stable_libtorch.abi3.so.xz > "$LIB"
    (cd /tmp/moe && sha256sum -c "$OLDPWD/.carry/moe/b/sha256.txt")
    set +e
    mkdir -p "$OUT/router_probe"
    RLA_VLLM_MOE_LIB=$LIB timeout 240 python3 -m pytest -q -p no:cacheprovider -o addopts=-ra -m gpu \
      tests/engines/test_router_probe_gpu.py tests/alignment/test_align_router.py \
      > "$OUT/router_probe/gpu_tests.log" 2>&1
    echo "pytest rc=$?"; grep -E "passed|failed|FAILED|Error" "$OUT/router_probe/gpu_tests.log" | tail -20
    PYTHONPATH=$PWD/src:$PWD timeout 240 python3 lab/bench/router_probe_h200.py --library "$LIB" \
      --out "$OUT/router_probe" 2>&1 | tee "$OUT/router_probe/probe.log" ;;
  *) echo "usage: $0 part|run" >&2; exit 2 ;;
esac
