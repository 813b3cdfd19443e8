"""rla.integrations.trl against the real TRL package: a few GRPO steps of the bundled tiny Qwen2.

Everything here runs TRL's own ``GRPOTrainer`` on CPU (TRL 1.16, the version the README names).
The "rollout engine" is :class:`rla.rollout.sampler.Sampler` under the vLLM profile, handed to TRL as a
``rollout_func`` that returns per-token logprobs, exactly the path a vLLM server takes into
TRL's batch (``sampling_per_token_logps``).
"""

from __future__ import annotations

import os
from importlib.resources import files

import pytest
import torch

trl = pytest.importorskip("trl", reason="the TRL integration is tested where trl is installed (README)")

from datasets import Dataset  # noqa: E402  (a TRL dependency)
from safetensors.torch import load_file  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402

import rla  # noqa: E402
from rla.integrations import trl as rla_trl  # noqa: E402
from rla.rollout.sampler import Sampler, SamplingParams  # noqa: E402

MODEL = str(files("rla") / "assets" / "tiny-qwen2")
PROMPTS = ["1+1=", "2+3=", "4+4=", "7+1=", "9+9=", "3+5=", "6+2=", "8+1="]
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")


def reward(completions, **_):
    """A reward that varies between completions, so the policy really moves after step 1."""
    return [float(sum(map(ord, c)) % 7) for c in completions]


def _config(tmp_path, **kw):
    base = dict(
        output_dir=str(tmp_path / "out"), per_device_train_batch_size=4, num_generations=4,
        max_completion_length=6, max_steps=1, beta=0.1, use_cpu=True, report_to=[], logging_steps=1,
        save_strategy="no", learning_rate=5e-3, model_init_kwargs={"dtype": torch.bfloat16}, seed=0,
        disable_tqdm=True,
    )
    base.update(kw)
    return trl.GRPOConfig(**base)


def _trainer(tmp_path, rollout_func=None, **kw):
    tok = AutoTokenizer.from_pretrained(MODEL)
    return trl.GRPOTrainer(
        model=MODEL, reward_funcs=reward, args=_config(tmp_path, **kw),
        train_dataset=Dataset.from_dict({"prompt": PROMPTS}), processing_class=tok,
        rollout_func=rollout_func,
    )


class VllmProfileRollouts:
    """``rollout_func``: sample with rla's vLLM-profile stack (own bf16 copy, synced each call)
    and return its logprobs; one NaN per batch stands for a token vLLM could not score."""

    def __init__(self):
        self.sampler = None
        self.nan_count = 0

    def __call__(self, prompts, trainer):
        model = trainer.accelerator.unwrap_model(trainer.model)
        if self.sampler is None:
            self.sampler = Sampler(model, profile="vllm")
        self.sampler.load_weights(model)
        tok = trainer.processing_class
        ids = [tok(p, add_special_tokens=False)["input_ids"] for p in prompts]
        records = self.sampler.generate(ids, SamplingParams(max_new_tokens=6, seed=len(self.__dict__)))
        logprobs = [list(r.logprobs) for r in records]
        logprobs[0][0] = float("nan")
        self.nan_count += 1
        return {"prompt_ids": ids, "completion_ids": [list(r.response_ids) for r in records], "logprobs": logprobs}


def _logs(trainer):
    return [h for h in trainer.state.log_history if "loss" in h]


def test_attach_aligns_reference_kl_exactly_zero_at_step_one_and_logs_metrics(tmp_path):
    rollouts = VllmProfileRollouts()
    trainer = _trainer(tmp_path, rollout_func=rollouts, max_steps=2)
    att = rla_trl.attach(trainer, profile="vllm")
    assert att.reference is not None and rla.alignment_of(trainer.ref_model) is not None
    assert "mismatch/*" in att.metrics
    trainer.train()
    step1, step2 = _logs(trainer)
    assert step1["kl"] == 0.0  # same weights, same rounding: policy and reference agree bit for bit
    assert step2["kl"] > 0.0  # ... and the KL term is live: after an update it moves
    for log in (step1, step2):
        assert log["mismatch/n_nan_masked"] == 1.0  # the NaN token, masked and counted
        assert 0 < log["mismatch/k3"] < 1e-2 and log["mismatch/abs/max"] >= log["mismatch/abs/mean"] > 0
        # every completion token of the 4 rollouts is measured, except the one NaN
        assert log["mismatch/n_tokens"] == 4 * log["completions/mean_length"] - 1
    # rla writes only mismatch/* keys; TRL's own keys are all still there, none renamed or dropped.
    ours = {k for k in step1 if k.startswith("mismatch/")}
    assert ours == att.logged_keys and {"loss", "kl", "reward", "entropy", "grad_norm"} <= set(step1)


