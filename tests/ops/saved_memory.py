"""Shared by the ops tests: one definition of "bytes kept for backward"."""

import torch


def saved_bytes(fn, inputs):
    """Bytes the autograd graph keeps for backward beyond the inputs themselves.

    Saved tensors are collected through saved_tensors_hooks and deduplicated by storage; storages
    of the inputs (held by the caller anyway) are not counted.
    """
    held = {t.untyped_storage().data_ptr() for t in inputs}
    seen = {}

    def pack(t):
        ptr = t.untyped_storage().data_ptr()
        if ptr not in held:
            seen[ptr] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn(*inputs)
    return sum(seen.values())
