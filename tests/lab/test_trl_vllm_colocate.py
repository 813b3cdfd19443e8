"""lab/bench/trl_vllm_colocate.py on CPU, without vLLM: what it adds to TRL's ``LLM(...)`` call and
its pass conditions (the run itself needs the GPU: tests/integrations/test_integration_trl_vllm_gpu.py).

- ``wrap_llm`` hands TRL's own arguments through unchanged, adds only
  ``attention_config={"backend": ...}``, records what TRL passed and the distributed variables, and
  refuses when TRL passes an ``attention_config`` itself (a TRL that does needs no wrapper).
- ``checks_of`` fails each condition on a log that breaks it.
"""

from __future__ import annotations

import pytest

pytest.importorskip("trl")

from lab.bench import trl_vllm_colocate as C  # noqa: E402


@pytest.fixture
def engine(monkeypatch):
    """TRL's module-level ``LLM`` name (absent without vLLM) as a recorder of its call."""
    from trl.generation import vllm_generation

    calls = []
    monkeypatch.setattr(vllm_generation, "LLM", lambda *a, **k: calls.append(k) or "engine", raising=False)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    return vllm_generation, calls


def test_wrap_llm_adds_only_the_attention_backend(engine):
    module, calls = engine
    record = {}
    C.wrap_llm("TRITON_ATTN", record)
    trl_kwargs = dict(model="m", distributed_executor_backend="external_launcher", seed=0, quantization=None,
                      logprobs_mode="processed_logprobs")
    assert module.LLM(**trl_kwargs) == "engine"
    assert calls == [dict(trl_kwargs, attention_config={"backend": "TRITON_ATTN"})]
    assert record["trl_llm_kwargs"] == trl_kwargs
    assert record["added_llm_kwargs"] == {"attention_config": {"backend": "TRITON_ATTN"}}
    assert record["dist_env_at_llm"]["RANK"] == "0" and record["dist_env_at_llm"]["WORLD_SIZE"] == "1"
    with pytest.raises(ValueError, match="attention_config itself"):
        module.LLM(model="m", attention_config={"backend": "FLASH_ATTN"})


def test_wrap_llm_auto_leaves_trls_call_as_it_is(engine):
    module, calls = engine
    record = {}
    C.wrap_llm(None, record)
    module.LLM(model="m", seed=1)
    assert calls == [{"model": "m", "seed": 1}] and "added_llm_kwargs" not in record


def test_checks_fail_on_a_log_that_breaks_them():
    good = [{"loss": 0.1, "kl": 0.0, "reward": 1.0, "mismatch/k3": 1e-9, "mismatch/n_tokens": 64},
            {"loss": 0.2, "kl": 1e-4, "reward": 2.0, "mismatch/k3": 2e-9, "mismatch/n_tokens": 60}]
    assert all(C.checks_of(good, 2, syncs=2).values())
    assert not C.checks_of(good, 3, syncs=2)["steps"]
    assert not C.checks_of(good, 2, syncs=1)["weights_synced"]
    assert not C.checks_of([dict(good[0], kl=1e-7), good[1]], 2, 2)["step1_kl_zero"]
    assert not C.checks_of([good[0], dict(good[1], **{"mismatch/n_tokens": 0})], 2, 2)["mismatch_every_step"]
    assert not C.checks_of([good[0], {k: v for k, v in good[1].items() if k != "mismatch/k3"}], 2, 2)["mismatch_every_step"]
    assert not C.checks_of([good[0], {k: v for k, v in good[1].items() if k != "reward"}], 2, 2)["trl_keys_kept"]
    assert not any(C.checks_of([], 2, 0).values())
