"""The engine twin of Gemma 3's text model (``gemma3_text``), laid out as vLLM's ``models/gemma3.py``.

vLLM 0.33's ``Gemma3DecoderLayer.forward``: the first layer's ``input_layernorm`` is a plain norm,
every later one a fused add + norm of the previous layer's output and residual; attention
(``Gemma3Attention.forward``: one QKV projection, ``q_norm`` / ``k_norm`` per head on
``unflatten(-1, (heads, head_dim))``, ``rotary_emb``, attention, ``o_proj``); then
``post_attention_layernorm`` (plain), ``pre_feedforward_layernorm(h, residual)`` (the attention's
add fused into it), the MLP (``Gemma3MLP``: gate/up, ``GeluAndMul(approximate="tanh")`` as
``get_act_and_mul_fn("gelu_pytorch_tanh")`` maps it, down), ``post_feedforward_layernorm`` (plain);
the layer returns ``(h, residual)`` and the next layer's input norm adds them. ``Gemma3Model``
scales the embedding by ``normalizer`` and ends with ``norm(h, residual)``, and the logits are
softcapped, as :mod:`rla.engines.vllm_twin_gemma` (what Gemma 3 and Gemma 4 share) lays them out.

Every norm is ``GemmaRMSNorm`` (``x * rstd * (1 + w)``, ``1 + w`` in fp32): its ``forward_native``
runs in every mode (``rla.engines.vllm_family_ops``), so in eager mode only GeluAndMul
(``torch.ops._C.gelu_tanh_and_mul``) and the rotary embedding are CUDA kernels. Each attention
has the cache ``get_rope`` builds from ``config.rope_parameters[layer_type]``: sliding layers a
default cache, full layers a linear-scaled one (``LinearScalingRotaryEmbedding``), both in the
model's dtype.

The per-layer trace is the residual stream entering each layer's attention (the next layer's
fused add), as for the Llama layout.
"""

from __future__ import annotations

import torch.nn.functional as F

from rla.engines.vllm_twin_gemma import GemmaTwin

__all__ = ["Gemma3Twin"]


class Gemma3Twin(GemmaTwin):
    """vLLM 0.33's Gemma 3 forward of an HF ``Gemma3ForCausalLM`` (see the module doc); arguments as
    :class:`rla.engines.vllm_twin.VllmTwin`."""

    FAMILIES = ("gemma3_text",)
    NAME = "Gemma 3"
    ROPE_TYPES = ("default", "linear")

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

    def _bind_ops(self, engine, mode, library):
        super()._bind_ops(engine, mode, library)
        fam = self.family
        self.norm = fam.gemma_rms_norm
        self.add_norm = lambda x, residual, weight, eps: fam.gemma_rms_norm(x, weight, eps, residual)

    def _mlp(self, attn, residual, w):
        """``o_proj``, post-attention norm, the fused add + pre-feed-forward norm, GeGLU, down,
        post-feed-forward norm -> ``(h, residual)``."""
        hidden = F.linear(attn, w["wo"], w["bo"])
        hidden = self.norm(hidden, w["post_attn"], self.eps)
        hidden, residual = self.add_norm(hidden, residual, w["pre_ff"], self.eps)
        hidden = F.linear(self.act(self._gate_up(hidden, w)), w["wd"])
        return self.norm(hidden, w["post_ff"], self.eps), residual

    def _first_piece(self, ids, positions, embed, w):
        return self._qkv(self.embed_scaled(ids, embed), None, w, positions)
