"""Liger Kernel under ``rla.align``: recognise what Liger patched, align on top of it, or refuse.

Liger (``liger-kernel``) is one flag in each RL framework: TRL ``use_liger_kernel``, verl
``actor_rollout_ref.model.use_liger``, OpenRLHF ``--ds.use_liger_kernel``. Its
``apply_liger_kernel_to_<family>`` patches, for the dense families rla supports (Llama, Mistral,
Qwen2, Qwen3):

- RoPE: the modeling module's global ``apply_rotary_pos_emb`` becomes ``liger_rotary_pos_emb``,
  for the whole process. The aligned attention forward is rebuilt around a copy of the module's
  globals with rla's RoPE in that name (``rla.alignment.rope``), so Liger's RoPE is never called
  by an aligned attention; Liger's function has another signature than HF's, which is how rla
  used to mistake it for a transformers change.
- RMSNorm and SwiGLU MLP: on a model built after the patch, the classes (``LigerRMSNorm``,
  ``LigerSwiGLUMLP``) replace ``<Prefix>RMSNorm`` / ``<Prefix>MLP``; on a model patched as an
  instance (``model=...``, what TRL and verl do) each module keeps its class and gets Liger's
  ``forward`` as an instance attribute. Either way the module has the family's parameters
  (``weight`` + ``variance_epsilon``; ``gate_proj`` / ``up_proj`` / ``down_proj``), and rla's
  aligned forward, installed per instance, replaces Liger's (``rla.unalign`` gives Liger's back).
  A Liger norm with ``offset != 0`` (Gemma's ``(1 + w)`` weight) is not the family's norm and is
  refused.
- Outside the regions: the fused linear cross-entropy forward of ``<Prefix>ForCausalLM`` (and
  Liger's cross-entropy) is left as it is and keeps working: it reads the aligned body's hidden
  states.

What rla cannot align over (Liger's fused MoE experts, any other module whose forward Liger
replaced inside the decoder body, in a region being aligned) is refused with an error naming
Liger and the flag to change. After aligning, no module of an aligned region runs a Liger forward
(:func:`check_after`); the alignment report lists what Liger had replaced and what it keeps.
"""

from __future__ import annotations

import sys

import torch

from rla.alignment.families import Family, class_named

__all__ = ["FLAGS", "is_liger", "stands_for", "liger_forward", "rope_is_liger", "refusal", "notes_before",
           "outside_notes", "check_after"]

_PACKAGE = "liger_kernel"

#: How each framework turns Liger on (the flag to change when rla refuses).
FLAGS = ("TRL: GRPOConfig(use_liger_kernel=...); verl: actor_rollout_ref.model.use_liger; "
         "OpenRLHF: --ds.use_liger_kernel; by hand: liger_kernel.transformers.apply_liger_kernel_to_<family>(...)")

#: Liger classes that stand in for a family's class (role -> Liger class name).
_STAND_INS = {"norm": "LigerRMSNorm", "mlp": "LigerSwiGLUMLP"}


def is_liger(obj) -> bool:
    """Whether ``obj`` (a function, bound method or class) is defined in the ``liger_kernel`` package."""
    obj = getattr(obj, "__func__", obj)
    module = getattr(obj, "__module__", None) or ""
    return module == _PACKAGE or module.startswith(_PACKAGE + ".")


def stands_for(module: torch.nn.Module, role: str) -> bool:
    """``module`` is the Liger class Liger's own patch puts where the family's ``role`` class was."""
    name = _STAND_INS.get(role)
    klass = class_named(module, name) if name else None
    return klass is not None and is_liger(klass)


def liger_forward(module: torch.nn.Module) -> bool:
    """The forward ``module`` runs (instance attribute, else its class's) is Liger's."""
    forward = module.__dict__.get("forward", None) or type(module).forward
    return is_liger(forward)


