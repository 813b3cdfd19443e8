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
- ``renorm`` (``norm_topk_prob``; Mixtral always): how the k chosen weights are divided by their
  sum s. ``torch`` = w / ``w.sum(-1)`` as HF writes it: the order of ``torch.sum`` over the k
  slots is the running kernel's (slot order on CPU; on CUDA a tree from k = 3 on:
  (w0 + w2) + w1 at k = 3); ``divide`` = w / s with s summed in slot order ((w0 + w1) + w2 ...);
  ``reciprocal`` = w * RN(1 / s), the same s (vLLM's fused renormalisation: one division of the
  routed scale, 1.0, by s, then a multiply per weight). DeepSeek-V3 adds 1e-20 to s as HF does
  (for any s above ~1e-12 an exact no-op in fp32).
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
