"""The engine twin: an HF decoder's forward as vLLM runs it, with vLLM's own region code.

Per-op conformance cannot see what an engine's compiler does *between* ops. The twin can: it
takes an HF model's weights and runs the forward the way vLLM's model code lays it out, where
every region (RMSNorm, residual-add + RMSNorm, SiluAndMul, rotary embedding and its cos/sin cache)
is vLLM's own function, loaded from its package by :mod:`rla.engines.vllm`, while the GEMMs
(``F.linear`` on the same weights) and the attention (the HF model's own attention function and
mask) are the same on both sides. Any difference between the twin and ``rla.align(model,
profile)`` is then a rounding location (or an arithmetic order) that the profile gets wrong.

Layout (vLLM's ``Qwen2DecoderLayer`` / ``Qwen3DecoderLayer`` / ``LlamaDecoderLayer``): tokens are
flattened to [T, hidden]; each layer starts with a fused add + norm of the previous layer's MLP
output and residual (the first with a plain norm), attention is q/k/v projections, Qwen3's per-head
q/k norms, rotary on [T, heads*head_dim] with the engine's cos/sin cache indexed by position, then
o_proj, a fused add + norm, gate/up, SiluAndMul on cat(gate, up), down; the model ends with a
fused add + final norm, and logits are ``F.linear`` in bf16 outside the compiled graph.

Modes:

- ``default``: vLLM V1's default. The native ops are compiled with Inductor the way vLLM compiles
  a model: one graph split at attention into pieces, attention opaque between them. A piece is
  [layer i after attention + layer i+1 up to attention], so Inductor fuses across the residual add
  and the q/k-norm -> RoPE chain exactly where vLLM's compiled graph can. The weights are piece
  inputs, so one compiled piece serves every middle layer.
- ``eager``: ``enforce_eager``: vLLM's compiled CUDA kernels (``torch.ops._C``), no compiler.
- ``native``: the native ops run eagerly (no compiler): every bf16 op rounds. Not an engine mode;
  useful on machines without a GPU to separate what the compiler does from what the ops do.

The per-layer trace is the residual stream entering each layer's attention (after the previous
layer's MLP add), which crosses a piece boundary as a bf16 tensor in vLLM too: recording it does
not change what Inductor fuses. The last entry is the stream the final norm reads, rounded.

Other families subclass this one, overriding the hooks their model file changes (the cos/sin cache,
the region functions, the layer's weights and pieces, the masks, the logits):
:mod:`rla.engines.vllm_twin_gemma3` (Gemma 3), :mod:`rla.engines.vllm_twin_gemma4` (Gemma 4; what the two
share is :mod:`rla.engines.vllm_twin_gemma`),
:mod:`rla.engines.vllm_twin_moe` (GLM-4 MoE, GPT-OSS); :mod:`rla.engines.vllm_twin_qwen3_5` (Qwen3.5 dense) and
:mod:`rla.engines.vllm_twin_qwen3_5_moe` (Qwen3.5 MoE);
:func:`rla.engines.vllm_twin_families.build_twin` picks the class by ``config.model_type``.
"""

from __future__ import annotations

import itertools
import types
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

__all__ = ["VllmTwin", "TwinOutput", "MODES", "SUPPORTED_FAMILIES", "attention_inputs", "layer_attention_inputs",
           "compiled_piece"]

MODES = ("default", "eager", "native")
SUPPORTED_FAMILIES = ("qwen2", "qwen3", "llama")


@dataclass
class TwinOutput:
    logits: torch.Tensor
    """[B, S, vocab] in the model's dtype (vLLM computes bf16 logits by default)."""
    layers: list[torch.Tensor] = field(default_factory=list)
    """Residual stream after each decoder layer, [B, S, hidden] in the model's dtype."""


#: Keyword arguments the attention *module* consumes; the rest reach its attention function.
_MODULE_OWN = ("hidden_states", "position_embeddings", "attention_mask", "cache", "past_key_values",
               "use_cache", "cache_position")


