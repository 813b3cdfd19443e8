"""The engine twin of Gemma 3's text model (``gemma3_text``), laid out as vLLM's ``models/gemma3.py``.

vLLM 0.33's ``Gemma3DecoderLayer.forward``: the first layer's ``input_layernorm`` is a plain norm,
every later one a fused add + norm of the previous layer's output and residual; attention
(``Gemma3Attention.forward``: one QKV projection, ``q_norm`` / ``k_norm`` per head on
``unflatten(-1, (heads, head_dim))``, ``rotary_emb``, attention, ``o_proj``); then
``post_attention_layernorm`` (plain), ``pre_feedforward_layernorm(h, residual)`` (the attention's
add fused into it), the MLP (``Gemma3MLP``: gate/up, ``GeluAndMul(approximate="tanh")`` as
``get_act_and_mul_fn("gelu_pytorch_tanh")`` maps it, down), ``post_feedforward_layernorm`` (plain);
the layer returns ``(h, residual)`` and the next layer's input norm adds them. ``Gemma3Model``
scales the embedding by ``normalizer``, a buffer ``torch.tensor(hidden_size ** 0.5)`` made in the
model's dtype (vLLM builds the model under its dtype as default), and ends with
``norm(h, residual)``; ``LogitsProcessor`` applies ``final_logit_softcapping`` to the bf16 logits as
``logits / cap``, ``tanh``, ``* cap`` (``layers/logits_processor.py``).

Every norm is ``GemmaRMSNorm`` (``x * rstd * (1 + w)``, ``1 + w`` in fp32): its ``forward_native``
runs in every mode (``rla.engines.vllm_family_ops``), so in eager mode only GeluAndMul
(``torch.ops._C.gelu_tanh_and_mul``) and the rotary embedding are CUDA kernels. Each attention
has the cache ``get_rope`` builds from ``config.rope_parameters[layer_type]``: sliding layers a
default cache, full layers a linear-scaled one (``LinearScalingRotaryEmbedding``), both in the
model's dtype. Attention is the HF model's own function with its per-layer-type mask (sliding
window on sliding layers), as on the training side.

The per-layer trace is the residual stream entering each layer's attention (the next layer's
fused add), as for the Llama layout.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from rla.engines.vllm_twin import VllmTwin, layer_attention_inputs

__all__ = ["Gemma3Twin"]

_ROPE_TYPES = ("default", "linear")


class Gemma3Twin(VllmTwin):
    """vLLM 0.33's Gemma 3 forward of an HF ``Gemma3ForCausalLM`` (see the module doc); arguments as
    :class:`rla.engines.vllm_twin.VllmTwin`."""

    FAMILIES = ("gemma3_text",)

    def __init__(self, model, engine, mode: str = "default", library: str | None = None, **options):
        cfg = model.config
        if cfg.model_type in self.FAMILIES:
            act = getattr(cfg, "hidden_activation", None)
            if act != "gelu_pytorch_tanh":
                raise NotImplementedError(f"the Gemma 3 twin runs GeluAndMul(approximate='tanh') for "
                                          f"hidden_activation='gelu_pytorch_tanh'; this config has {act!r}")
            bad = {t: rp.get("rope_type") for t, rp in cfg.rope_parameters.items() if rp.get("rope_type") not in _ROPE_TYPES}
            if bad:
                raise NotImplementedError(f"the Gemma 3 twin builds the rotary caches of {_ROPE_TYPES}; got {bad}")
        self.family = engine.family_ops()
        super().__init__(model, engine, mode, library, **options)
        self.normalizer = torch.tensor(cfg.hidden_size ** 0.5, dtype=self.dtype, device=self.device)
        self.softcap = getattr(cfg, "final_logit_softcapping", None)

    def _rope_cache(self, cfg, engine):
        """One cache per layer type (``self.caches``), as each attention's ``get_rope`` builds it."""
        self.caches = {}
        for layer_type, rp in cfg.rope_parameters.items():
            if rp["rope_type"] == "linear":
                cache = self.family.linear_cache(self.head_dim, cfg.max_position_embeddings, rp["rope_theta"],
                                                 rp["factor"], dtype=self.dtype, device=self.device)
            else:
                cache = engine.cos_sin_cache(self.head_dim, self.head_dim, cfg.max_position_embeddings,
                                             rp["rope_theta"], None, dtype=self.dtype, device=self.device)
            self.caches[layer_type] = cache
        return None

    @property
    def position_limit(self) -> int:
        return min(c.shape[0] for c in self.caches.values())

    def _bind_ops(self, engine, mode, library):
        super()._bind_ops(engine, mode, library)
        fam = self.family
        self.norm = fam.gemma_rms_norm
        self.add_norm = lambda x, residual, weight, eps: fam.gemma_rms_norm(x, weight, eps, residual)
        if mode == "eager":
            self.act = engine.c_ops(library).gelu_tanh_and_mul
        else:
            self.act = lambda x: fam.gelu_and_mul(x, "tanh")

    def layer_weights(self, layer, merged_gemms: bool = False):
        a, m = layer.self_attn, layer.mlp
        w = {
            "in": layer.input_layernorm.weight, "post_attn": layer.post_attention_layernorm.weight,
            "pre_ff": layer.pre_feedforward_layernorm.weight, "post_ff": layer.post_feedforward_layernorm.weight,
            "wq": a.q_proj.weight, "bq": a.q_proj.bias, "wk": a.k_proj.weight, "bk": a.k_proj.bias,
            "wv": a.v_proj.weight, "bv": a.v_proj.bias, "wo": a.o_proj.weight, "bo": a.o_proj.bias,
            "qn": a.q_norm.weight, "kn": a.k_norm.weight,
            "wg": m.gate_proj.weight, "wu": m.up_proj.weight, "wd": m.down_proj.weight,
            "cos_sin": self.caches[a.layer_type],
        }
        if merged_gemms:
            w["wqkv"] = torch.cat((w["wq"], w["wk"], w["wv"]))
            w["bqkv"] = None if w["bq"] is None else torch.cat((w["bq"], w["bk"], w["bv"]))
            w["wgu"] = torch.cat((w["wg"], w["wu"]))
        return w

    def release_model(self):
        raise NotImplementedError("the Gemma 3 twin keeps its model (the engine-backed forward covers the Llama layout)")

    def cache_for(self, w, query):
        return w["cos_sin"]

    def _mlp(self, attn, residual, w):
        """``o_proj``, post-attention norm, the fused add + pre-feed-forward norm, GeGLU, down,
        post-feed-forward norm -> ``(h, residual)``."""
        hidden = F.linear(attn, w["wo"], w["bo"])
        hidden = self.norm(hidden, w["post_attn"], self.eps)
        hidden, residual = self.add_norm(hidden, residual, w["pre_ff"], self.eps)
        if "wgu" in w:
            gate_up = F.linear(hidden, w["wgu"])
        else:
            gate_up = torch.cat((F.linear(hidden, w["wg"]), F.linear(hidden, w["wu"])), dim=-1)
        hidden = F.linear(self.act(gate_up), w["wd"])
        return self.norm(hidden, w["post_ff"], self.eps), residual

    def _first_piece(self, ids, positions, embed, w):
        return self._qkv(F.embedding(ids, embed) * self.normalizer, None, w, positions)

    def layer_masks(self, input_ids, position_ids) -> list:
        return [mask for mask, _ in layer_attention_inputs(self.model.model, input_ids, None, position_ids)]

    def logits(self, hidden):
        logits = F.linear(hidden, self.lm_head)
        if self.softcap is not None:
            logits = logits / self.softcap
            logits = torch.tanh(logits)
            logits = logits * self.softcap
        return logits
