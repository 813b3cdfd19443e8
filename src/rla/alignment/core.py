"""``align`` / ``unalign`` / ``aligned``: find the family's modules, check, patch, report.

The alignment of a model lives on its decoder body (``<Prefix>Model``): ``_rla_alignment`` holds
the profile, regions and report, and every patched module holds its own ``_rla_patch``
(``rla.alignment.patch``). ``unalign`` walks the body and undoes each patch; aligning an aligned model
unaligns it first, so nothing is ever wrapped twice.

Pickling (``torch.save(model)``, ``copy.deepcopy``, ``pickle``): an aligned body carries an instance
``__reduce_ex__`` (:class:`_AlignedReduce`) that pickles a copy of its module tree with every patch
undone (sharing the parameter tensors, so no memory is copied) together with the profile and
regions; unpickling aligns that copy again (:func:`_restore_aligned`), so the loaded model is
aligned, computes the same logits bit for bit, and ``rla.unalign`` works on it. A model aligned
with ``ops=`` (engine-backed ops hold an engine) refuses to pickle, naming ``rla.unalign`` and
``save_pretrained``.
"""

from __future__ import annotations

import contextlib
import types
import warnings
from dataclasses import dataclass, field

import torch
from packaging.version import Version

from rla.alignment import compat, gemma, gemma4, liger, mla, moe_out, qwen3_5
from rla.alignment.alignment_report import AlignmentReport
from rla.alignment.families import FAMILIES, Family, class_named, get_family
from rla.alignment.lm_head import align_head, find_head
from rla.alignment.patch import foreign_wrapper, install, patch_of, uninstall
from rla.alignment.rmsnorm import align_layers, align_norms
from rla.alignment.rope import align_attention, align_rotary
from rla.alignment.router import align_router_region, moe_blocks

ROUTER_MIN_TRANSFORMERS = "5.24"
"""The oldest transformers the router region was checked on (tests/alignment/test_align_router.py
fails on 5.5.3: its Qwen2-MoE keeps the routing weights in fp32, its DeepSeek-V3 experts are a
``DeepseekV3NaiveMoe``); refused below it."""
from rla.alignment.routed_experts import experts_profile
from rla.alignment.swiglu import (
    align_clamped_experts,
    align_experts,
    align_mlps,
    check_activation,
    check_clamped_experts,
    check_experts,
    family_notes,
)
from rla.profiles import HEAD_POINTS, REGIONS, RoundingProfile, aliases, for_engine, resolve

__all__ = ["align", "unalign", "aligned", "alignment_of", "ALIGN_REGIONS"]

#: Every region ``rla.align`` knows: the profile's three, and the MoE ``router`` (opt-in: the
#: default ``regions`` stays the three, so an MoE model's routing is HF's unless asked for).
ALIGN_REGIONS: tuple[str, ...] = (*REGIONS, "router")

_STATE_ATTR = "_rla_alignment"


@dataclass
class _Modules:
    """The modules of one decoder body that the three regions patch, by role."""

    rotary: torch.nn.Module
    layers: list[torch.nn.Module]
    layer_class: type
    attentions: list[torch.nn.Module] = field(default_factory=list)
    norms: list[torch.nn.Module] = field(default_factory=list)
    qk_norms: list[torch.nn.Module] = field(default_factory=list)
    latent_norms: list[torch.nn.Module] = field(default_factory=list)  # MLA's q_a/kv_a_layernorm
    mlps: list[torch.nn.Module] = field(default_factory=list)
    shared_experts: list[torch.nn.Module] = field(default_factory=list)
    experts: list[torch.nn.Module] = field(default_factory=list)


def _check_regions(regions) -> tuple[str, ...]:
    if isinstance(regions, str):
        regions = (regions,)
    try:
        regions = tuple(regions)
    except TypeError:
        raise TypeError(f"regions must be a tuple of region names from {ALIGN_REGIONS}, got {regions!r}") from None
    unknown = [r for r in regions if r not in ALIGN_REGIONS]
    if unknown:
        raise ValueError(f"unknown region(s) {unknown}; regions are {ALIGN_REGIONS} (any non-empty subset)")
    if not regions:
        raise ValueError(f"regions is empty; pick a non-empty subset of {ALIGN_REGIONS} (or call rla.unalign)")
    return tuple(r for r in ALIGN_REGIONS if r in regions)


