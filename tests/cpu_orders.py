"""What a test may assume about the CPU's reduction orders.

PyTorch's CPU kernels and Inductor's C++ code sum a row in partials as wide as the CPU's vector unit
(16 fp32 lanes with AVX-512, 8 with AVX2), so an fp32 sum of squares, and a norm's rstd from it, can move
by an ulp between two CPUs. The rounding-location facts the suite checks do not move with it, but a few
tests pin exact bits that only one width gives: their inputs were chosen on AVX-512 machines, and on an
AVX2 machine (an AMD EPYC, 2026-12-03) a norm of a later layer or a probe element came out one ulp apart.
"""

from __future__ import annotations

import pytest
import torch

#: The vector unit torch's CPU kernels run here ("AVX512", "AVX2", ...).
CAPABILITY = torch.backends.cpu.get_cpu_capability()
AVX512 = CAPABILITY == "AVX512"

#: For a test whose inputs pin bits that hold with AVX-512's reduction orders only.
avx512_orders = pytest.mark.skipif(
    not AVX512,
    reason=f"its exact bits were chosen with AVX-512's 16-lane reduction orders; this CPU's kernels are {CAPABILITY} "
    "(a norm's sum of squares in other partials: tests/cpu_orders.py)",
)
