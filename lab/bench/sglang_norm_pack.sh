#!/usr/bin/env bash
# Make the pieces that lab/bench/sglang_norm_carry.sh takes to the GPU machine, so SGLang 0.5.23's
# RMSNorm / fused add+RMSNorm run there from their own code: FlashInfer 0.7.2's CuTe-DSL norm
# kernels (what sgl_kernel.rmsnorm hands bf16 to) with nvidia-cutlass-dsl 4.8.0 (cu13 flavour),
# plus FlashInfer's JIT norm.cu sources (its fallback path) for a cross-check.
#
#   bash lab/bench/sglang_norm_pack.sh /work/main/.sgl/norm   # needs /work/main/.sgl made by sglang_carry.sh
#
# What one device call can carry is 64 MiB with the working tree (~23-25 MB), so the payload is one
# site tree (xz -9), cut in three byte ranges: p1 (+ SGLang's kernel-closure wheels from .sgl/whl),
# p2, p3 (+ SGLang's wheel without its Rust extensions). bin/ holds the device script and the
# sha256 manifest; every call carries bin/ and one piece. Left out of the payload: FlashInfer's
# data/ (csrc, CUTLASS, CCCL: its JIT sources for other kernels) except what norm.cu needs, the
# DSL's cu12 flavour (the H200's driver is CUDA 13) and its aarch64/QNX stubs.
set -euo pipefail
DEST=${1:?usage: sglang_norm_pack.sh DEST_DIR (e.g. /work/main/.sgl/norm)}
HERE=$(cd "$(dirname "$0")/../.." && pwd)
SGL=$(cd "$(dirname "$DEST")" && pwd)   # the .sgl folder that sglang_carry.sh made
[ -f "$SGL/sglang-0.5.23-pyfiles.zip" ] && ls "$SGL"/whl/apache_tvm_ffi-0.1.11-*.whl > /dev/null \
  || { echo "run lab/bench/sglang_carry.sh $SGL first"; exit 1; }
W=/tmp/sglnorm_pack; rm -rf "$W"; mkdir -p "$W/dl" "$W/site"
PLAT="--only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64"
python3 -m pip download -q --no-deps $PLAT -d "$W/dl" flashinfer-python==0.7.2 nvidia-cutlass-dsl==4.8.0 \
  nvidia-cutlass-dsl-libs-core==4.8.0 nvidia-cutlass-dsl-libs-base==4.8.0 nvidia-cutlass-dsl-libs-cu13==4.8.0
(cd "$W/dl" && sha256sum *.whl) > "$W/wheels.sha256"
for w in "$W"/dl/*.whl; do unzip -q -o "$w" -d "$W/site"; done
S=$W/site
# FlashInfer: its Python tree whole; of data/ only what the JIT norm module (jit/norm.py) compiles
mkdir -p "$W/keep/csrc"
cp "$S"/flashinfer/data/csrc/{norm.cu,flashinfer_norm_binding.cu,tvm_ffi_utils.h} "$W/keep/csrc/"
mv "$S/flashinfer/data/include" "$S/flashinfer/data/spdlog" "$S/flashinfer/data/cccl" "$W/keep/"
rm -rf "$S/flashinfer/data"; mkdir -p "$S/flashinfer/data"; mv "$W"/keep/* "$S/flashinfer/data/"
# the DSL: drop the stubs for other platforms
rm -rf "$S"/nvidia_cutlass_dsl/cu13/lib/stubs
# what PYTHONPATH needs in place of the .pth that pip --target would not run
test -f "$S/nvidia_cutlass_dsl/dsl_packages/cutlass/_mlir/_mlir_libs/_cutlass_ir.cu13.cpython-312-x86_64-linux-gnu.so"
cp "$W/wheels.sha256" "$S/WHEELS.sha256"
tar cf - -C "$W" site | xz -9 -T2 > "$W/payload.tar.xz"
# three byte ranges, balanced with what rides along: p1 28 MiB (+ .sgl/whl, 6.5 MB), p2 30 MiB,
# p3 the rest (~16 MB, + the 19.9 MB SGLang zip): ~36, 31.5, 36 MB a call, plus the tree
rm -rf "$DEST"; mkdir -p "$DEST/bin" "$DEST/p1/whl" "$DEST/p2" "$DEST/p3"
dd if="$W/payload.tar.xz" of="$DEST/p1/payload.part1" bs=1M count=28 status=none
dd if="$W/payload.tar.xz" of="$DEST/p2/payload.part2" bs=1M skip=28 count=30 status=none
dd if="$W/payload.tar.xz" of="$DEST/p3/payload.part3" bs=1M skip=58 status=none
ln "$SGL"/whl/*.whl "$DEST/p1/whl/"
ln "$SGL/sglang-0.5.23-pyfiles.zip" "$DEST/p3/"
cp "$HERE/benchmarks/sglang_norm_carry.sh" "$HERE/benchmarks/sglang_norm_smoke.py" "$DEST/bin/"
(cd "$DEST" && sha256sum p1/payload.part1 p2/payload.part2 p3/payload.part3 p3/sglang-0.5.23-pyfiles.zip p1/whl/*.whl) > "$DEST/bin/MANIFEST.sha256"
sha256sum "$W/payload.tar.xz" | awk '{print $1"  payload.tar.xz"}' >> "$DEST/bin/MANIFEST.sha256"
cp "$W/wheels.sha256" "$DEST/bin/WHEELS.sha256"
du -b "$DEST"/p1 "$DEST"/p2 "$DEST"/p3 "$DEST"/bin "$W/payload.tar.xz"