def rope_is_liger(attention_class: type) -> bool:
    """The modeling module of ``attention_class`` has Liger's ``apply_rotary_pos_emb`` as its global."""
    modeling = sys.modules.get(attention_class.__module__)
    return modeling is not None and is_liger(getattr(modeling, "apply_rotary_pos_emb", None))


def refusal(what: str) -> NotImplementedError:
    return NotImplementedError(
        f"rla.align: {what}. Liger Kernel patched it and rla cannot align over that kernel. Turn Liger "
        f"off for this model or for that kernel ({FLAGS}), or align without that region."
    )


def _named(body: torch.nn.Module, wanted) -> list[str]:
    ids = {id(m) for m in wanted}
    return [name or type(body).__name__ for name, m in body.named_modules() if id(m) in ids]


def notes_before(body: torch.nn.Module, family: Family, found, regions) -> tuple[list[str], set[int]]:
    """Check what Liger patched in ``body`` before aligning; -> (report notes, ids of Liger modules).

    Raises where a Liger module in a region being aligned is not one rla can replace."""
    norms = found.norms + found.qk_norms
    mlps = found.mlps + found.shared_experts
    liger_norms = [n for n in norms if liger_forward(n)]
    liger_mlps = [m for m in mlps if liger_forward(m)]
    liger_experts = [e for e in found.experts if liger_forward(e) or any(liger_forward(x) for x in e.modules())]
    rope = bool(found.attentions) and rope_is_liger(class_named(found.attentions[0], family.cls("attention")))
    if not (liger_norms or liger_mlps or liger_experts or rope):
        return [], set()
    if "rmsnorm" in regions:
        for norm in liger_norms:
            offset = getattr(norm, "offset", 0.0)
            if offset not in (0, 0.0):
                raise refusal(f"{_named(body, [norm])[0]} is Liger's RMSNorm with offset={offset} (weight read as "
                              f"{offset} + w), not {family.cls('norm')}")
    if "swiglu" in regions and liger_experts:
        raise refusal(f"{', '.join(_named(body, liger_experts)[:3])} run Liger's fused MoE experts")
    replaced, kept = [], []
    for region, present, what in (("rope", rope, "RoPE (apply_rotary_pos_emb, process-wide)"),
                                  ("rmsnorm", bool(liger_norms), f"RMSNorm ({len(liger_norms)} modules)"),
                                  ("swiglu", bool(liger_mlps), f"SwiGLU MLP ({len(liger_mlps)} modules)")):
        if present:
            (replaced if region in regions else kept).append(what)
    notes = []
    if replaced:
        notes.append(f"Liger Kernel: rla's aligned ops replace Liger's {', '.join(replaced)} in this model "
                     "(rla.unalign gives them back)")
    if kept:
        notes.append(f"Liger Kernel: its {', '.join(kept)} still run{'s' if len(kept) == 1 else ''}: "
                     "that region is not aligned")
    return notes, {id(m) for m in liger_norms + liger_mlps + liger_experts}


def outside_notes(model: torch.nn.Module, body: torch.nn.Module) -> list[str]:
    """Liger's patches outside the decoder body (the causal LM's fused linear cross-entropy)."""
    inside = {id(m) for m in body.modules()}
    outside = [name or type(model).__name__ for name, m in model.named_modules()
               if id(m) not in inside and liger_forward(m)]
    if not outside:
        return []
    return [f"Liger Kernel: {', '.join(outside[:3])} keep{'s' if len(outside) == 1 else ''} Liger's forward "
            "(its fused linear cross-entropy; outside rla's regions, it reads the aligned hidden states)"]


def check_after(body: torch.nn.Module, found, regions) -> None:
    """No module of an aligned region may still run a Liger forward (rla's forward must have replaced it)."""
    roles = {"rmsnorm": found.norms + found.qk_norms, "swiglu": found.mlps + found.shared_experts + found.experts}
    left = [m for region, modules in roles.items() if region in regions for m in modules if liger_forward(m)]
    if left:
        raise refusal(f"{', '.join(_named(body, left)[:3])} still run Liger's forward after alignment")
