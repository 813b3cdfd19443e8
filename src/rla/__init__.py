"""rla: rounding-location alignment for LLM reinforcement learning.

``import rla`` stays light: the names below import their modules (and torch, transformers) on
first use.
"""

__all__ = ["align", "unalign", "aligned", "alignment_of", "AlignmentReport"]

_ALIGN_NAMES = ("align", "unalign", "aligned", "alignment_of", "AlignmentReport")


def __getattr__(name):
    if name in _ALIGN_NAMES:
        import importlib

        return getattr(importlib.import_module("rla.alignment"), name)
    raise AttributeError(f"module 'rla' has no attribute {name!r}")
