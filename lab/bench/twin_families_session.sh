#!/usr/bin/env bash
# Device calls of the family-twin session (vLLM 0.33's twin of Gemma 3, Gemma 4, GLM-4 MoE, GPT-OSS and
# Qwen3.5 dense at realistic width, default and eager mode: lab/bench/twin_families.py), one H200. Made on the CPU
# machine first: bash lab/bench/twin_families_pack.sh (writes .carry/twin33/). What the run needs
# travels in pieces, one per call on the still-warm machine (a call's tree + carry < 64 MiB; the
# tracked tree alone is ~53 MB, so a call carries at most ~14 MB), each kept in /tmp/twin33 for the last call:
#   bash lab/bench/twin_families_session.sh piece 1     (carry .carry/twin33/p1; then 2 .. 5: seconds each)
#   bash lab/bench/twin_families_session.sh tf          (carry .carry/twin33/tf: transformers 5.24 into /tmp)
#   bash lab/bench/twin_families_session.sh run 6 [MODEL...]  (carry .carry/twin33/p6 and .carry/twin33/mini;
#     MODELs: twin_families.FAMILIES to run, default all; five in both modes pass the stage's 500 s, so split them:
#     `run 6 gemma3-h2560 glm4moe-h2048 gptoss-h2880` (405 s on 2026-12-03), `run 6 qwen35-h2048` (50 s), then
#     `run 6 gemma4-h2560`, `run 6 qwen35moe-h2048` (not run yet): each call reassembles the library from /tmp/twin33)
# `run` assembles the kernel library, checks its sha256, and runs the families stage in both modes
# (about 3-5 minutes: Inductor compiling each family's pieces dominates; the stage's own limit is
# 500 s). Everything lands in $OUT/results.tgz (the tool returns at most 8 files).
# MODES="default" (environment) runs one mode only (default: both); TESTS="tests/x.py ..." then runs those
# test files on the GPU (-o addopts=-ra: the device has no pytest-xdist), their log in r/tests.log.
set -u
CALL=$1; K=${2:-}; MODELS="${*:3}"
export PYTHONPATH=$PWD/src:$PWD/tests:$PWD PYTHONUNBUFFERED=1 RLA_ENGINE_CACHE=/tmp/twin33/cache
mkdir -p /tmp/twin33
if [ "$CALL" = tf ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/twin33/tf .carry/twin33/tf/*.whl
  PYTHONPATH=/tmp/twin33/tf python3 -c "import transformers; print(transformers.__version__)"; exit $?
fi
cp .carry/twin33/p$K/part* /tmp/twin33/
[ "$CALL" = piece ] && { ls -l /tmp/twin33; exit 0; }
[ -d /tmp/twin33/tf/transformers ] || { echo "transformers 5.24 is not in /tmp/twin33/tf: run the tf call first"; exit 1; }
export PYTHONPATH=/tmp/twin33/tf:$PYTHONPATH
W=$PWD/.carry/twin33/mini/vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl
L=/tmp/twin33/_C.so.xz
R=$OUT/r; mkdir -p $R
finish() { tar czf $OUT/results.tgz -C $OUT r && rm -rf $R; }
trap finish EXIT
stamp() { echo "== $1 $(date -u +%FT%TZ)" | tee -a $R/commands.log; }
cat /tmp/twin33/part? > $L
(cd /tmp/twin33 && sha256sum _C.so.xz) > $R/library_sha256.txt
if ! diff -q <(cut -d' ' -f1 $R/library_sha256.txt) <(cut -d' ' -f1 .carry/twin33/mini/sha256.txt); then
  echo "the assembled kernel library's sha256 is not the packed one: a piece is missing" | tee $R/error.txt; exit 1
fi
nvidia-smi > $R/nvidia-smi.txt 2>&1
python3 -c "import torch, triton, transformers; print(torch.__version__, torch.version.cuda, triton.__version__, transformers.__version__, torch.cuda.get_device_name())" > $R/env.txt 2>&1
ONLY=${MODELS:+--only $MODELS}
MODES=${MODES:-default eager}
stamp "lab/bench/engine_twin_h200.py --stages families --modes $MODES $ONLY"
timeout 500 python3 lab/bench/engine_twin_h200.py --stages families --modes $MODES $ONLY --wheel $W --library $L --out $R/families > $R/families.log 2>&1
stamp "done rc=$?"
python3 lab/bench/engine_twin_h200.py --summarize $R/families > $R/families_summary.md 2>&1
if [ -n "${TESTS:-}" ]; then
  stamp "python3 -m pytest -q -p no:cacheprovider -o addopts=-ra $TESTS"
  timeout 200 python3 -m pytest -q -p no:cacheprovider -o addopts=-ra $TESTS > $R/tests.log 2>&1
  stamp "tests rc=$?"
fi
