"""What an engine adapter hands calibration: its region functions as one mode runs them.

Calibration (``rla.engines.calibrate``) knows no engine. Each adapter (``rla.engines.vllm``,
``rla.engines.sglang``) turns "mode X on device Y" into a :class:`RegionOps`: the callables that
compute the engine's RMSNorm, residual-add + RMSNorm, SiLU-and-mul, RoPE (and, where the engine
has one, its fused q/k norm), the evidence each gives, and -- for an op whose code cannot run on
this machine -- why not. Calibration then runs what it can and keeps the adapter's weaker
evidence (its baseline profile) for the points nothing ran for, saying so in the report.

The op signatures (every op leaves its inputs untouched; in-place kernels run on clones):

- ``rms_norm(x, weight, eps) -> out``
- ``fused_add_rms_norm(x, residual, weight, eps) -> (out, new_residual)``
- ``silu_and_mul(x) -> out`` with ``x = cat(gate, up)`` on the last dim
- ``rope(positions, q, k, head_size, cache) -> (q, k)``: q/k [tokens, heads * head_size], ``cache``
  the engine's cos/sin cache as its rope kernel reads it (the adapter's ``rope_cache``)
- ``qk_norm(q, k, q_weight, k_weight, eps, head_size) -> (q, k)`` (optional): the engine's fused
  per-head q/k RMSNorm; without it a q/k chain normalises each head with ``rms_norm``
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

__all__ = ["RegionOps", "OP_NAMES"]

#: The ops calibration knows, in the order it runs them.
OP_NAMES: tuple[str, ...] = ("rms_norm", "fused_add_rms_norm", "silu_and_mul", "rope", "qk_norm")


@dataclass
class RegionOps:
    """An engine's region functions in one mode, on one device.

    ``ops`` run the per-op experiments; ``chain_ops`` build the cross-op chains (the same
    functions, or the uncompiled ones when ``compile_chains`` compiles a chain as one graph).
    ``evidence[op]`` is what a point decided from ``op`` may claim (``rla.profiles.EVIDENCE``).
    ``unavailable[op]`` says why an op of the engine's path could not run here; its points keep
    the adapter's baseline evidence. ``notes`` go into the conformance report as they are.
    """

    ops: dict[str, Callable]
    evidence: dict[str, str]
    chain_ops: dict[str, Callable] | None = None
    compile_chains: bool = False
    notes: list[str] = field(default_factory=list)
    unavailable: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.chain_ops is None:
            self.chain_ops = self.ops
        unknown = (set(self.ops) | set(self.unavailable)) - set(OP_NAMES)
        if unknown:
            raise ValueError(f"unknown region ops {sorted(unknown)}; known: {OP_NAMES}")
        missing = set(self.ops) - set(self.evidence)
        if missing:
            raise ValueError(f"no evidence given for ops {sorted(missing)}")

    def has(self, *names: str) -> bool:
        return all(n in self.ops for n in names)