def _check_ops(impl):
    if callable(getattr(impl, "make_forward", None)):  # a whole body forward (rla.engines.vllm_forward)
        return impl
    missing = [name for name in ("rope", "swiglu", "rms_norm", "add_rms_norm") if not callable(getattr(impl, name, None))]
    if missing:
        raise TypeError(f"ops={impl!r} lacks {missing}; it must provide rla.ops' rope, swiglu, rms_norm, add_rms_norm")
    return impl


def _check_ops_profile(impl, profile: RoundingProfile) -> None:
    realised = getattr(impl, "profile", None)  # engine-backed ops realise one calibrated row's regions
    a, b = ({k: v for k, v in q.points().items() if k not in HEAD_POINTS} for q in (realised or profile, profile))
    if realised is not None and a != b:  # the head is rla's either way (rla.alignment.lm_head)
        diff = {p: (a[p], b[p]) for p in a if a[p] != b[p]}
        raise ValueError(f"{impl!r} rounds like {realised.name!r}, not {profile.name!r}: {diff}")
    body_forward = callable(getattr(impl, "make_forward", None))  # forms the sum inside its pieces
    if realised is not None and profile.norm_residual == "fp32_sum" and not body_forward:
        raise ValueError(
            f"{impl!r}: engine-backed ops need a rounded_sum profile; under fp32_sum the norm reads a sum "
            "formed in the previous layer, which the engine forms inside its next fused add"
        )


def _find(model) -> tuple[Family, torch.nn.Module]:
    """The model's family and its decoder body, through PEFT / torch.compile / FSDP2 wrappers."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"rla.align needs a transformers model (torch.nn.Module), got {type(model).__name__}")
    config = None
    for m in model.modules():
        config = m.__dict__.get("config")
        if config is not None and hasattr(config, "model_type"):
            break
    else:
        raise NotImplementedError(
            f"rla.align: {type(model).__name__} has no transformers config; it supports HF "
            f"transformers models of the families {', '.join(FAMILIES)}"
        )
    family = get_family(config.model_type, type(model).__name__)
    if family.min_transformers and compat.TRANSFORMERS_VERSION < Version(family.min_transformers):
        raise NotImplementedError(
            f"rla.align: {family.model_type} is aligned on transformers >= {family.min_transformers} (the layout "
            f"src/rla/alignment reads); transformers {compat.TRANSFORMERS_VERSION} lays it out otherwise. Upgrade "
            "transformers, or align without this model (docs/families.md)"
        )
    for m in model.modules():
        if class_named(m, family.cls("body")) is not None and isinstance(
            getattr(m, "layers", None), torch.nn.ModuleList
        ):
            return family, m
    raise NotImplementedError(
        f"rla.align: found a {family.model_type} config but no {family.cls('body')} with `layers` "
        f"inside {type(model).__name__}"
    )


def _expect(module, family: Family, role: str, where: str) -> torch.nn.Module:
    if module is not None and class_named(module, family.cls(role)) is None and liger.stands_for(module, role):
        return module  # Liger's class in the family's place (rla.alignment.liger)
    if module is not None and class_named(module, family.cls(role)) is None and liger.is_liger(type(module)):
        raise liger.refusal(f"{where} is Liger's {type(module).__name__}, where {family.cls(role)} was")
    if module is None or class_named(module, family.cls(role)) is None:
        raise NotImplementedError(
            f"rla.align: expected a {family.cls(role)} at {where}, found {type(module).__name__}. "
            f"transformers {compat.TRANSFORMERS_VERSION} may lay out {family.model_type} differently "
            "from what src/rla/alignment/families.py describes."
        )
    return module


def _scan(body: torch.nn.Module, family: Family) -> _Modules:
    rotary = _expect(getattr(body, "rotary_emb", None), family, "rotary", "model.rotary_emb")
    layers = list(body.layers)
    if not layers:
        raise NotImplementedError("rla.align: the model has no decoder layers")
    found = _Modules(rotary, layers, class_named(layers[0], family.cls("layer")) or type(layers[0]))
    found.norms.append(_expect(getattr(body, "norm", None), family, "norm", "model.norm"))
    for i, layer in enumerate(layers):
        where = f"model.layers[{i}]"
        _expect(layer, family, "layer", where)
        attn = _expect(getattr(layer, "self_attn", None), family, "attention", f"{where}.self_attn")
        found.attentions.append(attn)
        for name in ("input_layernorm", "post_attention_layernorm"):
            found.norms.append(_expect(getattr(layer, name, None), family, "norm", f"{where}.{name}"))
        if family.mla:  # q_a_layernorm is None without a q LoRA (q_proj instead)
            for name in mla.LATENT_NORMS:
                if name == "kv_a_layernorm" or getattr(attn, name, None) is not None:
                    found.latent_norms.append(
                        _expect(getattr(attn, name, None), family, "norm", f"{where}.self_attn.{name}"))
        if family.qk_norm and not (family.qk_norm_optional and getattr(attn, "q_norm", None) is None):
            for name in ("q_norm", "k_norm"):
                found.qk_norms.append(
                    _expect(getattr(attn, name, None), family, "norm", f"{where}.self_attn.{name}")
                )
        mlp = getattr(layer, "mlp", None)
        dense = family.dense_mlp and mlp is not None
        if dense and (class_named(mlp, family.cls("mlp")) is not None or liger.stands_for(mlp, "mlp")):
            found.mlps.append(mlp)
        elif family.moe and mlp is not None and class_named(mlp, family.cls("moe")) is not None:
            found.experts.append(_expect(getattr(mlp, "experts", None), family, "experts", f"{where}.mlp.experts"))
            if family.shared_expert:
                shared = getattr(mlp, family.shared_expert, None)
                found.shared_experts.append(
                    _expect(shared, family, "mlp", f"{where}.mlp.{family.shared_expert}")
                )
        else:
            expected = family.cls("mlp") + (f" or {family.cls('moe')}" if family.moe else "")
            _expect(mlp, family, "moe" if not family.dense_mlp else "mlp", f"{where}.mlp (a {expected})")
    return found


def alignment_of(model) -> AlignmentReport | None:
    """The report of ``model``'s current alignment, or None when it is not aligned."""
    _, body = _find(model)
    state = body.__dict__.get(_STATE_ATTR)
    return None if state is None else state


