"""The engine adapter contract (``rla.engines.adapter``): vLLM's and SGLang's adapters meet it.

Both are loaded from their real wheels (the engine cache; nothing installed) and checked member
by member against ``RegionEngine`` (``isinstance`` of the runtime-checkable protocol only sees
that names exist; ``missing`` also checks that the methods are callable and ``modes`` is a tuple
of names). The checker itself is shown to catch an adapter that lacks a member.
"""

from __future__ import annotations

import pytest

from rla.engines import adapter as A
from rla.engines import sglang, vllm


@pytest.fixture(scope="module", params=["vllm", "sglang"])
def engine(request, vllm_wheel, sglang_wheel):
    return {"vllm": vllm, "sglang": sglang}[request.param].load(vllm_wheel if request.param == "vllm" else sglang_wheel)


def test_each_region_adapter_meets_the_contract(engine):
    assert isinstance(engine, A.Engine) and isinstance(engine, A.RegionEngine)
    assert A.missing(engine, A.RegionEngine) == []
    assert engine.name in A.ENGINES and engine.modes[0] == "default"
    assert engine.provenance and all({"file", "sha256"} <= set(p) for p in engine.provenance.values())
    with pytest.raises(KeyError):
        engine.source_fact("no_such_point")


def test_load_engine_checks_the_contract(vllm_wheel, monkeypatch):
    eng = A.load_engine("vllm", vllm_wheel)
    assert eng.version == "0.33.0"
    monkeypatch.setattr(type(eng), "source_fact", None)
    with pytest.raises(RuntimeError, match="breaks the RegionEngine contract: 'source_fact' is not callable"):
        A.load_engine("vllm", vllm_wheel)
    with pytest.raises(ValueError, match="unknown engine 'trt'"):
        A.load_engine("trt")


class _Live:
    """A rollout engine as the contract reads one: identity, one mode, its settings, generate."""

    name, version, modes, provenance = "vllm", "0.26.0", ("default", "eager"), {}
    mode, settings = "default", {"enforce_eager": False}

    def generate(self, prompts, params, *, metadata=None):
        return []


def test_missing_names_what_an_object_lacks():
    live = _Live()
    assert A.missing(live, A.RolloutEngine) == [] and isinstance(live, A.RolloutEngine)
    assert not isinstance(live, A.RegionEngine)
    assert "no attribute 'region_ops'" in A.missing(live, A.RegionEngine)
    live.modes = ["default"]
    assert A.missing(live, A.Engine) == ["'modes' must be a non-empty tuple of mode names, got ['default']"]
    live.generate = "not a method"
    assert "'generate' is not callable" in A.missing(live, A.RolloutEngine)
    with pytest.raises(ValueError, match="not an engine contract"):
        A.missing(live, dict)
