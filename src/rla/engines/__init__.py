"""Engine adapters: an inference engine's *own* code, loaded from its package or wheel at run time.

What an adapter gives is written down as code in :mod:`rla.engines.adapter` (``Engine``: identity;
``RegionEngine``: the engine's region code, which vLLM's and SGLang's adapters implement;
``RolloutEngine``: the engine running, returning rollout records). A module serving one engine
only says so in its name (``vllm_twin``, ``vllm_forward``).

``rla.engines.vllm.load(wheel=None)`` gives vLLM's native region ops, its rotary cache builder and
(on CUDA) its compiled kernels; ``rla.engines.probes`` makes the probe inputs and
``rla.engines.calibrate`` turns an engine into a rounding profile (its pieces: ``bit_match``,
``region_experiments``, ``decisions``); ``rla.engines.vllm_twin`` runs an HF
model's forward as the engine lays it out, with the engine's own region code (Gemma 3, GLM-4 MoE and
GPT-OSS in ``vllm_twin_gemma3`` / ``vllm_twin_moe``, their region code in ``vllm_family_ops``;
``vllm_twin_families.build_twin`` picks by family), and ``rla.engines.twin_compare`` compares a training model
with it logits and layer by layer (``rla verify``);
``rla.engines.backed.engine_ops`` puts the engine's compiled kernels into ``rla.align``'s forward
(vLLM's eager mode), ``rla.engines.vllm_forward.engine_forward`` its compiled pieces (default mode).
Submodules are imported on use (``import rla.engines.vllm``): importing this package loads
nothing.
"""

from rla.engines.source import EngineCodeError, EngineNotFound, EngineUnavailable

__all__ = ["EngineCodeError", "EngineNotFound", "EngineUnavailable"]
