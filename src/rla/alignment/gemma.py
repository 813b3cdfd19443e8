"""Gemma 3's text model (``gemma3_text``): its layer shape, aligned region by region.

What differs from the Llama-shaped families (``docs/families.md`` gives each engine's code):

- **Zero-centred RMSNorm**, ``x * rstd * (1 + w)``: HF, vLLM and SGLang all form ``1 + w`` in fp32
  from the stored weight and round once after the product. ``rla.ops.rms_norm(...,
  weight_offset=1.0)`` computes it; with an fp32 master weight the engine's copy RN(w) is what
  ``1 +`` is added to. Which points hold for these norms is the row's ``zero_centred_norm``
  variant (:meth:`rla.profiles.RoundingProfile.variant`): HF's Gemma norm rounds once (``fused``)
  where its Llama norm rounds twice; vLLM's CUDA norm kernels take only a weight of the input's
  dtype, so with ``enforce_eager`` its Gemma norms still run the PyTorch ops (fp32 sum, PyTorch's
  reduction).
- **Sandwich norms**: ``input_layernorm`` -> attention -> ``post_attention_layernorm`` -> add ->
  ``pre_feedforward_layernorm`` -> MLP -> ``post_feedforward_layernorm`` -> add. The engines fuse
  each add into the norm after it (``pre_feedforward_layernorm`` and the next layer's
  ``input_layernorm``), so ``norm_residual`` decides what those two norms read, and the aligned
  layer hands the next layer the fp32 sum under ``fp32_sum`` (as ``rla.alignment.rmsnorm`` does).
  ``residual_stream='fp32_carry'`` is applied by analogy with the Llama layout: the next layer's
  add reads the pre-feed-forward add's fp32 sum (rebuilt by ``rla.ops.carry_add``). Under the
  variant point ``post_norm_out='fp32'`` (vLLM's compiled graph) the post-attention and
  post-feed-forward norms hand the add after them their fp32 output.
- **GeGLU** (``gelu_pytorch_tanh``): ``rla.ops.geglu`` under the ``swiglu`` point (the gated
  product's rounding; the engines' activation-and-mul code is one template for both activations).
- **RoPE**: one rotary module with a table per layer type (sliding: theta 10k; full: theta 1M,
  linear scaling), called as ``rotary_emb(x, position_ids, layer_type)``. The aligned forward
  returns fp32 half tables from fp32 frequencies computed by HF's own init function for that layer
  type, evaluated where ``rope_inv_freq`` says; attention applies them with ``rla.ops.rope``.
  Under ``qk_norm_out='fp32'`` the q/k norms hand RoPE their unrounded output (two ops; the fused
  ``qk_norm_rope`` kernel does not take the zero-centred weight).

Left as HF computes them (the report says so): the embedding scale (``sqrt(hidden)`` rounded to
the weights' dtype in HF and vLLM alike), attention (its softcap and sliding window are the
attention's, outside the regions), the final logit softcap.
"""

from __future__ import annotations

import sys
import types

import torch
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from rla import ops
from rla.alignment import compat
from rla.alignment.alignment_report import FixedHazard
from rla.alignment.families import Family, class_named
from rla.alignment.patch import install, uninstall, with_globals
from rla.alignment.rmsnorm import _layer_parameters, layer_start, residual_source, stack_dtype
from rla.alignment.rope import make_apply_rotary
from rla.profiles import RoundingProfile

__all__ = ["align_gemma3", "align_zero_centred_layers", "ZERO_CENTRED", "GEGLU_ACTIVATIONS", "POST_NORMS"]

#: The row variant whose points hold for these models' norms and layers.
ZERO_CENTRED = "zero_centred_norm"

#: ``config.hidden_activation`` values whose gated product ``rla.ops.geglu`` computes.
GEGLU_ACTIVATIONS = ("gelu_pytorch_tanh",)

