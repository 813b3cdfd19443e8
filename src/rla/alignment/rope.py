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
import warnings

import torch

from rla import ops
from rla.alignment import compat, liger
from rla.alignment.families import Family, class_named
from rla.alignment.patch import install, with_globals
from rla.alignment.qk_chain import fuse_qk_norm_into_rope
from rla.alignment.rmsnorm import stack_dtype
from rla.alignment.alignment_report import FixedHazard
from rla.profiles import RoundingProfile

__all__ = ["align_rotary", "align_attention", "make_apply_rotary", "make_apply_partial_rotary",
           "make_apply_interleaved_rotary", "make_apply_qk_norm_rope", "fp32_inv_freq", "angle_error"]


#: Rope types whose frequencies HF's ``dynamic_rope_update`` recomputes during the forward.
_DYNAMIC = ("dynamic", "longrope")


def _frequencies(self, device: torch.device) -> torch.Tensor:
    """The fp32 ``inv_freq`` the aligned rotary multiplies positions by, on ``device``.

    Static rope types: computed once per device by the module's own init function from the config,
    evaluated where the profile says (``rope_inv_freq``: ``host`` = on the CPU, as HF's init does;
    ``device`` = on ``device``, as the engines build their cos/sin cache) and kept outside the
    module's buffers, so ``model.to(torch.bfloat16)`` / ``.half()`` / an FSDP cast after
    ``rla.align`` cannot round it. Dynamic types read the buffer HF's decorator maintains (it
    recomputes on the input's device); a cast that rounded it is undone here from the config.
    """
    state = self.__dict__["_rla_rotary"]
    if self.rope_type in _DYNAMIC:
        inv_freq = self.inv_freq
        if inv_freq.dtype != torch.float32:
            _note_cast(state, inv_freq.dtype)
            grown = getattr(self, "max_seq_len_cached", 0) > getattr(self, "original_max_seq_len", 0)
            seq_len = self.max_seq_len_cached if grown and self.rope_type == "dynamic" else None
            fresh = compat.rope_init(self, device, seq_len=seq_len)[0]
            self._buffers["inv_freq"] = fresh
            if "original_inv_freq" in self._buffers and self._buffers["original_inv_freq"].dtype != torch.float32:
                self._buffers["original_inv_freq"] = compat.rope_init(self, device)[0]
            inv_freq = fresh
        return inv_freq.to(device)
    cache = state["inv_freq"]
    if device not in cache:
        where = device if state["evaluate_on"] == "device" else torch.device("cpu")
        cache[device] = compat.rope_init(self, where)[0].to(device)
    buffer = self._buffers.get("inv_freq")
    if buffer is not None and buffer.dtype != torch.float32:
        _note_cast(state, buffer.dtype)
    return cache[device]


def _note_cast(state: dict, dtype: torch.dtype) -> None:
    """Report, once, that the model was cast after ``rla.align`` (and that it did no harm)."""
    if state["cast_seen"]:
        return
    state["cast_seen"] = True
    name = str(dtype).replace("torch.", "")
    message = (
        f"the model was cast to {name} after rla.align (its RoPE inv_freq buffer is {name} now); "
        "the aligned rotary keeps computing cos/sin from fp32 frequencies, as the engine does"
    )
    state["report"].hazards.append(FixedHazard("cast after align", message))
    warnings.warn("rla.align: " + message, stacklevel=3)


def _aligned_rotary_forward(self, x, position_ids):
    inv_freq = _frequencies(self, x.device)
    freqs = position_ids[..., None].to(torch.float32) * inv_freq
    cos, sin = freqs.cos(), freqs.sin()
    if self.attention_scaling != 1.0:
        cos, sin = cos * self.attention_scaling, sin * self.attention_scaling
    if self.__dict__["_rla_rotary"]["round_tables"]:  # the q/k-norm -> RoPE chain reads the stack
        lp = x.dtype  # dtype off the tables (see make_apply_rotary); the profile rounds them anyway
        if lp == torch.float32 and torch.is_autocast_enabled(x.device.type):
            lp = torch.get_autocast_dtype(x.device.type)
        cos, sin = cos.to(lp), sin.to(lp)
    return cos, sin


