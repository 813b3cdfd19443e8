#!/usr/bin/env bash
# vLLM 0.26's MoE library onto the GPU machine in four ~10 MB calls (carry .carry/m1 .. .carry/m4, one per call):
# on 2026-12-02 the device refused a call carrying .carry/moe/a (20.2 MB) with the tree, which it had accepted the
# day before (the tree grew). The halves are made on the CPU machine from lab/bench/vllm026_pack.sh's pieces:
#   split -b 10100000 .carry/moe/a/partaa -> m1/p, m2/p;  .carry/moe/b/partab -> m3/p, m4/p (+ m4/sha256.txt)
#   bash lab/bench/vllm026_moe_halves.sh 1|2|3|4   (4 assembles it into /tmp/site/vllm, as vllm026_device.sh moe b)
set -eo pipefail
mkdir -p /tmp/vpm
case "$1" in
  1) cat .carry/m1/p > /tmp/vpm/partaa ;;
  2) cat .carry/m2/p >> /tmp/vpm/partaa ;;
  3) cat .carry/m3/p > /tmp/vpm/partab ;;
  4) cat .carry/m4/p >> /tmp/vpm/partab
     m=_moe_C_stable_libtorch.abi3.so
     cat /tmp/vpm/partaa /tmp/vpm/partab > /tmp/vpm/$m.xz && xz -dc /tmp/vpm/$m.xz > /tmp/vpm/$m
     (cd /tmp/vpm && sha256sum -c "$OLDPWD/.carry/m4/sha256.txt")
     cp /tmp/vpm/$m /tmp/site/vllm/$m ;;
  *) echo "usage: $0 1|2|3|4" >&2; exit 2 ;;
esac
ls -la /tmp/vpm
