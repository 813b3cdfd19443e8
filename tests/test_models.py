"""rla.models: config factory sizes, the safetensors check, and the bundled model."""

import json
import random

import pytest
import torch

from rla import models
from rla.rl import bundled
from rla.rl.tokenizer import build_tokenizer

# (size, low, high) in parameters: the names promise these ranges (an MoE's: active per token)
SIZE_RANGES = [("tiny", 2e6, 5e6), ("10m", 8e6, 15e6), ("50m", 40e6, 65e6), ("150m", 100e6, 200e6)]


@pytest.mark.parametrize("arch", models.ARCHS)
@pytest.mark.parametrize("size, low, high", SIZE_RANGES)
def test_param_counts_in_range(arch, size, low, high):
    cfg = models.tiny_config(arch, size)
    assert low <= models.active_param_count(cfg) <= high
    if arch != "qwen3_moe":
        assert models.active_param_count(cfg) == models.param_count(cfg)
    assert cfg.model_type == arch and cfg._attn_implementation == "sdpa"
    assert cfg.hidden_size // cfg.num_attention_heads == 64  # head_dim of the released families
    assert cfg.vocab_size % 64 == 0 and cfg.vocab_size >= len(build_tokenizer())


def test_the_moe_config_is_8_experts_top_2_and_counts_its_active_parameters():
    cfg = models.tiny_config("qwen3_moe", "10m")
    assert (cfg.num_experts, cfg.num_experts_per_tok, cfg.norm_topk_prob) == (8, 2, True)
    assert cfg.moe_intermediate_size == cfg.intermediate_size // 2 and not cfg.output_router_logits
    with torch.device("meta"):
        model = models.build_model(cfg)
    experts = sum(p.numel() for n, p in model.named_parameters() if ".mlp.experts." in n)
    total = sum(p.numel() for p in model.parameters())
    assert total == models.param_count(cfg) >= 30e6  # the experiment's >= 30M
    assert models.active_param_count(cfg) == total - experts * 6 // 8


def test_1p5b_is_qwen25_1p5b_shaped():
    cfg = models.tiny_config("qwen2", "1.5b", vocab_size=151936)
    # Qwen2.5-1.5B: 1,543,714,304 parameters (tied embeddings), head_dim 128, 2 kv heads
    assert models.param_count(cfg) == 1_543_714_304
    assert cfg.hidden_size // cfg.num_attention_heads == 128 and cfg.num_key_value_heads == 2
    assert cfg.rope_parameters["rope_theta"] == 1e6 and cfg.tie_word_embeddings
    assert models.tiny_config("qwen2", "1.5b").vocab_size == models.VOCAB_SIZE  # the trainer's vocabulary


def test_tiny_fits_the_bundle_limit():
    # <= 10 MB of bf16 safetensors: 2 bytes a parameter plus a small header
    assert 2 * models.param_count(models.tiny_config("qwen2", "tiny")) < 10e6 - 50_000


@pytest.mark.parametrize("arch", models.ARCHS)
def test_family_numerics(arch):
    cfg = models.tiny_config(arch, "micro", max_position_embeddings=4096)
    assert cfg.max_position_embeddings == 4096
    assert cfg.rope_parameters["rope_theta"] == {"qwen2": 1e6, "qwen3": 1e6, "llama": 5e5, "qwen3_moe": 1e6}[arch]
    model = models.build_model(cfg, seed=0)
    names = dict(model.named_parameters())
    assert ("model.layers.0.self_attn.q_proj.bias" in names) == (arch == "qwen2")
    assert ("model.layers.0.self_attn.q_norm.weight" in names) == (arch in ("qwen3", "qwen3_moe"))
    assert ("model.layers.0.mlp.gate.weight" in names) == (arch == "qwen3_moe")
    logits = model(torch.tensor([[1, 5, 6, 7]])).logits
    assert logits.shape == (1, 4, 64) and logits.std() > 0


def test_errors():
    with pytest.raises(ValueError, match="known: qwen2, qwen3, llama"):
        models.tiny_config("gpt2")
    with pytest.raises(ValueError, match="known: micro, tiny"):
        models.tiny_config("qwen2", "7b")


def _write_safetensors(path):
    from safetensors.torch import save_file

    save_file({"w": torch.arange(6, dtype=torch.float32).reshape(2, 3)}, str(path))
    return path.read_bytes()


def test_check_safetensors(tmp_path):
    good = tmp_path / "good.safetensors"
    data = _write_safetensors(good)
    assert models.check_safetensors(good)["w"]["shape"] == [2, 3]
    cases = {
        "truncated": data[:-4],
        "lfs": b"version https://git-lfs.github.com/spec/v1\noid sha256:ab\nsize 123\n",
        "tiny": b"abc",
        "huge-header": (10**12).to_bytes(8, "little") + b"{}",
        "bad-json": (4).to_bytes(8, "little") + b"{x:1" + b"\0" * 24,
    }
    messages = {"truncated": "truncated", "lfs": "LFS", "tiny": "not a safetensors", "huge-header": "header length",
                "bad-json": "corrupt"}
    for name, blob in cases.items():
        p = tmp_path / name
        p.write_bytes(blob)
        with pytest.raises(ValueError, match=messages[name]):
            models.check_safetensors(p)


def test_load_bundled_missing_files(tmp_path, monkeypatch):
    monkeypatch.setattr(models, "bundled_path", lambda: tmp_path)
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(FileNotFoundError, match="model.safetensors.*train_tiny_model.py"):
        models.load_bundled_model()
    for name in ("model.safetensors", "tokenizer.json", "tokenizer_config.json", "task.json"):
        (tmp_path / name).write_text("version https://git-lfs.github.com/spec/v1\n")
    with pytest.raises(ValueError, match="LFS"):
        models.load_bundled_model()


BUNDLED = models.bundled_path()
HAVE_BUNDLED = (BUNDLED / "model.safetensors").is_file()


@pytest.mark.skipif(not HAVE_BUNDLED, reason="the bundled model is not in src/rla/assets/tiny-qwen2 yet "
                    "(lab/tools/train_tiny_model.py makes it)")
def test_load_bundled_and_accuracy():
    from rla.rl.sft import evaluate

    model, tok = bundled.load_bundled()
    assert type(model).__name__ == "Qwen2ForCausalLM"
    assert model.dtype == torch.bfloat16 and not model.training
    assert model.model.rotary_emb.inv_freq.dtype == torch.float32  # from_pretrained keeps it fp32
    assert (BUNDLED / "model.safetensors").stat().st_size <= 10e6
    assert "final training loss" in (BUNDLED / "TRAINING.md").read_text()
    task = bundled.bundled_task()
    assert json.loads((BUNDLED / "task.json").read_text())["task"] == task.spec()
    assert 100 <= task.expected_length() <= 200
    problems = task.sample(random.Random(2024), 16)
    result = evaluate(model, tok, task, problems, temperatures=(0.0,))
    assert result["greedy_acc"] > 0, result
