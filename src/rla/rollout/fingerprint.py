"""A cheap fingerprint of the weights that sampled a rollout (the records' ``policy`` field).

Rollouts sampled by the policy one optimizer step earlier look like rounding to every size test:
on the bundled model their k3 is inside the rounding scale. The records can say which weights
sampled them instead, and ``rla diagnose`` compares that with the checkpoint before any forward
(:mod:`rla.diagnosis.policy`). The fingerprint must be cheap (it is computed at every weight sync
of a training run) and equal wherever the same weights are held.

The rule ``rla-weights/1`` (the tag is part of the fingerprint, so a later rule gets a new one):

1. the tensors: a module's ``state_dict()``, or the mapping given; only floating-point tensors
   (integer buffers such as position ids are not weights);
2. per tensor, a digest: SHA-256 of its shape (``"4x8;"``, ASCII, dimensions joined by ``x``;
   ``";"`` for a scalar) followed by a fixed strided sample of its values: with ``n`` elements of
   the flattened tensor, ``k = min(n, SAMPLE)`` elements at indices ``(i * n) // k`` for
   ``i = 0 .. k-1``, each rounded to bfloat16 (round to nearest even, as ``tensor.to(torch.bfloat16)``)
   and written as its two bytes, little-endian;
3. the fingerprint: ``"rla-weights/1:"`` and the first 32 hex digits of SHA-256 over the
   *sorted, distinct* per-tensor digests (raw bytes, concatenated).

Why so: names are left out, and the digests sorted, so a trainer's wrapped names (``module.``,
``_fsdp_wrapped_module.``) and a checkpoint's give the same fingerprint; distinct digests make a
tied embedding counted once whether a state dict lists it once or twice. Values are taken in
bfloat16 so fp32 master weights and their bf16 copy in the sampler (or a bf16 checkpoint saved
from them) agree, while a change that moves a bf16 weight changes it: one Adam step at lr 1e-5
moves every bf16 weight below 2^-8 in magnitude (about 15% of a 0.02-std matrix), so a sample of
:data:`SAMPLE` elements per tensor misses such a step with probability about 0.85^4096 per
matrix. A change that moves no bf16 value is not seen, and cannot change bf16 rollouts either.
A model loaded in fp16 rounds the weights twice (to fp16, then here to bf16) and may differ in a
last bit from the bf16 of the original weights; compute both sides from the same dtype.
Cost: ``SAMPLE`` elements gathered per tensor (on its device) and hashed: milliseconds for a
small model, about one per tensor for a large one. Sharded tensors (DTensor) are read through
``full_tensor()``, a collective that every rank must join.
"""

from __future__ import annotations

import hashlib
import re

__all__ = ["RULE", "SAMPLE", "weights_fingerprint", "parse"]

RULE = "rla-weights/1"
SAMPLE = 4096
"""Elements sampled per tensor (the rule's ``k``)."""
_FORM = re.compile(r"^([a-z0-9-]+/[0-9]+):([0-9a-f]{32})$")


def _digest(t) -> bytes:
    import torch

    t = t.detach()
    if hasattr(t, "full_tensor"):  # a DTensor: the whole tensor, as every rank sees it
        t = t.full_tensor()
    flat = t.reshape(-1)
    n = flat.numel()
    k = min(n, SAMPLE)
    h = hashlib.sha256(("x".join(str(d) for d in t.shape) + ";").encode("ascii"))
    if k:
        idx = (torch.arange(k, dtype=torch.int64, device=flat.device) * n) // k
        sample = flat[idx].to(torch.bfloat16).view(torch.int16).cpu().numpy().astype("<i2")
        h.update(sample.tobytes())
    return h.digest()


def weights_fingerprint(weights) -> str:
    """The ``rla-weights/1`` fingerprint (module docstring) of a module or a mapping name -> tensor."""
    import torch  # here, not at the top: rollouts.load validates fingerprints without torch

    state = weights.state_dict() if isinstance(weights, torch.nn.Module) else weights
    try:
        tensors = list(state.values())
    except AttributeError:
        raise TypeError(f"weights_fingerprint needs a torch module or a mapping of tensors, got "
                        f"{type(weights).__name__}") from None
    digests = sorted({_digest(t) for t in tensors if isinstance(t, torch.Tensor) and t.is_floating_point()})
    if not digests:
        raise ValueError("weights_fingerprint: no floating-point tensors to fingerprint")
    return f"{RULE}:{hashlib.sha256(b''.join(digests)).hexdigest()[:32]}"


def parse(fingerprint) -> tuple[str, str]:
    """``(rule, hex)`` of a fingerprint string; ValueError naming the expected form otherwise."""
    m = _FORM.match(fingerprint) if isinstance(fingerprint, str) else None
    if m is None:
        raise ValueError(f"expected a weights fingerprint such as '{RULE}:' followed by 32 hex digits, got "
                         f"{fingerprint!r}")
    return m.group(1), m.group(2)
