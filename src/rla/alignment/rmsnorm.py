"""RMSNorm region: every norm through ``rla.ops.rms_norm``, and the residual sum across layers.

Engines fuse layer i's last residual add into layer i+1's input norm (and the last one into the
final norm). Under ``norm_residual='fp32_sum'`` that norm reads the fp32 sum x + r, while the
residual stream stays RN(x + r). In HF the add and the norm are in different modules, so the
aligned decoder layer returns the *fp32 sum* instead of RN(x + r):

    layer i:    ... s = x + r (fp32)  -> returned as is
    layer i+1:  residual = RN(s)      (the unchanged residual stream)
                h = input_layernorm(s) (reads the fp32 sum, output rounded to lp)
    final norm: model.norm(s_last)

so the profile holds at every norm, the final one included. Under ``rounded_sum`` the layer
returns RN(x + r) in lp, as HF does. Inside the layer, the attention's residual add and the
post-attention norm run as one ``rla.ops.add_rms_norm`` (one fused kernel on CUDA) with that
norm's weight and eps; forward hooks on ``post_attention_layernorm`` therefore do not fire. Under
``fp32_sum`` that add + norm keeps for backward the layer's input s (fp32, kept by the input norm
anyway) instead of the residual RN(s) (``residual_source``), so nothing keeps RN(s).

Memory traffic on rla's own ops (``ops=None``; issue #36), each the same bits as the separate ops
(``SWITCHES`` turns them off): under ``fp32_sum`` a layer i > 0 runs its input norm and the
residual's rounding RN(s) as one ``rla.ops.rms_norm_and_round`` (one read of s; in backward d_s =
d_norm + d_r is formed in the norm's backward kernel, no cast-up and no separate add), and under
``fp32_carry`` the add + norm does not write RN(x + r), which nothing reads
(``add_rms_norm(new_residual=False)``). Zero-centred layers (``gemma``, ``qwen3_5``) and ``ops=``
plugs keep the separate ops.
Consequences worth knowing:

- Hooks on ``input_layernorm`` of a layer i > 0 do not fire under ``fp32_sum`` with rla's own
  ops (the norm runs inside ``rms_norm_and_round``), as for ``post_attention_layernorm``.
- ``output_hidden_states`` shows the fp32 sums (the values the next norm reads), not RN(x + r).
- Layer 0 receives the embeddings (lp; fp32 under autocast with fp32 weights, rounded here as
  the engine's bf16 embedding table would be).
- A layer i > 0 that receives an lp tensor under ``fp32_sum`` raises: something rounded the sum
  between layers, usually FSDP2's ``MixedPrecisionPolicy(cast_forward_inputs=True)``.

``lp``, the stack's low-precision dtype, is the input's dtype when that is bf16/fp16; for an fp32
input it is the autocast dtype when autocast is on, else the norm weight's dtype (bf16 for a bf16
model or under FSDP2 ``param_dtype=bf16``; fp32 for an fp32 model, where nothing is rounded).
"""

from __future__ import annotations

import inspect
import types

import torch

from rla import ops
from rla.alignment import compat
from rla.alignment.moe_out import hands_fp32
from rla.alignment.patch import install
from rla.profiles import RoundingProfile

__all__ = ["stack_dtype", "align_norms", "align_layers", "layer_start", "residual_source", "ROUNDS_WITH_NORM",
           "SWITCHES"]


def stack_dtype(x: torch.Tensor, weight: torch.Tensor) -> torch.dtype:
    """The low-precision dtype the engine would hold ``x`` in (see the module docstring)."""
    if x.dtype != torch.float32:
        return x.dtype
    device_type = x.device.type
    if torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    return weight.dtype


def _make_norm_forward(profile: RoundingProfile, fp32_out: bool, impl=None, after_add: bool = False):
    # rla.ops (impl None) is looked up at call time, so a profiler or test can wrap rla.ops.rms_norm
    rms_norm = impl.rms_norm if impl is not None else (lambda *a, **k: ops.rms_norm(*a, after_add=after_add, **k))
    if after_add and impl is not None and hasattr(impl, "rms_norm_of_sum"):
        # An engine whose layers start with a fused add + norm normalises the sum inside that
        # kernel: engine-backed ops reduce it with the same kernel (see rla.engines.backed); rla's
        # own ops take ``after_add`` for the same reason (rla.ops.reduction).
        rms_norm = impl.rms_norm_of_sum
    if not fp32_out:
        def forward(self, hidden_states):
            lp = stack_dtype(hidden_states, self.weight)
            return rms_norm(hidden_states, self.weight, self.variance_epsilon, profile, dtype=lp)
    else:  # a q/k norm whose unrounded output RoPE reads (qk_norm_out='fp32')
        def forward(self, hidden_states):
            lp = stack_dtype(hidden_states, self.weight)
            return rms_norm(
                hidden_states, self.weight, self.variance_epsilon, profile, dtype=lp, out_dtype=torch.float32
            )

    return forward


