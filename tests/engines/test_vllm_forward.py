"""The engine-backed training forward of vLLM's default mode (``rla.engines.vllm_forward``), on CPU.

vLLM's own native region code, compiled in pieces by Inductor's CPU backend as the twin compiles
it (``tests/engines/test_vllm_twin.py``), runs as the aligned model's forward. Checked:

- the logits are the twin's, bit for bit (the engine's pieces run: nothing of rla's forward);
- the gradient is rla's gradient of the calibrated profile: on CPU the aligned model with
  ``rla.ops`` equals the twin bit for bit, so its gradients are the oracle here, and they are
  matched bit for bit; HF eager's differ (the check is not vacuous);
- padding masks, re-alignment, deepcopy and ``rla.unalign`` behave; what is not covered is refused
  with a message that names it.
"""

import copy

import pytest
import torch

import rla
from rla import profiles

from align_spec import single_thread, tiny_config, tiny_model, tokens  # noqa: F401
from twin_default_cases import CASES, case_model as _model


@pytest.fixture(scope="module")
def pieces(vllm_engine):
    from rla.engines.vllm_forward import engine_forward

    return engine_forward(vllm_engine, "default")


def _loss_and_grads(model, ids, positions, attention_mask=None):
    model.zero_grad(set_to_none=True)
    logits = model(input_ids=ids, position_ids=positions, attention_mask=attention_mask).logits
    logits.float().log_softmax(-1).mean().backward()
    return logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("case", list(CASES))
def test_forward_is_the_twins_and_backward_is_rlas(case, vllm_engine, pieces):
    from twin_default_cases import IDS as ids, POSITIONS as positions, default_twin

    model = _model(case)
    twin = default_twin(case, vllm_engine)  # the twin of this model (same case, seed 0), built once per session

    oracle, hf = copy.deepcopy(model), copy.deepcopy(model)
    rla.align(oracle, "vllm-0.33")
    want_logits, want = _loss_and_grads(oracle, ids, positions)
    assert torch.equal(want_logits, twin.logits)  # the oracle is exact here (test_vllm_twin.py)
    _, hf_grads = _loss_and_grads(hf, ids, positions)

    report = rla.align(model, "vllm-0.33", ops=pieces)
    assert report.ops == pieces.name and "gradient of 'vllm-0.33'" in report.notes[-1]
    logits, grads = _loss_and_grads(model, ids, positions)
    assert torch.equal(logits, twin.logits)
    assert grads.keys() == want.keys()
    for name, g in grads.items():
        assert torch.equal(g, want[name]), name
    assert any(not torch.equal(g, hf_grads[name]) for name, g in grads.items())


def test_padding_mask_reuse_deepcopy_and_unalign(pieces):
    model = _model("qwen3")
    ids = tokens(2, 16)
    mask = torch.ones(2, 16, dtype=torch.long)
    mask[1, :5] = 0  # left padding in the second row
    positions = (mask.cumsum(-1) - 1).clamp_min(0)
    before = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits

    oracle = copy.deepcopy(model)
    rla.align(oracle, "vllm-0.33")
    want = oracle(input_ids=ids, attention_mask=mask, position_ids=positions).logits

    rla.align(model, "vllm-0.33", ops=pieces)
    rla.align(model, "vllm-0.33", ops=pieces)  # aligning again replaces; the compiled pieces are reused
    got = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits
    assert torch.equal(got[mask.bool()], want[mask.bool()])

    twin_copy = copy.deepcopy(model)  # the copy runs the pieces on its own weights
    with torch.no_grad():
        twin_copy.model.layers[0].mlp.down_proj.weight.mul_(2)
    assert torch.equal(model(input_ids=ids, attention_mask=mask, position_ids=positions).logits, got)
    assert not torch.equal(twin_copy(input_ids=ids, attention_mask=mask, position_ids=positions).logits, got)

    rla.unalign(model)
    assert torch.equal(model(input_ids=ids, attention_mask=mask, position_ids=positions).logits, before)