_NORMS = ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm", "post_feedforward_layernorm")
#: The norms whose output the add after them reads (unrounded under ``post_norm_out='fp32'``).
POST_NORMS = ("post_attention_layernorm", "post_feedforward_layernorm")
_STATIC_ROPE = ("default", "linear")


def _expect(module, family: Family, role: str, where: str) -> torch.nn.Module:
    if module is None or class_named(module, family.cls(role)) is None:
        raise NotImplementedError(
            f"rla.align: expected a {family.cls(role)} at {where}, found {type(module).__name__}. "
            f"transformers {compat.TRANSFORMERS_VERSION} may lay out Gemma 3 differently from what "
            "src/rla/alignment/gemma.py describes."
        )
    return module


def _scan(body, family: Family) -> dict:
    """The modules each region patches; anything unexpected is refused before anything changes."""
    rotary = _expect(getattr(body, "rotary_emb", None), family, "rotary", "model.rotary_emb")
    bad = {t: r for t, r in getattr(rotary, "rope_type", {}).items() if r not in _STATIC_ROPE}
    if bad:
        raise NotImplementedError(f"rla.align: Gemma 3 rope types {bad}; the aligned rotary computes {_STATIC_ROPE}")
    layers = list(body.layers)
    if not layers:
        raise NotImplementedError("rla.align: the model has no decoder layers")
    found = {"rotary": rotary, "layers": layers, "attentions": [], "norms": [], "qk_norms": [], "mlps": [],
             "final": _expect(getattr(body, "norm", None), family, "norm", "model.norm")}
    for i, layer in enumerate(layers):
        where = f"model.layers[{i}]"
        _expect(layer, family, "layer", where)
        attn = _expect(getattr(layer, "self_attn", None), family, "attention", f"{where}.self_attn")
        found["attentions"].append(attn)
        for name in _NORMS:
            found["norms"].append(_expect(getattr(layer, name, None), family, "norm", f"{where}.{name}"))
        for name in ("q_norm", "k_norm"):
            found["qk_norms"].append(_expect(getattr(attn, name, None), family, "norm", f"{where}.self_attn.{name}"))
        found["mlps"].append(_expect(getattr(layer, "mlp", None), family, "mlp", f"{where}.mlp"))
    for norm in found["norms"] + found["qk_norms"] + [found["final"]]:
        if not isinstance(getattr(norm, "eps", None), float) or not isinstance(getattr(norm, "weight", None), torch.Tensor):
            raise NotImplementedError(f"rla.align: {type(norm).__name__} has no float `eps` / `weight`; this "
                                      "transformers release changed Gemma 3's RMSNorm")
    return found


# ---------------------------------------------------------------------------------------------
# norms
# ---------------------------------------------------------------------------------------------


def _norm_forward(profile: RoundingProfile, fp32_out: bool = False, after_add: bool = False):
    out_dtype = torch.float32 if fp32_out else None

    def forward(self, hidden_states):
        lp = stack_dtype(hidden_states, self.weight)
        return ops.rms_norm(hidden_states, self.weight, self.eps, profile, dtype=lp, out_dtype=out_dtype,
                            after_add=after_add, weight_offset=1.0)

    return forward


def _layer_forward(profile: RoundingProfile, index: int, names, defaults):
    fp32_sum = profile.norm_residual == "fp32_sum"
    carry = profile.residual_stream == "fp32_carry"
    reads_sum = fp32_sum and index > 0
    if profile.post_norm_out == "fp32":
        return compat.with_layer_checkpointing(_post_norm_fp32_forward(profile, index, names, defaults))

    def forward(self, hidden_states, *args, **kwargs):
        kwargs, lp, residual, h = layer_start(self, hidden_states, args, kwargs, names, defaults, reads_sum, index,
                                              profile)
        attn_out = self.self_attn(hidden_states=h, **kwargs)[0].to(lp)
        attn_out = self.post_attention_layernorm(attn_out)
        norm = self.pre_feedforward_layernorm  # the add fused into the norm after it, as the engines do
        h, rounded = ops.add_rms_norm(attn_out, residual, norm.weight, norm.eps, profile, weight_offset=1.0,
                                      residual_source=residual_source(hidden_states, residual, reads_sum))
        mlp_out = self.post_feedforward_layernorm(self.mlp(h).to(lp))
        if carry:  # the next add reads the pre-feed-forward add's fp32 sum (see the module docstring)
            return ops.carry_add(attn_out, residual, mlp_out, torch.float32 if fp32_sum else lp)
        if fp32_sum:  # the fp32 sum for the next layer's input norm
            return mlp_out.to(torch.float32, copy=True).add_(rounded)
        return mlp_out + rounded

    return compat.with_layer_checkpointing(forward)