def attention_inputs(body, input_ids, attention_mask, position_ids):
    """What HF's own decoder ``body`` hands its first attention layer for these inputs: the mask
    (None under SDPA's causal path; padding and packed sequences included) and the keyword
    arguments its attention function receives from the layer (e.g. ``position_ids``, which flash
    attention reads packed sequences from). The body's *class* forward runs up to that attention,
    where a pre-hook takes them and stops it (so an instance forward installed by rla.align is not
    re-entered). The twin and the engine-backed forward attend on the same mask as HF."""
    seen = {}

    def hook(module, args, kwargs):
        seen["mask"] = kwargs.get("attention_mask")
        seen["extra"] = {k: v for k, v in kwargs.items() if k not in _MODULE_OWN}
        raise _Captured

    handle = body.layers[0].self_attn.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        with torch.no_grad():
            type(body).forward(body, input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids)
    except _Captured:
        pass
    finally:
        handle.remove()
    if "mask" not in seen:
        raise RuntimeError("the HF body's first attention layer was never called")
    return seen["mask"], seen["extra"]


class _Captured(Exception):
    pass


class _LayerRecorder(torch.nn.Module):
    """Stands in for a decoder layer while :func:`layer_attention_inputs` runs the body: records the
    keyword arguments the body hands the layer and passes the hidden states on."""

    def __init__(self, seen: list, attention_type=None):
        super().__init__()
        self.seen, self.attention_type = seen, attention_type

    def forward(self, hidden_states, *args, **kwargs):
        self.seen.append(kwargs)
        return hidden_states


def layer_attention_inputs(body, input_ids, attention_mask, position_ids) -> list:
    """Per decoder layer, ``(mask, extra)`` as HF's own ``body`` hands it to that layer, which passes
    them on to its attention (Gemma 3 and GPT-OSS build one mask per layer type, sliding or full,
    and pick each layer's from ``config.layer_types``). The body's *class* forward runs with its
    layers replaced for the call by recorders (nothing of the layers runs), then restored."""
    seen: list[dict] = []
    layers = body.layers
    body.layers = torch.nn.ModuleList(_LayerRecorder(seen, getattr(layer, "attention_type", None)) for layer in layers)
    try:
        with torch.no_grad():
            type(body).forward(body, input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids)
    finally:
        body.layers = layers
    if len(seen) != len(layers):
        raise RuntimeError(f"the HF body called {len(seen)} of its {len(layers)} decoder layers")
    return [(kw.get("attention_mask"), {k: v for k, v in kw.items() if k not in _MODULE_OWN}) for kw in seen]


