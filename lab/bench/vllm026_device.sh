#!/usr/bin/env bash
# vLLM 0.26.0 put together on the GPU machine from pieces carried in .carry/, one call each
# (the device's /tmp stays while the machine is warm; each call's tree + carry must stay < 64 MiB).
#
# The pieces, made on the CPU machine from the PyPI wheel (vllm-0.26.0-cp38-abi3-manylinux_2_28_x86_64):
#   .carry/a, .carry/b, .carry/c  the wheel's vllm/_C_stable_libtorch.abi3.so, `strip --strip-unneeded`,
#                                 `xz -9e`, `split -b 18600000` (partaa/ab/ac); c also holds sha256.txt
#                                 of the whole .xz, vllm_py.tar.xz (the wheel's Python tree without
#                                 FlashAttention, DeepGEMM, FMHA-SM100 and the MoE library) and
#                                 vllm_third_party.tar.xz (vllm/third_party without deep_gemm/fmha_sm100)
#   .carry/w                      cp312 wheels of the pure-Python packages the offline LLM path imports
#                                 and the device lacks (resolved on CPU; installed --no-deps)
# The pieces are made by lab/bench/vllm026_pack.sh.
# Steps: part a | part b | assemble | deps; then `source lab/bench/vllm026_device.sh env`.
set -o pipefail
case "${1:-}" in
  part)
    mkdir -p /tmp/vp && cp .carry/$2/part* /tmp/vp/ && ls -la /tmp/vp ;;
  assemble)
    set -e
    cp .carry/c/partac /tmp/vp/
    cat /tmp/vp/partaa /tmp/vp/partab /tmp/vp/partac > /tmp/vp/_C.so.xz
    (cd /tmp/vp && sha256sum -c "$OLDPWD/.carry/c/sha256.txt")
    mkdir -p /tmp/site && tar -xJf .carry/c/vllm_py.tar.xz -C /tmp/site && tar -xJf .carry/c/vllm_third_party.tar.xz -C /tmp/site
    xz -dc /tmp/vp/_C.so.xz > /tmp/site/vllm/_C_stable_libtorch.abi3.so
    # the one change to the installed engine (the results say why): FA libraries not carried, TRITON_ATTN used
    sed -i 's/^if not (FA2_AVAILABLE or FA3_AVAILABLE):/if False:  # rla live run: FA libraries not carried; TRITON_ATTN backend/' /tmp/site/vllm/vllm_flash_attn/__init__.py
    grep -n "rla live run" /tmp/site/vllm/vllm_flash_attn/__init__.py
    ls -la /tmp/site/vllm/_C_stable_libtorch.abi3.so ;;
  deps)
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/deps .carry/w/*.whl 2>&1 | tail -2
    ls /tmp/deps | wc -l ;;
  env)
    export PYTHONPATH=/tmp/site:/tmp/deps:$PWD/src:$PWD/lab/bench VLLM_ENABLE_V1_MULTIPROCESSING=0 VLLM_USE_FLASHINFER_SAMPLER=0 ;;
  *) echo "usage: $0 part a|b | assemble | deps | env" >&2; exit 2 ;;
esac
