"""Clear errors: unsupported models, bad regions and profiles, layouts and casts rla cannot align."""

from __future__ import annotations

import pytest
import torch
import transformers

import rla

from align_spec import single_thread, tiny_config, tiny_model, tokens  # noqa: F401


def test_unsupported_model_names_the_supported_families():
    cfg = transformers.GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=64)
    gpt2 = transformers.GPT2LMHeadModel(cfg)
    with pytest.raises(NotImplementedError, match=r"gpt2.*Supported families: llama, mistral, qwen2, qwen3"):
        rla.align(gpt2)
    with pytest.raises(NotImplementedError, match="no transformers config"):
        rla.align(torch.nn.Linear(2, 2))
    with pytest.raises(TypeError, match="torch.nn.Module"):
        rla.align("Qwen/Qwen3-8B")


@pytest.fixture(scope="module")
def model():
    return tiny_model("qwen2")


@pytest.mark.parametrize(
    "regions,error,match",
    [
        (("rope", "mlp"), ValueError, r"unknown region\(s\) \['mlp'\]; regions are \('rope', 'swiglu', 'rmsnorm', 'router'\)"),
        ((), ValueError, "regions is empty"),
        (3, TypeError, "regions must be a tuple"),
    ],
)
def test_bad_regions(model, regions, error, match):
    with pytest.raises(error, match=match):
        rla.align(model, "vllm", regions=regions)
    assert rla.alignment_of(model) is None  # nothing half-applied


def test_a_single_region_may_be_a_string(model):
    assert rla.align(model, "vllm", regions="swiglu").regions == ("swiglu",)
    rla.unalign(model)


def test_bad_profiles(model):
    with pytest.raises(KeyError, match="unknown rounding profile 'vlm'; known profiles: hf, sglang-0.5.23, vllm-0.26, vllm-0.26-eager, vllm-0.33"):
        rla.align(model, "vlm")
    with pytest.raises(TypeError, match="profile must be a name"):
        rla.align(model, 3)
    from rla.profiles import get

    custom = get("vllm").replace(name="vllm-custom", swiglu="per_op")
    assert rla.align(model, custom).profile is custom
    rla.unalign(model)


def test_non_silu_activation_refuses_only_the_swiglu_region():
    model = tiny_model("llama", config=tiny_config("llama", hidden_act="gelu"))
    with pytest.raises(ValueError, match="hidden_act is 'gelu'"):
        rla.align(model, "vllm")
    assert rla.align(model, "vllm", regions=("rope", "rmsnorm")).regions == ("rope", "rmsnorm")
    rla.unalign(model)


def test_a_rounded_sum_between_layers_names_cast_forward_inputs(model):
    """What FSDP2's MixedPrecisionPolicy(cast_forward_inputs=True) does, without FSDP."""
    rla.align(model, "vllm")
    layer = model.model.layers[1]
    x = torch.randn(1, 4, 64).to(torch.bfloat16)
    pos = torch.arange(4)[None]
    cos_sin = model.model.rotary_emb(x, pos)
    with pytest.raises(RuntimeError, match=r"decoder layer 1 received .*cast_forward_inputs=False"):
        layer(x, attention_mask=None, position_ids=pos, position_embeddings=cos_sin)
    layer(x.float(), attention_mask=None, position_ids=pos, position_embeddings=cos_sin)  # the fp32 sum
    rla.align(model, "vllm-eager")  # rounded_sum: the lp residual stream is what layers pass
    layer(x, attention_mask=None, position_ids=pos, position_embeddings=cos_sin)
    rla.unalign(model)


def test_rounded_cos_sin_under_an_fp32_cos_profile_is_an_error(model):
    rla.align(model, "rla")  # fp32 cos/sin at every head size (sglang's only at 64/128/256/512: not this model's 16)
    x = torch.randn(1, 4, 64).to(torch.bfloat16)
    pos = torch.arange(4)[None]
    cos, sin = model.model.rotary_emb(x, pos)
    with pytest.raises(TypeError, match="(?s)keeps cos/sin in fp32.*cast_forward_inputs=False"):
        model.model.layers[0](x, attention_mask=None, position_ids=pos,
                              position_embeddings=(cos.to(torch.bfloat16), sin.to(torch.bfloat16)))
    rla.unalign(model)


def test_unalign_refuses_to_drop_a_later_wrapper(model):
    rla.align(model, "vllm")
    mlp = model.model.layers[0].mlp
    aligned_forward = mlp.forward
    mlp.forward = lambda x: aligned_forward(x)  # e.g. a hook library wrapping after align
    with pytest.raises(RuntimeError, match="replaced after rla.align"):
        rla.unalign(model)
    mlp.forward = aligned_forward
    rla.unalign(model)
    assert "forward" not in mlp.__dict__


def test_an_earlier_instance_forward_is_restored(model):
    mlp = model.model.layers[0].mlp
    original = type(mlp).forward.__get__(mlp)

    def hooked(x):
        return original(x)

    mlp.forward = hooked  # an instance forward installed before align (accelerate-style hook)
    rla.align(model, "vllm")
    assert mlp.forward is not hooked
    rla.unalign(model)
    assert mlp.forward is hooked
    del mlp.forward