def align(
    model: torch.nn.Module,
    profile: str | RoundingProfile = "vllm",
    regions=REGIONS,
    ops=None,
    *,
    engine_version: str | None = None,
    allow_meta: bool = False,
) -> AlignmentReport:
    """Make ``model``'s training forward round where ``profile``'s engine rounds.

    Per instance and reversible (``rla.unalign``); aligning again replaces the alignment. See the
    ``rla.alignment`` package docstring for what changes in each region.

    ``ops`` is the implementation of the four region ops (default :mod:`rla.ops`: the PyTorch
    reference on CPU, rla's fused kernels on CUDA). :func:`rla.engines.backed.engine_ops` gives
    one whose forward is the engine's own compiled kernels and whose backward is rla's gradient,
    so the forward's arithmetic order (a norm's reduction tree, FMA) is the engine's too.

    An engine alias (``"vllm"``, ``"vllm-eager"``, ``"sglang"``) resolves to the row calibrated for
    the engine version in use (:func:`rla.profiles.for_engine`): ``engine_version`` when given,
    else the installed engine's (package metadata; the engine is not imported). The report's
    ``profile_choice`` says which row and why; a version with no calibrated row gets the nearest row and
    a :class:`rla.profiles.ProfileVersionWarning` naming both versions and ``rla calibrate``.

    A model on the meta device is refused unless ``allow_meta=True``: the alignment itself reads
    no tensor data (it patches code and reads dtypes; the aligned rotary computes its fp32
    frequencies from the config at the first forward), but a meta model computes nothing until
    its weights and buffers are filled in. ``allow_meta=True`` is for a copy that is filled in
    later from a copy aligned the same way, as verl's non-rank-0 workers are (built on the meta
    device, then FSDP1's ``sync_module_states`` or verl's ``fsdp2_load_full_state_dict``
    broadcasts rank 0's weights and buffers): both copies must then hold the same buffers in the
    same dtypes, so the meta copy is aligned exactly as the real one. A rounded ``inv_freq``
    found on the meta device is replaced as usual; its angle error cannot be measured there.
    """
    match = for_engine(profile, engine_version) if isinstance(profile, str) else None
    if engine_version is not None and match is None:
        raise ValueError(
            f"engine_version={engine_version!r} selects among an engine's calibrated rows; profile "
            f"{getattr(profile, 'name', profile)!r} is not an engine alias ({', '.join(aliases())})"
        )
    p = match.profile if match is not None else resolve(profile)
    regions = _check_regions(regions)
    impl = None if ops is None else _check_ops(ops)  # None: rla.ops, looked up at call time
    if impl is not None:
        _check_ops_profile(impl, p)
    family, body = _find(model)
    row = p
    p, head = _at_head_size(p, body.config)
    if family.unsupported(regions):
        raise NotImplementedError(
            f"rla.align: {family.model_type} supports the regions {family.regions}, not "
            f"{family.unsupported(regions)} (docs/families.md and docs/rounding.md "
            f"say what is aligned for it and why); pass regions={family.regions!r}"
        )
    if "router" in regions and compat.TRANSFORMERS_VERSION < Version(ROUTER_MIN_TRANSFORMERS):
        raise NotImplementedError(
            f"rla.align: the router region is checked on transformers >= {ROUTER_MIN_TRANSFORMERS}; transformers "
            f"{compat.TRANSFORMERS_VERSION} computes its MoE blocks otherwise (routing weights kept in fp32, other "
            "expert layouts), so HF's own values are not reproduced there. Upgrade transformers or leave 'router' out "
            "of regions"
        )
    routers = moe_blocks(body, family) if "router" in regions else []
    if "router" in regions and not routers:
        raise ValueError(
            f"rla.align 'router' region: {type(model).__name__} has no MoE block "
            f"({family.cls('moe') if family.moe else 'a dense family'}); align without 'router'"
        )
    if "router" in regions and impl is not None:
        raise NotImplementedError(f"rla.align 'router' region with ops={impl!r}: the router runs rla.ops.routing only")
    if family.mla and impl is not None and {"rope", "rmsnorm"} & set(regions):
        raise NotImplementedError(
            f"rla.align: ops={impl!r} on {family.model_type}: engine-backed ops cover the Llama-shaped attention, not "
            "MLA's latent norms and rope half; align it with rla.ops (ops=None), or with ops= in 'swiglu' only")
    meta = next((n for n, t in (*body.named_parameters(), *body.named_buffers()) if t.is_meta), None)
    if meta is not None and not allow_meta:
        raise ValueError(
            f"rla.align: {meta} is on the meta device (no data): an aligned model computes nothing until its "
            "weights are loaded. Align after loading them (from_pretrained, or to_empty + load_state_dict), or pass "
            "allow_meta=True when the weights and buffers are filled in later from a copy aligned the same way"
        )
    if family.layout in _OWN_LAYOUTS:
        return _align_own_layout(model, body, family, row, p, head, regions, impl, match)
    found = _scan(body, family)
    if "swiglu" in regions:
        if family.experts_gate == "clamped_swiglu":
            for experts in found.experts:
                check_clamped_experts(experts)
        else:
            check_activation(body.config)
            for experts in found.experts:
                check_experts(experts)
    if body.__dict__.get(_STATE_ATTR) is not None:
        unalign(body)
    liger_notes, _ = liger.notes_before(body, family, found, regions)

    report = AlignmentReport(
        profile=row,
        regions=regions,
        family=family.model_type,
        model_class=type(model).__name__,
        transformers_version=str(compat.TRANSFORMERS_VERSION),
        ops="rla.ops" if impl is None else (getattr(impl, "name", None) or getattr(impl, "__name__", None) or type(impl).__name__),
    )
    if match is not None:
        report.profile_choice = match.message()
    _note_head_size(report, row, p, head)
    if ops is not None:  # what aligned() re-applies (not part of the report's data)
        report.__dict__["_ops_object"] = ops
    # q/k norm -> RoPE as one fp32 chain (qk_norm_out='fp32'): needs both regions aligned
    chain = p.qk_norm_out == "fp32" and bool(found.qk_norms) and {"rope", "rmsnorm"} <= set(regions)
    if chain and p.rope_cos_sin == "fp32":
        raise NotImplementedError(
            f"profile {p.name!r}: qk_norm_out='fp32' with rope_cos_sin='fp32' (no engine calibrated so far "
            "does both) is not implemented"
        )
    if callable(getattr(impl, "make_forward", None)):
        _align_body(model, body, found, family, p, regions, impl, report)
        return report
    row_at_head = p  # the row at this head size, before the family's variant (the experts' variant reads it)
    if family.variant is not None:
        if impl is not None:
            raise NotImplementedError(f"rla.align: ops={impl!r} on {family.model_type}: engine-backed ops cover "
                                      "the Llama-shaped families without a row variant; align with rla.ops (ops=None)")
        pv = p.variant(family.variant)
        if pv is not p:
            changed = {k: v for k, v in pv.points().items() if getattr(p, k) != v}
            report.notes.append(f"{family.model_type}'s norms and experts follow {pv.name!r}: {changed}, the row's "
                                "variant for them (docs/families.md)")
        p = pv
        report.variant = family.variant
    report.notes.extend(family_notes(family))
    if family.mla:
        report.notes.extend(mla.notes(body.config, regions))
    try:
        if "rope" in regions:
            report.hazards.extend(align_rotary(found.rotary, p, report, round_tables=chain))
            if family.partial_rotary and impl is not None:
                raise NotImplementedError(f"rla.align: ops={impl!r} on {family.model_type}: engine-backed ops do "
                                          "not rotate part of a head; align it with rla.ops (ops=None)")
            fused, notes = align_attention(found.attentions, family, p, impl, qk_chain=chain,
                                           partial=family.partial_rotary)
            report.counts["rope"] = {"rotary_emb": 1,
                                     "MLA self_attn (rope half)" if family.mla else "self_attn": len(found.attentions)}
            if fused:  # the q/k norms run inside RoPE's op (rla.alignment.qk_chain)
                report.counts["rope"]["fused q/k norm + RoPE"] = fused
            report.notes.extend(notes)
        if "swiglu" in regions:
            align_mlps(found.mlps + found.shared_experts, p, impl)
            if family.experts_gate == "clamped_swiglu":
                align_clamped_experts(found.experts, p)
            elif found.experts:
                align_experts(found.experts, experts_profile(row_at_head, p, report), impl)
            counts = {"mlp": len(found.mlps)}
            if family.moe:
                counts["experts"] = len(found.experts)
                if family.shared_expert:
                    counts["shared_expert"] = len(found.shared_experts)
            report.counts["swiglu"] = counts
        if "rmsnorm" in regions:
            align_layers(found.layers, found.layer_class, p, impl, keep_router=family.moe_block != "MLP")
            after_add = {id(found.norms[0])} | {id(layer.input_layernorm) for layer in found.layers[1:]}
            align_norms([n for n in found.norms if id(n) in after_add], p, False, impl, after_add=True)
            align_norms([n for n in found.norms if id(n) not in after_add], p, False, impl)
            align_norms(found.qk_norms, p, chain, impl)
            align_norms(found.latent_norms, p, False, impl)  # MLA's: no add before them, a GEMM reads them
            counts = {"decoder layers": len(found.layers), "RMSNorm": len(found.norms)}
            if found.qk_norms:
                counts["q_norm/k_norm"] = len(found.qk_norms)
            if found.latent_norms:
                counts["q_a/kv_a_layernorm (MLA)"] = len(found.latent_norms)
            report.counts["rmsnorm"] = counts
        moe_fp32 = "rmsnorm" in regions and moe_out.fp32_sum(row_at_head, p, family)  # the add reads the fp32 sum
        if moe_fp32 and "router" not in regions:
            moe_out.align_blocks(moe_blocks(body, family), family, report)
        if "router" in regions:
            align_router_region(routers, family, p, report, fp32_out=moe_fp32)
        liger.check_after(body, found, regions)
    except BaseException:
        for m in body.modules():
            uninstall(m)
        raise
    report.notes.extend(liger_notes + liger.outside_notes(model, body))
    report.notes.extend(_nothing_to_round(model))
    _align_head(model, body, p, report)
    _guard(body, report)
    return report


