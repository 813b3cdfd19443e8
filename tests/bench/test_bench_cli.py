"""``rla bench``'s arguments: what the e2e run is told, and bad input refused by name (no GPU)."""

import argparse

import pytest

from rla.bench import e2e
from rla.commands import bench


def parse(*argv):
    p = argparse.ArgumentParser()
    bench.add_arguments(p)
    return p.parse_args(argv)


def test_shape_and_variants():
    args = parse("e2e", "--shape", "1x512", "--variants", "hf-bf16", "rla-vllm", "liger")
    assert args.shape == (1, 512) and args.variants == ["hf-bf16", "rla-vllm", "liger"]
    assert parse("e2e").shape is None and parse("e2e").compile is None
    assert parse("e2e", "--compile").compile == "default"
    assert parse("e2e", "--compile", "reduce-overhead").compile == "reduce-overhead"
    assert bench.E2E_VARIANTS == (*e2e.VARIANTS, "liger", "liger-flce", "rla-vllm+liger-flce",
                                  "rla-vllm-eager-kernels", "rla-vllm-pieces")
    assert set(e2e.OWN_MODEL) <= set(bench.E2E_VARIANTS)


@pytest.mark.parametrize("argv,message", [
    (("--shape", "512"), "BATCHxSEQ, e.g. 1x512; got '512'"),
    (("--shape", "0x512"), "batch >= 1 and seq >= 2"),
    (("--variants", "rla-vlm"), "invalid choice: 'rla-vlm'"),
])
def test_bad_arguments_are_named(argv, message, capsys):
    with pytest.raises(SystemExit):
        parse("e2e", *argv)
    assert message in capsys.readouterr().err


def test_e2e_arguments_reach_the_run(monkeypatch):
    """What ``rla bench e2e`` hands ``rla.bench.e2e.run`` (the run itself needs CUDA)."""
    import torch

    seen = {}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(e2e, "run", lambda **kw: seen.update(kw))
    args = parse("e2e", "--models", "qwen2.5-7b", "--variants", "rla-vllm", "liger", "--shape", "2x256",
                 "--compile", "reduce-overhead", "--steps", "7", "--out", "somewhere")
    assert bench.run(args) == 0
    assert seen == {"out_dir": "somewhere", "models": ("qwen2.5-7b",), "variants": ("rla-vllm", "liger"),
                    "reps": 7, "shape": (2, 256), "compile_mode": "reduce-overhead"}


def test_training_step_backpropagates_and_drops_the_gradients():
    """The step e2e times (and host_step.py profiles): loss of labels = ids, backward, no grads left."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1, vocab_size=50))
    ids = torch.randint(0, 50, (2, 8))
    seen = []
    model.lm_head.weight.register_hook(lambda g: seen.append(g.abs().sum().item()))
    loss = e2e.training_step(model, ids)()
    assert torch.equal(loss, model(input_ids=ids, labels=ids).loss.detach())
    assert seen and seen[0] > 0
    assert all(p.grad is None for p in model.parameters())


def test_every_e2e_model_shape_is_a_choice_and_builds():
    """Each shape of rla.bench.e2e.MODELS is offered by `rla bench e2e --models` and builds the
    family it names (on the meta device: no memory), Qwen3 with its q/k norms."""
    import torch

    from rla.bench import e2e
    from rla.commands import bench

    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    choices = next(a.choices for a in parser._actions if a.dest == "models")
    assert set(choices) == set(e2e.MODELS)
    for name, shape in e2e.MODELS.items():
        model = e2e.build_model(name, torch.bfloat16, device="meta")
        assert model.config.model_type == shape.get("family", "qwen2")
        assert model.config.hidden_size == shape["hidden_size"] and len(model.model.layers) == shape["num_hidden_layers"]
    assert hasattr(e2e.build_model("qwen3-1.7b", torch.bfloat16, device="meta").model.layers[0].self_attn, "q_norm")
