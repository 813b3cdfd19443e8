"""Shared by the ops and alignment tests: one definition of "bytes kept for backward"."""

import contextlib

import torch


@contextlib.contextmanager
def kept_storages(held):
    """While open, the storages the autograd graph saves for backward: yields a dict
    ``storage data_ptr -> nbytes`` (each storage once; sum its values), leaving out the storages
    of the tensors in ``held`` (inputs, parameters: held by the caller anyway)."""
    held = {t.untyped_storage().data_ptr() for t in held}
    kept = {}

    def pack(t):
        ptr = t.untyped_storage().data_ptr()
        if ptr not in held:
            kept[ptr] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        yield kept


def saved_bytes(fn, inputs):
    """Bytes the autograd graph keeps for backward beyond the inputs themselves.

    Saved tensors are collected through saved_tensors_hooks and deduplicated by storage; storages
    of the inputs (held by the caller anyway) are not counted.
    """
    with kept_storages(inputs) as kept:
        fn(*inputs)
    return sum(kept.values())
