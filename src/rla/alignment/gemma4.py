"""Gemma 4's text model (``gemma4_text``, transformers >= 5.24): its layer shape, aligned region by region.

Gemma 3's sandwich layer (``rla.alignment.gemma``) with these differences (``docs/families.md``
gives each engine's code):

- **Plain norms**, ``x * rstd * w`` (``Gemma4RMSNorm``: no ``1 +``; ``with_scale=False`` has no
  weight: the value norm, the router's norm). HF rounds once (the rows' ``gemma4`` variant: ``hf``
  ``norm_weight='fused'``); vLLM and SGLang build them as their plain ``RMSNorm``, so the rows'
  points hold as measured. A weightless norm runs ``rla.ops.rms_norm`` with a weight of ones
  (exact under either ``norm_weight``).
- **No fused add + norm in vLLM's Gemma 4 layer** (``models/gemma4.py``, 0.33 and 0.26): every add
  is ``hidden_states + residual`` in the model code and every norm the plain kernel, so each norm
  reduces in the plain norm's order (``after_add=False``). What a norm after an add reads follows
  ``norm_residual`` (the rounded sum, or the fp32 sum a compiled graph keeps), and the adds inside
  the layer chain follow ``residual_stream`` (``fp32_carry``: each add reads the previous add's fp32
  sum, through the per-layer-input add and the layer scalar), by analogy with the Llama layout
  (vLLM's CPU twin of Gemma 4 reads the rounded sum at the per-layer-input add: docs/families.md).
  Under the variant point ``post_norm_out='fp32'`` the norms of :data:`POST_NORMS` hand their
  add their fp32 output (vLLM's compiled graph, measured on Gemma 3 and Gemma 4 by the CPU twins).
- **A value norm** (``v_norm``, no weight) and **q/k norms** before RoPE; layers sharing another
  layer's K/V (``num_kv_shared_layers``) have only ``q_norm``; ``attention_k_eq_v`` layers reuse
  the key projection as values (HF's own attention forward does all of it).
- **RoPE**: one rotary module with a table per layer type and a head size per layer type
  (``global_head_dim`` for full attention); the full layers' ``proportional`` type rotates the
  first ``partial_rotary_factor`` of each half and gives the rest zero frequencies (an exact
  identity), over the whole head, as vLLM's ``Gemma4RotaryEmbedding`` does. HF's attention calls
  ``apply_rotary_pos_emb(x, cos, sin, unsqueeze_dim=2)`` once per tensor.
- **GeGLU** MLP (``rla.ops.geglu``) and a **per-layer-input gate**: ``gelu_tanh(gate(h)) * p``, two
  PyTorch ops in every engine's Gemma 4 code, under the ``swiglu`` point of the rows'
  ``gemma4_ple`` variant (SGLang's differs from its kernel's).
- **A layer scalar** multiplies the layer's output (a bf16 buffer in HF and the engines alike).

Left as HF computes them (the report says so): the embedding and per-layer-input scales, attention,
the final logit softcap, and in MoE layers the router and the experts (their three norms are
aligned).
"""

from __future__ import annotations

import sys
import types

import torch
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from rla import ops
from rla.alignment import compat, gemma4_body
from rla.alignment.alignment_report import FixedHazard
from rla.alignment.families import Family, class_named
from rla.alignment.patch import install, uninstall, with_globals
from rla.alignment.rmsnorm import _layer_parameters, layer_start, stack_dtype
from rla.profiles import RoundingProfile

__all__ = ["align_gemma4", "VARIANT", "PLE_VARIANT", "GEGLU_ACTIVATIONS", "LEFT_AS_IS", "POST_NORMS"]

#: The rows' variant whose points hold for Gemma 4's norms and layers, and the one for its
#: per-layer-input gate (``rla.profiles.VARIANTS``).
VARIANT, PLE_VARIANT = "gemma4", "gemma4_ple"

#: ``config.hidden_activation`` values whose gated product ``rla.ops.geglu`` computes.
GEGLU_ACTIVATIONS = ("gelu_pytorch_tanh",)

_NORM = "Gemma4RMSNorm"  # not "<prefix>RMSNorm": the norm class has no "Text" in its name
_LAYER_NORMS = ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                "post_feedforward_layernorm")
_MOE_NORMS = ("post_feedforward_layernorm_1", "post_feedforward_layernorm_2", "pre_feedforward_layernorm_2")
#: The norms whose output a residual add reads (unrounded under ``post_norm_out='fp32'``).
POST_NORMS = ("post_attention_layernorm", "post_feedforward_layernorm", "post_per_layer_input_norm")
_ROPE_TYPES = ("default", "proportional")


