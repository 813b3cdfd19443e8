"""TRL's real ``cast_lm_head_to_fp32`` (GRPOTrainer.__init__, TRL 1.16) under rla.align and rla.unalign.

TRL's cast is a function nested in ``GRPOTrainer.__init__`` (not importable), so the trainer itself
is built here, on CPU, on the bundled tiny Qwen2 (tied embeddings: TRL also hooks the embedding's
output back to bf16). Expected values are plain torch expressions of the point's definition
(docs/rounding.md, "LM head") and TRL's own head forward, never rla's function.
"""

from __future__ import annotations

import os
from importlib.resources import files

import pytest
import torch

trl = pytest.importorskip("trl", reason="the TRL integration is tested where trl is installed (README)")

from datasets import Dataset  # noqa: E402  (a TRL dependency)
from transformers import AutoTokenizer  # noqa: E402

import rla  # noqa: E402
from rla.alignment.patch import patch_of  # noqa: E402
from rla.diagnosis.doctor import doctor  # noqa: E402

MODEL = str(files("rla") / "assets" / "tiny-qwen2")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
BF16 = torch.bfloat16


def _trainer(tmp_path, cast: bool):
    args = trl.GRPOConfig(
        output_dir=str(tmp_path / "out"), per_device_train_batch_size=4, num_generations=4, max_completion_length=4,
        max_steps=1, beta=0.0, use_cpu=True, report_to=[], save_strategy="no", model_init_kwargs={"dtype": BF16},
        seed=0, disable_tqdm=True, cast_lm_head_to_fp32=cast,
    )
    return trl.GRPOTrainer(model=MODEL, reward_funcs=lambda completions, **_: [0.0] * len(completions), args=args,
                           train_dataset=Dataset.from_dict({"prompt": ["1+1=", "2+2="]}),
                           processing_class=AutoTokenizer.from_pretrained(MODEL))


def test_trl_cast_head_aligned_and_restored(tmp_path):
    trainer = _trainer(tmp_path, cast=True)
    m = trainer.model
    head = m.lm_head
    trl_forward = head.__dict__["forward"]  # TRL's cast_forward_to_fp32
    hooks = dict(m.model.embed_tokens._forward_hooks)
    assert head.weight.dtype == torch.float32 and len(hooks) == 1
    ids = torch.randint(0, m.config.vocab_size, (2, 16), generator=torch.Generator().manual_seed(0))
    m.eval()
    before = m(ids).logits
    assert before.dtype == torch.float32

    fp32_row = rla.profiles.get("vllm").replace(name="vllm-0.33+head_dtype=float32", lm_head="fp32")
    report = rla.align(m, fp32_row)
    assert "a trainer's forward" in report.lm_head
    h = m.model(ids).last_hidden_state
    logits = m(ids).logits
    assert torch.equal(logits, torch.matmul(h.float(), head.weight.to(BF16).float().t()))
    # at step 0 TRL's master weight is the checkpoint's bf16 values: the fp32 row is TRL's own head
    assert torch.equal(logits, trl_forward(h))

    report = rla.align(m, "vllm")  # the engine's default bf16 head
    assert report.lm_head.startswith("aligned (float32 weight")
    h = m.model(ids).last_hidden_state
    logits = m(ids).logits
    assert logits.dtype == BF16
    assert torch.equal(logits, torch.matmul(h, head.weight.to(BF16).t()))

    rla.unalign(m)
    assert head.__dict__["forward"] is trl_forward and patch_of(head) is None
    assert head.weight.dtype == torch.float32 and dict(m.model.embed_tokens._forward_hooks) == hooks
    assert torch.equal(m(ids).logits, before)


def test_doctor_names_trls_fp32_head_against_a_bf16_row(tmp_path):
    trainer = _trainer(tmp_path, cast=True)
    names = {h.name: h for h in doctor(trainer.model, profile="vllm")}
    assert "LM head dtype" in names and names["LM head dtype"].severity == "error"
    assert "cast_lm_head_to_fp32" in names["LM head dtype"].detail
    fp32_row = rla.profiles.get("vllm").replace(name="vllm+fp32-head", lm_head="fp32")
    assert "LM head dtype" not in {h.name for h in doctor(trainer.model, profile=fp32_row)}
    plain = _trainer(tmp_path, cast=False)
    assert "LM head dtype" not in {h.name for h in doctor(plain.model, profile="vllm")}
    assert "LM head dtype" in {h.name for h in doctor(plain.model, profile=fp32_row)}


def test_attach_says_when_trls_fused_head_is_not_the_rows(tmp_path):
    """TRL's fused GRPO head reads lm_head.weight itself (rla.align's head patch does not reach it):
    attach names a cast that disagrees with the row's lm_head."""
    from rla.integrations import trl as rla_trl

    att = rla_trl.attach(_trainer(tmp_path, cast=True), "vllm", log_metrics=False)
    assert any("cast_lm_head_to_fp32=True" in n and "lm_head='lp'" in n for n in att.policy.notes)
    fp32_row = rla.profiles.get("vllm").replace(name="vllm+fp32-head", lm_head="fp32")
    att = rla_trl.attach(_trainer(tmp_path, cast=False), fp32_row, log_metrics=False)
    assert any("without cast_lm_head_to_fp32=True" in n for n in att.policy.notes)
    att = rla_trl.attach(_trainer(tmp_path, cast=False), "vllm", log_metrics=False)
    assert not any("cast_lm_head_to_fp32" in n for n in att.policy.notes)