def head_size(config) -> int:
    """The attention head size of a decoder config, as HF's attention modules take it:
    ``config.head_dim`` where set, else ``hidden_size // num_attention_heads``. A heterogeneous
    config (transformers' per-layer configs: Gemma 4's head size per layer type) gives its first
    layer's; a family with several checks the others itself (``rla.alignment.gemma4``)."""
    if getattr(config, "is_heterogeneous", False):
        config = config.per_layer_config[0]
    size = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return int(size)


def _at_head_size(p: RoundingProfile, config) -> tuple[RoundingProfile, int | None]:
    """The row's points at this model's head size (``RoundingProfile.conditions``), and that head
    size when a condition changed any (None otherwise)."""
    if not p.conditions:
        return p, None
    h = head_size(config)
    at = p.at_head_size(h)
    return (p, None) if at is p else (at, h)


def _note_head_size(report: AlignmentReport, row: RoundingProfile, at: RoundingProfile, head: int | None) -> None:
    if head is None:
        return
    report.head_size = head
    changed = {k: v for k, v in at.points().items() if getattr(row, k) != v}
    report.notes.append(f"head size {head}: {row.name!r} rounds {changed} at this head size (the row's conditions: "
                        "the engine runs another kernel for it; docs/rounding.md)")


#: The layer shapes aligned by their own module (``Family.layout``), each ``(body, family, profile,
#: regions, report)``.
_OWN_LAYOUTS = {"gemma3": gemma.align_gemma3, "gemma4": gemma4.align_gemma4, "qwen3_5": qwen3_5.align_qwen3_5}