def _post_norm_fp32_forward(profile: RoundingProfile, index: int, names, defaults):
    """The layer under ``post_norm_out='fp32'``: the post-attention and post-feed-forward norms (their
    modules return fp32, :data:`POST_NORMS`) hand the add after them their unrounded output, as vLLM's
    compiled graph does; the adds in fp32 PyTorch ops (``rla.ops.add_rms_norm`` takes an x and a
    residual of one dtype), the pre-feed-forward norm reading the fp32 sum or its rounding
    (``norm_residual``), the MLP's add reading the attention add's fp32 sum under ``fp32_carry``."""
    fp32_sum = profile.norm_residual == "fp32_sum"
    carry = profile.residual_stream == "fp32_carry"
    reads_sum = fp32_sum and index > 0

    def forward(self, hidden_states, *args, **kwargs):
        kwargs, lp, residual, h = layer_start(self, hidden_states, args, kwargs, names, defaults, reads_sum, index,
                                              profile)
        attn_out = self.post_attention_layernorm(self.self_attn(hidden_states=h, **kwargs)[0].to(lp))  # fp32
        s1 = attn_out + residual.to(torch.float32)
        r1 = s1.to(lp)
        norm = self.pre_feedforward_layernorm  # the add fused into the norm after it, as the engines do
        h = ops.rms_norm(s1 if fp32_sum else r1, norm.weight, norm.eps, profile, dtype=lp, after_add=True,
                         weight_offset=1.0)
        s = (s1 if carry else r1.to(torch.float32)) + self.post_feedforward_layernorm(self.mlp(h).to(lp))
        return s if fp32_sum else s.to(lp)

    return forward


# ---------------------------------------------------------------------------------------------
# GeGLU
# ---------------------------------------------------------------------------------------------


def _mlp_forward(profile: RoundingProfile):
    def forward(self, x):
        return self.down_proj(ops.geglu(self.gate_proj(x), self.up_proj(x), profile))

    return forward


# ---------------------------------------------------------------------------------------------
# RoPE: one module, a table per layer type
# ---------------------------------------------------------------------------------------------


def _inv_freq(rotary, layer_type: str, device: torch.device) -> torch.Tensor:
    """fp32 frequencies of ``layer_type`` from HF's own init function, evaluated where the profile
    says (``host``: the CPU, as HF's init; ``device``: where the model runs), cached per device."""
    state = rotary.__dict__["_rla_rotary"]
    key = (layer_type, device)
    if key not in state["inv_freq"]:
        where = device if state["evaluate_on"] == "device" else torch.device("cpu")
        rope_type = rotary.rope_type[layer_type]
        rp = rotary.config.rope_parameters[layer_type]
        if where.type == "cpu":  # HF's own init function (it evaluates on the CPU whatever it is told)
            fn = rotary.compute_default_rope_parameters if rope_type == "default" else ROPE_INIT_FUNCTIONS[rope_type]
            inv_freq, scaling = fn(rotary.config, where, layer_type=layer_type)
        else:  # the same expression on the device (compat.default_inv_freq_on); linear divides by its factor
            inv_freq, scaling = compat.default_inv_freq_on(rp["rope_theta"], rotary.config.head_dim, where), 1.0
            if rope_type == "linear":
                inv_freq = inv_freq / rp["factor"]
        state["inv_freq"][key] = (inv_freq.to(torch.float32).to(device), float(scaling))
    return state["inv_freq"][key]