#: The aligned rotary forward, with HF's own dynamic/longrope frequency update around it.
ROTARY_FORWARD = compat.dynamic_rope_update(_aligned_rotary_forward)


def make_apply_rotary(profile: RoundingProfile, impl=None):
    """``apply_rotary_pos_emb`` with HF's signature, running ``rla.ops.rope`` under ``profile``
    (``impl`` replaces ``rla.ops``: engine-backed ops).

    Under ``qk_norm_out='fp32'`` the aligned q/k norms hand RoPE their unrounded fp32 output and
    the aligned rotary hands it cos/sin already rounded to the stack dtype (the profile rounds
    them anyway): RoPE reads the stack dtype off the tables and rounds its output to it once.
    (An attention forward rebuilt by ``rla.alignment.qk_chain`` calls
    :func:`make_apply_qk_norm_rope`'s function instead: one op for the whole chain.)

    The function closes over the profile alone and reads ``ops`` as a module global: Dynamo names
    a guard on any other closure cell of a function rebuilt around copied globals by the module
    the globals came from, and fails to build it (torch 2.13). For the same reason its defaults
    are HF's own (``unsqueeze_dim=1``): Dynamo reads them back through HF's function.
    """
    if impl is None:
        def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
            dtype = cos.dtype if q.dtype == torch.float32 and cos.dtype != torch.float32 else None
            return ops.rope(q, k, cos, sin, profile, unsqueeze_dim=unsqueeze_dim, dtype=dtype)
    else:
        rope = impl.rope

        def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
            dtype = cos.dtype if q.dtype == torch.float32 and cos.dtype != torch.float32 else None
            return rope(q, k, cos, sin, profile, unsqueeze_dim=unsqueeze_dim, dtype=dtype)

    apply_rotary_pos_emb.__doc__ = f"rla.ops.rope under profile {profile.name!r} (installed by rla.align)."
    return apply_rotary_pos_emb


def make_apply_partial_rotary(profile: RoundingProfile, half_tables: bool):
    """``apply_rotary_pos_emb`` of a partial-rotary family (GLM-4 MoE, Qwen3.5): ``rla.ops.rope`` on
    ``q[..., :rotary_dim]``, the rest passed through (rounded to the stack dtype when an aligned q/k
    norm handed it on unrounded under ``qk_norm_out='fp32'``), as HF's and vLLM's partial rotary
    leave it. ``half_tables``: the tables are the aligned rotary's [..., rotary_dim / 2] halves."""
    def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
        dtype = cos.dtype if q.dtype == torch.float32 and cos.dtype != torch.float32 else None
        lp = dtype or q.dtype
        d = cos.shape[-1] * (2 if half_tables else 1)
        qr, kr = ops.rope(q[..., :d], k[..., :d], cos, sin, profile, unsqueeze_dim=unsqueeze_dim, dtype=dtype)
        return torch.cat([qr, q[..., d:].to(lp)], dim=-1), torch.cat([kr, k[..., d:].to(lp)], dim=-1)

    apply_rotary_pos_emb.__doc__ = f"partial rla.ops.rope under profile {profile.name!r} (installed by rla.align)."
    return apply_rotary_pos_emb