def _align_own_layout(model, body, family, row, p, head, regions, impl, match) -> AlignmentReport:
    """Gemma 3's, Gemma 4's and Qwen3.5's layer shapes (``rla.alignment.gemma``, ``gemma4``,
    ``qwen3_5``): rla.ops only, no Liger, no ``ops=`` plug."""
    if impl is not None:
        raise NotImplementedError(
            f"rla.align: ops={impl!r} on {family.model_type}: engine-backed ops cover the Llama-shaped "
            "families only; align it with rla.ops (ops=None)"
        )
    if any(liger.is_liger(type(m)) for m in body.modules()):
        raise liger.refusal(f"{type(model).__name__} holds Liger modules; rla.align does not align Liger's kernels on {family.model_type}")
    if body.__dict__.get(_STATE_ATTR) is not None:
        unalign(body)
    report = AlignmentReport(
        profile=row, regions=regions, family=family.model_type, model_class=type(model).__name__,
        transformers_version=str(compat.TRANSFORMERS_VERSION), ops="rla.ops",
    )
    if match is not None:
        report.profile_choice = match.message()
    _note_head_size(report, row, p, head)
    _OWN_LAYOUTS[family.layout](body, family, p, regions, report)
    report.notes.extend(_nothing_to_round(model))
    _align_head(model, body, p, report)
    _guard(body, report)
    return report


