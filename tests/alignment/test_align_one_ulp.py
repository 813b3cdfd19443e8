"""One ulp at the aligned-model level: ``rla.align(model, "vllm-0.33")`` equals the oracle's
forward bit for bit (logits and every layer's stream) on models built so that a one-ulp change of
one region op's fp32 arithmetic flips the logits (``tests/ulp_models.py``).

Each test proves its own sensitivity: the oracle with the planted expression (an ``Arith`` of
``align_spec``) gives other logits on these very inputs, so a library whose op computed that
expression could not pass. On random tiny models the same changes pass every alignment test
(issue #37: ``1/sqrt`` for ``rsqrt``, a reordered fp32_carry add); ``lab/mutation`` plants each
one in ``src/rla`` and runs this file and the CPU twin's one-ulp test against it.
"""

from __future__ import annotations

import pytest
import torch

import rla

from align_spec import SPEC, single_thread, spec_forward  # noqa: F401
from ulp_models import PLANTED, one_ulp_case


@pytest.mark.parametrize("name", list(PLANTED))
def test_aligned_model_sees_a_one_ulp_change(name):
    model, ids, positions, planted = one_ulp_case(name)
    pts = SPEC["vllm-0.33"]
    with torch.no_grad():
        streams, planted_streams = [], []
        want = spec_forward(model, ids, pts, positions=positions, streams=streams)
        other = spec_forward(model, ids, pts, positions=positions, arith=planted, streams=planted_streams)
        # sensitivity: the planted one-ulp change reaches the logits on these inputs
        assert int((other != want).sum()) > 0, f"{name}: {PLANTED[name][0]} does not reach the logits"
        rla.align(model, "vllm-0.33")
        try:
            out = model(ids, position_ids=positions, output_hidden_states=True)
        finally:
            rla.unalign(model)
        assert torch.equal(out.logits, want), f"{name}: the aligned model is not the spec bit for bit"
        # every layer's stream but the last (HF's last hidden state is the final norm's output)
        for i, (got, exact) in enumerate(zip(out.hidden_states[1:-1], streams[:-1])):
            assert got.dtype == exact.dtype and torch.equal(got, exact), f"{name}: layer {i}'s stream"
        plain = model(ids, position_ids=positions).logits
    assert not torch.equal(plain, want)  # and HF eager rounds elsewhere on them