#: Set on a norm whose aligned forward is ``rla.ops.rms_norm(x, weight, variance_epsilon,
#: profile, dtype=stack, after_add=True)`` (rla's own ops, lp output): a layer may then run that
#: norm and its residual's rounding as one ``rla.ops.rms_norm_and_round`` (``layer_start``).
ROUNDS_WITH_NORM = "_rla_norm_after_add"

#: Module switches of the fp32_carry / fp32_sum traffic savings (issue #36), read at call time;
#: False restores the earlier separate ops (the tests compare the two, bit for bit).
#: ``ROUND_IN_NORM``: a layer's input norm of the fp32 sum also writes its residual RN(s)
#: (``rla.ops.rms_norm_and_round``) instead of a separate cast. ``SKIP_UNREAD_RESIDUAL``: under
#: ``fp32_carry`` the add + norm does not write RN(x + r), which nothing reads.
SWITCHES = {"ROUND_IN_NORM": True, "SKIP_UNREAD_RESIDUAL": True}


def align_norms(
    norms: list[torch.nn.Module], profile: RoundingProfile, fp32_out: bool = False, impl=None, after_add: bool = False
) -> None:
    """Route every norm through ``rla.ops.rms_norm``; with ``fp32_out`` (q/k norms under
    ``qk_norm_out='fp32'``) their output stays fp32 for RoPE (see ``rope.make_apply_rotary``).
    ``after_add``: these norms read a residual sum the engine forms in a fused add + norm (every
    layer's input norm but the first, the final norm); with rla's own ops they are marked
    (:data:`ROUNDS_WITH_NORM`) so that the layer can fuse its residual's rounding into them."""
    forward = _make_norm_forward(profile, fp32_out, impl, after_add)
    marked = impl is None and after_add and not fp32_out
    for norm in norms:
        if not hasattr(norm, "variance_epsilon") or not isinstance(getattr(norm, "weight", None), torch.Tensor):
            raise NotImplementedError(
                f"rla.align: {type(norm).__name__} has no `weight` / `variance_epsilon`; this "
                "transformers release changed the RMSNorm module (see src/rla/alignment/compat.py)"
            )
        attrs = {"forward": types.MethodType(forward, norm)}
        if marked:
            attrs[ROUNDS_WITH_NORM] = True
        install(norm, "norm", attrs)


def _cast_error(index: int, got: torch.dtype, profile: RoundingProfile) -> RuntimeError:
    return RuntimeError(
        f"rla.align: decoder layer {index} received its hidden states as {got}, but profile "
        f"{profile.name!r} (norm_residual='fp32_sum') hands each layer the fp32 sum x + r of the "
        "previous layer, which its input norm reads. Something rounded it between layers: usually "
        "FSDP2's MixedPrecisionPolicy(cast_forward_inputs=True), the default, which casts every "
        "sharded module's inputs to param_dtype. Use MixedPrecisionPolicy(param_dtype=..., "
        "cast_forward_inputs=False), or align with a rounded_sum profile ('hf', 'vllm-eager')."
    )


def _layer_parameters(forward) -> tuple[tuple[str, ...], tuple[tuple[str, object], ...]]:
    """Names (after ``hidden_states``) and defaults of the class forward, to pass them through."""
    params = list(inspect.signature(forward).parameters.values())[2:]  # self, hidden_states
    names = tuple(p.name for p in params if p.kind is p.POSITIONAL_OR_KEYWORD)
    defaults = tuple(
        (p.name, p.default)
        for p in params
        if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.default is not p.empty
    )
    return names, defaults


def layer_start(layer, hidden_states, args, kwargs, names, defaults, reads_sum: bool, index: int,
                profile: RoundingProfile, round_in_norm: bool = False):
    """What every aligned decoder layer does first -> ``(kwargs, lp, residual, h)``: positional
    arguments folded into ``kwargs`` (with the layer's ``defaults``), the stack's lp dtype, the
    residual in lp, and the input norm's output, reading the stream the profile says (the previous
    layer's fp32 sum when ``reads_sum``; an lp stream there is a cast the profile forbids).

    ``round_in_norm`` (a layer on rla's own ops): where the norm reads the fp32 sum s and is rla's
    ``rms_norm(..., after_add=True)`` (:data:`ROUNDS_WITH_NORM`), the residual RN(s) comes out of
    the norm's own kernel (``rla.ops.rms_norm_and_round``: one read of s, d_s formed in the norm's
    backward kernel) instead of a separate cast; the same bits forward and backward. The norm
    module is then not called, so hooks on ``input_layernorm`` do not fire for that layer."""
    for name, value in zip(names, args):
        kwargs[name] = value
    for name, value in defaults:
        kwargs.setdefault(name, value)
    norm = layer.input_layernorm
    lp = stack_dtype(hidden_states, norm.weight)
    if hidden_states.dtype == lp:
        if reads_sum and lp != torch.float32:
            raise _cast_error(index, hidden_states.dtype, profile)
        return kwargs, lp, hidden_states, norm(hidden_states)
    # fp32 in an lp stack: the previous layer's fp32 sum, or autocast embeddings
    if reads_sum and round_in_norm and getattr(norm, ROUNDS_WITH_NORM, False):
        h, residual = ops.rms_norm_and_round(hidden_states, norm.weight, norm.variance_epsilon, profile, dtype=lp,
                                             after_add=True)
        return kwargs, lp, residual, h
    residual = hidden_states.to(lp)
    return kwargs, lp, residual, norm(hidden_states if reads_sum else residual)


