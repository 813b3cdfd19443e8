"""The engine twin of Qwen3.5 dense's text model (``qwen3_5_text``), laid out as vLLM 0.33's ``models/qwen3_5.py``.

vLLM's ``Qwen3_5DecoderLayer`` is ``Qwen3NextDecoderLayer`` (``models/qwen3_next.py``) with Qwen3.5's mixers:
``forward`` opens with ``input_layernorm`` (plain on the first layer, else the fused add + norm of the previous
layer's output and residual), runs the token mixer, then ``post_attention_layernorm(h, residual)`` (fused add +
norm), the MLP (``Qwen2MoeMLP`` as ``Qwen3NextMLP``: one gate/up GEMM, ``SiluAndMul``, down), and returns
``(h, residual)``; ``Qwen3NextModel.forward`` ends with ``norm(h, residual)``. Every norm is ``GemmaRMSNorm``
(``x * rstd * (1 + w)``, ``1 + w`` in fp32: ``forward_native`` in every mode, ``rla.engines.vllm_family_ops``).

The mixers:

- **Gated DeltaNet (linear attention): HF's own ``Qwen3_5GatedDeltaNet`` module**, on both sides, as the
  attention function is (rla leaves the mixer as it is; vLLM runs FLA / FlashInfer kernels for it). vLLM's
  graph splits at its core op (``vllm::qwen_gdn_attention_core`` is in ``CompilationConfig._attention_ops``);
  here the whole module is outside the pieces: its output, a bf16 GEMM result in both, enters the next piece.
- **Full attention: ``Qwen3NextAttention.forward``**: one QKV GEMM of ``[q|gate]`` per head, k, v
  (``qkv_proj`` of ``num_heads * 2`` query heads), ``_project_qkv_gate``, attention, then
  ``attn_output * torch.sigmoid(gate)`` and ``o_proj`` (in the next piece: the split is at attention).
  ``_project_qkv_gate``, by ``qk``:

  - ``"kernel"`` (default): what vLLM runs on CUDA in both modes (``use_fused_qk_norm_rope_gate``): its Triton
    kernel ``fused_qk_rmsnorm_rope_gate`` (``layers/fused_qk_norm_rope.py``, loaded from the wheel by
    :func:`rla.engines.vllm_families.qwen3_5_qk_norm_rope_gate`) on ``qkv.split([2q, kv, kv])``, the bf16 norm
    weights with ``norm_beta=1``, the bf16 cos/sin cache and mRoPE's [3, T] positions with the rotary's
    ``mrope_section`` (a text prompt's three equal rows). The kernel is not a custom op in vLLM; Inductor
    launches a user-defined Triton kernel as it is and fuses nothing into it, so the twin holds it as an opaque
    op of its own (``rla_twin::qwen3_5_qk_norm_rope_gate``) inside the piece. On a CPU it runs only under
    Triton's interpreter (``TRITON_INTERPRET=1`` before the kernel is imported; the interpreter's fp32 -> bf16
    cast truncates, the compiled one rounds to nearest: tests/ops/interpreter_compat.py's ``round_bf16_casts``
    repairs it, as the kernel tests do).
  - ``"modules"``: the path without the kernel (not CUDA/XPU): ``qkv.split``, the gated split on
    ``view(T, heads, -1)`` + ``chunk(2)``, the ``q_norm`` / ``k_norm`` ``GemmaRMSNorm`` modules on
    [T, heads, head_dim], then ``MRotaryEmbedding.forward_native`` (the partial NeoX rotary on mRoPE positions,
    ``rla.engines.vllm_family_ops``), compiled into the piece in default mode.

The cos/sin cache is ``get_rope``'s for ``rope_type='default'`` with ``mrope_section``: an ``MRotaryEmbedding``
(``positions_factor`` 1 for a text model: ``qwen3_vl.mrope_positions_factor``) whose table is the base class's
``_compute_cos_sin_cache`` over ``head_dim * partial_rotary_factor`` dims, stored in the model's dtype.

Modes as :class:`rla.engines.vllm_twin.VllmTwin`'s: ``default`` compiles the pieces between mixers with Inductor
(``SiluAndMul`` and the norms' native code fused; the q/k kernel opaque), ``eager`` takes vLLM's CUDA
``silu_and_mul`` (the norms stay ``forward_native``), ``native`` runs the native ops eagerly. The per-layer
trace is the residual stream entering each layer's mixer, as for the Llama layout.
"""

from __future__ import annotations

import itertools
import os
import weakref

import torch
import torch.nn.functional as F