def _align_head(model, body: torch.nn.Module, p: RoundingProfile, report: AlignmentReport) -> None:
    """The row's ``lm_head`` point on the model's head (``rla.alignment.lm_head``); on a refusal the
    body's patches are undone, so a failed alignment leaves nothing behind."""
    try:
        report.lm_head = align_head(model, body, p)
    except BaseException:
        for m in body.modules():
            uninstall(m)
        raise


def _guard(body: torch.nn.Module, report: AlignmentReport) -> None:
    """What every alignment leaves on the body: its report, its pickling, its dtype guard."""
    body.__dict__[_STATE_ATTR] = report
    body.__dict__[_REDUCE_ATTR] = _AlignedReduce(body)
    body.__dict__[_DEEPCOPY_ATTR] = _AlignedDeepcopy(body)
    dtype = next((t.dtype for t in body.parameters() if t.is_floating_point()), None)
    if dtype in (torch.bfloat16, torch.float16):
        report.__dict__["_dtype_hook"] = body.register_forward_pre_hook(_DtypeGuard(dtype))


class _DtypeGuard:
    """Forward pre-hook of an aligned body: a ``RuntimeWarning`` (once) when it runs in fp32.

    The aligned ops round to the dtype their inputs arrive in; after ``model.float()`` (or
    ``.to(torch.float32)``) every rounding point is the identity and the alignment does nothing.
    A warning, not an error: an fp32 forward of an aligned model is legitimate (a reference), only
    believing it aligned is not.
    """

    def __init__(self, dtype: torch.dtype):
        self.dtype = dtype
        self.warned = False

    def __call__(self, module, args):
        if self.warned:
            return None
        now = next((t.dtype for t in module.parameters() if t.is_floating_point()), self.dtype)
        if now in (torch.float32, torch.float64) and not any(torch.is_autocast_enabled(d) for d in ("cpu", "cuda")):
            self.warned = True
            warnings.warn(
                f"rla: this model was aligned in {str(self.dtype).replace('torch.', '')} and now runs in "
                f"{str(now).replace('torch.', '')} with autocast off (model.float() or .to() after rla.align): every "
                "aligned rounding point is an identity, so the alignment does nothing. Cast back (model.to("
                f"{self.dtype})) or run under torch.autocast(..., dtype={self.dtype})",
                RuntimeWarning, stacklevel=2,
            )
        return None


