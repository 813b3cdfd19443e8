"""The ``moe_out`` variant point: what the residual add after an MoE block with shared experts reads.

HF's block returns ``routed + shared`` as an lp add, RN(shared + routed) (``round``). vLLM's compiled
graph forms the same sum outside its opaque fused-MoE op (``MoERunner.forward``: ``shared_output +
fused_output``, each a bf16 tensor from the op) and Inductor fuses it into the next residual add, which
reads it unrounded (``fp32``; the rows' ``moe_experts`` variant, docs/families.md "The engine twin of
GLM-4 MoE"). Under ``fp32`` the aligned block returns ``routed.float() + shared.float()`` (the two lp
outputs exactly as HF computes them, their sum in fp32) and marks itself with :data:`FP32_OUT`; the
aligned decoder layer (``rla.alignment.rmsnorm``, ``rla.alignment.qwen3_5``) then hands that sum to its
residual add unrounded: ``(a + r) + m`` under ``fp32_carry``, ``m + r`` otherwise, rounded once where
the stream is stored. The gradient is autograd's of those fp32 adds (each lp output receives the sum's
gradient cast to lp, as an lp add would give it).

The point belongs to the rmsnorm region (the add is the layer's); under the router region the routed
block forward (``rla.alignment.router``) forms the fp32 sum itself, with the routed scale of a
``routed_scale='output'`` row in fp32 too (vLLM's runner scales the op's output in the same graph). A
block without shared experts hands the add the routed experts' lp output in every stack: nothing to do.
"""

from __future__ import annotations

import types

import torch
import torch.nn.functional as F

from packaging.version import Version

from rla.alignment import compat
from rla.alignment.families import Family
from rla.alignment.patch import install, patch_of, uninstall
from rla.alignment.routed_experts import EXPERTS_KIND
from rla.profiles import RoundingProfile

__all__ = ["FP32_OUT", "fp32_sum", "hands_fp32", "align_blocks", "patch", "unpatch", "note"]

#: Set (to True) on a block whose forward returns the fp32 ``shared + routed`` for the layer's add.
FP32_OUT = "_rla_moe_fp32_out"

#: The oldest transformers whose MoE blocks the fp32-sum forwards were written from (GLM-4 MoE, DeepSeek-V3
#: and Qwen3.5 MoE are refused below it; older Qwen2-MoE blocks are left as HF has them, said in a note).
MIN_TRANSFORMERS = "5.24"


def fp32_sum(row: RoundingProfile, p: RoundingProfile, family: Family) -> bool:
    """Whether the blocks of ``family`` hand the add their fp32 sum: ``row``'s ``moe_experts`` variant
    over ``p`` (the row at the head size, with the family's kind) says ``moe_out='fp32'`` and the
    family's blocks have shared experts."""
    return family.shared_expert is not None and row.variant_on(EXPERTS_KIND, p).moe_out == "fp32"


def hands_fp32(mlp) -> bool:
    """Whether this layer's ``mlp`` returns the fp32 sum its add must read unrounded."""
    return bool(getattr(mlp, FP32_OUT, False))


def _added_forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
    """``Glm4MoeMoE.forward`` / ``DeepseekV3MoE.forward`` (transformers 5.24) with the last add in fp32."""
    shape = hidden_states.shape
    _, topk_weights, topk_indices = self.gate(hidden_states)
    routed = self.experts(hidden_states.view(-1, shape[-1]), topk_indices, topk_weights).view(*shape)
    return routed.float() + self.shared_experts(hidden_states).float()


def _gated_forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
    """``Qwen2MoeSparseMoeBlock.forward`` / ``Qwen3_5MoeSparseMoeBlock.forward`` (5.24) with the last add
    in fp32 (the shared expert's sigmoid gate and its product stay lp, as HF and vLLM's op round them)."""
    b, s, hidden = hidden_states.shape
    x = hidden_states.view(-1, hidden)
    shared = self.shared_expert(x)
    _, routing_weights, selected = self.gate(x)
    routed = self.experts(x, selected, routing_weights)
    shared = F.sigmoid(self.shared_expert_gate(x)) * shared
    return (routed.float() + shared.float()).reshape(b, s, hidden)


_FORWARDS = {"shared_experts": _added_forward, "shared_expert": _gated_forward}


def patch(block: torch.nn.Module, family: Family) -> None:
    """Install the fp32-sum forward on one block (its HF gate, experts and shared experts called as HF
    calls them, so the swiglu region's patches on them still apply)."""
    forward = _FORWARDS[family.shared_expert]
    install(block, "moe_out", {"forward": types.MethodType(forward, block), FP32_OUT: True})


def unpatch(block: torch.nn.Module) -> bool:
    """Undo :func:`patch` on ``block`` when it has it; whether it had (route replay swaps it for the
    routed forward with the same sum, ``rla.alignment.replay``)."""
    p = patch_of(block)
    if p is None or p.role != "moe_out":
        return False
    uninstall(block)
    return True


def align_blocks(blocks: list[torch.nn.Module], family: Family, report) -> None:
    """Patch each block (the rmsnorm region without the router region) and say so in ``report``; below
    :data:`MIN_TRANSFORMERS` leave them as HF has them and say that instead."""
    if compat.TRANSFORMERS_VERSION < Version(MIN_TRANSFORMERS):
        report.notes.append(f"not realised: the row's moe_out='fp32' ({EXPERTS_KIND} variant): transformers "
                            f"{compat.TRANSFORMERS_VERSION} lays out {family.model_type}'s MoE blocks otherwise than "
                            f"rla.alignment.moe_out reads (>= {MIN_TRANSFORMERS}); their shared + routed sum stays "
                            "rounded, as HF computes it")
        return
    for block in blocks:
        patch(block, family)
    note(report, len(blocks))


def note(report, blocks: int) -> None:
    """The report's record of the point: its value, the blocks, a note."""
    report.moe_out = "fp32"
    report.counts.setdefault("rmsnorm", {})["MoE blocks (fp32 shared + routed)"] = blocks
    report.notes.append(f"moe_out='fp32' ({EXPERTS_KIND} variant): {blocks} MoE blocks hand the residual add after "
                        "them the fp32 sum of their shared and routed experts' lp outputs, unrounded, as the engine's "
                        "compiled graph adds them outside its fused-MoE op (docs/families.md)")