def residual_source(hidden_states, residual, reads_sum: bool):
    """What a layer hands its add + norm as ``residual_source`` (``rla.ops.add_rms_norm``): its fp32
    input s when ``residual`` is RN(s) and the input norm read s, so keeps it for backward anyway
    (the add + norm then keeps s, not r beside it: 2 bytes per element and layer less, the same
    numbers); else None."""
    return hidden_states if reads_sum and residual is not hidden_states else None


def _make_layer_forward(profile: RoundingProfile, index: int, names, defaults, impl=None, keep_router: bool = True):
    add_rms_norm = impl.add_rms_norm if impl is not None else (lambda *a, **k: ops.add_rms_norm(*a, **k))
    # rla's own add + norm keeps the fp32 sum the input norm keeps anyway in place of its
    # rounding (``residual_source``); an ``ops=`` plug is called with rla.ops' plain arguments
    by_source = impl is None
    carry_add = getattr(impl, "carry_add", None) or (lambda *a: ops.carry_add(*a))
    fp32_sum = profile.norm_residual == "fp32_sum"
    carry = profile.residual_stream == "fp32_carry"
    # Only "first layer or not" enters the traced path: torch.compile guards on the closure values
    # it reads, and a per-layer index would compile one graph per layer (recompile_limit hit on a
    # 24-layer model, results/benchmarks/h200_2026-11-29_sampler.md). ``index`` is read only to
    # name the layer in the error.
    reads_sum = fp32_sum and index > 0
    skip_unread = by_source and carry and fp32_sum  # RN(x + r) is not even formed (rla.ops.add_rms_norm)

    def forward(self, hidden_states, *args, **kwargs):
        kwargs, lp, residual, h = layer_start(self, hidden_states, args, kwargs, names, defaults, reads_sum, index,
                                              profile, round_in_norm=by_source and SWITCHES["ROUND_IN_NORM"])

        attn_out = self.self_attn(hidden_states=h, **kwargs)[0].to(lp)
        # add + post-attention norm in one op: RN(x + r) handed on, the norm reading the sum the
        # profile says (the norm module's own weight and eps; its forward is rla's rms_norm)
        norm = self.post_attention_layernorm
        source = residual_source(hidden_states, residual, reads_sum) if by_source else None
        # fp32_carry reads x + r again in carry_add, never RN(x + r): rla's own add + norm skips it
        extra_kw = dict(new_residual=False) if skip_unread and SWITCHES["SKIP_UNREAD_RESIDUAL"] else {}
        if source is not None:
            extra_kw["residual_source"] = source
        out = add_rms_norm(attn_out, residual, norm.weight, norm.variance_epsilon, profile, **extra_kw)
        h, rounded = (out, None) if "new_residual" in extra_kw else out
        mlp_out = self.mlp(h)
        extra = ()
        if isinstance(mlp_out, tuple):  # an MoE block that also returns router logits
            mlp_out, *extra = mlp_out
        fp32_moe = hands_fp32(self.mlp)  # moe_out='fp32': the block's fp32 shared + routed, read unrounded
        if not fp32_moe:
            mlp_out = mlp_out.to(lp)
        if carry:  # fp32_carry: the MLP's add reads the fp32 a + r, rebuilt from the two lp
            # tensors in one fused read (as Inductor recomputes it in the consumer kernel):
            # (a + r) + h, rounded here unless the next norm reads the fp32 sum
            out = carry_add(attn_out, residual, mlp_out, torch.float32 if fp32_sum else lp)
        elif fp32_sum:  # x + r exactly in fp32 (r is promoted), for the next layer's norm; a copy
            # even when mlp_out is already fp32, so the add never writes into the MLP's output
            out = mlp_out.to(torch.float32, copy=True).add_(rounded)
        else:  # an lp add computes in fp32 and rounds once: RN(x + r)
            out = mlp_out + rounded
            if fp32_moe:
                out = out.to(lp)
        return (out, *extra) if extra and keep_router else out

    return compat.with_layer_checkpointing(forward)


def align_layers(layers: list[torch.nn.Module], layer_class: type, profile: RoundingProfile, impl=None,
                 keep_router: bool = True) -> None:
    """Replace each decoder layer's forward; ``layers`` in model order (index 0 reads embeddings).
    ``keep_router`` False: the layer drops what its MoE block returns beside the hidden states
    (GPT-OSS's layer discards the router scores), as HF's layer does."""
    names, defaults = _layer_parameters(layer_class.forward)
    for index, layer in enumerate(layers):
        forward = _make_layer_forward(profile, index, names, defaults, impl, keep_router)
        install(layer, "layer", {"forward": types.MethodType(forward, layer)})
