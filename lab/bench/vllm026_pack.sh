#!/usr/bin/env bash
# Makes the pieces lab/bench/vllm026_device.sh assembles on the GPU machine, on the CPU machine,
# from PyPI (writes .carry/p1 .. p5, c2, w1, w2 and .carry/moe/a, b; all gitignored). About 5 min on 2 cores.
# Each piece is at most ~18.6 MB: the device refused a call whose tree + carry held two of them (2026-12-02).
#   bash lab/bench/vllm026_pack.sh [WORKDIR]      (default /tmp/vllm026_pack)
# The wheels of .carry/w: the pure-Python packages (and small compiled ones) the offline LLM path
# imports that the device's image lacks (KINDS.md's package list), resolved --no-deps from these
# seeds and their requirements by lab/bench/vllm026_wheels.py.
set -euo pipefail
W=${1:-/tmp/vllm026_pack}; R=$PWD; mkdir -p "$W"
P=(--platform manylinux_2_28_x86_64 --python-version 3.12 --only-binary=:all:)
[ -f "$W/vllm-0.26.0-cp38-abi3-manylinux_2_28_x86_64.whl" ] || pip download -q vllm==0.26.0 --no-deps -d "$W" "${P[@]}"
rm -rf "$W/x" && mkdir -p "$W/x" && (cd "$W/x" && unzip -q ../vllm-0.26.0-cp38-abi3-manylinux_2_28_x86_64.whl)
rm -rf .carry/p* .carry/c2 .carry/w1 .carry/w2 .carry/moe && mkdir -p .carry/c2 .carry/moe/a .carry/moe/b .carry/w
v="$W/x/vllm"
# the kernel library: stripped, xz, three pieces (each call's tree + carry < 64 MiB)
strip --strip-unneeded -o "$W/_C.so" "$v/_C_stable_libtorch.abi3.so"
xz -9e -T2 -c "$W/_C.so" > "$W/_C.so.xz"
(cd "$W" && rm -f part* && split -b 11200000 _C.so.xz part && sha256sum _C.so.xz > "$R/.carry/c2/sha256.txt")
i=0; for f in "$W"/part*; do i=$((i+1)); rm -rf .carry/p$i; mkdir -p .carry/p$i; mv "$f" .carry/p$i/; done
# the Python tree without FlashAttention, DeepGEMM, FMHA-SM100, the MoE library and vllm-rs
tar -C "$W/x" -cJf .carry/c2/vllm_py.tar.xz --exclude='vllm/vllm_flash_attn/_vllm_fa*_C.abi3.so' \
  --exclude=vllm/_C_stable_libtorch.abi3.so --exclude=vllm/_moe_C_stable_libtorch.abi3.so \
  --exclude='vllm/_flashmla*' --exclude=vllm/vllm-rs --exclude=vllm/third_party vllm vllm-0.26.0.dist-info
tar -C "$W/x" -cJf .carry/c2/vllm_third_party.tar.xz --exclude=vllm/third_party/deep_gemm --exclude=vllm/third_party/fmha_sm100 vllm/third_party
# the MoE library, for the router probe and MoE models (two pieces)
m=_moe_C_stable_libtorch.abi3.so; mkdir -p "$W/moe"
strip --strip-unneeded -o "$W/moe/$m" "$v/$m"
xz -9e -T2 -c "$W/moe/$m" > "$W/moe/$m.xz"
(cd "$W/moe" && rm -f part* && split -b 20200000 $m.xz part && sha256sum $m.xz $m > "$R/.carry/moe/b/sha256.txt")
mv "$W/moe/partaa" .carry/moe/a/ && mv "$W/moe/partab" .carry/moe/b/
python3 lab/bench/vllm026_wheels.py .carry/w
# the wheels in two halves by size (alternating, largest first), each under ~13 MB
mkdir -p .carry/w1 .carry/w2; i=0
for f in $(ls -S .carry/w); do cp ".carry/w/$f" ".carry/w$(( i % 2 + 1 ))/"; i=$(( i + 1 )); done
du -sh .carry/*
