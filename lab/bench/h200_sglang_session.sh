#!/usr/bin/env bash
# One device call, one H200: SGLang 0.5.23's own JIT region kernels (FusedRopeKernel, the fast-math
# ActivationKernel, QKNormKernel) built by SGLang's load_jit with nvcc + ninja + tvm-ffi, and
# `rla calibrate --engine sglang` deciding the sglang-0.5.23 profile's points from them (issue #14).
#
# What travels in .sgl/ (git-ignored; carry it): sglang-0.5.23-pyfiles.zip, the cp312 wheel's
# members without its five compiled Rust extensions (the server's; 41 MB, never imported here), and
# whl/: apache-tvm-ffi 0.1.11 (SGLang's pin), msgspec, orjson, pybase64, starlette, ninja -- what
# the JIT kernels' import closure needs beyond the image. Rebuild it with lab/bench/sglang_carry.sh.
# Everything lands in $OUT/results.tgz (r/: commands.log, env, build.json, the profile and its
# reports, the logs); a kernel that fails to build leaves the others calibrated and the report
# names it. About 3-4 minutes after the machine starts.
set -u
export PYTHONUNBUFFERED=1
R=$OUT/r; mkdir -p $R
finish() { tar czf $OUT/results.tgz -C $OUT r && rm -rf $R; }
trap finish EXIT
stamp() { echo "== $1 $(date -u +%FT%TZ)" | tee -a $R/commands.log; }
S=$PWD/.sgl
W=$S/sglang-0.5.23-pyfiles.zip

# rla: this tree's (branch sgl merged), else the snapshot carried with it
SRC=$PWD
[ -f src/rla/engines/sglang.py ] || { mkdir -p /tmp/rla && tar xzf $S/rla-sgl.tar.gz -C /tmp/rla && SRC=/tmp/rla; }
if [ $SRC = $PWD ]; then V="the tree that travelled, $(git rev-parse --short HEAD 2>/dev/null || echo 'no .git')"; else V="snapshot $(cat $S/COMMIT)"; fi
echo "rla from $SRC ($V)" | tee -a $R/commands.log

stamp "pip install --target /tmp/site .sgl/whl/*.whl"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site $S/whl/*.whl > $R/pip.log 2>&1
export PYTHONPATH=$SRC/src:/tmp/site PATH=$PATH:/tmp/site/bin
export RLA_ENGINE_CACHE=/tmp/rlacache RLA_SGLANG_WHEEL=$W SGLANG_JIT_CACHE_DIR=/tmp/sgljit TVM_FFI_CACHE_DIR=/tmp/tvmffi
# SGLang's JIT links -L$CUDA_HOME/lib64 -lcudart: take the first toolkit root that has both
if [ -z "${CUDA_HOME:-}" ]; then
  for c in /usr/local/cuda /usr/local/cuda-13.0 "$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")"; do
    if [ -x "$c/bin/nvcc" ] && ls $c/lib64/libcudart.so > /dev/null 2>&1; then export CUDA_HOME=$c; break; fi
  done
fi
{ nvidia-smi; echo "CUDA_HOME=${CUDA_HOME:-unset} nvcc=$(command -v nvcc) ninja=$(command -v ninja) c++=$(command -v c++)"
  python3 -c "import torch, triton, transformers, tvm_ffi; print(torch.__version__, torch.version.cuda, triton.__version__, transformers.__version__, tvm_ffi.__version__, torch.cuda.get_device_name())"
  ${CUDA_HOME:-/usr/local/cuda}/bin/nvcc --version | tail -2; } > $R/env.txt 2>&1
sha256sum $W $S/whl/*.whl > $R/carried_sha256.txt

stamp "python3 lab/bench/sglang_jit_build.py --wheel $W"
(cd $SRC && timeout 240 python3 lab/bench/sglang_jit_build.py --wheel $W --out $R/build.json) > $R/build.log 2>&1

stamp "rla calibrate --engine sglang --device cuda --scale full --wheel $W --out $R/sglang-0.5.23.json"
timeout 240 python3 -m rla.cli calibrate --engine sglang --device cuda --scale full --wheel $W --out $R/sglang-0.5.23.json > $R/calibrate.log 2>&1
echo "calibrate exit $?" >> $R/commands.log

stamp "pytest tests/engines/test_engines_sglang.py (the compile-for-Hopper and the GPU calibration tests run here)"
(cd $SRC && timeout 150 python3 -m pytest -q -p no:cacheprovider -o addopts=-ra tests/engines/test_engines_sglang.py) > $R/gpu_tests.log 2>&1
echo "pytest exit $?" >> $R/commands.log
mkdir -p $R/ninja  # the exact nvcc command of every module built (flags, arch, includes)
for f in $(find /tmp/sgljit -name build.ninja); do cp $f $R/ninja/$(basename $(dirname $(dirname $(dirname $f)))).ninja; done
