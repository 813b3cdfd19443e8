"""Gemma 4's model-body variant points (``rla.profiles.variant_points``), realised with the rmsnorm region.

- ``ple_inputs='fused'``: the per-layer inputs ``(norm(G * ps) + E * es) * s`` as one fp32 expression,
  rounded once: the per-layer table's forward returns its rows times their lp scale unrounded (HF's
  ``get_per_layer_inputs`` only reshapes it), the model's ``project_per_layer_inputs`` is replaced by
  the same expression in fp32 (the projection's GEMM and its lp output as HF's, the scales as the
  model holds them), and the projection's norm hands it its fp32 output. Per-layer inputs passed in
  by the caller (``per_layer_inputs=``, lp) enter the chain as they are.
- ``stream_variance='fp32'`` (under ``norm_residual='fp32_sum'``, where a layer hands on its fp32
  output ``s``): the input norms of layers 1.. and the final norm normalise RN(s) with the mean square
  of ``s`` (``rla.ops.rms_norm(..., variance_of=s)``).
- ``embed_variance='fp32'``: the scaled embedding's forward returns HF's product RN(u), ``u = E * RN(c)``,
  and keeps ``u`` on that tensor (attribute :data:`UNROUNDED`: it lives as long as the embeddings do);
  the first layer's input norm normalises RN(u) with the mean square of ``u``. A forward from
  ``inputs_embeds`` (no ids) has no ``u``: that norm then takes the mean square of what it normalises,
  as HF's does.

``ple_add`` is the decoder layer's (``rla.alignment.gemma4``). On CUDA too the two-input norm is the
PyTorch reference (no fused kernel takes the second input yet).
"""

from __future__ import annotations

import types

import torch

from rla import ops
from rla.alignment.patch import install
from rla.alignment.rmsnorm import stack_dtype
from rla.profiles import RoundingProfile

__all__ = ["UNROUNDED", "align_body_points", "body_notes"]

#: The attribute on the aligned scaled embedding's output that holds its fp32 product u.
UNROUNDED = "_rla_unrounded"


def _weight(norm, x):
    if norm.with_scale:
        return norm.weight, stack_dtype(x, norm.weight)
    lp = stack_dtype(x, x)
    return torch.ones(x.shape[-1], dtype=lp, device=x.device), lp


def _as_float(scale):
    return scale.float() if isinstance(scale, torch.Tensor) else float(scale)


def _embed_forward(self, input_ids):
    rows = torch.nn.Embedding.forward(self, input_ids)
    scale = self.embed_scale.to(self.weight.dtype)
    out = rows * scale  # HF's product: RN(u), u exact in fp32 (two lp factors)
    if out.dtype in (torch.bfloat16, torch.float16):  # an fp32 model rounds nothing here
        setattr(out, UNROUNDED, rows.float() * scale.float())
    return out


def _table_forward(self, input_ids):
    """The per-layer table's rows times their lp scale, in fp32, unrounded."""
    return torch.nn.Embedding.forward(self, input_ids).float() * self.embed_scale.to(self.weight.dtype).float()


def _project_forward(self, inputs_embeds, per_layer_inputs=None):
    lp = stack_dtype(inputs_embeds, self.per_layer_model_projection.weight)
    proj = self.per_layer_model_projection(inputs_embeds).float() * _as_float(self.per_layer_model_projection_scale)
    proj = proj.reshape(*inputs_embeds.shape[:-1], self.config.num_hidden_layers, self.hidden_size_per_layer_input)
    proj = self.per_layer_projection_norm(proj)  # its fp32 output (installed so)
    if per_layer_inputs is None:
        return proj.to(lp)
    return ((proj + per_layer_inputs.float()) * _as_float(self.per_layer_input_scale)).to(lp)


def _stream_norm_forward(profile: RoundingProfile, plain):
    """The plain aligned norm, but an fp32 input in an lp stack (a layer's fp32 output) is normalised
    rounded, with its own mean square."""
    def forward(self, hidden_states):
        weight, lp = _weight(self, hidden_states)
        if hidden_states.dtype != torch.float32 or lp == torch.float32:
            return plain(self, hidden_states)
        return ops.rms_norm(hidden_states.to(lp), weight, self.eps, profile, dtype=lp, variance_of=hidden_states)

    return forward


def _embed_norm_forward(profile: RoundingProfile, plain):
    """The first input norm: the mean square of the embedding's fp32 product where it carries one."""
    def forward(self, hidden_states):
        u = getattr(hidden_states, UNROUNDED, None)
        if u is None or u.shape != hidden_states.shape:
            return plain(self, hidden_states)
        weight, lp = _weight(self, hidden_states)
        return ops.rms_norm(hidden_states, weight, self.eps, profile, dtype=lp, variance_of=u)

    return forward


def align_body_points(body, found: dict, p: RoundingProfile, plain, fp32_out) -> set:
    """Install what ``p``'s model-body points say on ``body`` (the norms get ``plain`` / ``fp32_out``,
    the aligned norm forwards, or the forwards built here); -> the ids of the norms installed here
    (the caller installs the rest)."""
    done = set()
    layers = found["layers"]
    if p.ple_inputs == "fused" and getattr(body, "hidden_size_per_layer_input", 0):
        install(body.embed_tokens_per_layer, "ple_table",
                {"forward": types.MethodType(_table_forward, body.embed_tokens_per_layer)})
        install(body, "ple_inputs", {"project_per_layer_inputs": types.MethodType(_project_forward, body)})
        norm = body.per_layer_projection_norm
        install(norm, "norm", {"forward": types.MethodType(fp32_out, norm)})
        done.add(id(norm))
    if p.stream_variance == "fp32" and p.norm_residual == "fp32_sum":
        forward = _stream_norm_forward(p, plain)
        for norm in [layer.input_layernorm for layer in layers[1:]] + [found["final"]]:
            install(norm, "norm", {"forward": types.MethodType(forward, norm)})
            done.add(id(norm))
    if p.embed_variance == "fp32":
        install(body.embed_tokens, "embedding", {"forward": types.MethodType(_embed_forward, body.embed_tokens)})
        norm = layers[0].input_layernorm
        install(norm, "norm", {"forward": types.MethodType(_embed_norm_forward(p, plain), norm)})
        done.add(id(norm))
    return done


def body_notes(body, p: RoundingProfile) -> list[str]:
    """What the report says of the model-body points that took effect."""
    notes = []
    if p.ple_inputs == "fused" and getattr(body, "hidden_size_per_layer_input", 0):
        notes.append("ple_inputs='fused': the per-layer inputs (norm(G * ps) + E * es) * s computed in fp32, the "
                     "projection norm's output unrounded, rounded once")
    if p.ple_add == "rounded" and p.residual_stream == "fp32_carry" and getattr(body, "hidden_size_per_layer_input", 0):
        notes.append("ple_add='rounded': the per-layer-input add reads RN(s), the tensor the gate's GEMM reads, not "
                     "the fp32 sum residual_stream='fp32_carry' carries")
    if p.stream_variance == "fp32" and p.norm_residual == "fp32_sum":
        notes.append("stream_variance='fp32': the input norms after the first layer and the final norm normalise the "
                     "rounded layer output with the mean square of its fp32 value")
    if p.embed_variance == "fp32":
        notes.append("embed_variance='fp32': the first input norm normalises the rounded scaled embedding with the "
                     "mean square of its fp32 product (a forward from inputs_embeds has no such product: there the "
                     "norm takes the mean square of what it normalises, as HF's)")
    return notes