def make_apply_interleaved_rotary(profile: RoundingProfile):
    """HF's ``apply_rotary_pos_emb_interleave`` (DeepSeek-V3 with ``config.rope_interleave``), same
    signature, running ``rla.ops.rope`` under ``profile``.

    HF rotates the pairs (x0, x1), (x2, x3), ... by one frequency each and returns them
    de-interleaved, ``cat(x_even*c - x_odd*s, x_odd*c + x_even*s)``: rotate-half RoPE of
    ``cat(x_even, x_odd)`` (HF's docstring says so; its cos/sin are ``cat(freqs, freqs)``). So q
    and k are de-interleaved here (an exact copy, as HF's own slices are) and rotated by the
    rotate-half op, forward and backward; each element is the per-pair product a GPT-J-style
    kernel computes (vLLM's ``is_neox_style=False``), in HF's layout. No other op layout is needed.
    Closes over the profile alone and reads ``ops`` as a module global (see :func:`make_apply_rotary`).
    """
    def apply_rotary_pos_emb_interleave(q, k, cos, sin, position_ids=None, unsqueeze_dim=1):
        q = torch.cat((q[..., 0::2], q[..., 1::2]), dim=-1)
        k = torch.cat((k[..., 0::2], k[..., 1::2]), dim=-1)
        dtype = cos.dtype if q.dtype == torch.float32 and cos.dtype != torch.float32 else None
        return ops.rope(q, k, cos, sin, profile, unsqueeze_dim=unsqueeze_dim, dtype=dtype)

    apply_rotary_pos_emb_interleave.__doc__ = (
        f"interleaved rla.ops.rope under profile {profile.name!r} (installed by rla.align)."
    )
    return apply_rotary_pos_emb_interleave


def make_apply_qk_norm_rope(profile: RoundingProfile, impl=None):
    """The ``apply_rotary_pos_emb`` of an attention forward rebuilt by ``rla.alignment.qk_chain``:
    it receives the raw q/k and the norm modules (``qk_norm=(q_norm, k_norm)``, a required
    keyword, so no default of it exists for Dynamo to guard) and runs ``rla.ops.qk_norm_rope``
    with the norms' own weights and eps, in the stack dtype the aligned norm would use."""
    if impl is None:
        def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1, *, qk_norm):
            qn, kn = qk_norm
            return ops.qk_norm_rope(
                q, k, qn.weight, kn.weight, (qn.variance_epsilon, kn.variance_epsilon), cos, sin, profile,
                unsqueeze_dim=unsqueeze_dim, dtype=stack_dtype(q, qn.weight),
            )
    else:
        qk_norm_rope = impl.qk_norm_rope

        def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1, *, qk_norm):
            qn, kn = qk_norm
            return qk_norm_rope(
                q, k, qn.weight, kn.weight, (qn.variance_epsilon, kn.variance_epsilon), cos, sin, profile,
                unsqueeze_dim=unsqueeze_dim, dtype=stack_dtype(q, qn.weight),
            )

    apply_rotary_pos_emb.__doc__ = (
        f"rla.ops.qk_norm_rope under profile {profile.name!r}: q/k norm and RoPE as one op (installed by rla.align)."
    )
    return apply_rotary_pos_emb


def fp32_inv_freq(rotary: torch.nn.Module) -> torch.Tensor:
    """The fp32 ``inv_freq`` the rotary module's own init computes from its config (on its device)."""
    inv_freq, _ = compat.rope_init(rotary)
    return inv_freq.to(rotary.inv_freq.device)


def angle_error(used: torch.Tensor, reference: torch.Tensor, position: int) -> float:
    """Max |angle error| in radians at ``position`` from using ``used`` instead of ``reference``
    frequencies: max_j |position * (used[j] - reference[j])|, evaluated in fp64."""
    return float((position * (used.detach().double().cpu() - reference.detach().double().cpu())).abs().max())


