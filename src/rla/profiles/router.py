"""The router points: where an MoE layer's routing and its weighted sum of experts round.

An MoE block is a chain of rounding locations of its own, apart from the three regions of
:mod:`rla.profiles.model`: the gate GEMM's output, the softmax (or sigmoid) of the router
logits, the top-k's tie-break, the dtype of the routing weights, whether the weight multiplies
the expert's rounded output or its fp32 GEMM accumulator, whether the weighted term is rounded
before the sum, the order and precision of the sum over the k experts, and (DeepSeek-V3) where
``routed_scaling_factor`` applies. A flipped expert choice is not a last-bit difference: the
token then reads another expert's weights.

Notation as in ``docs/rounding.md``: ``lp`` is the stack's low-precision dtype, ``RN`` rounds an
fp32 value to it; ``x`` the block's input (lp), ``W_g`` the gate weight, ``y_e`` expert e's
down-projection (its fp32 GEMM accumulator ``acc_e``, rounded ``RN(acc_e)``), ``w`` a routing
weight, and the k chosen experts sit in *slots* 0..k-1 in the order the top-k returns them
(descending score).

The points (:data:`ROUTER_POINTS`; the reference is ``rla.ops.routing``):

- ``logits``: ``lp`` = RN(x @ W_g^T), the gate GEMM's lp output (HF Qwen-MoE / Mixtral, vLLM,
  SGLang); ``fp32`` = the fp32 GEMM of lp inputs, unrounded (HF DeepSeek-V3's router).
- ``softmax`` (softmax routers): ``torch`` = ``torch.softmax(logits, dtype=float32)`` as HF calls
  it; ``divide`` = exp(l - max) / sum, the sum's order the running kernel's (``torch.sum`` in the
  reference, as for ``norm_reduction='unpinned'``); ``reciprocal`` = vLLM's ``topk_softmax``
  kernel: e = exp(l - max), the sum of e in the kernel's own order (the row cut into
  ``threads_per_row`` chunks of ``vpt`` logits, each summed in order from 0, then a butterfly over
  the chunks' sums; ``rla.ops.routing.topk_softmax_layout``), times RN(1 / sum).
- ``renorm`` (softmax routers' ``norm_topk_prob``; Mixtral always): how the k chosen weights are
  divided by their sum s. ``torch`` = w / ``w.sum(-1)`` as HF writes it: the order of ``torch.sum`` over the k
  slots is the running kernel's (slot order on CPU; on CUDA a tree from k = 3 on:
  (w0 + w2) + w1 at k = 3); ``divide`` = w / s with s summed in slot order ((w0 + w1) + w2 ...);
  ``reciprocal`` = w * RN(1 / s), the same s (vLLM's fused renormalisation: one division of the
  routed scale, 1.0, by s, then a multiply per weight).
- ``sigmoid`` (sigmoid routers, DeepSeek-V3): the fp32 scores of the fp32 logits. ``torch`` =
  ``logits.sigmoid()`` as HF calls it (torch's own kernel for the device: on CPU a vectorised
  1 / (1 + exp(-x)) that can differ from the scalar expression in the last bit); ``tanh_half`` =
  0.5 + 0.5 * tanh(x / 2), every step in fp32 (vLLM's ``sigmoid_accurate``: ``tanhf``, then one
  FFMA, exact but for its final rounding). The two differ by an ulp on a few percent of the bf16
  values; ``tanh_half`` has absolute, not relative, accuracy for negative x (a multiple of 2^-25
  below x ~ -1.1, exactly 0 below x ~ -18, where tanh(x / 2) rounds to -1) where ``torch`` keeps
  ~1e-8 and below.
- ``sigmoid_renorm`` (sigmoid routers' ``norm_topk_prob``): the k chosen scores over their sum s,
  with 1e-20 added to s as HF and the kernels do. ``torch``, ``divide`` and ``reciprocal`` as for
  ``renorm`` (the 1e-20 added in fp32: for any s above ~1e-12 an exact no-op); ``warp_fp64`` = vLLM's
  ``grouped_topk`` kernel: s = the 32-lane xor butterfly of one warp (lane j holds slot j's score,
  lanes k..31 hold 0; partner distances 16, 8, 4, 2, 1, every add fp32: at k = 8 the tree
  ((w0 + w4) + (w2 + w6)) + ((w1 + w5) + (w3 + w7)), at k = 3 (w0 + w2) + w1), then
  RN(double(w) / (double(s) + 1e-20)), the division in fp64 rounded once to fp32. For two fp32
  operands an fp64 quotient rounded to fp32 is the correctly rounded fp32 quotient (53 >= 2 * 24 + 2
  bits), so the fp64 division equals ``divide``'s; the butterfly's order is what differs. (The
  kernel multiplies w by its routed scale in fp64 before the division; vLLM passes it 1.0 for
  DeepSeek-V3 on CUDA and scales the combined output instead, ``routed_scale='output'``.)
- ``ties``: ``torch`` = ``torch.topk``'s order, as the model calls it; ``lowest_index`` = slots in
  descending score, equal scores broken toward the lower expert id (vLLM's and SGLang's kernels).
  With bf16 logits exact ties are common: a bf16 logit has 8 significant bits.
- ``weights``: the dtype of the (renormalised) routing weights handed to the experts: ``lp``
  (HF Qwen2/Qwen3-MoE cast them to the logits' dtype) or ``fp32`` (HF Mixtral / DeepSeek-V3, every
  engine).
- ``expert_out``: what the weight multiplies: ``lp`` = RN(acc_e) (HF: a bf16 GEMM output); ``fp32``
  = acc_e itself (the fused MoE kernel multiplies its fp32 accumulator before the store).
- ``weighted_term``: ``lp`` = the term w * y is rounded before the sum (HF eager, the fused
  kernels' store); ``fp32`` = kept fp32 into the sum (HF's ``grouped_mm`` experts with fp32 weights).
- ``combine``: ``lp_expert_order`` = the k terms added into an lp zero tensor in ascending expert
  id, every add rounded (HF's eager ``index_add_``); ``lp_slot_order`` = the same in slot order
  (an lp accumulator); ``fp32_slot_order`` = an fp32 sum in slot order, rounded once (HF's
  ``grouped_mm`` reshape + sum, vLLM's ``moe_sum`` kernels, SGLang's ``moe_sum_reduce``). With k = 2 all
  three are equal (0 + a is exact and a + b commutes); they differ from k = 3 on.
- ``routed_scale`` (routers with a ``routed_scaling_factor``, DeepSeek-V3): ``weights`` = the
  weights are multiplied in fp32 before the experts (HF); ``output`` = RN(RN(sum) * s), the
  combined lp output scaled (vLLM's runner); ``combine`` = the fp32 sum times s, rounded once
  (SGLang's ``moe_sum_reduce``).

A profile's router points are ``RoundingProfile.router`` (None: no router values claimed; the
``hf`` row's is None because HF's module is the baseline and its values depend on the family and
on ``config._experts_implementation``: ``rla.alignment.router.hf_router_points`` says which).
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["RouterPoints", "ROUTER_POINTS"]

#: Every router point and its choices.
ROUTER_POINTS: dict[str, tuple[str, ...]] = {
    "logits": ("lp", "fp32"),
    "softmax": ("torch", "divide", "reciprocal"),
    "renorm": ("torch", "divide", "reciprocal"),
    "sigmoid": ("torch", "tanh_half"),
    "sigmoid_renorm": ("torch", "divide", "reciprocal", "warp_fp64"),
    "ties": ("torch", "lowest_index"),
    "weights": ("lp", "fp32"),
    "expert_out": ("lp", "fp32"),
    "weighted_term": ("lp", "fp32"),
    "combine": ("lp_expert_order", "lp_slot_order", "fp32_slot_order"),
    "routed_scale": ("weights", "output", "combine"),
}


@dataclass(frozen=True)
class RouterPoints:
    """Where one stack rounds inside an MoE block (module docstring); checked on construction."""

    logits: str
    softmax: str
    renorm: str
    sigmoid: str
    sigmoid_renorm: str
    ties: str
    weights: str
    expert_out: str
    weighted_term: str
    combine: str
    routed_scale: str
    evidence: dict = field(default_factory=dict, compare=False, hash=False, repr=False)
    """point -> ``rla.profiles.PointEvidence`` (what each value was read or measured from)."""

    def __post_init__(self) -> None:
        for point, allowed in ROUTER_POINTS.items():
            value = getattr(self, point)
            if value not in allowed:
                raise ValueError(f"router point {point}={value!r} is not one of {allowed}")
        if self.routed_scale == "combine" and self.combine != "fp32_slot_order":
            raise ValueError(
                "router routed_scale='combine' scales the fp32 sum before its rounding; it needs "
                f"combine='fp32_slot_order', got combine={self.combine!r}"
            )

    def points(self) -> dict[str, str]:
        """The router points as a plain dict, in :data:`ROUTER_POINTS` order."""
        return {p: getattr(self, p) for p in ROUTER_POINTS}

    def replace(self, **changes) -> "RouterPoints":
        """A copy with ``changes`` (a changed point drops its evidence)."""
        import dataclasses

        unknown = [k for k in changes if k not in ROUTER_POINTS]
        if unknown:
            raise ValueError(f"unknown router point(s) {unknown}; the points are {list(ROUTER_POINTS)}")
        evidence = {p: e for p, e in self.evidence.items() if p not in changes}
        return dataclasses.replace(self, evidence=evidence, **changes)
