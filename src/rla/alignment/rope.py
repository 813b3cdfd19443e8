"""RoPE region: fp32 cos/sin from an fp32 ``inv_freq``, and ``rla.ops.rope`` inside attention.

Two per-instance patches:

- The rotary module's ``forward`` returns fp32 cos/sin half tables [B, S, D/2]: the first half of
  HF's ``cat(freqs, freqs)`` table, which repeats it, as vLLM caches it. The attention's
  ``rla.ops.rope`` reads a quarter of the bytes of HF's table in every layer, forward and backward,
  and rounds them if the profile says ``rope_cos_sin='round'``; nothing else in the supported
  families' layers reads cos/sin. Angles are ``position * inv_freq`` multiplied elementwise in fp32,
  never through a matmul, so TF32 and autocast cannot touch them; ``attention_scaling`` and the
  ``dynamic_rope_update`` decorator behave as in HF. If ``model.to(torch.bfloat16)`` rounded the
  ``inv_freq`` buffer (the phase-drift hazard of docs/rounding.md), it is recomputed in fp32 from the
  config with the module's own init function while aligned; unalign restores the old buffer.
- Each attention instance gets a rebuilt copy of its class's ``forward`` whose globals bind
  ``apply_rotary_pos_emb`` to ``rla.ops.rope`` under the profile. No attention code is copied.
"""

from __future__ import annotations

import sys
import types

import torch

from rla import ops
from rla.alignment import compat
from rla.alignment.families import Family, class_named
from rla.alignment.patch import install, with_globals
from rla.alignment.report import FixedHazard
from rla.profiles import RoundingProfile

__all__ = ["align_rotary", "align_attention", "make_apply_rotary", "fp32_inv_freq", "angle_error"]


def _aligned_rotary_forward(self, x, position_ids):
    inv_freq = self.inv_freq
    if inv_freq.dtype != torch.float32:
        raise RuntimeError(
            f"rla.align: the rotary embedding's inv_freq is {inv_freq.dtype}, not float32: the model "
            "was cast (model.to(dtype) / .half() / .bfloat16()) after rla.align, which rounds RoPE "
            "frequencies (phase drift over long contexts). Call rla.align(model, ...) again after "
            "casting: it recomputes inv_freq in fp32 from the config."
        )
    freqs = position_ids[..., None].to(torch.float32) * inv_freq.to(x.device)
    return freqs.cos() * self.attention_scaling, freqs.sin() * self.attention_scaling


#: The aligned rotary forward, with HF's own dynamic/longrope frequency update around it.
ROTARY_FORWARD = compat.dynamic_rope_update(_aligned_rotary_forward)


def make_apply_rotary(profile: RoundingProfile):
    """``apply_rotary_pos_emb`` with HF's signature, running ``rla.ops.rope`` under ``profile``."""

    def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
        return ops.rope(q, k, cos, sin, profile, unsqueeze_dim=unsqueeze_dim)

    apply_rotary_pos_emb.__doc__ = f"rla.ops.rope under profile {profile.name!r} (installed by rla.align)."
    return apply_rotary_pos_emb


def fp32_inv_freq(rotary: torch.nn.Module) -> torch.Tensor:
    """The fp32 ``inv_freq`` the rotary module's own init computes from its config (on its device)."""
    inv_freq, _ = compat.rope_init(rotary)
    return inv_freq.to(rotary.inv_freq.device)


def angle_error(used: torch.Tensor, reference: torch.Tensor, position: int) -> float:
    """Max |angle error| in radians at ``position`` from using ``used`` instead of ``reference``
    frequencies: max_j |position * (used[j] - reference[j])|, evaluated in fp64."""
    return float((position * (used.detach().double().cpu() - reference.detach().double().cpu())).abs().max())


def align_rotary(rotary: torch.nn.Module) -> list[FixedHazard]:
    """Patch one rotary module; returns the hazards it fixed (a rounded ``inv_freq``)."""
    hazards: list[FixedHazard] = []
    buffers: dict[str, torch.Tensor] = {}
    attrs: dict[str, object] = {"forward": types.MethodType(ROTARY_FORWARD, rotary)}
    rounded = [n for n in ("inv_freq", "original_inv_freq") if n in rotary._buffers
               and rotary._buffers[n] is not None and rotary._buffers[n].dtype != torch.float32]
    if rounded:
        inv_freq, scaling = compat.rope_init(rotary)
        inv_freq = inv_freq.to(rotary.inv_freq.device)
        old = rotary._buffers.get("original_inv_freq")
        if old is None:
            old = rotary._buffers["inv_freq"]
        buffers["inv_freq"] = inv_freq
        if "original_inv_freq" in rotary._buffers:
            buffers["original_inv_freq"] = inv_freq.clone()
        attrs["attention_scaling"] = scaling
        if hasattr(rotary, "original_max_seq_len"):
            attrs["max_seq_len_cached"] = rotary.original_max_seq_len
        position = int(getattr(rotary, "original_max_seq_len", None) or rotary.config.max_position_embeddings)
        error = angle_error(old, inv_freq, position)
        dtype = str(old.dtype).replace("torch.", "")
        hazards.append(
            FixedHazard(
                "bf16 inv_freq",
                f"RoPE inv_freq was {dtype} (model.to({dtype})): max angle error {error:.3g} "
                f"rad at position {position}; recomputed in fp32 from the config",
            )
        )
    if compat.HF_ROTARY_USES_MATMUL and torch.get_float32_matmul_precision() != "highest":
        hazards.append(
            FixedHazard(
                "TF32 RoPE angles",
                f"float32 matmul precision is {torch.get_float32_matmul_precision()!r} and this "
                f"transformers computes angles as inv_freq @ position_ids; the aligned rotary "
                "multiplies elementwise in fp32",
            )
        )
    keep = tuple(n for n in ("inv_freq", "original_inv_freq", "max_seq_len_cached", "attention_scaling",
                             "long_inv_freq") if n in rotary._buffers or n in rotary.__dict__)
    install(rotary, "rotary", attrs, buffers, keep=keep)
    return hazards


def align_attention(attentions: list[torch.nn.Module], family: Family, profile: RoundingProfile) -> None:
    """Give each attention instance a forward whose ``apply_rotary_pos_emb`` is ``rla.ops.rope``."""
    apply_rotary = make_apply_rotary(profile)
    rebuilt: dict[type, types.FunctionType] = {}
    for attn in attentions:
        klass = class_named(attn, family.cls("attention"))
        if klass not in rebuilt:
            modeling = sys.modules[klass.__module__]
            compat.check_apply_rotary_signature(modeling.apply_rotary_pos_emb)
            rebuilt[klass] = with_globals(
                klass.forward, modeling.__dict__, {"apply_rotary_pos_emb": apply_rotary}
            )
        install(attn, "attention", {"forward": types.MethodType(rebuilt[klass], attn)})
