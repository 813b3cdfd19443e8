"""Each region alone under torch.compile (AOT eager, fullgraph): logits and every gradient equal the eager
aligned model's. RoPE alone used to fail in dynamo's guard building: the attention forward rebuilt around a
copy of its module's globals kept the module's name, so dynamo's guards looked ``apply_rotary_pos_emb`` up in
the transformers module (the original) while the trace had used rla's (``rla.alignment.patch``)."""

from __future__ import annotations

import pytest
import torch

import rla
from align_spec import tiny_model, tokens


def _step(model, ids, compile_: bool):
    run = torch.compile(model, backend="aot_eager", fullgraph=True) if compile_ else model
    model.zero_grad(set_to_none=True)
    out = run(ids, labels=ids)
    out.loss.backward()
    torch._dynamo.reset()
    return out.logits.detach(), [p.grad.clone() for p in model.parameters()]


DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA"))]


@pytest.mark.parametrize("dev", DEVICES)
@pytest.mark.parametrize("regions", [("rope",), ("swiglu",), ("rmsnorm",)])
@pytest.mark.parametrize("family", ["qwen2", "qwen3"])
def test_one_region_compiled_equals_eager(family, regions, dev):
    """On CUDA the regions are rla's Triton kernels (torch.library ops) inside the compiled graph."""
    torch.manual_seed(0)
    model = tiny_model(family, num_hidden_layers=2).to(dev).train()
    rla.align(model, "vllm", regions=regions)
    ids = tokens(batch=2, seq=16).to(dev)
    logits, grads = _step(model, ids, False)
    c_logits, c_grads = _step(model, ids, True)
    assert torch.equal(c_logits, logits)
    assert all(bool(g.abs().sum() > 0) for g in grads)
    assert all(torch.equal(c, g) for c, g in zip(c_grads, grads))
