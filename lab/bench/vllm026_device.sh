#!/usr/bin/env bash
# vLLM 0.26.0 put together on the GPU machine from pieces carried in .carry/, one call each
# (the device's /tmp stays while the machine is warm; each call's tree + carry must stay < 64 MiB).
#
# The pieces, made on the CPU machine from the PyPI wheel (vllm-0.26.0-cp38-abi3-manylinux_2_28_x86_64):
#   .carry/p1 .. p5               the wheel's vllm/_C_stable_libtorch.abi3.so, `strip --strip-unneeded`,
#                                 `xz -9e`, `split -b 11200000` (partaa .. partae)
#   .carry/c2                     sha256.txt of the whole .xz, vllm_py.tar.xz (the wheel's Python tree
#                                 without FlashAttention, DeepGEMM, FMHA-SM100 and the MoE library) and
#                                 vllm_third_party.tar.xz (vllm/third_party without deep_gemm/fmha_sm100)
#   .carry/w1, .carry/w2          cp312 wheels of the pure-Python packages the offline LLM path imports
#                                 and the device lacks (resolved on CPU; installed --no-deps), in halves
# One piece per call: on 2026-12-02 the device refused a call carrying two 18.6 MB pieces, on 2026-12-03 one
# (the tree had grown to 52.7 MB of disk blocks; the limit is 64 MiB): pieces of at most ~13 MB now
# (five, so each call carries one). Calls: part p1 .. part p5 | assemble (carry c2) | deps (carry w1) | deps (w2),
# for MoE models moe a | moe b (carry .carry/moe/a, .carry/moe/b: see vllm026_moe_halves.sh for halves of these),
# for the 5.24-only families tf (.carry/tf).
# The pieces are made by lab/bench/vllm026_pack.sh.
# Then `source lab/bench/vllm026_device.sh env`.
set -o pipefail
case "${1:-}" in
  part)
    mkdir -p /tmp/vp && cp .carry/$2/part* /tmp/vp/ && ls -la /tmp/vp ;;
  assemble)
    set -e
    cat /tmp/vp/part* > /tmp/vp/_C.so.xz  # the pieces in split's order (partaa, partab, ...)
    (cd /tmp/vp && sha256sum -c "$OLDPWD/.carry/c2/sha256.txt")
    mkdir -p /tmp/site && tar -xJf .carry/c2/vllm_py.tar.xz -C /tmp/site && tar -xJf .carry/c2/vllm_third_party.tar.xz -C /tmp/site
    xz -dc /tmp/vp/_C.so.xz > /tmp/site/vllm/_C_stable_libtorch.abi3.so
    # the one change to the installed engine (the results say why): FA libraries not carried, TRITON_ATTN used
    sed -i 's/^if not (FA2_AVAILABLE or FA3_AVAILABLE):/if False:  # rla live run: FA libraries not carried; TRITON_ATTN backend/' /tmp/site/vllm/vllm_flash_attn/__init__.py
    grep -n "rla live run" /tmp/site/vllm/vllm_flash_attn/__init__.py
    ls -la /tmp/site/vllm/_C_stable_libtorch.abi3.so
    bash "$0" deps ;;  # the wheels carried with this call (w1), the rest in the next (deps, carry w2); bash: the tree is copied without its mode bits
  deps)
    for d in .carry/w1 .carry/w2; do [ -d $d ] && python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/deps $d/*.whl 2>&1 | tail -2; done
    ls /tmp/deps | wc -l ;;
  moe)  # the MoE kernel library (MoE models, the router probe): `moe a`, then `moe b` (carry .carry/moe/$2) assembles it
    mkdir -p /tmp/vpm && cp .carry/moe/$2/part* /tmp/vpm/ && ls -la /tmp/vpm
    if [ "$2" = b ]; then
      set -e; m=_moe_C_stable_libtorch.abi3.so
      cat /tmp/vpm/partaa /tmp/vpm/partab > /tmp/vpm/$m.xz && xz -dc /tmp/vpm/$m.xz > /tmp/vpm/$m
      (cd /tmp/vpm && sha256sum -c "$OLDPWD/.carry/moe/b/sha256.txt")
      cp /tmp/vpm/$m /tmp/site/vllm/$m && ls -la /tmp/site/vllm/$m
    fi ;;
  tf)  # transformers 5.24 (carry .carry/tf), ahead of the image's 5.17 on the path: the families rla.align reads in 5.24's layout
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/tf .carry/tf/*.whl 2>&1 | tail -2
    PYTHONPATH=/tmp/tf python3 -c "import transformers; print('transformers', transformers.__version__)" ;;
  env)
    # /tmp/tf only exists after `tf`: the image's transformers otherwise
    export PYTHONPATH=/tmp/tf:/tmp/site:/tmp/deps:$PWD/src:$PWD/lab/bench VLLM_ENABLE_V1_MULTIPROCESSING=0 VLLM_USE_FLASHINFER_SAMPLER=0 ;;
  *) echo "usage: $0 part p1..p5 | assemble | deps | moe a|b | tf | env" >&2; exit 2 ;;
esac
