"""The engine twin of Gemma 4's text model (``gemma4_text``), laid out as vLLM's ``models/gemma4.py``.

vLLM 0.33's ``Gemma4DecoderLayer.forward`` has **no fused add + norm**: ``residual = h``, the
input norm, attention, ``post_attention_layernorm``, ``h + residual``; ``pre_feedforward_layernorm``,
the MLP (``Gemma4MLP``: one gate/up GEMM, ``get_act_and_mul_fn("gelu_pytorch_tanh")`` ->
``GeluAndMul(approximate="tanh")``, down), ``post_feedforward_layernorm``, ``h + residual``; with
per-layer inputs ``gelu(per_layer_input_gate(h), approximate="tanh") * per_layer_input`` (two
PyTorch ops in every mode), ``per_layer_projection``, ``post_per_layer_input_norm``, ``h + p``;
then ``h * layer_scalar`` (a bf16 buffer); the layer returns ``(h, None)``. Every norm is the plain
``RMSNorm`` (``x * rstd * w``; ``v_norm`` has no weight: ``rms_norm(v, None)``), the native IR op
``ir/ops/layernorm.py rms_norm`` (compiled in default mode) or the CUDA ``rms_norm`` kernel in
eager mode (``kernels/vllm_c.py`` registers it for a weight of the input's dtype or none).

``Gemma4Attention.forward``: one QKV GEMM, ``q_norm`` / ``k_norm`` on ``unflatten(-1, (heads,
head_dim))``, ``rotary_emb(positions, q, k)``, ``v_norm``, attention (``scaling=1.0``), ``o_proj``.
With ``attention_k_eq_v`` the full layers' key weights are loaded into both the K and V slots of
``qkv_proj`` (``_gemma4_layer_weights_mapper``): the values are the raw key projection, as HF's.
Each attention's ``get_rope`` reads ``config.rope_parameters[layer_type]`` at that layer's head size
(``config.per_layer_config[i].head_dim``): ``default`` a plain cache, ``proportional``
``Gemma4RotaryEmbedding`` (``rotary_embedding/gemma4_rope.py``, the whole head rotated, zero
frequencies past ``partial_rotary_factor``, no ``factor`` read), both in the model's dtype.

``Gemma4Model.forward`` (compiled whole, split at attention): ``embed_tokens(ids) * normalizer``;
with per-layer inputs ``embed_tokens_per_layer(ids) * embed_scale_per_layer``, then
``per_layer_model_projection(h) * per_layer_projection_scale``, reshaped to [T, layers, D],
``per_layer_projection_norm``, ``(projection + per-layer embeddings) * per_layer_input_scale``; each
layer reads its slice. **The scale constants are bf16 tensors**: ``normalizer`` is made in the
model's dtype, and ``embed_scale_per_layer = torch.tensor(D ** 0.5)``, ``per_layer_input_scale =
torch.rsqrt(torch.tensor(2.0))`` and ``per_layer_projection_scale = torch.tensor(hidden ** -0.5)``
under the bf16 default dtype vLLM's loader sets (``model_loader/base_loader.py``): bf16, where HF
multiplies by the Python floats ``2 ** -0.5`` and ``hidden ** -0.5`` (docs/families.md, "Gemma 4
scale constants"). The model ends with the plain final norm; ``LogitsProcessor`` applies
``final_logit_softcapping`` to the bf16 logits (``/ cap``, ``tanh``, ``* cap``).

So the first compiled piece holds the embedding, the whole per-layer-input computation and the
first layer up to attention; it hands every later piece the per-layer inputs (bf16, [T, layers, D])
and each reads its layer's slice. The per-layer trace is each layer's output (``h * layer_scalar``,
the next layer's residual, which crosses a piece boundary in bf16).

Refused (``NotImplementedError``): MoE layers (``enable_moe_block``: vLLM's router and fused
experts are not laid out here) and K/V sharing (``num_kv_shared_layers``: a shared layer attends on
another layer's cache, which the twin's per-layer attention does not hold), an activation other
than ``gelu_pytorch_tanh`` and rope types other than ``default`` / ``proportional``. Attention is the
HF model's own function with its per-layer-type mask, as on the training side. What the layout shares
with Gemma 3's (the normalizer, the GeGLU, the weights, the caches by layer type, the masks, the softcap)
is :mod:`rla.engines.vllm_twin_gemma`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from rla.engines.vllm_twin import VllmTwin
from rla.engines.vllm_twin_gemma import GemmaTwin

__all__ = ["Gemma4Twin"]


class Gemma4Twin(GemmaTwin):
    """vLLM 0.33's Gemma 4 forward of an HF ``Gemma4ForCausalLM`` (see the module doc); arguments as
    :class:`rla.engines.vllm_twin.VllmTwin`."""

    FAMILIES = ("gemma4_text",)
    NAME = "Gemma 4"
    ROPE_TYPES = ("default", "proportional")

    def __init__(self, model, engine, mode: str = "default", library: str | None = None, **options):
        super().__init__(model, engine, mode, library, **options)
        cfg, body = model.config, model.model
        self.ple = None
        if getattr(cfg, "hidden_size_per_layer_input", 0):
            bf16 = {"dtype": self.dtype, "device": self.device}  # built under the loader's default dtype
            self.ple = {
                "embed": body.embed_tokens_per_layer.weight, "proj": body.per_layer_model_projection.weight,
                "norm": body.per_layer_projection_norm.weight,
                "embed_scale": torch.tensor(cfg.hidden_size_per_layer_input ** 0.5, **bf16),
                "input_scale": torch.rsqrt(torch.tensor(2.0, **bf16)),
                "proj_scale": torch.tensor(cfg.hidden_size ** -0.5, **bf16),
                "vocab": int(getattr(cfg, "vocab_size_per_layer_input", cfg.vocab_size)),
                "layers": cfg.num_hidden_layers, "dim": cfg.hidden_size_per_layer_input,
            }

    def check_config(self, cfg) -> None:
        super().check_config(cfg)
        if getattr(cfg, "enable_moe_block", False) or getattr(cfg, "num_experts", None):
            raise NotImplementedError("the Gemma 4 twin lays out dense layers only: this config has MoE layers "
                                      "(enable_moe_block), whose router and fused experts vLLM runs as Gemma4Router "
                                      "and FusedMoEFactory(activation='gelu_tanh'), not laid out here")
        if getattr(cfg, "num_kv_shared_layers", 0):
            raise NotImplementedError(f"the Gemma 4 twin does not lay out K/V sharing: num_kv_shared_layers="
                                      f"{cfg.num_kv_shared_layers} (vLLM's shared layers project q only and attend on "
                                      "an earlier layer's cache, kv_sharing_target_layer_name); use a config without it")

    @staticmethod
    def _attention_shape(cfg):
        if cfg.model_type != "gemma4_text":
            return VllmTwin._attention_shape(cfg)
        first = cfg.per_layer_config[0]  # each layer reads its own (layer_weights)
        return first.head_dim, cfg.num_attention_heads, first.num_key_value_heads

    def _rope_cache(self, cfg, engine):
        """One cache per layer type (``self.caches``), at that layer type's head size, as each
        attention's ``get_rope`` builds it."""
        self.caches = {}
        for layer_type in dict.fromkeys(cfg.layer_types):
            rp = cfg.rope_parameters[layer_type]
            d = cfg.per_layer_config[cfg.layer_types.index(layer_type)].head_dim
            if rp["rope_type"] == "proportional":
                cache = self.family.proportional_cache(d, rp.get("partial_rotary_factor", 1.0),
                                                       cfg.max_position_embeddings, rp["rope_theta"],
                                                       dtype=self.dtype, device=self.device)
            else:
                rotary = int(d * rp.get("partial_rotary_factor", 1.0))
                cache = engine.cos_sin_cache(d, rotary, cfg.max_position_embeddings, rp["rope_theta"], None,
                                             dtype=self.dtype, device=self.device)
            self.caches[layer_type] = cache
        return None

    def own_weights(self, layer) -> dict:
        """The layer scalar, the attention's head size, the per-layer-input block's weights."""
        w = {"scalar": layer.layer_scalar, "d": layer.self_attn.head_dim}
        if layer.hidden_size_per_layer_input:
            w.update(ple_gate=layer.per_layer_input_gate.weight, ple_proj=layer.per_layer_projection.weight,
                     ple_norm=layer.post_per_layer_input_norm.weight)
        return w

    # -- the layer, as models/gemma4.py lays it out ------------------------------------------------

    def _qkv(self, hidden, w, positions):
        """Layer start up to attention: ``residual = h``, input norm, QKV, q/k norms, RoPE, v norm."""
        residual = hidden
        hidden = self.norm(hidden, w["in"], self.eps)
        q, k, v = self._project_qkv(hidden, w)
        d = w["d"]
        q = self.norm(q.unflatten(-1, (-1, d)), w["qn"], self.eps).flatten(-2, -1)
        k = self.norm(k.unflatten(-1, (-1, d)), w["kn"], self.eps).flatten(-2, -1)
        q, k = self.rope(positions, q, k, d, self.cache_for(w, q))
        v = self.norm(v.unflatten(-1, (-1, d)), None, self.eps).flatten(-2, -1)
        return q, k, v, residual

    def _layer_rest(self, attn, residual, per_layer_input, w):
        """After attention: o_proj, post-attention norm, add, pre-feed-forward norm, GeGLU MLP,
        post-feed-forward norm, add, the per-layer-input block and its add, the layer scalar."""
        hidden = F.linear(attn, w["wo"], w["bo"])
        hidden = self.norm(hidden, w["post_attn"], self.eps)
        hidden = hidden + residual
        residual = hidden
        hidden = self.norm(hidden, w["pre_ff"], self.eps)
        hidden = F.linear(self.act(self._gate_up(hidden, w)), w["wd"])
        hidden = self.norm(hidden, w["post_ff"], self.eps)
        hidden = hidden + residual
        if per_layer_input is not None and "ple_gate" in w:
            gate = F.linear(hidden, w["ple_gate"])
            gate = F.gelu(gate, approximate="tanh")
            contribution = F.linear(gate * per_layer_input, w["ple_proj"])
            hidden = hidden + self.norm(contribution, w["ple_norm"], self.eps)
        return hidden * w["scalar"]

    def _per_layer_inputs(self, ids, embeds, ple):
        """``get_per_layer_inputs`` then ``project_per_layer_inputs`` -> [T, layers, D]."""
        valid = torch.logical_and(ids >= 0, ids < ple["vocab"])
        looked_up = F.embedding(torch.where(valid, ids, torch.zeros_like(ids)), ple["embed"]) * ple["embed_scale"]
        looked_up = looked_up.reshape(*ids.shape, ple["layers"], ple["dim"])
        projection = F.linear(embeds, ple["proj"]) * ple["proj_scale"]
        projection = projection.reshape(*embeds.shape[:-1], ple["layers"], ple["dim"])
        projection = self.norm(projection, ple["norm"], self.eps)
        return (projection + looked_up) * ple["input_scale"]

    # -- the pieces vLLM compiles between attentions ----------------------------------------------

    def _first_piece(self, ids, positions, embed, w, ple):
        hidden = self.embed_scaled(ids, embed)
        per_layer = None if ple is None else self._per_layer_inputs(ids, hidden, ple)
        return (*self._qkv(hidden, w, positions), per_layer)

    def _middle_piece(self, attn, residual, per_layer_input, positions, w, w_next):
        return self._qkv(self._layer_rest(attn, residual, per_layer_input, w), w_next, positions)

    def _last_piece(self, attn, residual, per_layer_input, w, final):
        hidden = self._layer_rest(attn, residual, per_layer_input, w)
        return self.norm(hidden, final, self.eps), hidden

    def run_layers(self, ids, positions, embed, layers, final, attend, run_piece=None):
        run_piece = run_piece or self.run_piece
        q, k, v, residual, per_layer = run_piece("first", (ids, positions, embed, layers[0], self.ple), 2)
        streams = []
        for i, w in enumerate(layers):
            attn = attend(i, q, k, v)
            mine = None if per_layer is None else per_layer[:, i, :]  # the slice each layer reads
            if i + 1 < len(layers):
                q, k, v, residual = run_piece("middle", (attn, residual, mine, positions, w, layers[i + 1]), 4)
            else:
                hidden, residual = run_piece("last", (attn, residual, mine, w, final), 3)
            streams.append(residual)
        return hidden, streams

    @staticmethod
    def mark_tokens(*tensors):
        VllmTwin.mark_tokens(*(t for t in tensors if t is not None))