def _expect(module, name: str, where: str) -> torch.nn.Module:
    if module is None or class_named(module, name) is None:
        raise NotImplementedError(
            f"rla.align: expected a {name} at {where}, found {type(module).__name__}. transformers "
            f"{compat.TRANSFORMERS_VERSION} may lay out Gemma 4 differently from src/rla/alignment/gemma4.py."
        )
    return module


def _check_rope(rotary) -> None:
    types_ = getattr(rotary, "rope_type", {})
    bad = {t: r for t, r in types_.items() if r not in _ROPE_TYPES}
    if bad or not types_:
        raise NotImplementedError(f"rla.align: Gemma 4 rope types {bad or types_}; the aligned rotary computes "
                                  f"{_ROPE_TYPES}")
    for t, r in types_.items():
        factor = rotary.config.rope_parameters[t].get("factor", 1.0)
        if r == "proportional" and factor != 1.0:
            raise NotImplementedError(
                f"rla.align: Gemma 4's {t} rope is proportional with factor {factor}: HF divides its frequencies by "
                "it, vLLM's Gemma4RotaryEmbedding (rotary_embedding/gemma4_rope.py) does not, so no row says which "
                "frequencies the engine uses. Align without 'rope'.")


def _scan(body, family: Family) -> dict:
    """The modules each region patches; anything unexpected is refused before anything changes."""
    rotary = _expect(getattr(body, "rotary_emb", None), family.cls("rotary"), "model.rotary_emb")
    _check_rope(rotary)
    layers = list(body.layers)
    if not layers:
        raise NotImplementedError("rla.align: the model has no decoder layers")
    found = {"rotary": rotary, "layers": layers, "attentions": [], "norms": [], "qk_norms": [], "v_norms": [],
             "mlps": [], "ple_layers": [], "moe_layers": [],
             "final": _expect(getattr(body, "norm", None), _NORM, "model.norm")}
    if getattr(body, "hidden_size_per_layer_input", 0):
        found["norms"].append(_expect(getattr(body, "per_layer_projection_norm", None), _NORM,
                                      "model.per_layer_projection_norm"))
    for i, layer in enumerate(layers):
        where = f"model.layers[{i}]"
        _expect(layer, family.cls("layer"), where)
        attn = _expect(getattr(layer, "self_attn", None), family.cls("attention"), f"{where}.self_attn")
        found["attentions"].append(attn)
        names = list(_LAYER_NORMS)
        if layer.hidden_size_per_layer_input:
            names.append("post_per_layer_input_norm")
            found["ple_layers"].append(layer)
        if layer.enable_moe_block:
            names.extend(_MOE_NORMS)
            found["moe_layers"].append(layer)
        for name in names:
            found["norms"].append(_expect(getattr(layer, name, None), _NORM, f"{where}.{name}"))
        found["qk_norms"].append(_expect(getattr(attn, "q_norm", None), _NORM, f"{where}.self_attn.q_norm"))
        if not attn.is_kv_shared_layer:  # a layer reading another layer's K/V has no k/v norms
            found["qk_norms"].append(_expect(getattr(attn, "k_norm", None), _NORM, f"{where}.self_attn.k_norm"))
            found["v_norms"].append(_expect(getattr(attn, "v_norm", None), _NORM, f"{where}.self_attn.v_norm"))
        found["mlps"].append(_expect(getattr(layer, "mlp", None), family.cls("mlp"), f"{where}.mlp"))
    for norm in found["norms"] + found["qk_norms"] + found["v_norms"] + [found["final"]]:
        weight = getattr(norm, "weight", None) if getattr(norm, "with_scale", None) else torch.empty(0)
        if not isinstance(getattr(norm, "eps", None), float) or not isinstance(weight, torch.Tensor):
            raise NotImplementedError(f"rla.align: {type(norm).__name__} has no float `eps` / `with_scale` and "
                                      "`weight`; this transformers release changed Gemma 4's RMSNorm")
    return found


# ---------------------------------------------------------------------------------------------
# norms: x * rstd * w, a weight of ones where the norm has none
# ---------------------------------------------------------------------------------------------