def test_without_attach_the_reference_is_unaligned_and_kl_is_not_zero(tmp_path):
    """The control: aligning only the policy (what the README said before) leaves TRL's own
    reference on HF's rounding, and the step-1 KL is not 0 although the weights are identical."""
    trainer = _trainer(tmp_path)
    rla.align(trainer.model, "vllm")
    trainer.train()
    assert _logs(trainer)[0]["kl"] > 0.0


def test_continuous_batching_with_bf16_keeps_the_alignment(tmp_path):
    """TRL casts the model with ``model.to(torch.bfloat16)`` before continuous-batching generation;
    the aligned rotary keeps its fp32 frequencies through that cast."""
    trainer = _trainer(tmp_path, use_transformers_continuous_batching=True, bf16=True)
    rla_trl.attach(trainer, profile="vllm")
    rotary = trainer.model.model.rotary_emb
    trainer.train()
    assert _logs(trainer)[0]["kl"] == 0.0
    assert rla.alignment_of(trainer.model) is not None
    assert trainer.model.model.embed_tokens.weight.dtype == torch.bfloat16  # TRL did cast
    report = rla.alignment_of(trainer.model)
    assert any(h.name == "cast after align" for h in report.hazards)
    # cos/sin still come from fp32 frequencies: HF's own fp32 init, evaluated independently.
    inv_freq, _ = type(rotary).compute_default_rope_parameters(trainer.model.config)
    pos = torch.arange(40)[None]
    cos, sin = rotary(torch.zeros(1, 40, 8, dtype=torch.bfloat16), pos)
    angles = pos[..., None].float() * inv_freq.float()
    assert cos.dtype == torch.float32 and torch.equal(cos, angles.cos()) and torch.equal(sin, angles.sin())


def test_checkpoint_resume_keeps_the_alignment(tmp_path):
    """Two steps straight vs. one step, save, a new trainer attached by the same line, resume:
    the same final weights, and the resumed model is aligned."""
    straight = _trainer(tmp_path / "a", max_steps=2)
    rla_trl.attach(straight, profile="vllm")
    straight.train()
    first = _trainer(tmp_path / "b", max_steps=2, save_strategy="steps", save_steps=1)
    rla_trl.attach(first, profile="vllm")
    first.train()
    ckpt = tmp_path / "b" / "out" / "checkpoint-1"
    saved = load_file(str(ckpt / "model.safetensors"))
    assert not any("rla" in k or "inv_freq" in k for k in saved)  # plain HF weights
    resumed = _trainer(tmp_path / "c", max_steps=2)
    att = rla_trl.attach(resumed, profile="vllm")
    resumed.train(resume_from_checkpoint=str(ckpt))
    assert rla.alignment_of(resumed.model) is not None and att.policy.profile.name == rla.alignment_of(
        resumed.model).profile.name
    want = straight.model.state_dict()
    got = resumed.model.state_dict()
    assert want.keys() == got.keys()
    moved = [k for k in want if not torch.equal(want[k], first.model.state_dict()[k])]
    assert not moved  # the saving run itself is deterministic
    diff = [k for k in want if not torch.equal(want[k], got[k])]
    assert not diff, diff[:3]


def test_peft_reference_is_the_aligned_policy_without_adapters(tmp_path):
    """With PEFT TRL builds no reference model: it disables the adapters of the policy, which
    ``attach`` aligned; a fresh LoRA adapter (B = 0) leaves step-1 KL exactly 0."""
    from peft import LoraConfig

    tok = AutoTokenizer.from_pretrained(MODEL)
    trainer = trl.GRPOTrainer(
        model=MODEL, reward_funcs=reward, args=_config(tmp_path), processing_class=tok,
        train_dataset=Dataset.from_dict({"prompt": PROMPTS}),
        peft_config=LoraConfig(r=4, target_modules=["q_proj", "v_proj"]),
    )
    att = rla_trl.attach(trainer, profile="vllm")
    assert trainer.ref_model is None and att.reference is None and "PEFT" in att.reference_note
    assert rla.alignment_of(trainer.model) is att.policy  # found through the PEFT wrapper
    trainer.train()
    assert _logs(trainer)[0]["kl"] == 0.0  # TRL's adapter-disabled reference path runs aligned
    assert rla.alignment_of(trainer.model) is att.policy


