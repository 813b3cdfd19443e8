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
    # a rollout_func without vLLM: TRL synced no engine, so no row claims which weights sampled it
    assert all(r.policy is None for r in dump.records) and "rla/policy" not in pd_columns(path)
    assert trainer.__dict__["_rla_attachment"].weights_column.startswith("not written: without use_vllm")

    plain = tmp_path / "plain.parquet"
    import pandas as pd

    pd.read_parquet(path).drop(columns=["rla/prompt_ids"]).to_parquet(plain)
    with pytest.raises(DumpFormatError, match="field 'rla/prompt_ids'.*holds decoded text.*log_tokens=True"):
        read_trl(plain, Sampling(temperature=1.0, top_p=1.0, top_k=-1))


def pd_columns(path):
    import pandas as pd

    return list(pd.read_parquet(path).columns)


class SyncRecorder:
    """Stands in for TRL's ``VLLMGeneration``: records the fingerprint of what each
    ``sync_weights`` call would send (the policy's tensors), and the global step."""

    def __init__(self, trainer):
        self.trainer, self.synced = trainer, []

    def sync_weights(self):
        from rla.rollout.fingerprint import weights_fingerprint

        t = self.trainer
        self.synced.append((t.state.global_step, weights_fingerprint(t.accelerator.unwrap_model(t.model))))


def test_with_vllm_each_row_names_the_weights_synced_for_its_generation(tmp_path):
    from transformers import AutoModelForCausalLM

    from rla.rollout.fingerprint import weights_fingerprint

    tok = AutoTokenizer.from_pretrained(MODEL)
    args = trl.GRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=4, num_generations=4,
                          max_completion_length=4, max_steps=2, beta=0.0, use_cpu=True, report_to=[],
                          logging_steps=1, save_strategy="no", log_completions=True, seed=0, disable_tqdm=True,
                          learning_rate=1e-3, model_init_kwargs={"dtype": torch.bfloat16})
    trainer = trl.GRPOTrainer(model=MODEL, reward_funcs=lambda completions, **_: [float(i % 3) for i in range(len(completions))],
                              args=args, train_dataset=Dataset.from_dict({"prompt": ["1+1=", "2+3="] * 4}),
                              processing_class=tok, rollout_func=KnownRollouts())
    # TRL's use_vllm path with the engine replaced by a recorder: GRPOTrainer._generate syncs, then
    # calls the rollout_func (no vLLM on this machine; the sync is TRL's own call)
    trainer.args.use_vllm = trainer.use_vllm = True
    trainer.vllm_importance_sampling_correction = False
    trainer._last_loaded_step = -1
    trainer.vllm_generation = engine = SyncRecorder(trainer)
    attachment = rla_trl.attach(trainer, "vllm", log_tokens=True)
    assert attachment.weights_column.startswith("rla/policy and rla/policy_step")
    trainer.train()
    assert [s for s, _ in engine.synced] == [0, 1] and engine.synced[0][1] != engine.synced[1][1]  # the step moved them
    start = AutoModelForCausalLM.from_pretrained(MODEL, dtype=torch.bfloat16)
    assert engine.synced[0][1] == weights_fingerprint(start)  # the checkpoint a user would diagnose step 0's rows with
    for k, (step, fp) in enumerate(engine.synced, start=1):
        dump = read_trl(tmp_path / "completions" / f"completions_{k:05d}.parquet", Sampling(1.0, 1.0, -1))
        assert [r.policy for r in dump.records] == [{"weights": fp, "step": step}] * 4
        assert not {"rla/policy", "rla/policy_step"} & set(dump.unused)


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