def _rotary_forward(self, x, position_ids, layer_type):
    inv_freq, scaling = _inv_freq(self, layer_type, x.device)
    freqs = position_ids[..., None].to(torch.float32) * inv_freq
    cos, sin = freqs.cos(), freqs.sin()
    if scaling != 1.0:
        cos, sin = cos * scaling, sin * scaling
    if self.__dict__["_rla_rotary"]["round_tables"]:  # RoPE reads the stack dtype off the tables
        lp = x.dtype
        if lp == torch.float32 and torch.is_autocast_enabled(x.device.type):
            lp = torch.get_autocast_dtype(x.device.type)
        cos, sin = cos.to(lp), sin.to(lp)
    return cos, sin


def _align_rotary(rotary, profile: RoundingProfile, round_tables: bool) -> list[FixedHazard]:
    hazards = []
    rounded = sorted(n for n, b in rotary._buffers.items() if b is not None and b.dtype != torch.float32)
    if rounded:
        hazards.append(FixedHazard(
            "bf16 inv_freq", f"RoPE buffers {rounded} were {rotary._buffers[rounded[0]].dtype} (a cast of the "
            "model); the aligned rotary recomputes each layer type's frequencies in fp32 from the config"))
    state = {"inv_freq": {}, "evaluate_on": profile.rope_inv_freq, "round_tables": round_tables}
    install(rotary, "rotary", {"forward": types.MethodType(_rotary_forward, rotary), "_rla_rotary": state})
    return hazards


def _align_attention(attentions, family: Family, profile: RoundingProfile) -> None:
    rebuilt = {}
    for attn in attentions:
        klass = class_named(attn, family.cls("attention"))
        if klass not in rebuilt:
            modeling = sys.modules[klass.__module__]
            compat.check_apply_rotary_signature(modeling.apply_rotary_pos_emb)
            rebuilt[klass] = with_globals(klass.forward, modeling.__dict__,
                                          {"apply_rotary_pos_emb": make_apply_rotary(profile)})
        install(attn, "attention", {"forward": types.MethodType(rebuilt[klass], attn)})


# ---------------------------------------------------------------------------------------------
# the whole model
# ---------------------------------------------------------------------------------------------


def zero_centred_variant(profile: RoundingProfile, regions: tuple[str, ...], report, what: str,
                         kind: str = ZERO_CENTRED):
    """``(the row's variant for a zero-centred-norm decoder, whether q/k norm -> RoPE runs as the fp32
    chain)``: ``kind`` is ``zero_centred_norm`` (Gemma 3) or a kind extending it (Qwen3.5's
    ``qwen3_5``: its attention's points besides); the report names the variant and, where it changes
    points, a note that ``what`` follows it. The chain with fp32 RoPE tables is refused."""
    p = profile.variant(kind)
    report.variant = kind
    chain = p.qk_norm_out == "fp32" and {"rope", "rmsnorm"} <= set(regions)
    if chain and p.rope_cos_sin == "fp32":
        raise NotImplementedError(f"profile {p.name!r}: qk_norm_out='fp32' with rope_cos_sin='fp32' is not implemented")
    if p is not profile:
        changed = {k: v for k, v in {**p.points(), **p.kind_points(kind)}.items() if getattr(profile, k) != v}
        report.notes.append(f"{what} follow {p.name!r}: {changed}, the row's variant for them (docs/families.md)")
    return p, chain


