"""The e2e bench's Gemma 3 shape and arms on CPU (their timing is a GPU run: ``rla bench e2e
--models gemma3-4b --variants hf-bf16 rla-vllm liger liger-flce``).

- ``gemma3-4b`` builds Gemma 3 4B's text model (on the meta device: no memory): its layer pattern,
  its two RoPE tables, the sizes of its projections.
- The ``rla-vllm`` arm on a tiny Gemma 3 is the vllm row bit for bit (the oracle written from
  docs/families.md, tests/gemma_spec.py), its training step backpropagates, its undo unaligns.
- The ``liger`` / ``liger-flce`` arms put Liger's Gemma 3 patch on the model (its RoPE, its
  zero-centred norms, its GeGLU MLP; the fused linear cross-entropy forward) and the undo gives
  transformers' module globals back. Liger's kernels cannot run on this CPU, which shows they are
  on the path.
"""

from __future__ import annotations

import pytest
import torch

import rla
from gemma_spec import gemma_points, spec_forward, tiny_gemma3
from rla.bench import e2e


def _ids(seq=12, batch=2):
    return torch.randint(0, 128, (batch, seq), generator=torch.Generator().manual_seed(5))


def test_gemma3_4b_is_the_checkpoints_text_model():
    model = e2e.build_model("gemma3-4b", torch.bfloat16, device="meta")
    cfg = model.config
    assert type(model).__name__ == "Gemma3ForCausalLM" and len(model.model.layers) == 34
    full = [i for i, t in enumerate(cfg.layer_types) if t == "full_attention"]
    assert full == [5, 11, 17, 23, 29] and set(cfg.layer_types) == {"sliding_attention", "full_attention"}
    assert cfg.rope_parameters["full_attention"] == {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6}
    assert cfg.rope_parameters["sliding_attention"] == {"rope_type": "default", "rope_theta": 10000.0}
    attn, mlp = model.model.layers[0].self_attn, model.model.layers[0].mlp
    assert (attn.q_proj.weight.shape, attn.k_proj.weight.shape) == ((8 * 256, 2560), (4 * 256, 2560))
    assert mlp.gate_proj.weight.shape == (10240, 2560) and cfg.hidden_activation == "gelu_pytorch_tanh"
    assert model.lm_head.weight is model.model.embed_tokens.weight and model.lm_head.weight.shape == (262208, 2560)
    assert cfg.sliding_window == 1024 and cfg.query_pre_attn_scalar == 256 and not cfg.use_cache


def test_rla_vllm_arm_on_gemma3_is_the_row_and_trains():
    model = tiny_gemma3().train()
    ids = _ids()
    undo, how = e2e._align(model, "rla-vllm")
    try:
        assert how == "rla.align(model, 'vllm')" and rla.alignment_of(model) is not None
        with torch.no_grad():
            got = model(ids).logits
        seen = []
        model.model.layers[0].pre_feedforward_layernorm.weight.register_hook(lambda g: seen.append(g.abs().sum()))
        loss = e2e.training_step(model, ids)()
        assert torch.isfinite(loss) and seen and seen[0] > 0
    finally:
        undo()
    assert rla.alignment_of(model) is None
    with torch.no_grad():
        want = spec_forward(model.eval(), ids, gemma_points(rla.profiles.get("vllm").name))
    assert torch.equal(got, want), f"{(got == want).float().mean():.4f} of logits equal"


@pytest.mark.parametrize("variant", ["liger", "liger-flce"])
def test_liger_arms_patch_gemma3_and_give_the_globals_back(variant):
    pytest.importorskip("liger_kernel")
    from liger_kernel.transformers.model.gemma3 import causal_forward
    from transformers.models.gemma3 import modeling_gemma3 as mg

    from rla.alignment.liger import is_liger

    before = {n: getattr(mg, n) for n in ("apply_rotary_pos_emb", "Gemma3RMSNorm", "Gemma3MLP")}
    model = tiny_gemma3().train()
    undo, how = e2e._align(model, variant)
    try:
        assert how.startswith("Liger Kernel (rope, rms_norm, geglu") and ("fused_linear" in how) == (variant == "liger-flce")
        assert is_liger(mg.apply_rotary_pos_emb)
        layer = model.model.layers[0]
        for norm in (layer.input_layernorm, layer.post_attention_layernorm, layer.pre_feedforward_layernorm,
                     layer.post_feedforward_layernorm, layer.self_attn.q_norm, model.model.norm):
            assert is_liger(norm.forward), norm
        assert is_liger(layer.mlp.forward)
        assert (getattr(model.forward, "__func__", None) is causal_forward) == (variant == "liger-flce")
        with pytest.raises(RuntimeError, match="driver"), torch.no_grad():  # a Triton kernel, no GPU here
            model(input_ids=_ids(), labels=_ids())
    finally:
        undo()
    assert {n: getattr(mg, n) for n in before} == before


def test_liger_arm_refuses_a_family_it_has_no_patch_for():
    class Cfg:
        model_type = "gpt_oss"

    class Model:
        config = Cfg()

    with pytest.raises(ValueError, match="no Liger patch is listed for 'gpt_oss'"):
        e2e._liger(Model())
