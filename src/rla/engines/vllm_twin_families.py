"""The vLLM engine twin of any family it lays out: :func:`build_twin` picks the layout by ``config.model_type``.

- Qwen2, Qwen3, Llama: :class:`rla.engines.vllm_twin.VllmTwin` (``models/qwen2.py``, ``qwen3.py``, ``llama.py``);
- Gemma 3's text model: :class:`rla.engines.vllm_twin_gemma3.Gemma3Twin` (``models/gemma3.py``);
- Gemma 4's text model, dense layers: :class:`rla.engines.vllm_twin_gemma4.Gemma4Twin` (``models/gemma4.py``);
- GLM-4 MoE and GPT-OSS: :class:`rla.engines.vllm_twin_moe.Glm4MoeTwin` / ``GptOssTwin``
  (``models/glm4_moe.py``, ``models/gpt_oss.py``), their MoE block an opaque op with HF's router;
- Qwen3.5 dense's text model: :class:`rla.engines.vllm_twin_qwen3_5.Qwen3_5Twin` (``models/qwen3_5.py``,
  ``models/qwen3_next.py``), its Gated DeltaNet mixers HF's own modules, its q/k norm + RoPE vLLM's Triton
  kernel (``qk='kernel'``) or the unfused modules (``qk='modules'``);
- Qwen3.5 MoE's text model: :class:`rla.engines.vllm_twin_qwen3_5_moe.Qwen3_5MoeTwin` (the same files), the
  Qwen3.5 layers with the MoE block of the GLM-4 MoE twin, its shared expert's sigmoid gate inside the op.

Each module's docstring says what follows the engine's model file and what is the same on both
sides by construction (GEMMs, attention, the MoE routers).
"""

from __future__ import annotations

from rla.engines.vllm_twin import SUPPORTED_FAMILIES, VllmTwin
from rla.engines.vllm_twin_gemma3 import Gemma3Twin
from rla.engines.vllm_twin_gemma4 import Gemma4Twin
from rla.engines.vllm_twin_moe import Glm4MoeTwin, GptOssTwin
from rla.engines.vllm_twin_qwen3_5 import Qwen3_5Twin
from rla.engines.vllm_twin_qwen3_5_moe import Qwen3_5MoeTwin

__all__ = ["build_twin", "TWINS", "TWIN_FAMILIES"]

#: ``config.model_type`` -> the twin class that lays it out.
TWINS = {**dict.fromkeys(SUPPORTED_FAMILIES, VllmTwin), "gemma3_text": Gemma3Twin, "gemma4_text": Gemma4Twin,
         "glm4_moe": Glm4MoeTwin, "gpt_oss": GptOssTwin, "qwen3_5_text": Qwen3_5Twin,
         "qwen3_5_moe_text": Qwen3_5MoeTwin}
TWIN_FAMILIES = tuple(TWINS)


def build_twin(model, engine, mode: str = "default", library: str | None = None, **options) -> VllmTwin:
    """The vLLM twin of ``model`` (an HF ``*ForCausalLM`` of a family in :data:`TWIN_FAMILIES`);
    arguments as :class:`rla.engines.vllm_twin.VllmTwin` (and a family's own, e.g. Qwen3.5's ``qk``)."""
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    if model_type not in TWINS:
        raise NotImplementedError(f"the vLLM twin covers {', '.join(TWIN_FAMILIES)}; this model is {model_type!r}")
    return TWINS[model_type](model, engine, mode, library, **options)
