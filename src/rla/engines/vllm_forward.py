"""Engine-backed training forward for a compiling engine: the twin's compiled pieces, rla's gradient.

vLLM's default mode compiles its model with Inductor in *pieces* split at attention, and Inductor
fuses across op boundaries inside a piece: the post-attention residual reaches the MLP's add
unrounded, Qwen3's q/k-norm output reaches RoPE unrounded, and each norm's sum of squares is
reduced in the order of the kernel Inductor generates for that piece. No per-op kernel reproduces
that, so :mod:`rla.engines.backed`'s per-op ops cannot serve this mode. This module runs the
pieces themselves in the training forward:

- **forward** = the engine twin's pieces (:class:`rla.engines.vllm_twin.VllmTwin`): vLLM's own native
  region code, laid out as vLLM's model code lays it out, compiled by the same torch in the same
  process as vLLM compiles a model (one graph per piece, the token dimension dynamic), with HF's
  own attention function between pieces. The logits are therefore the twin's, bit for bit;
- **backward** = ``rla.ops``' exact straight-through gradient of the calibrated profile, by
  recomputing each piece from its saved inputs (the attention output and residual entering it,
  and the weights) with ``rla.ops`` laid out the same way. Attention is differentiated by autograd
  as in HF. The recomputation is a forward of the piece's GEMMs, as activation checkpointing
  does; only the two [tokens, hidden] tensors entering each piece are saved.

``compile_backward`` (default None: the recomputation runs eagerly) names a ``torch.compile``
backend for the recomputed reference pieces (one graph per piece, forward and backward by
AOTAutograd, the token dimension dynamic). ``'aot_eager'`` runs the same aten ops and keeps the
gradient bit for bit (tested on CPU); it saves host time only. ``'inductor'`` also fuses the glue
between rla's ops (which stay opaque custom ops on CUDA): the gradients' accumulations and the
bias gradients' reductions may then round or sum in another order, so it is not guaranteed to be
exact; ``lab/bench/engine_forward_breakdown.py`` measures both, and whether the bits hold.

Use: ``rla.align(model, "vllm-0.33", ops=rla.engines.vllm_forward.engine_forward(vllm.load()))``. The
decoder body's forward is replaced (per instance, reversible by ``rla.unalign``); the lm_head and
the loss stay HF's. It is a forward over whole sequences (training, scoring): no KV cache, no
``inputs_embeds``; bf16/fp16 weights on the device the engine runs on; Qwen2, Qwen3, Llama.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch.utils._pytree import tree_flatten, tree_unflatten

from rla import ops as rla_ops
from rla import profiles
from rla.engines.backed import calibrated_profile, engine_backed
from rla.engines.vllm_twin import MODES, SUPPORTED_FAMILIES, VllmTwin, attention_inputs, compiled_piece

__all__ = ["EngineForward", "engine_forward", "recording_streams"]

_RECORD = "_rla_engine_streams"

# cache_position: whole sequences, so positions come from position_ids (HF derives the same arange)
_IGNORED = ("return_dict", "use_cache", "cache_position")
_REFUSED_TRUE = ("output_attentions", "output_hidden_states")


class _Reference:
    """The twin's pieces written with ``rla.ops`` under ``profile``: what the backward differentiates.

    Same boundaries, same GEMMs on the same weights; every region is the rla op of the profile
    (so the fp32_carry chain is ``carry_add`` of the attention sum and the MLP output, and the
    q/k norms hand RoPE fp32 under ``qk_norm_out='fp32'``)."""

    def __init__(self, profile: profiles.RoundingProfile, twin: VllmTwin, compile_backend: str | None = None):
        self.p, self.eps, self.d = profile, twin.eps, twin.head_dim
        self.cache = twin.cos_sin_cache
        self.fp32_sum = profile.norm_residual == "fp32_sum"
        self.carry = profile.residual_stream == "fp32_carry"
        self.chain = profile.qk_norm_out == "fp32"
        self.compiled = {}
        if compile_backend is not None:  # each piece on a code object of its own, as the twin's
            self.compiled = {n: compiled_piece(getattr(self, n), backend=compile_backend) for n in ("first", "middle", "last")}

    def run(self, name, args, dynamic):
        """Piece ``name`` on ``args`` (the recomputation in the backward): compiled if asked for,
        the token dimension of ``args[:dynamic]`` dynamic as in the forward's pieces."""
        fn = self.compiled.get(name)
        if fn is None:
            return getattr(self, name)(*args)
        VllmTwin.mark_tokens(*args[:dynamic])
        return fn(*args)

    def _qkv(self, x, residual, w, positions, lp, after_add):
        """Input norm (``x`` is what the norm reads), q/k/v, q/k norms, rotary -> (q, k, v, residual)."""
        p, d = self.p, self.d
        hidden = rla_ops.rms_norm(x, w["in"], self.eps, p, dtype=lp, after_add=after_add)
        q = F.linear(hidden, w["wq"], w["bq"])
        k = F.linear(hidden, w["wk"], w["bk"])
        v = F.linear(hidden, w["wv"], w["bv"])
        t = q.shape[0]
        q4, k4 = q.view(1, t, -1, d), k.view(1, t, -1, d)
        if "qn" in w:
            out = torch.float32 if self.chain else None
            q4 = rla_ops.rms_norm(q4, w["qn"], self.eps, p, dtype=lp, out_dtype=out)
            k4 = rla_ops.rms_norm(k4, w["kn"], self.eps, p, dtype=lp, out_dtype=out)
        table = self.cache[positions].float()
        cos, sin = table[None, :, : d // 2], table[None, :, d // 2 :]
        q4, k4 = rla_ops.rope(q4, k4, cos, sin, p, unsqueeze_dim=2, dtype=lp)
        return q4.reshape(t, -1), k4.reshape(t, -1), v, residual

    def _mlp(self, attn, residual, w):
        a = F.linear(attn, w["wo"])
        h, rounded = rla_ops.add_rms_norm(a, residual, w["post"], self.eps, self.p)
        m = F.linear(rla_ops.swiglu(F.linear(h, w["wg"]), F.linear(h, w["wu"]), self.p), w["wd"])
        lp = a.dtype
        if self.carry:
            s = rla_ops.carry_add(a, residual, m, torch.float32 if self.fp32_sum else lp)
        elif self.fp32_sum:
            s = m.float() + rounded.float()
        else:
            s = m + rounded
        return s, lp

    def first(self, ids, positions, embed, w):
        e = F.embedding(ids, embed)
        return self._qkv(e, e, w, positions, e.dtype, after_add=False)

    def middle(self, attn, residual, positions, w, w_next):
        s, lp = self._mlp(attn, residual, w)
        return self._qkv(s, s.to(lp), w_next, positions, lp, after_add=True)

    def last(self, attn, residual, w, final):
        s, lp = self._mlp(attn, residual, w)
        return rla_ops.rms_norm(s, final, self.eps, self.p, dtype=lp, after_add=True), s.to(lp)


def _piece(twin, reference, name, args, dynamic):
    """Piece ``name`` as the engine runs it in the forward (:meth:`VllmTwin.run_piece`), the
    gradient of ``reference``'s piece of that name in the backward; ``args`` may hold dicts of
    weights (flattened to tensors for autograd)."""
    flat, spec = tree_flatten(args)
    where = [i for i, x in enumerate(flat) if isinstance(x, torch.Tensor)]

    def rebuild(tensors):
        leaves = list(flat)
        for i, t in zip(where, tensors):
            leaves[i] = t
        return tree_unflatten(leaves, spec)

    return engine_backed(
        lambda *ts: twin.run_piece(name, rebuild(ts), dynamic),  # compiled pieces fail loudly, never run eagerly
        lambda *ts: reference.run(name, rebuild(ts), dynamic),
        *[flat[i] for i in where],
    )


class EngineForward:
    """A decoder body's forward from an engine's compiled pieces (see the module doc).

    ``rla.align(model, profile, ops=this)`` installs it; ``profile`` must be the row the pieces
    realise (the calibrated row of the engine version and mode)."""

    def __init__(self, engine, mode: str, profile: profiles.RoundingProfile, library: str | None = None,
                 compile_backward: str | None = None):
        if mode not in MODES or mode == "native":
            raise ValueError(f"engine-backed forward modes are 'default' and 'eager', got {mode!r}")
        if compile_backward is not None and not isinstance(compile_backward, str):
            raise TypeError(f"compile_backward names a torch.compile backend ('aot_eager', 'inductor') or is None, "
                            f"got {compile_backward!r}")
        self.engine, self.mode, self.profile, self.library = engine, mode, profile, library
        self.compile_backward = compile_backward
        self.name = f"vLLM {engine.version} {mode}-mode pieces"
        self._twins: dict[str, VllmTwin] = {}
        self._references: dict[int, _Reference] = {}

    def _twin(self, causal_lm, body) -> VllmTwin:
        """One twin (one set of compiled pieces) per model shape, device and dtype: aligning
        again, or another model of the same config, reuses the compiled pieces instead of
        compiling them anew (each new set would count against Dynamo's recompile limit)."""
        w = body.embed_tokens.weight
        cfg = {k: v for k, v in body.config.to_dict().items() if k not in ("_name_or_path", "architectures")}
        key = repr((sorted(cfg.items(), key=str), str(w.device), str(w.dtype), body.config._attn_implementation))
        if key not in self._twins:
            self._twins[key] = VllmTwin(causal_lm, self.engine, self.mode, self.library).release_model()
        return self._twins[key]

    def __repr__(self) -> str:
        return f"EngineForward({self.name}, profile {self.profile.name})"

    def __deepcopy__(self, memo):  # a copied model shares the engine and the compiled pieces
        return self

    def make_forward(self, causal_lm, body):
        """The body forward to install on ``body`` (``causal_lm``'s decoder); raises what is not covered."""
        cfg = body.config
        if cfg.model_type not in SUPPORTED_FAMILIES:
            raise NotImplementedError(
                f"{self.name}: the engine-backed forward covers {', '.join(SUPPORTED_FAMILIES)}; "
                f"this model is {cfg.model_type!r}"
            )
        dtype = body.embed_tokens.weight.dtype
        if dtype not in (torch.bfloat16, torch.float16):
            raise ValueError(
                f"{self.name}: the engine runs the model in its weights' dtype; got {dtype}. Load or cast "
                "the model to bfloat16 (fp32 master weights under autocast are not this mode)"
            )
        _check_linears(self.name, body)
        twin = self._twin(causal_lm, body)
        if twin.cos_sin_cache.shape[-1] != twin.head_dim:
            raise NotImplementedError(f"{self.name}: partial rotary (rotary_dim < head_dim) is not covered")
        if id(twin) not in self._references:  # one per twin: its compiled recomputation is reused too
            self._references[id(twin)] = _Reference(self.profile, twin, self.compile_backward)
        reference = self._references[id(twin)]
        name = self.name

        def forward(self, input_ids=None, attention_mask=None, position_ids=None, **kwargs):
            _check_call(name, kwargs)
            if input_ids is None:
                raise ValueError(f"{name}: input_ids are required (inputs_embeds is not covered)")
            if _sharded(self):
                raise NotImplementedError(
                    f"{name}: the model's parameters are sharded (FSDP2 DTensors); the engine-backed forward "
                    "reads whole weights and bypasses the layers that gather them: not covered"
                )
            _check_linears(name, self)
            if torch.compiler.is_compiling():
                raise RuntimeError(f"{name}: compiles its own pieces; do not torch.compile the aligned model")
            if self.embed_tokens.weight.device != twin.device:
                raise RuntimeError(
                    f"{name}: aligned on {twin.device}, the model is now on {self.embed_tokens.weight.device}; "
                    "align again after moving it"
                )
            return _run(self, twin, reference, input_ids, attention_mask, position_ids)

        return forward


def _sharded(body) -> bool:
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # a torch built without distributed
        return False
    return isinstance(body.embed_tokens.weight, DTensor)


_LINEARS = (("self_attn", "q_proj"), ("self_attn", "k_proj"), ("self_attn", "v_proj"), ("self_attn", "o_proj"),
            ("mlp", "gate_proj"), ("mlp", "up_proj"), ("mlp", "down_proj"))


def _check_linears(name, body) -> None:
    """The pieces read each projection's ``weight`` (and bias): a LoRA, quantized or otherwise
    wrapped linear would compute something else than its weight says, so it is refused."""
    for i, layer in enumerate(body.layers):
        for block, proj in _LINEARS:
            mod = getattr(getattr(layer, block), proj)
            if type(mod) is not torch.nn.Linear:
                raise NotImplementedError(
                    f"{name}: layers[{i}].{block}.{proj} is a {type(mod).__module__}.{type(mod).__qualname__}, "
                    "not a plain torch.nn.Linear "
                    "(PEFT adapters, quantized layers): the engine's pieces read its weight only; not covered"
                )


def _check_call(name, kwargs):
    embeds = kwargs.pop("inputs_embeds", None)
    if embeds is not None:
        raise ValueError(f"{name}: inputs_embeds is not covered; pass input_ids")
    for key in ("cache", "past_key_values"):
        cache = kwargs.pop(key, None)
        if cache is not None and cache.get_seq_length() > 0:
            raise ValueError(
                f"{name}: a forward over whole sequences (training, scoring): it keeps no KV cache; "
                "generate with the engine, or rla.unalign the model first"
            )
    for key in _REFUSED_TRUE:
        if kwargs.pop(key, False):
            raise ValueError(f"{name}: {key}=True is not covered (the forward runs the engine's pieces, not HF's layers)")
    for key in _IGNORED:
        kwargs.pop(key, None)
    if kwargs:
        raise TypeError(f"{name}: unexpected arguments {sorted(kwargs)} (not covered by the engine-backed forward)")


def _run(body, twin, reference, input_ids, attention_mask, position_ids):
    from transformers.modeling_outputs import BaseModelOutputWithPast

    b, s = input_ids.shape
    position_ids = twin.positions(input_ids, position_ids)
    mask, extra = attention_inputs(body, input_ids, attention_mask, position_ids)
    ids, positions = input_ids.reshape(-1), position_ids.reshape(-1)
    attn_mods = [layer.self_attn for layer in body.layers]

    def attend(i, q, k, v):
        module = attn_mods[i]
        dropout = module.attention_dropout if module.training else 0.0
        return twin.attend(module, q, k, v, mask, b, s, dropout, extra)

    hidden, streams = twin.run_layers(
        ids, positions, body.embed_tokens.weight, [VllmTwin.layer_weights(layer) for layer in body.layers],
        body.norm.weight, attend, lambda name, args, dynamic: _piece(twin, reference, name, args, dynamic),
    )
    record = body.__dict__.get(_RECORD)
    if record is not None:
        record.extend(t.detach().view(b, s, -1) for t in streams)
    return BaseModelOutputWithPast(last_hidden_state=hidden.view(b, s, -1))


@contextlib.contextmanager
def recording_streams(body):
    """Inside the block, an engine-backed ``body`` appends the residual stream after each decoder
    layer ([B, S, hidden], as the twin records it) to the yielded list: HF's layer hooks do not
    fire, since the forward runs the engine's pieces, not HF's layers."""
    streams: list[torch.Tensor] = []
    body.__dict__[_RECORD] = streams
    try:
        yield streams
    finally:
        body.__dict__.pop(_RECORD, None)


def engine_forward(engine, mode: str = "default", library: str | None = None, profile=None,
                   compile_backward: str | None = None) -> EngineForward:
    """An engine-backed body forward for ``rla.align(..., ops=...)``: ``engine``'s pieces in the
    forward (``mode`` 'default': vLLM's native ops compiled by Inductor in pieces; 'eager': its
    CUDA kernels), ``rla.ops``' gradient of ``profile`` in the backward (default: the calibrated
    row of this engine version and mode), recomputed eagerly or, with ``compile_backward`` (a
    ``torch.compile`` backend: see the module doc), compiled."""
    p = profiles.resolve(profile) if profile is not None else calibrated_profile("vllm", engine.version, mode)
    return EngineForward(engine, mode, p, library, compile_backward)
