"""``rla.unalign`` takes back what ``rla.align`` put in ``sys.modules``.

The attention forward is rebuilt around a copy of its modeling module's globals, registered as a
module of its own (``rla._aligned.<module>.<n>``, ``rla.alignment.patch.with_globals``) so that
torch.compile's guards resolve ``apply_rotary_pos_emb`` where the trace did. The entry lives as
long as the rebuilt function (held by the installed forwards, and by anything else that kept one):
a process that aligns and unaligns a model many times ends with no more entries than it started
with, and the model aligned again computes the same logits.
(That compile still works with the module registered: test_align_compile_regions.py.)
"""

from __future__ import annotations

import sys

import pytest
import torch

import rla
from align_spec import tiny_model, tokens


def _aligned_modules() -> set[str]:
    return {name for name in sys.modules if name.startswith("rla._aligned.")}


# qwen3: its forward rebuilt from rewritten source (rla.alignment.qk_chain); qwen2: HF's code as is
@pytest.mark.parametrize("family", ["qwen2", "qwen3"])
def test_unalign_removes_the_modules_align_registered(family):
    model = tiny_model(family).eval()
    ids = tokens(batch=2, seq=16)
    before = _aligned_modules()  # other tests' models may still be aligned
    logits = []
    for _ in range(4):
        rla.align(model, "vllm")
        added = _aligned_modules() - before
        assert len(added) == 1, added  # one attention class, one rebuilt forward
        with torch.no_grad():
            logits.append(model(ids).logits)
        rla.unalign(model)
        assert _aligned_modules() <= before, _aligned_modules() - before
    assert all(torch.equal(x, logits[0]) for x in logits[1:])
    with torch.no_grad():
        assert not torch.equal(model(ids).logits, logits[0])  # unaligned: HF's roundings, other logits


def test_a_kept_forward_keeps_its_module_until_dropped():
    model = tiny_model("qwen2").eval()
    before = _aligned_modules()
    rla.align(model, "vllm")
    kept = model.model.layers[0].self_attn.forward  # callable (and compilable) after unalign
    added = _aligned_modules() - before
    rla.unalign(model)
    assert len(added) == 1 and added <= _aligned_modules()
    del kept
    assert _aligned_modules() <= before
