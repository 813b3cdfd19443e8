#!/usr/bin/env bash
# Make the folder that lab/bench/h200_sglang_session.sh carries to the GPU machine (Python 3.12,
# x86-64, no network): SGLang 0.5.23's cp312 wheel without its compiled Rust extensions (the
# server's, never imported by the kernel path; 39 MB -> 20 MB), the wheels its JIT kernels' import
# closure needs beyond the machine's image, and a snapshot of this branch's rla (used when the
# tree that travels does not have the SGLang adapter yet).
#   bash lab/bench/sglang_carry.sh /work/main/.sgl      # a git-ignored folder of the repo that travels
set -euo pipefail
DEST=${1:?usage: sglang_carry.sh DEST_DIR}
HERE=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p "$DEST/whl" /tmp/sglang_carry
PLAT="--only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_34_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform manylinux_2_5_x86_64"
python3 -m pip download -q --no-deps $PLAT -d /tmp/sglang_carry sglang==0.5.23
python3 -m pip download -q --no-deps $PLAT -d "$DEST/whl" apache-tvm-ffi==0.1.11 msgspec==0.23.0 orjson==3.13.0 pybase64==1.5.1 starlette==1.10.0 ninja==1.13.0
W=$(ls /tmp/sglang_carry/sglang-0.5.23-cp312-*.whl)
cp "$W" "$DEST/sglang-0.5.23-pyfiles.zip"
zip -q -d "$DEST/sglang-0.5.23-pyfiles.zip" '*.so'
sha256sum "$W" > "$DEST/sglang-0.5.23-wheel.sha256"
(cd "$HERE" && git archive --format=tar.gz -o "$DEST/rla-sgl.tar.gz" HEAD src tests pyproject.toml lab/bench/sglang_jit_build.py lab/bench/h200_sglang_session.sh && git rev-parse --short HEAD > "$DEST/COMMIT")
du -sh "$DEST"/* "$DEST"/whl/*