_REDUCE_ATTR = "__reduce_ex__"
_DEEPCOPY_ATTR = "__deepcopy__"


class _AlignedReduce:
    """The aligned body's ``__reduce_ex__`` (module docstring): its unpatched copy, realigned on load."""

    def __init__(self, body: torch.nn.Module):
        self.body = body

    def __call__(self, protocol):
        report = self.body.__dict__.get(_STATE_ATTR)
        if report is None:  # unaligned meanwhile without unalign (should not happen): pickle as a plain module
            return object.__reduce_ex__(self.body, protocol)
        if "_ops_object" in report.__dict__:
            raise TypeError(
                f"this model is aligned with ops={report.ops!r}, which cannot be pickled (it holds an engine). "
                "Call rla.unalign(model) before torch.save / pickle, or save the weights with "
                "model.save_pretrained(...) and align the loaded model again"
            )
        return _restore_aligned, (_unpatched_copy(self.body, {}), report.profile, report.regions)


class _AlignedDeepcopy:
    """``copy.deepcopy`` of an aligned body: what pickling gives (its unpatched copy, aligned again),
    except for an alignment with engine ``ops`` (an engine cannot be pickled, but a deep copy needs
    no pickle): that body is copied as PyTorch copies any module, patches and all, the ops object
    shared, so the copy runs the engine's pieces on its own weights."""

    def __init__(self, body: torch.nn.Module):
        self.body = body

    def __call__(self, memo):
        import copy

        report = self.body.__dict__.get(_STATE_ATTR)
        engine_backed = report is not None and "_ops_object" in report.__dict__
        if engine_backed:  # the ops are code (an engine, a module of functions): shared, not copied
            ops = report.__dict__["_ops_object"]
            memo[id(ops)] = ops
        rv = object.__reduce_ex__(self.body, 4) if engine_backed else self.body.__reduce_ex__(4)
        return copy._reconstruct(self.body, memo, *rv)


def _unpatched_copy(module: torch.nn.Module, memo: dict) -> torch.nn.Module:
    """A new module tree like ``module``'s with every rla patch undone; tensors and other state shared."""
    from rla.alignment.patch import PATCH_ATTR, _MISSING

    if id(module) in memo:
        return memo[id(module)]
    new = module.__class__.__new__(module.__class__)
    memo[id(module)] = new
    d = dict(module.__dict__)
    for name in (_STATE_ATTR, _REDUCE_ATTR, _DEEPCOPY_ATTR):
        d.pop(name, None)
    if any(isinstance(h, _DtypeGuard) for h in d.get("_forward_pre_hooks", {}).values()):
        d["_forward_pre_hooks"] = type(d["_forward_pre_hooks"])(
            (k, h) for k, h in d["_forward_pre_hooks"].items() if not isinstance(h, _DtypeGuard))
    patch = d.pop(PATCH_ATTR, None)
    if patch is not None:
        for name, value in patch.saved_attrs.items():
            if value is _MISSING:
                d.pop(name, None)
            else:
                d[name] = value
        d["_buffers"] = {**d["_buffers"], **patch.saved_buffers}
    d["_modules"] = {k: None if c is None else _unpatched_copy(c, memo) for k, c in d["_modules"].items()}
    new.__dict__.update(d)
    return new


def _restore_aligned(body: torch.nn.Module, profile: RoundingProfile, regions) -> torch.nn.Module:
    """Unpickling an aligned body: align its unpatched copy again, as it was."""
    align(body, profile, regions)
    return body