def _norm_forward(profile: RoundingProfile, fp32_out: bool = False):
    out_dtype = torch.float32 if fp32_out else None

    def forward(self, hidden_states):
        if self.with_scale:
            weight = self.weight
            lp = stack_dtype(hidden_states, weight)
        else:  # x * rstd rounded once: a weight of ones is exact under either norm_weight
            lp = stack_dtype(hidden_states, hidden_states)
            weight = torch.ones(hidden_states.shape[-1], dtype=lp, device=hidden_states.device)
        return ops.rms_norm(hidden_states, weight, self.eps, profile, dtype=lp, out_dtype=out_dtype)

    return forward


# ---------------------------------------------------------------------------------------------
# the decoder layer: its adds, the per-layer-input gate, the layer scalar
# ---------------------------------------------------------------------------------------------


def _layer_forward(stream: RoundingProfile | None, ple: RoundingProfile | None, index: int, names, defaults):
    """The layer's forward. ``stream``: the profile whose ``norm_residual`` / ``residual_stream`` the
    adds follow (None: HF's, every add rounded); ``ple``: the profile of the per-layer-input gate's
    product (None: HF's ``act_fn(g) * p``). The norms are the layer's modules (aligned or HF's)."""
    fp32_sum = stream is not None and stream.norm_residual == "fp32_sum"
    carry = stream is not None and stream.residual_stream == "fp32_carry"
    ple_carry = carry and stream.ple_add == "stream"  # the per-layer-input add reads the carried sum
    reads_sum = fp32_sum and index > 0

    def forward(self, hidden_states, *args, **kwargs):
        kwargs, lp, residual, h = layer_start(self, hidden_states, args, kwargs, names, defaults, reads_sum, index,
                                              stream)
        per_layer_input = kwargs.pop("per_layer_input", None)
        attn_out = self.post_attention_layernorm(self.self_attn(hidden_states=h, **kwargs)[0].to(lp))
        s1 = attn_out.to(torch.float32) + residual  # the fp32 sum; RN of it is the lp add
        r1 = s1.to(lp)
        h = self.pre_feedforward_layernorm(s1 if fp32_sum else r1)
        mlp_out = self.mlp(h)
        if self.enable_moe_block:  # HF's router and experts, reading what HF's read; their norms aligned
            flat = r1.reshape(-1, r1.shape[-1])
            _, top_k_weights, top_k_index = self.router(flat)
            experts_in = self.pre_feedforward_layernorm_2((s1 if fp32_sum else r1).reshape(flat.shape))
            moe_out = self.experts(experts_in, top_k_index, top_k_weights).reshape(r1.shape)
            mlp_out = self.post_feedforward_layernorm_1(mlp_out) + self.post_feedforward_layernorm_2(moe_out)
        mlp_out = self.post_feedforward_layernorm(mlp_out.to(lp))
        s = (s1 if carry else r1.to(torch.float32)) + mlp_out  # the MLP's add, in fp32
        if self.hidden_size_per_layer_input:
            rounded = s.to(lp)
            gate = self.per_layer_input_gate(rounded)
            gated = self.act_fn(gate) * per_layer_input if ple is None else ops.geglu(gate, per_layer_input, ple)
            ple_out = self.post_per_layer_input_norm(self.per_layer_projection(gated).to(lp))
            s = (s if ple_carry else rounded.to(torch.float32)) + ple_out
        if fp32_sum:  # the next layer's input norm (or the final norm) reads the fp32 value
            return s * self.layer_scalar.to(torch.float32)
        if carry:  # the chain rounded once, at the layer's output
            return (s * self.layer_scalar.to(torch.float32)).to(lp)
        return (s.to(lp) * self.layer_scalar).to(lp)  # HF's in-place product: RN(RN(s) * scalar)

    return compat.with_layer_checkpointing(forward)


# ---------------------------------------------------------------------------------------------
# GeGLU
# ---------------------------------------------------------------------------------------------


def _mlp_forward(profile: RoundingProfile):
    def forward(self, x):
        return self.down_proj(ops.geglu(self.gate_proj(x), self.up_proj(x), profile))

    return forward


# ---------------------------------------------------------------------------------------------
# RoPE: one module, a table and a head size per layer type
# ---------------------------------------------------------------------------------------------