def align_zero_centred_layers(found: dict, family: Family, profile: RoundingProfile, chain: bool, layer_forward,
                              report, post_norms: tuple[str, ...] = ()) -> None:
    """The rmsnorm region of a decoder with zero-centred norms (Gemma 3, Qwen3.5): every layer's
    forward from ``layer_forward(profile, index, names, defaults)`` (the layout's own adds), every
    norm's (reading the sum the previous add hands on where one precedes it: each later layer's
    input norm and the final norm), the q/k norms' (an fp32 output under the q/k chain, ``chain``).
    ``found``: the scan's ``layers``, ``norms``, ``final`` and ``qk_norms``; ``post_norms``: the
    layer's norms that return their fp32 output (Gemma 3's :data:`POST_NORMS` under
    ``post_norm_out='fp32'``), which the layer forward adds unrounded."""
    names, defaults = _layer_parameters(class_named(found["layers"][0], family.cls("layer")).forward)
    for index, layer in enumerate(found["layers"]):
        install(layer, "layer", {"forward": types.MethodType(layer_forward(profile, index, names, defaults), layer)})
    after_add = {id(found["final"])} | {id(layer.input_layernorm) for layer in found["layers"][1:]}
    fp32_out = {id(getattr(layer, n)) for layer in found["layers"] for n in post_norms}
    for norm in found["norms"] + [found["final"]]:
        forward = _norm_forward(profile, fp32_out=id(norm) in fp32_out, after_add=id(norm) in after_add)
        install(norm, "norm", {"forward": types.MethodType(forward, norm)})
    qk_forward = _norm_forward(profile, fp32_out=chain)
    for norm in found["qk_norms"]:
        install(norm, "norm", {"forward": types.MethodType(qk_forward, norm)})
    report.counts["rmsnorm"] = {"decoder layers": len(found["layers"]),
                                "zero-centred RMSNorm": len(found["norms"]) + 1,
                                "q_norm/k_norm": len(found["qk_norms"])}


def align_gemma3(body, family: Family, profile: RoundingProfile, regions: tuple[str, ...], report) -> None:
    """Align a Gemma 3 text body in ``regions`` under ``profile`` (its ``zero_centred_norm`` variant
    for the norms and the layer); fills ``report``. Refuses before patching anything it cannot do."""
    found = _scan(body, family)
    act = getattr(body.config, "hidden_activation", None)
    if "swiglu" in regions and act not in GEGLU_ACTIVATIONS:
        raise ValueError(f"rla.align 'swiglu' region: Gemma 3's config.hidden_activation is {act!r}; the region "
                         f"aligns the gated product of {GEGLU_ACTIVATIONS}. Align without 'swiglu'.")
    p, chain = zero_centred_variant(profile, regions, report, "zero-centred norms (x * (1 + w)) and Gemma's layers")
    try:
        if "rope" in regions:
            report.hazards.extend(_align_rotary(found["rotary"], p, chain))
            _align_attention(found["attentions"], family, p)
            report.counts["rope"] = {"rotary_emb (per layer type)": 1, "self_attn": len(found["attentions"])}
            if chain:
                report.notes.append("q/k norm -> RoPE runs as two ops (an fp32 q/k between them): the fused "
                                    "qk_norm_rope kernel does not take the zero-centred weight")
        if "swiglu" in regions:
            forward = _mlp_forward(p)
            for mlp in found["mlps"]:
                install(mlp, "mlp", {"forward": types.MethodType(forward, mlp)})
            report.counts["swiglu"] = {"GeGLU mlp (gelu tanh)": len(found["mlps"])}
        if "rmsnorm" in regions:
            post = POST_NORMS if p.post_norm_out == "fp32" else ()
            align_zero_centred_layers(found, family, p, chain, _layer_forward, report, post_norms=post)
            if post:
                report.notes.append("post_norm_out='fp32': the post-attention and post-feed-forward norms hand the "
                                    "add after them their fp32 output (the adds as PyTorch ops, the norms on the "
                                    "PyTorch reference as every zero-centred norm)")
    except BaseException:
        for m in body.modules():
            uninstall(m)
        raise
    report.notes.extend(LEFT_AS_IS)


#: What the alignment of a Gemma 3 model leaves to HF's code, and why (printed in the report).
LEFT_AS_IS = [
    "left as is: the embedding scale sqrt(hidden), rounded to the weights' dtype in HF and vLLM alike",
    "left as is: attention (sliding window, softcap) and the final logit softcap are outside the regions",
]
