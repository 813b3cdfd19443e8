"""Engine adapters: an inference engine's *own* code, loaded from its package or wheel at run time.

``rla.engines.vllm.load(wheel=None)`` gives vLLM's native region ops, its rotary cache builder and
(on CUDA) its compiled kernels; ``rla.engines.probes`` makes the probe inputs and
``rla.engines.calibrate`` turns an engine into a rounding profile. Submodules are imported on
use (``import rla.engines.vllm``): importing this package loads nothing.
"""

from rla.engines.source import EngineCodeError, EngineNotFound, EngineUnavailable

__all__ = ["EngineCodeError", "EngineNotFound", "EngineUnavailable"]
