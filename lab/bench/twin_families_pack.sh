#!/usr/bin/env bash
# Makes, on the CPU machine, what lab/bench/twin_families_session.sh needs on the GPU machine (all
# under the gitignored .carry/twin33/): a mini vLLM 0.33.0 wheel holding the Python files rla reads
# (the region code, the model files, the fused-MoE facts; its METADATA for the version) and the
# kernel library _C_stable_libtorch.abi3.so stripped, xz'd and split in pieces of at most 11.2 MB
# (p1..pN, one per device call: a call's tree + carry must stay under 64 MiB); and the transformers
# 5.24.0 wheel (tf/: the device image has 5.17, and rla.align reads GLM-4 MoE's and GPT-OSS's 5.24 layout).
#   bash lab/bench/twin_families_pack.sh [WHEEL]   (default ~/.cache/rla/engines/vllm-0.33.0-...whl)
set -euo pipefail
WHEEL=${1:-$HOME/.cache/rla/engines/vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl}
C=.carry/twin33; T=$(mktemp -d); rm -rf $C && mkdir -p $C/mini
(cd $T && unzip -q "$WHEEL" 'vllm/model_executor/*.py' 'vllm/ir/*.py' 'vllm/kernels/*.py' 'vllm/_custom_ops.py' \
   'vllm/config/compilation.py' 'vllm-0.33.0.dist-info/METADATA' vllm/_C_stable_libtorch.abi3.so)
(cd $T && zip -q -r mini.whl vllm -x vllm/_C_stable_libtorch.abi3.so && zip -q mini.whl vllm-0.33.0.dist-info/METADATA)
mv $T/mini.whl $C/mini/vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl
strip --strip-unneeded -o $T/_C.so $T/vllm/_C_stable_libtorch.abi3.so
xz -9e -T2 -c $T/_C.so > $T/_C.so.xz
(cd $T && sha256sum _C.so.xz > sha256.txt && split -b 11200000 -d -a 1 _C.so.xz part)
i=1; for f in $T/part*; do mkdir -p $C/p$i && mv $f $C/p$i/; i=$((i + 1)); done
mv $T/sha256.txt $C/mini/
rm -rf $T
mkdir -p $C/tf && python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 -d $C/tf transformers==5.24.0
du -sh $C/*
