"""The LM head under ``rla.align``: the row's ``lm_head`` point (:mod:`rla.profiles.head`).

The head is not one of the regions: every alignment applies it, whatever ``regions`` says, because
the logits it produces are what every logprob is taken from. What happens to it:

- ``lm_head='fp32'`` (a run with vLLM's ``head_dtype=float32`` or SGLang's
  ``--enable-fp32-lm-head``): the head's forward becomes :func:`rla.ops.lm_head.lm_head`, fp32
  logits of the ``lp`` hidden state and the engine's copy of the weight (RN(w) of an fp32 master),
  under autocast too.
- ``lm_head='lp'`` (every engine's default): a plain head whose weight is in the stack's dtype
  already computes RN(h @ W^T) (HF's ``nn.Linear``, under autocast too), and is left as it is;
  the report says so. A head that computes otherwise -- TRL's ``cast_lm_head_to_fp32`` (an fp32
  weight and an instance ``forward`` that casts the hidden state to fp32), a head cast to fp32 by
  hand -- gets :func:`rla.ops.lm_head.lm_head`'s ``lp`` path: the bf16 GEMM the engine runs.

The patch is per instance (``rla.alignment.patch``): the instance ``forward`` a trainer set (TRL's)
is saved and put back by ``rla.unalign``, which finds the head from the model as ``rla.align``
does (so a pickled or deep-copied model's head is unaligned too); dtypes, parameters and hooks are
never touched. What the patch cannot reach: code that reads ``lm_head.weight`` itself instead of
calling the head -- TRL 1.16's fused LM head (``add_fused_lm_head``: GRPO's training logprobs),
whose dtype ``cast_lm_head_to_fp32`` decides (docs/integrations/trl.md; ``rla doctor`` names a
mismatch with the row).
"""

from __future__ import annotations

import torch

from rla.alignment.patch import install, patch_of, uninstall
from rla.ops.lm_head import lm_head
from rla.profiles import RoundingProfile

__all__ = ["find_head", "align_head", "unalign_head", "AlignedHead", "ROLE"]

ROLE = "lm_head"


def find_head(model: torch.nn.Module, body: torch.nn.Module | None) -> torch.nn.Module | None:
    """The output head (``get_output_embeddings()``) of the causal LM in ``model`` around ``body``
    (None: any); None when ``model`` is the body itself or holds no head."""
    for m in model.modules():
        get = getattr(m, "get_output_embeddings", None)
        if m is body or not callable(get):
            continue
        head = get()
        if isinstance(head, torch.nn.Module) and isinstance(getattr(head, "weight", None), torch.Tensor):
            return head
    return None


class AlignedHead:
    """The aligned head's ``forward``: the row's ``lm_head`` point over the module's own weight and
    bias. A callable object (not a bound method), so a pickled or deep-copied model keeps it."""

    def __init__(self, module: torch.nn.Module, profile: RoundingProfile):
        self.module = module
        self.profile = profile

    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        return lm_head(hidden, self.module.weight, getattr(self.module, "bias", None), self.profile)

    def __repr__(self) -> str:
        return f"AlignedHead(lm_head={self.profile.lm_head!r})"


def _computes_lp(head: torch.nn.Module, body_dtype: torch.dtype | None) -> bool:
    """Whether ``head`` already computes RN(h @ W^T): its class's own forward (no instance
    ``forward`` a trainer set) over a weight in the body's dtype."""
    return "forward" not in head.__dict__ and "_old_forward" not in head.__dict__ and head.weight.dtype == body_dtype


def align_head(model: torch.nn.Module, body: torch.nn.Module, profile: RoundingProfile) -> str:
    """Apply ``profile.lm_head`` to ``model``'s head (module docstring); what was done, for the report."""
    head = find_head(model, body)
    if head is None:
        return "no LM head in the aligned module (align the *ForCausalLM to align its head)"
    unalign_head(model, body)
    if getattr(head, "lora_A", None) is not None:
        raise NotImplementedError(
            f"rla.align: the LM head is a PEFT LoRA layer ({type(head).__name__}); the lm_head point "
            "is applied to a plain head only. Leave lm_head out of the adapter's target_modules")
    body_dtype = next((t.dtype for t in body.parameters() if t.is_floating_point()), None)
    weight = str(head.weight.dtype).replace("torch.", "")
    if profile.lm_head == "lp" and _computes_lp(head, body_dtype):
        return (f"left as it is: its own forward on a {weight} weight already computes the row's lp logits, "
                "RN(h @ W^T)")
    trainer = "a trainer's forward (e.g. TRL's cast_lm_head_to_fp32), kept for rla.unalign; " \
        if "forward" in head.__dict__ else ""
    install(head, ROLE, {"forward": AlignedHead(head, profile)})
    what = ("fp32 logits of the lp hidden state and RN(W), unrounded" if profile.lm_head == "fp32"
            else "lp logits RN(h @ RN(W)^T), the engine's bf16 GEMM")
    return f"aligned ({weight} weight; {trainer}rla.ops.lm_head): {what}"


def unalign_head(model: torch.nn.Module, body: torch.nn.Module) -> bool:
    """Undo :func:`align_head` on ``model``'s head; True when it was aligned."""
    head = find_head(model, body)
    patch = None if head is None else patch_of(head)
    if patch is None or patch.role != ROLE:
        return False
    uninstall(head)
    return True
