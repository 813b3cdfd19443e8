"""rla: rounding-location alignment for LLM reinforcement learning.

The one-line entry points live here; ``import rla`` stays light, and each name imports its module
(and torch, transformers) on first use:

- ``rla.align(model, profile="vllm")``, ``rla.unalign``, ``rla.aligned``, ``rla.alignment_of``
  (:mod:`rla.alignment`); ``rla.replay_routes(model, experts)`` / ``rla.capture_routes(model)``
  for MoE routing replay (:mod:`rla.alignment.replay`);
- ``rla.logprobs(model, records)``: training-side logprobs of recorded tokens
  (:mod:`rla.rollout.train_logprobs`);
- ``rla.diagnose(model, records, profile)``, ``rla.detect_profile``, ``rla.doctor(model)``
  (:mod:`rla.diagnosis`).

Modules: :mod:`rla.profiles`, :mod:`rla.ops`, :mod:`rla.metrics`, :mod:`rla.rollout.rollouts`,
:mod:`rla.rollout.sampler`, :mod:`rla.rl`; each subpackage is an attribute of ``rla`` too,
imported on first use (``import rla; rla.profiles.load(...)``).
"""

_LAZY = {
    "align": "rla.alignment",
    "unalign": "rla.alignment",
    "aligned": "rla.alignment",
    "alignment_of": "rla.alignment",
    "AlignmentReport": "rla.alignment",
    "replay_routes": "rla.alignment",
    "capture_routes": "rla.alignment",
    "logprobs": "rla.rollout.train_logprobs",
    "diagnose": "rla.diagnosis",
    "detect_profile": "rla.diagnosis",
    "doctor": "rla.diagnosis",
}

_MODULES = ("alignment", "diagnosis", "integrations", "metrics", "models", "ops", "profiles", "rl", "rollout")
"""Subpackages reachable as ``rla.<name>`` after a bare ``import rla``."""

__all__ = list(_LAZY) + list(_MODULES)


def __getattr__(name):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    if name in _MODULES:
        import importlib

        return importlib.import_module(f"rla.{name}")
    raise AttributeError(f"module 'rla' has no attribute {name!r}")
