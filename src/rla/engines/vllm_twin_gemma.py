"""What vLLM 0.33's Gemma 3 and Gemma 4 model files share, once, as the base of their twins.

``models/gemma3.py`` and ``models/gemma4.py`` (the text models) lay out the same model around
different layers: ``Gemma*Model`` scales the embedding by ``normalizer``, a buffer
``torch.tensor(hidden_size ** 0.5)`` made in the model's dtype (vLLM builds the model under its dtype
as default); every layer has the sandwich norms (``input_layernorm``, ``post_attention_layernorm``,
``pre_feedforward_layernorm``, ``post_feedforward_layernorm``), per-head ``q_norm`` / ``k_norm``, an
MLP of gate/up, ``GeluAndMul(approximate="tanh")`` (``get_act_and_mul_fn("gelu_pytorch_tanh")``,
``torch.ops._C.gelu_tanh_and_mul`` in eager mode) and down; each attention reads the cos/sin cache its
``get_rope`` builds from ``config.rope_parameters[layer_type]``; attention is the HF model's own
function with its per-layer-type mask (sliding window on sliding layers), as on the training side;
``LogitsProcessor`` applies ``final_logit_softcapping`` to the bf16 logits as ``logits / cap``,
``tanh``, ``* cap`` (``layers/logits_processor.py``).

What differs -- the norms, the adds, the caches' rope types, Gemma 4's per-layer inputs and layer
scalar -- is in :mod:`rla.engines.vllm_twin_gemma3` and :mod:`rla.engines.vllm_twin_gemma4`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from rla.engines.vllm_twin import VllmTwin, layer_attention_inputs

__all__ = ["GemmaTwin"]


class GemmaTwin(VllmTwin):
    """The part of vLLM 0.33's Gemma 3 and Gemma 4 forwards they share (see the module doc); arguments
    as :class:`rla.engines.vllm_twin.VllmTwin`. A subclass names its family (``NAME``, for messages)
    and the rope types its caches are built for (``ROPE_TYPES``)."""

    NAME = "Gemma"
    ROPE_TYPES: tuple[str, ...] = ()

    def __init__(self, model, engine, mode: str = "default", library: str | None = None, **options):
        cfg = model.config
        if cfg.model_type in self.FAMILIES:  # another family: VllmTwin refuses it, naming the families
            self.check_config(cfg)
        self.family = engine.family_ops()
        super().__init__(model, engine, mode, library, **options)
        self.normalizer = torch.tensor(cfg.hidden_size ** 0.5, dtype=self.dtype, device=self.device)
        self.softcap = getattr(cfg, "final_logit_softcapping", None)

    def check_config(self, cfg) -> None:
        """What the twin lays out; anything else is refused naming what vLLM computes instead."""
        act = getattr(cfg, "hidden_activation", None)
        if act != "gelu_pytorch_tanh":
            raise NotImplementedError(f"the {self.NAME} twin runs GeluAndMul(approximate='tanh') for "
                                      f"hidden_activation='gelu_pytorch_tanh'; this config has {act!r}")
        bad = {t: rp.get("rope_type") for t, rp in cfg.rope_parameters.items()
               if rp.get("rope_type") not in self.ROPE_TYPES}
        if bad:
            raise NotImplementedError(f"the {self.NAME} twin builds the rotary caches of {self.ROPE_TYPES}; got {bad}")

    @property
    def position_limit(self) -> int:
        return min(c.shape[0] for c in self.caches.values())

    def _bind_ops(self, engine, mode, library):
        super()._bind_ops(engine, mode, library)
        if mode == "eager":
            self.act = engine.c_ops(library).gelu_tanh_and_mul
        else:
            self.act = lambda x: self.family.gelu_and_mul(x, "tanh")

    def layer_weights(self, layer, merged_gemms: bool = False):
        """The layer's tensors by the names the pieces read, its attention's cos/sin cache among them
        (``self.caches``, by layer type), and what :meth:`own_weights` adds."""
        a, m = layer.self_attn, layer.mlp
        v = a.k_proj if a.v_proj is None else a.v_proj  # Gemma 4's attention_k_eq_v: K loaded into the V slot too
        w = {
            "in": layer.input_layernorm.weight, "post_attn": layer.post_attention_layernorm.weight,
            "pre_ff": layer.pre_feedforward_layernorm.weight, "post_ff": layer.post_feedforward_layernorm.weight,
            "wq": a.q_proj.weight, "bq": a.q_proj.bias, "wk": a.k_proj.weight, "bk": a.k_proj.bias,
            "wv": v.weight, "bv": v.bias, "wo": a.o_proj.weight, "bo": a.o_proj.bias,
            "qn": a.q_norm.weight, "kn": a.k_norm.weight,
            "wg": m.gate_proj.weight, "wu": m.up_proj.weight, "wd": m.down_proj.weight,
            "cos_sin": self.caches[a.layer_type],
        }
        w.update(self.own_weights(layer))
        return self.merge_gemms(w) if merged_gemms else w

    def own_weights(self, layer) -> dict:
        """A family's further tensors of ``layer`` (none here)."""
        return {}

    def release_model(self):
        raise NotImplementedError(f"the {self.NAME} twin keeps its model (the engine-backed forward covers the Llama "
                                  "layout)")

    def cache_for(self, w, query):
        return w["cos_sin"]

    def embed_scaled(self, ids, embed):
        """``embed_tokens(ids) * normalizer`` (the bf16 buffer)."""
        return F.embedding(ids, embed) * self.normalizer

    def layer_masks(self, input_ids, position_ids) -> list:
        return [mask for mask, _ in layer_attention_inputs(self.model.model, input_ids, None, position_ids)]

    def logits(self, hidden):
        logits = F.linear(hidden, self.lm_head)
        if self.softcap is not None:
            logits = logits / self.softcap
            logits = torch.tanh(logits)
            logits = logits * self.softcap
        return logits
