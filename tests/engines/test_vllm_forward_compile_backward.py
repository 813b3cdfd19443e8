"""``engine_forward(..., compile_backward=...)``: the recomputed pieces of the backward compiled.

On CPU, where vLLM's pieces are compiled by Inductor's CPU backend: with ``'aot_eager'`` the
logits and every parameter gradient equal the eager recomputation's bit for bit (same aten ops;
only the host's dispatch changes), across a change of sequence length (the token dimension is
dynamic: no recompile per length). ``'inductor'`` is measured on the GPU by
``lab/bench/engine_forward_breakdown.py`` (its fusions may reorder the glue's sums), not here.

The engine is read from a vLLM wheel: ``$RLA_ENGINE_WHEEL`` if set, else vLLM 0.33's wheel in the
engine cache (``tests/conftest.py``'s). Without either the tests skip (no download from here).
"""

import copy

import pytest
import torch

import rla

from align_spec import single_thread, tiny_model, tokens  # noqa: F401
from engine_versions import VLLM_VERSION


@pytest.fixture(scope="module")
def engine(vllm_wheel_if_cached):
    from rla.engines import vllm

    wheel = vllm_wheel_if_cached
    if wheel is None:
        pytest.skip(f"no vLLM wheel: set RLA_ENGINE_WHEEL or cache vllm-{VLLM_VERSION} (tests/conftest.py)")
    return vllm.load(str(wheel))


def _grads(model, ids):
    model.zero_grad(set_to_none=True)
    logits = model(input_ids=ids).logits
    logits.float().log_softmax(-1).mean().backward()
    return logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("family", ["qwen2", "qwen3"])
def test_aot_eager_recomputation_keeps_the_gradient_bit_for_bit(family, engine):
    from rla.engines.vllm_forward import engine_forward

    plain, compiled = engine_forward(engine, "default"), engine_forward(engine, "default", compile_backward="aot_eager")
    model = tiny_model(family)
    other = copy.deepcopy(model)
    rla.align(model, plain.profile.name, ops=plain)
    rla.align(other, compiled.profile.name, ops=compiled)
    reference = next(iter(compiled._references.values()))
    calls = []

    def counted(name, fn):
        return lambda *args: calls.append(name) or fn(*args)

    reference.compiled = {n: counted(n, fn) for n, fn in reference.compiled.items()}
    for seq in (24, 40):  # a second length: the dynamic token dimension serves it
        ids = tokens(2, seq)
        want_logits, want = _grads(model, ids)
        logits, got = _grads(other, ids)
        assert torch.equal(logits, want_logits)
        assert got.keys() == want.keys()
        for name, g in got.items():
            assert torch.equal(g, want[name]), (seq, name)
    layers = model.config.num_hidden_layers
    assert sorted(calls) == sorted(["first", "last", *["middle"] * (layers - 1)] * 2)  # the backward ran them
    assert not next(iter(plain._references.values())).compiled


def test_compile_backward_takes_a_backend_name(engine):
    from rla.engines.vllm_forward import engine_forward

    with pytest.raises(TypeError, match="names a torch.compile backend"):
        engine_forward(engine, "default", compile_backward=True)
    assert engine_forward(engine, "default").compile_backward is None  # the default: eager recomputation