class VllmTwin:
    """vLLM's forward of ``model`` (an HF Qwen2/Qwen3/Llama ``*ForCausalLM``) from ``engine``'s code.

    ``engine`` is :func:`rla.engines.vllm.load`'s result; ``library`` (eager mode) names vLLM's
    kernel library if it is not in the engine's package.

    ``inductor_options`` (default mode): Inductor configuration the pieces compile under, e.g. the
    engine's own ``CompilationConfig().inductor_compile_config`` read from its package at run time
    (vLLM sets ``combo_kernels`` and ``benchmark_combo_kernel``, which decide how kernels are
    grouped); None compiles with stock Inductor. ``merged_gemms``: q/k/v and gate/up as one GEMM
    each over the concatenated weights, then split, as vLLM's ``QKVParallelLinear`` and
    ``MergedColumnParallelLinear`` compute them (the GEMM's shape picks the BLAS kernel, and with
    it the reduction order); False keeps one GEMM per projection.
    """

    #: ``config.model_type`` values this class lays out (subclasses: their own family).
    FAMILIES = SUPPORTED_FAMILIES

    def __init__(self, model, engine, mode: str = "default", library: str | None = None, *,
                 inductor_options: dict | None = None, merged_gemms: bool = False):
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        cfg = model.config
        if cfg.model_type not in self.FAMILIES:
            raise NotImplementedError(
                f"the vLLM twin covers {', '.join(self.FAMILIES)}; this model is {cfg.model_type!r}"
                + ("" if type(self) is not VllmTwin else
                   " (Gemma 3, Gemma 4, GLM-4 MoE, GPT-OSS and Qwen3.5: rla.engines.vllm_twin_families.build_twin)")
            )
        body = model.model
        if inductor_options and mode != "default":
            raise ValueError(f"inductor_options apply to the compiled default mode, not {mode!r}")
        self.model, self.engine, self.mode = model, engine, mode
        self.merged_gemms = merged_gemms
        self.dtype = body.embed_tokens.weight.dtype
        self.device = body.embed_tokens.weight.device
        self.eps = float(cfg.rms_norm_eps)
        self.head_dim, self.n_heads, self.n_kv = self._attention_shape(cfg)
        self.cos_sin_cache = self._rope_cache(cfg, engine)
        self.layers = [self.layer_weights(layer, merged_gemms) for layer in body.layers]
        self.final_norm = body.norm.weight
        self.embed = body.embed_tokens.weight
        self.lm_head = model.lm_head.weight
        self._attention_fn = _attention_function(model, self.first_attention(body))
        self._bind_ops(engine, mode, library)
        # the pieces as the engine runs them (compiled in default mode): first(ids, positions,
        # embed, w), middle(attn, residual, positions, w, w_next), last(attn, residual, w, final)
        self.first, self.middle, self.last = self._first_piece, self._middle_piece, self._last_piece
        if mode == "default":
            self.first, self.middle, self.last = (
                compiled_piece(self._first_piece, inductor_options), compiled_piece(self._middle_piece, inductor_options),
                compiled_piece(self._last_piece, inductor_options),
            )

    @staticmethod
    def first_attention(body):
        """The body's first attention module (whose class names HF's attention function)."""
        return body.layers[0].self_attn

    @staticmethod
    def _attention_shape(cfg) -> tuple[int, int, int]:
        """(head size, query heads, key/value heads) of the config's attention (a family whose
        layers differ overrides this and reads each layer's own)."""
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        return head_dim, cfg.num_attention_heads, cfg.num_key_value_heads

    def _rope_cache(self, cfg, engine, partial_rotary_default: float = 1.0):
        """The engine's cos/sin cache for the config's rope parameters, in the model's dtype (a
        family whose model file builds it otherwise overrides this)."""
        rp = dict(getattr(cfg, "rope_parameters", None) or {})
        rope_type = rp.get("rope_type", "default")
        scaling = None if rope_type == "default" else rp
        rotary_dim = int(self.head_dim * rp.get("partial_rotary_factor", partial_rotary_default))
        return engine.cos_sin_cache(
            self.head_dim, rotary_dim, cfg.max_position_embeddings, rp["rope_theta"], scaling,
            dtype=self.dtype, device=self.device,
        )

    def _bind_ops(self, engine, mode, library):
        """The region functions of ``mode``: eager, vLLM's CUDA kernels; otherwise its native ops."""
        if mode == "eager":
            k = engine.c_ops(library)
            self.norm, self.add_norm, self.act = k.rms_norm, k.fused_add_rms_norm, k.silu_and_mul
            self.rope = lambda pos, q, kk, d, cache: k.rotary_embedding(pos, q, kk, d, cache, True)
        else:
            self.norm, self.add_norm = engine.rms_norm_native, engine.fused_add_rms_norm_native
            self.act = engine.silu_and_mul_native
            self.rope = lambda pos, q, kk, d, cache: engine.rope_native(pos, q, kk, d, cache, True)

    @staticmethod
    def layer_weights(layer, merged_gemms: bool = False):
        """One decoder layer's tensors by the names the pieces read (read anew at each call); with
        ``merged_gemms`` also the concatenated q/k/v and gate/up weights (a copy)."""
        a, m = layer.self_attn, layer.mlp
        w = {
            "in": layer.input_layernorm.weight,
            "post": layer.post_attention_layernorm.weight,
            "wq": a.q_proj.weight, "bq": a.q_proj.bias,
            "wk": a.k_proj.weight, "bk": a.k_proj.bias,
            "wv": a.v_proj.weight, "bv": a.v_proj.bias,
            "wo": a.o_proj.weight,
            "wg": m.gate_proj.weight, "wu": m.up_proj.weight, "wd": m.down_proj.weight,
        }
        if hasattr(a, "q_norm"):
            w["qn"], w["kn"] = a.q_norm.weight, a.k_norm.weight
        return VllmTwin.merge_gemms(w) if merged_gemms else w

    @staticmethod
    def merge_gemms(w: dict) -> dict:
        """``w`` with the concatenated q/k/v and gate/up weights added (copies), which :meth:`_project_qkv`
        and :meth:`_gate_up` read as one GEMM each."""
        w["wqkv"] = torch.cat((w["wq"], w["wk"], w["wv"]))
        w["bqkv"] = None if w["bq"] is None else torch.cat((w["bq"], w["bk"], w["bv"]))
        w["wgu"] = torch.cat((w["wg"], w["wu"]))
        return w

    def release_model(self) -> "VllmTwin":
        """Keep only what the pieces need (config constants, the engine's functions, the cos/sin
        cache): the model's weights are dropped, so a twin kept for its compiled pieces (the
        engine-backed forward caches one per model shape) does not keep a model alive. The
        twin's own ``forward`` is then unavailable; the pieces take every weight as an argument."""
        self.model = None
        self.layers, self.embed, self.lm_head, self.final_norm = [], None, None, None
        return self

    # -- the layer, as vLLM's model code lays it out ---------------------------------------------

    def _qkv(self, hidden, residual, w, positions):
        """Layer start up to attention: (add +) input norm, q/k/v, q/k norms, rotary."""
        if residual is None:
            residual = hidden
            hidden = self.norm(hidden, w["in"], self.eps)
        else:
            hidden, residual = self.add_norm(hidden, residual, w["in"], self.eps)
        q, k, v = self._project_qkv(hidden, w)
        if "qn" in w:  # Qwen3: per-head norms on [T, heads, head_dim]
            t = q.shape[0]
            q = self.norm(q.view(t, -1, self.head_dim), w["qn"], self.eps).view(q.shape)
            k = self.norm(k.view(t, -1, self.head_dim), w["kn"], self.eps).view(k.shape)
        q, k = self.rope(positions, q, k, self.head_dim, self.cache_for(w, q))
        return q, k, v, residual

    @staticmethod
    def _project_qkv(hidden, w):
        """q, k, v of the normed ``hidden``: one GEMM over the concatenated weights, split, as vLLM's
        ``QKVParallelLinear`` (``merged_gemms``), else one GEMM per projection."""
        if "wqkv" in w:
            return F.linear(hidden, w["wqkv"], w["bqkv"]).split(
                [w["wq"].shape[0], w["wk"].shape[0], w["wv"].shape[0]], dim=-1)
        return F.linear(hidden, w["wq"], w["bq"]), F.linear(hidden, w["wk"], w["bk"]), F.linear(hidden, w["wv"], w["bv"])

    @staticmethod
    def _gate_up(hidden, w):
        """[gate | up] of the normed ``hidden``: one GEMM, as vLLM's ``MergedColumnParallelLinear``
        (``merged_gemms``), else two GEMMs concatenated."""
        if "wgu" in w:
            return F.linear(hidden, w["wgu"])
        return torch.cat((F.linear(hidden, w["wg"]), F.linear(hidden, w["wu"])), dim=-1)

    def cache_for(self, w, query):
        """The cos/sin cache layer ``w``'s rotary embedding reads, as its kernel receives it."""
        return self.cos_sin_cache

    def _mlp(self, attn, residual, w):
        """Layer after attention: o_proj, add + post-attention norm, gate/up, SiluAndMul, down."""
        hidden = F.linear(attn, w["wo"], w.get("bo"))
        hidden, residual = self.add_norm(hidden, residual, w["post"], self.eps)
        return F.linear(self.act(self._gate_up(hidden, w)), w["wd"]), residual

    # -- the pieces vLLM compiles between attentions ----------------------------------------------

    def _first_piece(self, ids, positions, embed, w):
        return self._qkv(F.embedding(ids, embed), None, w, positions)

    def _middle_piece(self, attn, residual, positions, w, w_next):
        hidden, residual = self._mlp(attn, residual, w)
        return self._qkv(hidden, residual, w_next, positions)

    def _last_piece(self, attn, residual, w, final):
        hidden, residual = self._mlp(attn, residual, w)
        return self.add_norm(hidden, residual, final, self.eps)

    # -- the forward -------------------------------------------------------------------------------

    @torch.no_grad()
    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor | None = None) -> TwinOutput:
        """Logits and per-layer residual stream for ``input_ids`` [B, S] at ``position_ids``."""
        if self.model is None:
            raise RuntimeError("this twin released its model (release_model): only its pieces can run")
        b, s = input_ids.shape
        position_ids = self.positions(input_ids, position_ids)
        masks = self.layer_masks(input_ids, position_ids)
        ids, positions = input_ids.reshape(-1), position_ids.reshape(-1)
        attn_mods = [layer.self_attn for layer in self.model.model.layers]
        hidden, streams = self.run_layers(
            ids, positions, self.embed, self.layers, self.final_norm,
            lambda i, q, k, v: self.attend(attn_mods[i], q, k, v, masks[i], b, s),
        )
        logits = self.logits(hidden)
        shape = (b, s, -1)
        return TwinOutput(logits.view(shape), [t.view(shape) for t in streams])

    __call__ = forward

    def layer_masks(self, input_ids, position_ids) -> list:
        """The mask each layer's attention receives from HF's body (one for every layer here: a
        family with sliding and full layers takes :func:`layer_attention_inputs`)."""
        mask, _ = attention_inputs(self.model.model, input_ids, None, position_ids)
        return [mask] * len(self.layers)

    def logits(self, hidden):
        """``lm_head`` in the model's dtype, outside the compiled graph (vLLM's ``LogitsProcessor``)."""
        return F.linear(hidden, self.lm_head)

    @property
    def position_limit(self) -> int:
        """Positions the engine's cos/sin cache holds."""
        return self.cos_sin_cache.shape[0]

    def positions(self, input_ids, position_ids=None):
        """``position_ids`` (default 0..S-1 per row), checked against the engine's cos/sin cache."""
        b, s = input_ids.shape
        if position_ids is None:
            position_ids = torch.arange(s, device=input_ids.device)[None].expand(b, s)
        if int(position_ids.max()) >= self.position_limit:
            raise ValueError(
                f"position {int(position_ids.max())} is past the engine's cos/sin cache "
                f"({self.position_limit} positions = max_position_embeddings)"
            )
        return position_ids

    def run_layers(self, ids, positions, embed, layers, final, attend, run_piece=None):
        """The pieces in model order, ``attend(i, q, k, v)`` between them -> (final hidden, the
        residual stream after each layer). ``run_piece(name, args, dynamic)`` runs one piece
        (default :meth:`run_piece`; the engine-backed forward wraps it with rla's gradient)."""
        run_piece = run_piece or self.run_piece
        q, k, v, residual = run_piece("first", (ids, positions, embed, layers[0]), 2)
        streams = []
        for i, w in enumerate(layers):
            attn = attend(i, q, k, v)
            if i + 1 < len(layers):
                q, k, v, residual = run_piece("middle", (attn, residual, positions, w, layers[i + 1]), 3)
            else:
                hidden, residual = run_piece("last", (attn, residual, w, final), 2)
            streams.append(residual)
        return hidden, streams

    def run_piece(self, name: str, args: tuple, dynamic: int):
        """Piece ``name`` (first, middle, last) on ``args``; in default mode the token dimension of
        ``args[:dynamic]`` is marked dynamic first (weights stay static)."""
        if self.mode == "default":
            self.mark_tokens(*args[:dynamic])
        return getattr(self, name)(*args)

    @staticmethod
    def mark_tokens(*tensors):
        """vLLM compiles the token dimension dynamic and every other one static: one graph per
        piece serves every batch size, and the hidden size stays a constant of the kernels."""
        for t in tensors:
            if t.shape[0] > 1:  # Dynamo specialises sizes 0 and 1; a single token compiles its own graph
                torch._dynamo.mark_dynamic(t, 0)

    def attend(self, module, q, k, v, mask, b, s, dropout=0.0, extra=None):
        """The HF model's own attention function on [B, heads, S, head_dim] views, as HF's attention
        module calls it (its sliding window, and ``extra``: the keyword arguments the layer handed
        the module, e.g. ``position_ids`` that a flash-attention function reads packed sequences from);
        the head size is the module's own where it has one (Gemma 4's layer types differ)."""
        d = getattr(module, "head_dim", None) or self.head_dim
        q = q.view(b, s, -1, d).transpose(1, 2)
        k = k.view(b, s, -1, d).transpose(1, 2)
        v = v.view(b, s, -1, d).transpose(1, 2)
        kw = dict(extra or {})
        kw.update(self.attention_kwargs(module))
        out, _ = self._attention_fn(module, q, k, v, mask, dropout=dropout, scaling=module.scaling, **kw)
        return out.reshape(b * s, -1).contiguous()

    def attention_kwargs(self, module) -> dict:
        """What HF's attention module hands its attention function besides q/k/v, the mask, dropout
        and scaling: its sliding window (None on full layers)."""
        return {"sliding_window": module.sliding_window} if hasattr(module, "sliding_window") else {}