def test_what_is_not_covered_is_refused(vllm_engine, pieces):
    from transformers import DynamicCache

    from rla.engines.vllm_forward import engine_forward

    model = _model("qwen2")
    with pytest.raises(ValueError, match="aligns all of"):
        rla.align(model, "vllm-0.33", regions=("rope",), ops=pieces)
    with pytest.raises(ValueError, match="rounds like 'vllm-0.33', not 'hf'"):
        rla.align(model, "hf", ops=pieces)
    with pytest.raises(ValueError, match="modes are 'default' and 'eager'"):
        engine_forward(vllm_engine, "native", profile="vllm-0.33")
    with pytest.raises(NotImplementedError, match="covers qwen2, qwen3, llama"):
        rla.align(tiny_model("mistral"), "vllm-0.33", ops=pieces)
    with pytest.raises(ValueError, match="Load or cast the model to bfloat16"):
        rla.align(tiny_model("qwen2", dtype=torch.float32), "vllm-0.33", ops=pieces)

    rla.align(model, "vllm-0.33", ops=pieces)
    ids = tokens(1, 6)
    with pytest.raises(ValueError, match="inputs_embeds is not covered"):
        model(inputs_embeds=model.model.embed_tokens(ids))
    with pytest.raises(ValueError, match="output_hidden_states=True is not covered"):
        model(input_ids=ids, output_hidden_states=True)
    cache = DynamicCache(config=model.config)
    rla.unalign(model)
    model(input_ids=ids, past_key_values=cache, use_cache=True)  # fills the cache with HF's forward
    rla.align(model, "vllm-0.33", ops=pieces)
    with pytest.raises(ValueError, match="keeps no KV cache"):
        model(input_ids=tokens(1, 1), past_key_values=cache, use_cache=True)
    with pytest.raises(ValueError, match="past the engine's cos/sin cache"):
        model(input_ids=ids, position_ids=torch.arange(model.config.max_position_embeddings, model.config.max_position_embeddings + 6)[None])
    assert profiles.get("vllm-0.33").same_rounding(pieces.profile)


def test_the_forward_runs_the_engines_pieces_not_rlas_ops(vllm_engine, pieces):
    """Where Inductor's CPU kernels reduce a norm in another order than rla's ops (the bundled
    model's hidden size, 256 tokens), rla's forward misses the twin and the engine-backed one
    does not: the forward is the engine's compiled code, not a copy of its rounding."""
    from rla.engines.twin_compare import aligned_side, compare
    from rla.engines.vllm_twin import VllmTwin
    from rla.hf import load_model
    from repo_root import ROOT

    model = load_model(str(ROOT / "src/rla/assets/tiny-qwen2"), torch.bfloat16, "cpu")
    ids = torch.randint(0, model.config.vocab_size, (1, 256), generator=torch.Generator().manual_seed(1))
    positions = torch.arange(256)[None]
    out = VllmTwin(model, vllm_engine, "default")(ids, positions)
    sides = {"rla": aligned_side(model, "vllm-0.33"), "pieces": aligned_side(model, "vllm-0.33", ops=pieces)}
    rla_side, pieces_side = compare((out.logits, out.layers), sides, ids, positions).sides
    assert rla_side.logits_equal < 1.0
    assert pieces_side.logits_equal == 1.0 and [r["equal"] for r in pieces_side.layers] == [1.0] * len(out.layers)


def test_packed_positions_reach_attention_as_in_hf(pieces):
    """Two sequences packed in one row (position_ids restart, no attention_mask), as padding-free
    trainers pass them: the engine-backed forward hands the attention function what HF's layer
    hands it (the mask HF's body builds and ``position_ids``, which flash attention reads packed
    sequences from; not run on CPU), so the logits equal the aligned model's."""
    model = _model("qwen2")
    ids = tokens(1, 24)
    packed = torch.cat((torch.arange(10), torch.arange(14)))[None]
    oracle = copy.deepcopy(model)
    rla.align(oracle, "vllm-0.33")
    want = oracle(input_ids=ids, position_ids=packed).logits
    rla.align(model, "vllm-0.33", ops=pieces)
    assert torch.equal(model(input_ids=ids, position_ids=packed).logits, want)


def test_peft_adapters_are_refused_not_ignored(pieces):
    """The pieces read each projection's weight: a LoRA layer's adapters would be skipped silently,
    so a model with adapters is refused by name, at align time and, if wrapped after, at the call."""
    peft = pytest.importorskip("peft")
    config = peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"])
    with pytest.raises(NotImplementedError, match=r"layers\[0\]\.self_attn\.q_proj is a peft\.tuners\.lora\.layer\.Linear"):
        rla.align(peft.get_peft_model(_model("qwen2"), config), "vllm-0.33", ops=pieces)
    model = _model("qwen2")
    rla.align(model, "vllm-0.33", ops=pieces)
    wrapped = peft.get_peft_model(model, config)
    with pytest.raises(NotImplementedError, match="not a plain torch.nn.Linear"):
        wrapped(input_ids=tokens(1, 6))


def test_the_cached_pieces_keep_no_model_alive(pieces):
    """The compiled pieces are cached per model shape and shared (a re-alignment, TRL's reference
    model); the cache keeps no model: a deleted aligned model is freed (GPU weights included)."""
    import gc
    import weakref

    model = _model("llama3", seed=3)
    rla.align(model, "vllm-0.33", ops=pieces)
    model(input_ids=tokens(1, 6))
    gone = weakref.ref(model)
    del model
    gc.collect()
    assert gone() is None
