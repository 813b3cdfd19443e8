"""The order in which a norm adds its sum of squares: the ``norm_reduction`` point, as code.

fp32 addition is not associative: sum(x*x) over a row of 1536 values depends on the order the
kernel adds them, and a one-ulp difference in the sum can move ``rstd`` by an ulp, which flips
bf16 outputs and, through later layers, logits (docs/rounding.md, "Reduction order"). So where an
engine's kernel adds matters as much as where it rounds. Two choices:

``unpinned``
    The order of whichever kernel runs: PyTorch's ``mean`` for the reference ops, Triton's tree for
    rla's fused kernels. rstd can then differ from the engine's by an ulp in a small fraction of
    rows (measured and reported by ``rla verify``).

``vllm_block``
    vLLM's CUDA norm kernels (``rms_norm`` and ``fused_add_rms_norm``, enforce_eager, 0.33). One
    thread block per row; the row is read in vectors of ``vec`` elements (16 bytes: 8 bf16); thread
    ``t`` of ``threads`` takes vectors ``t, t + threads, t + 2*threads, ...`` and keeps a running
    fp32 partial:

    - the plain norm adds each element's square to its partial, one after the other;
    - the add+norm adds, per vector, the sum of its pair sums ``(x0^2 + x1^2) + (x2^2 + x3^2) ...``
      (left to right), then that to its partial; without 16-byte vectors (hidden % 8 != 0) it reads
      single elements and adds each square to its partial.

    Then a block reduction: within each warp of 32 threads a tree over neighbours (lane i + lane
    i+1, then pairs of pairs, ... five levels), then the warps' sums added in warp order, one after
    the other. ``threads`` is the launch's block size: the plain norm uses min(vectors, B), the
    add+norm min(hidden, B) (threads past the row's end hold 0, which adds exactly), with B = 1024
    when the call has fewer than 256 rows and 256 otherwise. rstd = rsqrt(sum / hidden + eps), with
    an IEEE division.

    The squares of bf16 or fp16 values are exact in fp32, so whether the kernel contracts a square
    and an add into an FMA changes nothing; the order of the adds is all there is. Bit equality
    with vLLM's kernels was measured on the H200 (results/benchmarks, ``norm_reduction``).

    The block size depends on the rows of one call. The engine's rows are its batch at that step
    (a prefill chunk, or the sequences decoding together), so for hidden > 2048 (more vectors than
    256 threads) a token computed in a small decode batch was reduced with 1024 threads, and the
    training side, which sees all tokens in one call, uses 256: those rows can differ by an ulp.

This module holds the tree as plain PyTorch (exact: every step is one fp32 add of whole tensors),
used by the reference ops on any device and as the oracle of the Triton kernel.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

__all__ = ["REDUCTIONS", "BlockTree", "vllm_block_tree", "call_tree", "block_sum_squares"]

REDUCTIONS: tuple[str, ...] = ("unpinned", "vllm_block")

WARP = 32
_SMALL_CALL_ROWS = 256  # vLLM: fewer rows than this in one call -> blocks of up to 1024 threads


@dataclass(frozen=True)
class BlockTree:
    """One launch's reduction: ``threads`` partials, ``vec`` elements per read, and whether a
    vector's squares are summed as pair sums before joining the partial (``pairwise``)."""

    threads: int
    vec: int
    pairwise: bool

    @property
    def warps(self) -> int:
        return -(-self.threads // WARP)

    def rounds(self, n: int) -> int:
        """Reads per thread (vectors, or elements when ``vec`` is 1)."""
        return -(-(n // self.vec) // self.threads)


def vllm_block_tree(n: int, rows: int, fused_add: bool) -> BlockTree:
    """The tree vLLM's kernel uses for rows of ``n`` elements (bf16/fp16) in a call of ``rows`` rows."""
    if n < 1:
        raise ValueError(f"a norm row needs at least one element, got {n}")
    max_threads = 1024 if rows < _SMALL_CALL_ROWS else 256
    if fused_add:
        vec = 8 if n % 8 == 0 else 1
        return BlockTree(threads=min(n, max_threads), vec=vec, pairwise=vec == 8)
    vec = math.gcd(8, n)
    return BlockTree(threads=min(n // vec, max_threads), vec=vec, pairwise=False)


def call_tree(x: torch.Tensor, fused_add: bool) -> BlockTree:
    """:func:`vllm_block_tree` of one call on ``x`` [..., n]: its rows are the call's rows."""
    n = x.shape[-1]
    return vllm_block_tree(n, x.numel() // n if n else 0, fused_add)


def block_sum_squares(v: torch.Tensor, tree: BlockTree) -> torch.Tensor:
    """sum(v*v, -1) of fp32 ``v`` [..., n] added in ``tree``'s order -> [...] fp32."""
    if v.dtype != torch.float32:
        raise TypeError(f"block_sum_squares takes the fp32 row values, got {v.dtype}")
    n = v.shape[-1]
    if n % tree.vec:
        raise ValueError(f"rows of {n} elements cannot be read in vectors of {tree.vec}")
    lead = v.shape[:-1]
    sq = (v * v).reshape(-1, n // tree.vec, tree.vec)
    rounds, threads = tree.rounds(n), tree.threads
    pad = rounds * threads - sq.shape[1]  # reads past the row's end: 0, which adds exactly
    if pad:
        sq = torch.cat((sq, sq.new_zeros(sq.shape[0], pad, tree.vec)), dim=1)
    sq = sq.view(-1, rounds, threads, tree.vec)
    partial = torch.zeros(sq.shape[0], threads, dtype=torch.float32, device=v.device)
    for r in range(rounds):
        if tree.pairwise:
            s = sq[:, r, :, 0] + sq[:, r, :, 1]
            for j in range(2, tree.vec, 2):
                s = s + (sq[:, r, :, j] + sq[:, r, :, j + 1])
            partial = partial + s
        else:
            for j in range(tree.vec):
                partial = partial + sq[:, r, :, j]
    lanes = tree.warps * WARP
    if lanes > threads:
        partial = torch.cat((partial, partial.new_zeros(partial.shape[0], lanes - threads)), dim=1)
    lanes_v = partial.view(-1, tree.warps, WARP)
    while lanes_v.shape[-1] > 1:  # neighbours first: (l0 + l1) + (l2 + l3), ...
        lanes_v = lanes_v[..., 0::2] + lanes_v[..., 1::2]
    warp_sums = lanes_v[..., 0]
    total = warp_sums[:, 0]
    for w in range(1, tree.warps):
        total = total + warp_sums[:, w]
    return total.reshape(lead)