_PIECE_CODES = itertools.count()


def compiled_piece(method, options: dict | None = None, backend: str = "inductor"):
    """``method`` compiled as vLLM compiles a piece, on a code object of its own (Inductor
    configured by ``options``, stock when None; ``backend`` another torch.compile backend).

    Dynamo keeps its compiled graphs per code object, at most ``recompile_limit`` (8) of them; past
    that it runs the function *eagerly*, which here would silently be another rounding (the native
    ops unfused). Every twin shares the piece methods' code, so a process that builds twins of
    several models (a test session, a benchmark) would reach the limit. A copy of the code object
    per twin keeps each twin's graphs apart, and a piece that still hits the limit fails loudly."""
    fn = method.__func__
    code = fn.__code__.replace(co_name=f"{fn.__code__.co_name}_{next(_PIECE_CODES)}")  # distinct by value too
    own = types.FunctionType(code, fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)
    compiled = torch.compile(types.MethodType(own, method.__self__), backend=backend, fullgraph=True,
                             options=dict(options) if options else None)

    def run(*args):
        # only the token dimension is dynamic (marked), as vLLM compiles: another layer's weight or
        # cos/sin cache of another shape (Gemma 3's sliding and full caches) recompiles the piece
        # static instead of making that dimension symbolic, which changes the generated kernels
        with torch._dynamo.config.patch(fail_on_recompile_limit_hit=True, automatic_dynamic_shapes=False):
            return compiled(*args)

    return run


def _attention_function(model, attn_module):
    """The attention function the HF attention module calls for this model's implementation."""
    import sys

    impl = model.config._attn_implementation
    if impl == "eager":
        return sys.modules[type(attn_module).__module__].eager_attention_forward
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    return ALL_ATTENTION_FUNCTIONS[impl]
