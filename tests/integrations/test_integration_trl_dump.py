"""TRL's own completions table (``log_completions=True``, written by ``GRPOTrainer.log``) with the
token columns of ``attach(..., log_tokens=True)``, read back by ``rla triage --from trl``.

One GRPO step of the bundled tiny Qwen2 on CPU with a ``rollout_func`` returning known logprobs;
TRL writes ``completions/completions_00001.parquet`` itself.
"""

from __future__ import annotations

import os
from importlib.resources import files

import pytest
import torch

trl = pytest.importorskip("trl", reason="the TRL integration is tested where trl is installed (README)")

from datasets import Dataset  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402

from rla.integrations import trl as rla_trl  # noqa: E402
from rla.rollout.framework_dumps import DumpFormatError, Sampling, read_trl  # noqa: E402

MODEL = str(files("rla") / "assets" / "tiny-qwen2")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")


class KnownRollouts:
    """Fixed completions with known logprobs, as a vLLM server would return them."""

    def __init__(self):
        self.sent = []

    def __call__(self, prompts, trainer):
        tok = trainer.processing_class
        out = {"prompt_ids": [], "completion_ids": [], "logprobs": []}
        for k, p in enumerate(prompts):
            ids = tok(p, add_special_tokens=False)["input_ids"]
            comp = [10 + k, 20 + k, 30 + (k % 3)][: 2 + k % 2]
            lps = [-0.125 * (j + 1) - 0.01 * k for j in range(len(comp))]
            out["prompt_ids"].append(ids)
            out["completion_ids"].append(comp)
            out["logprobs"].append(lps)
        self.sent.append(out)
        return out


def test_trls_completions_table_carries_the_tokens_and_both_sides_logprobs(tmp_path):
    tok = AutoTokenizer.from_pretrained(MODEL)
    rollouts = KnownRollouts()
    args = trl.GRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=4, num_generations=4,
                          max_completion_length=4, max_steps=1, beta=0.0, use_cpu=True, report_to=[],
                          logging_steps=1, save_strategy="no", log_completions=True, seed=0, disable_tqdm=True,
                          model_init_kwargs={"dtype": torch.bfloat16})
    trainer = trl.GRPOTrainer(model=MODEL, reward_funcs=lambda completions, **_: [1.0] * len(completions),
                              args=args, train_dataset=Dataset.from_dict({"prompt": ["1+1=", "2+3="] * 2}),
                              processing_class=tok, rollout_func=rollouts)
    rla_trl.attach(trainer, "vllm", log_tokens=True)
    trainer.train()
    path = tmp_path / "completions" / "completions_00001.parquet"
    dump = read_trl(path, Sampling(temperature=1.0, top_p=1.0, top_k=-1))
    sent = rollouts.sent[0]
    assert [r.prompt_ids for r in dump.records] == sent["prompt_ids"]
    assert [r.response_ids for r in dump.records] == sent["completion_ids"]
    # TRL holds sampling_per_token_logps as float32: the records carry exactly those values
    assert [r.logprobs for r in dump.records] == [torch.tensor(x).double().tolist() for x in sent["logprobs"]]
    assert dump.trainer_field == "old_per_token_logps" and len(dump.trainer_logprobs) == 4
    assert all(len(t) == len(c) for t, c in zip(dump.trainer_logprobs, sent["completion_ids"]))
    assert {"prompt", "completion", "advantage", "step"} <= set(dump.unused)

    plain = tmp_path / "plain.parquet"
    import pandas as pd

    pd.read_parquet(path).drop(columns=["rla/prompt_ids"]).to_parquet(plain)
    with pytest.raises(DumpFormatError, match="field 'rla/prompt_ids'.*holds decoded text.*log_tokens=True"):
        read_trl(plain, Sampling(temperature=1.0, top_p=1.0, top_k=-1))


def test_log_tokens_needs_trls_log_completions(tmp_path):
    tok = AutoTokenizer.from_pretrained(MODEL)
    args = trl.GRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=4, num_generations=4,
                          max_completion_length=4, max_steps=1, beta=0.0, use_cpu=True, report_to=[],
                          save_strategy="no", disable_tqdm=True)
    trainer = trl.GRPOTrainer(model=MODEL, reward_funcs=lambda completions, **_: [1.0] * len(completions), args=args,
                              train_dataset=Dataset.from_dict({"prompt": ["1+1="] * 4}), processing_class=tok,
                              rollout_func=KnownRollouts())
    with pytest.raises(ValueError, match="log_completions=True"):
        rla_trl.attach(trainer, "vllm", log_tokens=True)