def _device_inv_freq(rp: dict, rope_type: str, dim: int, device: torch.device) -> torch.Tensor:
    """The frequencies of one layer type evaluated on ``device``, op for op HF's init functions'
    expression (default; proportional: the rotated angles, then zeros for the rest)."""
    if rope_type == "default":
        return compat.default_inv_freq_on(rp["rope_theta"], dim, device)
    angles = int(rp.get("partial_rotary_factor", 1.0) * dim // 2)
    exponent = torch.arange(0, 2 * angles, 2, dtype=torch.int64).to(device=device, dtype=torch.float) / dim
    inv_freq = 1.0 / (rp["rope_theta"] ** exponent)
    return torch.cat((inv_freq, torch.zeros(dim // 2 - angles, dtype=torch.float32, device=device)))


def _inv_freq(rotary, layer_type: str, device: torch.device) -> torch.Tensor:
    """fp32 frequencies of ``layer_type``, evaluated where the profile says (``host``: the CPU, with
    HF's own init function; ``device``: where the model runs), cached per device."""
    state = rotary.__dict__["_rla_rotary"]
    key = (layer_type, device)
    if key not in state["inv_freq"]:
        rope_type = rotary.rope_type[layer_type]
        layer_config = rotary.config.per_layer_config[layer_type]
        if state["evaluate_on"] == "device" and device.type != "cpu":
            inv_freq = _device_inv_freq(rotary.config.rope_parameters[layer_type], rope_type, layer_config.head_dim,
                                        device)
        else:  # HF's own init function, on the CPU as its __init__ runs it
            fn = rotary.compute_default_rope_parameters if rope_type == "default" else ROPE_INIT_FUNCTIONS[rope_type]
            inv_freq = fn(layer_config, torch.device("cpu"), layer_type=layer_type)[0]
        state["inv_freq"][key] = inv_freq.to(torch.float32).to(device)
    return state["inv_freq"][key]


def _rotary_forward(self, x, position_ids, layer_type):
    freqs = position_ids[..., None].to(torch.float32) * _inv_freq(self, layer_type, x.device)
    cos, sin = freqs.cos(), freqs.sin()  # half tables [..., D/2]
    scaling = getattr(self, f"{layer_type}_attention_scaling", 1.0)
    if scaling != 1.0:
        cos, sin = cos * scaling, sin * scaling
    if self.__dict__["_rla_rotary"]["round_tables"]:  # RoPE reads the stack dtype off the tables
        lp = x.dtype
        if lp == torch.float32 and torch.is_autocast_enabled(x.device.type):
            lp = torch.get_autocast_dtype(x.device.type)
        cos, sin = cos.to(lp), sin.to(lp)
    return cos, sin


def _align_rotary(rotary, profile: RoundingProfile, round_tables: bool) -> list[FixedHazard]:
    rounded = sorted(n for n, b in rotary._buffers.items() if b is not None and b.dtype != torch.float32)
    hazards = []
    if rounded:
        hazards.append(FixedHazard(
            "bf16 inv_freq", f"RoPE buffers {rounded} were {rotary._buffers[rounded[0]].dtype} (a cast of the "
            "model); the aligned rotary recomputes each layer type's frequencies in fp32 from the config"))
    state = {"inv_freq": {}, "evaluate_on": profile.rope_inv_freq, "round_tables": round_tables}
    install(rotary, "rotary", {"forward": types.MethodType(_rotary_forward, rotary), "_rla_rotary": state})
    return hazards


def make_apply_rotary_one(profile: RoundingProfile):
    """Gemma 4's ``apply_rotary_pos_emb(x, cos, sin, unsqueeze_dim)`` (one tensor), running
    ``rla.ops.rope`` under ``profile``. The op rotates a pair: the second is x's first head (a view,
    its output discarded), which costs 1/heads of the rotation and keeps the op as it is. An fp32
    ``x`` with rounded tables is a q/k norm's unrounded output (``qk_norm_out='fp32'``)."""
    def apply_rotary_pos_emb(x, cos, sin, unsqueeze_dim=1):
        dtype = cos.dtype if x.dtype == torch.float32 and cos.dtype != torch.float32 else None
        return ops.rope(x, x.narrow(unsqueeze_dim, 0, 1), cos, sin, profile, unsqueeze_dim=unsqueeze_dim,
                        dtype=dtype)[0]

    apply_rotary_pos_emb.__doc__ = f"rla.ops.rope of one tensor under profile {profile.name!r} (installed by rla.align)."
    return apply_rotary_pos_emb


def _check_apply_rotary_signature(fn) -> None:
    import inspect

    params = list(inspect.signature(fn).parameters)
    if params != ["x", "cos", "sin", "unsqueeze_dim"]:
        raise RuntimeError(f"transformers {compat.TRANSFORMERS_VERSION}: Gemma 4's apply_rotary_pos_emb{tuple(params)} "
                           "no longer has the signature (x, cos, sin, unsqueeze_dim) that rla.align replaces; update "
                           "src/rla/alignment/gemma4.py")


def _align_attention(attentions, family: Family, profile: RoundingProfile) -> None:
    rebuilt = {}
    for attn in attentions:
        klass = class_named(attn, family.cls("attention"))
        if klass not in rebuilt:
            modeling = sys.modules[klass.__module__]
            _check_apply_rotary_signature(modeling.apply_rotary_pos_emb)
            rebuilt[klass] = with_globals(klass.forward, modeling.__dict__,
                                          {"apply_rotary_pos_emb": make_apply_rotary_one(profile)})
        install(attn, "attention", {"forward": types.MethodType(rebuilt[klass], attn)})


# ---------------------------------------------------------------------------------------------
# the whole model
# ---------------------------------------------------------------------------------------------


def _variants(profile: RoundingProfile, report) -> tuple[RoundingProfile, RoundingProfile]:
    """(the row's ``gemma4`` variant, its ``gemma4_ple`` variant); the report names the first and
    notes where either changes points."""
    p, ple = profile.variant(VARIANT), profile.variant(PLE_VARIANT)
    report.variant = VARIANT
    for what, v, kind in (("Gemma 4's norms and layers follow", p, VARIANT),
                          ("the per-layer-input gate gelu_tanh(g) * p follows", ple, PLE_VARIANT)):
        if v is not profile:
            changed = {k: x for k, x in {**v.points(), **v.kind_points(kind)}.items() if getattr(profile, k) != x}
            report.notes.append(f"{what} {v.name!r}: {changed}, the row's variant for them (docs/families.md)")
    return p, ple


def _check_head_sizes(body, report, p: RoundingProfile) -> None:
    """A row whose points depend on the head size (``conditions``) must give both layer types' head
    sizes the same points: the aligned model runs one profile."""
    sizes = {body.config.per_layer_config[t].head_dim for t in set(body.config.layer_types)}
    row = report.profile
    at = {h: row.at_head_size(h).points() for h in sizes}
    if len({tuple(v.items()) for v in at.values()}) > 1:
        raise NotImplementedError(
            f"rla.align: profile {row.name!r} rounds otherwise at Gemma 4's head sizes {sorted(sizes)} (its "
            f"conditions: {at}); one aligned model runs one set of points. Align with a row without head-size "
            "conditions, or without 'rope'.")


def align_gemma4(body, family: Family, profile: RoundingProfile, regions: tuple[str, ...], report) -> None:
    """Align a Gemma 4 text body in ``regions`` under ``profile`` (its ``gemma4`` variant for the norms
    and the layer, its ``gemma4_ple`` variant for the per-layer-input gate); fills ``report``.
    Refuses before patching anything it cannot do."""
    found = _scan(body, family)
    act = getattr(body.config, "hidden_activation", None)
    if "swiglu" in regions and act not in GEGLU_ACTIVATIONS:
        raise ValueError(f"rla.align 'swiglu' region: Gemma 4's config.hidden_activation is {act!r}; the region "
                         f"aligns the gated product of {GEGLU_ACTIVATIONS}. Align without 'swiglu'.")
    _check_head_sizes(body, report, profile)
    p, ple = _variants(profile, report)
    chain = p.qk_norm_out == "fp32" and {"rope", "rmsnorm"} <= set(regions)
    if chain and p.rope_cos_sin == "fp32":
        raise NotImplementedError(f"profile {p.name!r}: qk_norm_out='fp32' with rope_cos_sin='fp32' is not implemented")
    try:
        if "rope" in regions:
            report.hazards.extend(_align_rotary(found["rotary"], p, chain))
            _align_attention(found["attentions"], family, p)
            report.counts["rope"] = {"rotary_emb (per layer type)": 1, "self_attn": len(found["attentions"])}
            if chain:
                report.notes.append("q/k norm -> RoPE runs as two ops (an fp32 q/k between them), as on Gemma 3")
        if "swiglu" in regions:
            forward = _mlp_forward(p)
            for mlp in found["mlps"]:
                install(mlp, "mlp", {"forward": types.MethodType(forward, mlp)})
            report.counts["swiglu"] = {"GeGLU mlp (gelu tanh)": len(found["mlps"])}
            if found["ple_layers"]:
                report.counts["swiglu"]["per-layer-input gate"] = len(found["ple_layers"])
        if "rmsnorm" in regions or ("swiglu" in regions and found["ple_layers"]):
            _align_layers(found, family, p if "rmsnorm" in regions else None, ple if "swiglu" in regions else None)
        if "rmsnorm" in regions:
            _align_norms(body, found, p, chain, report)
    except BaseException:
        for m in body.modules():
            uninstall(m)
        raise
    report.notes.extend(LEFT_AS_IS)
    if found["ple_layers"]:
        report.notes.append(LEFT_PLE_SCALES)
    if found["moe_layers"]:
        report.notes.append(LEFT_MOE)


def _align_layers(found: dict, family: Family, stream: RoundingProfile | None, ple: RoundingProfile | None) -> None:
    names, defaults = _layer_parameters(class_named(found["layers"][0], family.cls("layer")).forward)
    for index, layer in enumerate(found["layers"]):
        forward = _layer_forward(stream, ple, index, names, defaults)
        install(layer, "layer", {"forward": types.MethodType(forward, layer)})


def _align_norms(body, found: dict, p: RoundingProfile, chain: bool, report) -> None:
    plain, fp32 = _norm_forward(p), _norm_forward(p, fp32_out=True)
    post = {id(getattr(layer, n)) for layer in found["layers"] for n in POST_NORMS
            if getattr(layer, n, None) is not None} if p.post_norm_out == "fp32" else set()
    done = gemma4_body.align_body_points(body, found, p, plain, fp32)  # the model-body points' norms
    for norm in found["norms"] + found["v_norms"] + [found["final"]]:
        if id(norm) not in done:
            install(norm, "norm", {"forward": types.MethodType(fp32 if id(norm) in post else plain, norm)})
    report.notes.extend(gemma4_body.body_notes(body, p))
    if post:
        report.notes.append("post_norm_out='fp32': the post-attention, post-feed-forward and post-per-layer-input "
                            "norms hand the add after them their fp32 output (the MoE block's two inner post-norms "
                            "stay rounded: their sum is no residual add)")
    qk = _norm_forward(p, fp32_out=chain)
    for norm in found["qk_norms"]:
        install(norm, "norm", {"forward": types.MethodType(qk, norm)})
    report.counts["rmsnorm"] = {"decoder layers": len(found["layers"]), "RMSNorm": len(found["norms"]) + 1,
                                "q_norm/k_norm": len(found["qk_norms"]), "v_norm": len(found["v_norms"])}


#: What the alignment of a Gemma 4 model leaves to HF's code, and why (printed in the report).
LEFT_AS_IS = [
    "left as is: the embedding scale sqrt(hidden), rounded to the weights' dtype in HF and vLLM alike",
    "left as is: attention (sliding window, scaling 1.0, K/V shared across layers) and the final logit softcap are "
    "outside the regions",
    "not expressed in the rows: SGLang 0.5.23 rounds the post-feed-forward norm, the residual add and the layer "
    "scalar once (gemma_rmsnorm_residual_scalar, models without per-layer inputs) and its next input norm reads that "
    "rounded stream (docs/families.md)",
]

#: Printed for a model with per-layer inputs.
LEFT_PLE_SCALES = ("left as is: the per-layer-input scales: HF multiplies by the Python floats hidden**-0.5 and 2**-0.5 "
                   "(Gemma4TextModel.project_per_layer_inputs), vLLM 0.33/0.26 and SGLang 0.5.23 by their bf16 "
                   "roundings; a constant's dtype is no rounding point (rla doctor names it)")

#: Printed for a model with MoE layers.
LEFT_MOE = ("left as is: the MoE block's router (Gemma4TextRouter: HF scales by the weight, then by hidden**-0.5 as a "
            "Python float; vLLM by its bf16 root_size first) and experts (GeGLU experts, which rla.align has no path "
            "for; vLLM's fused MoE runs its gelu_tanh_and_mul kernel in both modes); the block's three norms are aligned")
