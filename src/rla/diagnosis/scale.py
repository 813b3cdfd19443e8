"""The size a rounding mismatch can have for this model, these sequences and these lengths.

Every profile is a way of rounding the same exact computation. Run the model's bf16 forward with
all regions aligned to each profile (HF eager is the ``hf`` profile) and the same weights in fp32
(bf16 -> fp32 is exact, so it is the same function, rounded far less), and measure each against
the fp32 forward: ``s_P = k3(bf16 under P, fp32)``. The scale is ``S = max_P s_P``.

Two rounding stacks a and b differ per token by ``|d_ab| <= |d_a32| + |d_b32|``, and k3 ~ d^2/2
for small d, so ``k3_ab <= 2 (s_a + s_b) <= 4 S``. An engine also differs in what profiles do not
model (GEMM and attention kernels, decode vs prefill); on the bundled model that part is about a
seventh of S. A mismatch more than ``FAR = 10`` times S (2.5 times the rounding bound) is not
rounding: the diagnosis then looks for what is wrong with the input instead of attributing it.

Cost: one extra copy of the weights in fp32 (twice the bf16 model's memory) for one forward.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import numpy as np

import rla.metrics as M
from rla.diagnosis.passes import forward_pass, per_sequence_k3

__all__ = ["FAR", "RoundingScale", "fp32_reference", "rounding_scale"]

FAR = 10.0
"""A mismatch beyond FAR x the rounding scale is not rounding (2.5x the 4 S bound; module docstring)."""


@dataclass
class RoundingScale:
    k3: float
    """S: the largest k3 between the bf16 forward under any profile and the fp32 forward."""
    per_profile: dict[str, float]
    """profile group label -> k3(bf16 forward under it, fp32 forward)."""
    per_sequence: np.ndarray = field(repr=False)
    """Per sequence, the largest k3 against fp32 over the profiles."""

    def bound(self) -> np.ndarray:
        """Per sequence, the k3 beyond which its mismatch is not rounding: FAR x max(own scale, S)."""
        return FAR * np.maximum(self.per_sequence, self.k3)

    def to_dict(self) -> dict:
        return {"k3": self.k3, "far_factor": FAR, "per_profile": self.per_profile}


def fp32_reference(model, records, sizes, bar=None) -> np.ndarray:
    """Training logprobs of the recorded tokens from an fp32 copy of ``model`` (same weights)."""
    ref = copy.deepcopy(model).float()
    try:
        return forward_pass(ref, records, None, (), sizes, bar, "fp32 reference")
    finally:
        del ref


def rounding_scale(reference: np.ndarray, by_profile: dict[str, np.ndarray], mask: np.ndarray) -> RoundingScale:
    """The scale from the fp32 ``reference`` and each profile group's fully aligned bf16 logprobs."""
    per_profile = {label: M.mismatch(pi, reference, mask)["mismatch/k3"] for label, pi in by_profile.items()}
    per_seq = np.max([per_sequence_k3(pi, reference, mask) for pi in by_profile.values()], axis=0)
    return RoundingScale(max(per_profile.values()), per_profile, per_seq)