def test_engine_backed_forward_in_trl(tmp_path, vllm_engine):
    """``attach(..., ops=engine_forward(vllm))``: TRL's policy and reference forward through vLLM's
    own compiled pieces (its native code under Inductor, here the CPU backend) and train with rla's
    gradient: step-1 KL is exactly 0 (both run the same pieces on the same weights), the policy
    moves, and the mismatch against the vLLM-profile rollouts is measured. Without rollouts from
    outside, TRL would sample with the training model, which this forward cannot (no KV cache)."""
    from rla.engines.vllm_forward import engine_forward

    pieces = engine_forward(vllm_engine, "default")
    with pytest.raises(ValueError, match="keeps no KV cache"):
        rla_trl.attach(_trainer(tmp_path), profile="vllm", ops=pieces)
    trainer = _trainer(tmp_path, rollout_func=VllmProfileRollouts(), max_steps=2)
    att = rla_trl.attach(trainer, profile="vllm", ops=pieces)
    assert att.policy.ops == pieces.name and att.reference.ops == pieces.name
    trainer.train()
    step1, step2 = _logs(trainer)
    assert step1["kl"] == 0.0 and step2["kl"] > 0.0
    assert step1["grad_norm"] > 0 and 0 <= step1["mismatch/k3"] < 1e-2


def test_trainers_attach_was_not_written_for_are_refused_by_name(tmp_path):
    """RLOO passes every duck-typed hook check but carries no rollout logprobs: refused by name."""
    tok = AutoTokenizer.from_pretrained(MODEL)
    rloo = trl.RLOOTrainer(
        model=MODEL, reward_funcs=reward, processing_class=tok, train_dataset=Dataset.from_dict({"prompt": PROMPTS}),
        args=trl.RLOOConfig(output_dir=str(tmp_path / "rloo"), per_device_train_batch_size=4, num_generations=4,
                            max_completion_length=6, max_steps=1, use_cpu=True, report_to=[], save_strategy="no",
                            model_init_kwargs={"dtype": torch.bfloat16}),
    )
    with pytest.raises(TypeError, match="not RLOOTrainer: its generation batch keeps no rollout logprobs"):
        rla_trl.attach(rloo)
    assert rla.alignment_of(rloo.model) is None


def test_use_liger_kernel_is_refused_naming_the_flag(tmp_path):
    trainer = _trainer(tmp_path, use_liger_kernel=True)
    with pytest.raises(ValueError, match=r"use_liger_kernel=False"):
        rla_trl.attach(trainer)
    assert rla.alignment_of(trainer.model) is None


def test_liger_applied_after_attach_stops_training_with_a_clear_error(tmp_path):
    """What TRL's use_liger_kernel does at train(), done by hand after attach: Liger's forwards
    replace the aligned norms and MLPs; the next step refuses instead of training misaligned."""
    import importlib

    pytest.importorskip("liger_kernel")
    from transformers.integrations.liger import apply_liger_kernel

    modeling = importlib.import_module("transformers.models.qwen2.modeling_qwen2")
    saved = dict(vars(modeling))
    try:
        trainer = _trainer(tmp_path, rollout_func=VllmProfileRollouts())
        rla_trl.attach(trainer)
        apply_liger_kernel(trainer.model, {"fused_linear_cross_entropy": False})  # transformers' Trainer.train line
        with pytest.raises(RuntimeError, match="aligned forward replaced after attach"):
            trainer.train()
    finally:
        for name, value in saved.items():
            setattr(modeling, name, value)


def test_fp32_weights_under_trl_autocast_are_reported_and_run_aligned(tmp_path):
    """TRL's defaults: fp32 weights, bf16=True (accelerate's bf16 autocast). The report says that
    training runs aligned under autocast, and it does: the policy's logits under autocast equal the
    bf16-loaded aligned model's bit for bit, and differ from the unaligned policy's."""
    from transformers import AutoModelForCausalLM

    trainer = _trainer(tmp_path, model_init_kwargs={})
    assert next(trainer.model.parameters()).dtype == torch.float32 and trainer.accelerator.mixed_precision == "bf16"
    ids = torch.randint(3, 60, (2, 20), generator=torch.Generator().manual_seed(0))
    with torch.no_grad(), trainer.accelerator.autocast():
        unaligned = trainer.model(ids).logits
    att = rla_trl.attach(trainer)
    for report in (att.policy, att.reference):
        assert not any(n.startswith("nothing to round") for n in report.notes)
        assert any("autocast" in n and "training runs aligned" in n for n in report.notes)
    bf16 = AutoModelForCausalLM.from_pretrained(MODEL, dtype=torch.bfloat16,
                                                attn_implementation=trainer.model.config._attn_implementation)
    rla.align(bf16, "vllm")
    with torch.no_grad():
        with trainer.accelerator.autocast():
            aligned = trainer.model(ids).logits
        expected = bf16(ids).logits
    assert torch.equal(aligned, expected) and not torch.equal(aligned, unaligned)