def align_rotary(rotary: torch.nn.Module, profile: RoundingProfile, report, round_tables: bool = False) -> list[FixedHazard]:
    """Patch one rotary module; returns the hazards it fixed (a rounded ``inv_freq``).

    ``report`` (the alignment's report) receives a hazard later if the model is cast after
    alignment (see :func:`_frequencies`)."""
    hazards: list[FixedHazard] = []
    buffers: dict[str, torch.Tensor] = {}
    state = {"inv_freq": {}, "evaluate_on": profile.rope_inv_freq, "cast_seen": False, "report": report,
             "round_tables": round_tables}
    attrs: dict[str, object] = {"forward": types.MethodType(ROTARY_FORWARD, rotary), "_rla_rotary": state}
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
        dtype = str(old.dtype).replace("torch.", "")
        if old.is_meta:  # rla.align(allow_meta=True): no values to compare
            error = "not measured (the buffer is on the meta device)"
        else:
            error = f"{angle_error(old, inv_freq, position):.3g} rad at position {position}"
        hazards.append(
            FixedHazard(
                "bf16 inv_freq",
                f"RoPE inv_freq was {dtype} (model.to({dtype})): max angle error {error}; "
                "recomputed in fp32 from the config",
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


#: Run the q/k norm -> RoPE chain as one op (``rla.ops.qk_norm_rope``) in attention forwards
#: rebuilt by ``rla.alignment.qk_chain``. False keeps the two-op chain (norms with an fp32 output,
#: then RoPE): the tests compare the two, which must agree bit for bit.
FUSE_QK_NORM_ROPE = True


def align_attention(
    attentions: list[torch.nn.Module], family: Family, profile: RoundingProfile, impl=None, qk_chain: bool = False,
    partial: bool = False,
) -> tuple[int, list[str]]:
    """Give each attention instance a forward whose ``apply_rotary_pos_emb`` is ``rla.ops.rope``.

    ``qk_chain`` (``qk_norm_out='fp32'`` with q/k norms): the forward is rebuilt from HF's source
    so that the q/k norms run inside RoPE's op (``rla.alignment.qk_chain``). Returns (how many
    attentions run the fused op, notes for the report: why a class keeps the two-op chain)."""
    apply_rotary = make_apply_partial_rotary(profile, half_tables=True) if partial else make_apply_rotary(profile, impl)
    fuse = qk_chain and FUSE_QK_NORM_ROPE and not partial
    notes: list[str] = []
    if qk_chain and partial:
        notes.append("q/k norm -> partial RoPE runs as two ops (an fp32 q/k between them): the fused "
                     "qk_norm_rope kernel rotates whole heads")
    if fuse and not callable(getattr(ops if impl is None else impl, "qk_norm_rope", None)):
        notes.append(f"q/k norm -> RoPE runs as two ops (an fp32 q/k between them): {impl!r} has no qk_norm_rope")
        fuse = False
    rebuilt: dict[type, tuple[types.FunctionType, bool]] = {}
    fused = 0
    for attn in attentions:
        klass = class_named(attn, family.cls("attention"))
        if klass not in rebuilt:
            modeling = sys.modules[klass.__module__]
            if not liger.is_liger(modeling.apply_rotary_pos_emb):  # Liger's replaces HF's process-wide;
                compat.check_apply_rotary_signature(modeling.apply_rotary_pos_emb)  # the forward calls it as HF's
            replacements = {"apply_rotary_pos_emb": apply_rotary}
            if family.mla:  # DeepSeek-V3 calls one of the two, as config.rope_interleave says
                compat.check_apply_rotary_interleave_signature(modeling.apply_rotary_pos_emb_interleave)
                replacements["apply_rotary_pos_emb_interleave"] = make_apply_interleaved_rotary(profile)
            forward, why = None, ""
            if fuse:
                forward, why = fuse_qk_norm_into_rope(
                    klass.forward, modeling.__dict__, {"apply_rotary_pos_emb": make_apply_qk_norm_rope(profile, impl)}
                )
            if forward is None and fuse:
                notes.append(
                    f"q/k norm -> RoPE runs as two ops (an fp32 q/k between them): transformers "
                    f"{compat.TRANSFORMERS_VERSION}'s {klass.__name__}.forward does not have the shape "
                    f"rla.alignment.qk_chain rewrites ({why})"
                )
            if forward is None:
                forward = with_globals(klass.forward, modeling.__dict__, replacements)
            rebuilt[klass] = (forward, why == "" and fuse)
        forward, is_fused = rebuilt[klass]
        fused += is_fused
        install(attn, "attention", {"forward": types.MethodType(forward, attn)})
    return fused, notes
