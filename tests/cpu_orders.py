"""What a test may assume about the CPU's reduction orders.

PyTorch's CPU kernels and Inductor's C++ code sum a row in partials as wide as the CPU's vector unit
(16 fp32 lanes with AVX-512, 8 with AVX2; an Inductor kernel that loads bf16 uses two vectors' lanes, 32 or
16), so an fp32 sum of squares, and a norm's rstd from it, can move by an ulp between two CPUs. The
rounding-location facts the suite checks do not move with it, but a test that pins exact bits must hold with
either width. The two that once held with AVX-512's orders only (on an AVX2 AMD EPYC, 2026-12-03, a norm of a
later layer or a probe element came out one ulp apart) now do:

- tests/engines/test_vllm_twin_qwen3_5.py (hidden 384): the oracle's compiled mean of squares loads bf16 as the
  twin's norm kernels do, so Inductor gives it their lanes on any CPU (the same order by construction);
- tests/engines/test_vllm_twin_families.py (Gemma 4's default twin): its weights (``GEMMA4_SEED``) are ones
  where Inductor's sums (the twin's) and PyTorch's eager ones (the oracle's and ``rla.align``'s: the rows'
  ``norm_reduction='unpinned'``) give the same bits with AVX-512's lanes and with AVX2's.

To run a test with AVX2's orders on an AVX-512 machine: ``ATEN_CPU_CAPABILITY=avx2`` (set before torch is
imported) makes ATen pick its AVX2 kernels, and Inductor follows it while ``config.cpp.simdlen`` is None
(``torch/_inductor/cpu_vec_isa.py``, ``pick_vec_isa``); give it a fresh ``TORCHINDUCTOR_CACHE_DIR``: with the
cache AVX-512 runs filled, torch 2.13's compiled Gemma 4 twin came out all NaN under the variable.
"""

from __future__ import annotations

import torch

#: The vector unit torch's CPU kernels run here ("AVX512", "AVX2", ...).
CAPABILITY = torch.backends.cpu.get_cpu_capability()
AVX512 = CAPABILITY == "AVX512"