def _align_body(model, body, found, family, p, regions, impl, report) -> None:
    """Install an engine-backed body forward (``rla.engines.vllm_forward``): one forward that realises
    the three regions together, so nothing else is patched."""
    if regions != REGIONS:
        raise ValueError(f"{impl!r} replaces the whole decoder forward: it aligns all of {REGIONS}, not {regions}")
    causal = next((m for m in model.modules() if m.__dict__.get("_modules", {}).get("model") is body), None)
    if causal is None or not hasattr(causal, "lm_head"):
        raise NotImplementedError(f"{impl!r} needs the *ForCausalLM around the {family.prefix}Model")
    forward = impl.make_forward(causal, body)
    install(body, "body", {"forward": types.MethodType(forward, body)})
    report.counts = {r: {"decoder layers (engine forward)": len(found.layers)} for r in REGIONS}
    report.notes.append(
        f"the decoder body's forward is {impl.name}; its backward is rla.ops' gradient of {p.name!r}, "
        "recomputed per piece from the piece's inputs"
    )
    _align_head(model, body, p, report)
    _guard(body, report)  # its pickling refuses, naming rla.unalign (an engine is not picklable)


def _nothing_to_round(model: torch.nn.Module) -> list[str]:
    """A note when the model computes in fp32 with autocast off: the aligned ops round to the
    dtype their inputs arrive in, so every rounding point is then the identity, and an alignment
    that looks successful changes nothing. FSDP2 mixed precision (``param_dtype`` bf16/fp16)
    or an autocast region active now makes the inputs low precision, so no note."""
    dtypes = {p.dtype for p in model.parameters() if p.is_floating_point()}
    if not dtypes or not dtypes <= {torch.float32, torch.float64}:
        return []
    if any(torch.is_autocast_enabled(d) for d in ("cpu", "cuda")):
        return []
    for m in model.modules():
        state = getattr(m, "_get_fsdp_state", None)
        policy = getattr(getattr(state() if state else None, "_mp_policy", None), "param_dtype", None)
        if policy in (torch.bfloat16, torch.float16):
            return []
    names = "/".join(sorted(str(d).replace("torch.", "") for d in dtypes))
    return [
        f"nothing to round: the weights are {names} and autocast is off, so every intermediate is "
        f"already {names} and the aligned points are exact identities. Alignment takes effect when "
        "the model runs in bf16: load it with dtype=torch.bfloat16, or run it under "
        "torch.autocast(..., dtype=torch.bfloat16) or FSDP mixed precision (param_dtype=bf16)"
    ]


def unalign(model: torch.nn.Module) -> AlignmentReport | None:
    """Undo ``rla.align`` on ``model``; returns the removed alignment's report (None if none)."""
    _, body = _find(model)
    head = find_head(model, body)
    patched = [m for m in (*body.modules(), *([head] if head is not None else [])) if patch_of(m) is not None]
    rewrapped = [(type(m).__name__, name) for m in patched if (name := foreign_wrapper(m))]
    if rewrapped:
        raise RuntimeError(
            "rla.unalign: these modules' attributes were replaced after rla.align, so restoring "
            f"the originals would drop that wrapper: {rewrapped[:4]}. Remove the later wrapper "
            "(e.g. an accelerate hook) first, or align after adding it."
        )
    for m in patched:  # the head too (rla.alignment.lm_head)
        uninstall(m)
    body.__dict__.pop(_REDUCE_ATTR, None)
    body.__dict__.pop(_DEEPCOPY_ATTR, None)
    report = body.__dict__.pop(_STATE_ATTR, None)
    hook = None if report is None else report.__dict__.pop("_dtype_hook", None)
    if hook is not None:
        hook.remove()
    return report


@contextlib.contextmanager
def aligned(model: torch.nn.Module, profile: str | RoundingProfile = "vllm", regions=REGIONS, ops=None, *,
            engine_version: str | None = None):
    """``with rla.aligned(model, "vllm") as report:`` aligns inside the block only.

    On exit the model returns to its state before the block: unaligned, or aligned as it was.
    """
    before = alignment_of(model)
    report = align(model, profile, regions, ops, engine_version=engine_version)
    try:
        yield report
    finally:
        unalign(model)
        if before is not None:
            align(model, before.profile, before.regions, before.__dict__.get("_ops_object"))