from rla.engines.vllm_twin import TwinOutput, VllmTwin, compiled_piece, layer_attention_inputs

__all__ = ["Qwen3_5Twin", "QK_PATHS"]

QK_PATHS = ("kernel", "modules")

_KERNELS: "weakref.WeakValueDictionary[int, Qwen3_5Twin]" = weakref.WeakValueDictionary()
_KEYS = itertools.count()
_OPS: dict = {}


def _qk_op():
    """The twin's opaque q/k op, registered once per process (at the first kernel twin): the kernel
    of the twin ``key`` names, on the tensors ``Qwen3NextAttention._project_qkv_gate`` hands it."""
    if not _OPS:
        @torch.library.custom_op("rla_twin::qwen3_5_qk_norm_rope_gate", mutates_args=())
        def qk_norm_rope_gate(q_gate: torch.Tensor, k: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor,
                              cache: torch.Tensor, positions: torch.Tensor, key: int, eps: float, heads: int,
                              kv_heads: int, head_dim: int, rotary_dim: int,
                              mrope_section: list[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
            return _KERNELS[key].kernel(q_gate, k, q_weight, k_weight, cache, positions, eps, heads, kv_heads,
                                        head_dim, rotary_dim, mrope_section=mrope_section)

        @qk_norm_rope_gate.register_fake
        def _(q_gate, k, q_weight, k_weight, cache, positions, key, eps, heads, kv_heads, head_dim, rotary_dim,
              mrope_section):
            t = q_gate.shape[0]
            q = q_gate.new_empty((t, heads * head_dim))
            return q, k.new_empty((t, kv_heads * head_dim)), torch.empty_like(q)

        _OPS["qk"] = qk_norm_rope_gate
    return _OPS["qk"]


class Qwen3_5Twin(VllmTwin):
    """vLLM 0.33's Qwen3.5 dense forward of an HF ``Qwen3_5ForCausalLM`` (see the module doc); arguments as
    :class:`rla.engines.vllm_twin.VllmTwin`, and ``qk`` (:data:`QK_PATHS`): the q/k norm + RoPE path."""

    FAMILIES = ("qwen3_5_text",)

    def __init__(self, model, engine, mode: str = "default", library: str | None = None, *, qk: str = "kernel",
                 **options):
        cfg = model.config
        if qk not in QK_PATHS:
            raise ValueError(f"qk must be one of {QK_PATHS}, got {qk!r}")
        if cfg.model_type in self.FAMILIES:
            _check_config(cfg)
        self.family = engine.family_ops()
        self.qk = qk
        super().__init__(model, engine, mode, library, **options)
        rp = cfg.rope_parameters
        self.rotary_dim = self.cos_sin_cache.shape[-1]
        self.mrope_section = [int(x) for x in rp["mrope_section"]]
        self.mrope = self.family.mrope_module(self.cos_sin_cache, self.head_dim, self.rotary_dim, self.mrope_section,
                                              bool(rp.get("mrope_interleaved", False)))
        self.kinds = [layer.block_type for layer in model.model.layers]
        self.mixers = [getattr(layer, "linear_attn", None) or layer.self_attn for layer in model.model.layers]
        if qk == "kernel":
            self._load_kernel(engine)
        self._pieces: dict = {}

    def _load_kernel(self, engine):
        from rla.engines import vllm_families
        from rla.engines.source import cache_dir

        if self.device.type == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
            raise RuntimeError(
                "vLLM's Qwen3.5 q/k norm + RoPE is a Triton kernel (fused_qk_rmsnorm_rope_gate): on a CPU it runs "
                "under Triton's interpreter only (TRITON_INTERPRET=1 before the kernel is loaded, its bf16 casts "
                "rounded to nearest as tests/ops/interpreter_compat.round_bf16_casts does); or build the twin with "
                "qk='modules' (vLLM's path without the kernel)")
        self.kernel, self.kernel_provenance = vllm_families.qwen3_5_qk_norm_rope_gate(
            engine.package, cache_dir() / "extracted")
        _qk_op()
        self.kernel_key = next(_KEYS)
        _KERNELS[self.kernel_key] = self

    @staticmethod
    def first_attention(body):
        return next(layer.self_attn for layer in body.layers if layer.block_type == "full_attention")

    def _bind_ops(self, engine, mode, library):
        super()._bind_ops(engine, mode, library)
        fam = self.family
        self.norm = fam.gemma_rms_norm
        self.add_norm = lambda x, residual, weight, eps: fam.gemma_rms_norm(x, weight, eps, residual)

    def layer_weights(self, layer, merged_gemms: bool = False):
        m = layer.mlp
        w = self.mixer_weights(layer, merged_gemms)
        w.update(wg=m.gate_proj.weight, wu=m.up_proj.weight, wd=m.down_proj.weight)
        if merged_gemms:
            w["wgu"] = torch.cat((w["wg"], w["wu"]))
        return w

    @staticmethod
    def mixer_weights(layer, merged_gemms: bool = False) -> dict:
        """A layer's kind, its two norms' weights and, for full attention, the attention's tensors."""
        w = {"kind": layer.block_type, "in": layer.input_layernorm.weight,
             "post": layer.post_attention_layernorm.weight}
        if layer.block_type == "full_attention":
            a = layer.self_attn
            w.update(wq=a.q_proj.weight, bq=a.q_proj.bias, wk=a.k_proj.weight, bk=a.k_proj.bias, wv=a.v_proj.weight,
                     bv=a.v_proj.bias, wo=a.o_proj.weight, bo=a.o_proj.bias, qn=a.q_norm.weight, kn=a.k_norm.weight)
            if merged_gemms:
                w["wqkv"] = torch.cat((w["wq"], w["wk"], w["wv"]))
                w["bqkv"] = None if w["bq"] is None else torch.cat((w["bq"], w["bk"], w["bv"]))
        return w

    def release_model(self):
        raise NotImplementedError("the Qwen3.5 twin keeps its model (its linear-attention mixers are HF's modules)")

    # -- the layer, as vLLM's model code lays it out ---------------------------------------------

    def _mixer_inputs(self, h, w, positions):
        """Normed hidden -> what the mixer takes: ``(h,)`` for the linear attention (HF's module), else
        ``(q, k, v, gate)`` (``Qwen3NextAttention.forward`` up to ``self.attn``)."""
        if w["kind"] == "linear_attention":
            return (h,)
        if "wqkv" in w:
            qkv = F.linear(h, w["wqkv"], w["bqkv"])
        else:
            qkv = torch.cat([F.linear(h, w[n], w[b]) for n, b in (("wq", "bq"), ("wk", "bk"), ("wv", "bv"))], dim=-1)
        q_size, kv_size = self.n_heads * self.head_dim, self.n_kv * self.head_dim
        q_gate, k, v = qkv.split([q_size * 2, kv_size, kv_size], dim=-1)
        mrope_positions = positions.expand(3, -1)  # a text prompt's [3, T] mRoPE positions: three equal rows
        if self.qk == "kernel":
            q, k, gate = torch.ops.rla_twin.qwen3_5_qk_norm_rope_gate(
                q_gate, k, w["qn"], w["kn"], self.cos_sin_cache, mrope_positions.contiguous(), self.kernel_key,
                self.eps, self.n_heads, self.n_kv, self.head_dim, self.rotary_dim, self.mrope_section)
            return q, k, v, gate
        t = q_gate.shape[0]
        q, gate = torch.chunk(q_gate.view(t, self.n_heads, -1), 2, dim=-1)
        q, gate = q.reshape(t, -1), gate.reshape(t, -1)
        q = self.norm(q.view(-1, self.n_heads, self.head_dim), w["qn"], self.eps).view(-1, q_size)
        k = self.norm(k.view(-1, self.n_kv, self.head_dim), w["kn"], self.eps).view(-1, kv_size)
        q, k = self.mrope.forward_native(mrope_positions, q, k)
        return q, k, v, gate

    def _mixer_output(self, out, w):
        """The mixer's output as the layer adds it: HF's module output, or ``o_proj(attn * sigmoid(gate))``."""
        if w["kind"] == "linear_attention":
            return out[0]
        attn, gate = out
        return F.linear(attn * torch.sigmoid(gate), w["wo"], w["bo"])

    def _mlp(self, hidden, residual, w):
        hidden, residual = self.add_norm(hidden, residual, w["post"], self.eps)
        if "wgu" in w:
            gate_up = F.linear(hidden, w["wgu"])
        else:
            gate_up = torch.cat((F.linear(hidden, w["wg"]), F.linear(hidden, w["wu"])), dim=-1)
        return F.linear(self.act(gate_up), w["wd"]), residual

    # -- the pieces vLLM compiles between mixers ----------------------------------------------------

    def _first_piece(self, ids, positions, embed, w):
        hidden = F.embedding(ids, embed)
        return self._mixer_inputs(self.norm(hidden, w["in"], self.eps), w, positions), hidden

    def _middle_piece(self, out, residual, positions, w, w_next):
        hidden, residual = self._mlp(self._mixer_output(out, w), residual, w)
        hidden, residual = self.add_norm(hidden, residual, w_next["in"], self.eps)
        return self._mixer_inputs(hidden, w_next, positions), residual

    def _last_piece(self, out, residual, w, final):
        hidden, residual = self._mlp(self._mixer_output(out, w), residual, w)
        return self.add_norm(hidden, residual, final, self.eps)

    def _piece(self, name: str, kinds: tuple):
        """Piece ``name`` for the layer kinds it spans, compiled once per kind pair in default mode."""
        key = (name, kinds)
        if key not in self._pieces:
            method = getattr(self, f"_{name}_piece")
            self._pieces[key] = compiled_piece(method) if self.mode == "default" else method
        return self._pieces[key]

    def run_piece(self, name, args, dynamic, kinds=()):
        if self.mode == "default":
            self.mark_tokens(*[t for a in args[:dynamic] for t in (a if isinstance(a, tuple) else (a,))])
        return self._piece(name, kinds)(*args)

    # -- the forward -------------------------------------------------------------------------------

    def layer_masks(self, input_ids, position_ids) -> list:
        return [mask for mask, _ in layer_attention_inputs(self.model.model, input_ids, None, position_ids)]

    @torch.no_grad()
    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor | None = None) -> TwinOutput:
        b, s = input_ids.shape
        position_ids = self.positions(input_ids, position_ids)
        masks = self.layer_masks(input_ids, position_ids)
        ids, positions = input_ids.reshape(-1), position_ids.reshape(-1)
        hidden, streams = self.run_layers(ids, positions, self.embed, self.layers, self.final_norm,
                                          lambda i, inputs: self.mix(i, inputs, masks[i], b, s))
        logits = self.logits(hidden)
        shape = (b, s, -1)
        return TwinOutput(logits.view(shape), [t.view(shape) for t in streams])

    __call__ = forward

    def mix(self, i, inputs, mask, b, s):
        """Layer ``i``'s mixer outside the pieces: HF's Gated DeltaNet module on [B, S, hidden] as HF's
        layer calls it, or HF's attention function -> what the next piece reads."""
        if self.kinds[i] == "linear_attention":
            (h,) = inputs
            out = self.mixers[i](hidden_states=h.view(b, s, -1), cache=None, attention_mask=mask)
            return (out.reshape(b * s, -1),)
        q, k, v, gate = inputs
        return self.attend(self.mixers[i], q, k, v, mask, b, s), gate

    def run_layers(self, ids, positions, embed, layers, final, attend, run_piece=None):
        """The pieces in model order, ``attend(i, inputs)`` (layer i's mixer, :meth:`mix`) between them."""
        run_piece = run_piece or self.run_piece
        kinds = [w["kind"] for w in layers]
        inputs, residual = run_piece("first", (ids, positions, embed, layers[0]), 2, (kinds[0],))
        streams = []
        for i, w in enumerate(layers):
            out = attend(i, inputs)
            if i + 1 < len(layers):
                inputs, residual = run_piece("middle", (out, residual, positions, w, layers[i + 1]), 3,
                                             (kinds[i], kinds[i + 1]))
            else:
                hidden, residual = run_piece("last", (out, residual, w, final), 2, (kinds[i],))
            streams.append(residual)
        return hidden, streams


def _check_config(cfg):
    """What vLLM's Qwen3.5 layers compute that the twin lays out, else a clear error."""
    if cfg.hidden_act != "silu":
        raise NotImplementedError(f"vLLM's Qwen3.5 MLP (Qwen2MoeMLP) supports hidden_act='silu' only; "
                                  f"got {cfg.hidden_act!r}")
    rp = dict(getattr(cfg, "rope_parameters", None) or {})
    if rp.get("rope_type", "default") != "default" or "mrope_section" not in rp:
        raise NotImplementedError(f"the Qwen3.5 twin builds get_rope's MRotaryEmbedding for rope_type='default' with "
                                  f"mrope_section; got {rp}")
    if getattr(cfg, "layer_scale", False):
        raise NotImplementedError("layer_scale: vLLM's Qwen3NextDecoderLayer scales the mixer and MLP outputs, which "
                                  "HF's Qwen3.5 layer does not")
    bad = sorted(set(cfg.layer_types) - {"linear_attention", "full_attention"})
    if bad:
        raise NotImplementedError(f"Qwen3.5 layer types {bad}: vLLM's Qwen3_5DecoderLayer builds linear_attention "
                                  "and full_attention only")
