"""Gemma 4's scale constants, whose dtype differs between HF and the engines (``rla doctor``).

A constant's dtype is no rounding point, so ``rla.align`` leaves these as HF has them
(docs/families.md, Gemma 4); the doctor names the ones a model has, with the numbers:

- the per-layer inputs (``hidden_size_per_layer_input > 0``): HF multiplies by ``hidden**-0.5`` and
  ``2**-0.5`` as Python floats (``Gemma4TextModel.project_per_layer_inputs``); vLLM 0.33/0.26
  (``Gemma4Model.__init__``: buffers made with ``torch.tensor`` under the bf16 default dtype the
  loader sets) and SGLang 0.5.23 (``Gemma4TextModel.__init__``, the same) by their bf16 roundings;
- the embeddings: HF and vLLM multiply by ``sqrt(hidden)`` rounded to bf16, SGLang 0.5.23 by the
  Python float (``Gemma3TextScaledWordEmbedding``, which its Gemma 4 reuses);
- the MoE router's input: HF scales the normed value by the weight, then by ``hidden**-0.5`` as a
  Python float; vLLM multiplies by the bf16 ``root_size`` first, SGLang folds ``RN(scale * RN(root))``
  into its norm's weight.
"""

from __future__ import annotations

import torch

__all__ = ["GEMMA4_TYPES", "gemma4_constants"]

#: ``config.model_type`` of Gemma 4's text model and of its multimodal wrapper.
GEMMA4_TYPES = ("gemma4_text", "gemma4")


def _bf16(v: float) -> float:
    return float(torch.tensor(v, dtype=torch.float32).to(torch.bfloat16))


def _text_config(cfg):
    if getattr(cfg, "model_type", None) == "gemma4":
        return getattr(cfg, "text_config", None)
    return cfg if getattr(cfg, "model_type", None) == "gemma4_text" else None


def _body(model):
    return next((m for m in model.modules() if type(m).__name__ == "Gemma4TextModel"), None)


def gemma4_constants(model) -> list[str]:
    """What of the above ``model`` has, one sentence each (empty for other families). The
    per-layer-input scales are read from the model (a user may have set them to the engine's)."""
    cfg = _text_config(getattr(model, "config", None))
    if cfg is None:
        return []
    found = []
    body = _body(model)
    if getattr(cfg, "hidden_size_per_layer_input", 0) and body is not None:
        scales = {"per_layer_model_projection_scale": cfg.hidden_size ** -0.5, "per_layer_input_scale": 2 ** -0.5}
        off = {name: (float(getattr(body, name, v)), _bf16(v)) for name, v in scales.items()
               if float(getattr(body, name, v)) != _bf16(v)}
        if off:
            parts = ", ".join(f"{n} {hf:.8g} (engines: {rn:.8g})" for n, (hf, rn) in off.items())
            found.append(f"the per-layer inputs are scaled by Python floats in HF ({parts}: "
                         "Gemma4TextModel.project_per_layer_inputs), by their bf16 roundings in vLLM 0.33/0.26 and "
                         "SGLang 0.5.23 (tensors made under the bf16 default dtype their loaders set)")
    root = cfg.hidden_size ** 0.5
    if _bf16(root) != root:
        found.append(f"SGLang 0.5.23 scales the embeddings by sqrt(hidden) = {root:.8g} as a Python float "
                     f"(Gemma3TextScaledWordEmbedding), HF and vLLM by its bf16 rounding {_bf16(root):.8g}")
    if getattr(cfg, "enable_moe_block", False):
        found.append("HF's MoE router scales its normed input by the weight, then by hidden**-0.5 as a Python float "
                     "(Gemma4TextRouter.forward); vLLM by its bf16 root_size first, SGLang by RN(scale * RN(root)) "
                     "folded into its norm weight")
    return found
