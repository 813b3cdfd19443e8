"""An aligned model survives ``torch.save`` / ``torch.load``, ``copy.deepcopy`` and ``pickle``: the
copy is aligned, computes the same logits bit for bit, and ``rla.unalign`` works on it; the
original is unchanged. ``model.float()`` after ``align`` warns at the next forward; aligning a
model on the meta device is refused (issue 38, items 4 and 6), unless ``allow_meta=True`` (verl's
non-rank-0 workers, filled in later by rank 0's broadcast; issue 35)."""

import copy
import io
import pickle
import warnings

import pytest
import torch

import rla
from align_spec import tiny_model


def _logits(model, ids):
    with torch.no_grad():
        return model(ids).logits


def _copies(model):
    buf = io.BytesIO()
    torch.save(model, buf)
    buf.seek(0)
    yield "torch.save/torch.load", torch.load(buf, weights_only=False)
    yield "copy.deepcopy", copy.deepcopy(model)
    yield "pickle", pickle.loads(pickle.dumps(model))


@pytest.mark.parametrize("family", ["qwen2", "qwen3"])
def test_an_aligned_model_pickles_aligned_bit_for_bit_and_unaligns_after(family):
    model = tiny_model(family)
    ids = torch.randint(0, model.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(0))
    plain = _logits(model, ids)
    rla.align(model, "vllm")
    aligned = _logits(model, ids)
    assert not torch.equal(aligned, plain)  # the premise: aligning changes the logits
    for how, other in _copies(model):
        report = rla.alignment_of(other)
        assert report is not None and report.profile.name == rla.alignment_of(model).profile.name, how
        assert report.regions == rla.alignment_of(model).regions, how
        assert torch.equal(_logits(other, ids), aligned), how
        assert other.lm_head.weight is other.model.embed_tokens.weight or not model.config.tie_word_embeddings
        rla.unalign(other)
        assert rla.alignment_of(other) is None and torch.equal(_logits(other, ids), plain), how
        assert torch.equal(_logits(model, ids), aligned), f"{how}: unaligning the copy changed the original"
    rla.unalign(model)
    assert torch.equal(_logits(model, ids), plain)
    plain_copy = pickle.loads(pickle.dumps(model))  # an unaligned model pickles as a plain one
    assert rla.alignment_of(plain_copy) is None and torch.equal(_logits(plain_copy, ids), plain)


def test_an_alignment_with_engine_ops_refuses_to_pickle_naming_the_ways_out():
    """Pickling would have to pickle the engine: refused. A deep copy needs no pickle: it copies the
    module as PyTorch does, still aligned with the same ops, on weights of its own."""
    from rla import ops as rla_ops

    model = tiny_model("qwen2")
    ids = torch.randint(0, model.config.vocab_size, (1, 8), generator=torch.Generator().manual_seed(0))
    rla.align(model, "vllm", ops=rla_ops)
    for dump in (pickle.dumps, lambda m: torch.save(m, io.BytesIO())):
        with pytest.raises(TypeError, match=r"rla\.unalign\(model\).*save_pretrained"):
            dump(model)
    twin = copy.deepcopy(model)
    assert rla.alignment_of(twin) is not None and torch.equal(_logits(twin, ids), _logits(model, ids))
    with torch.no_grad():
        twin.model.layers[0].mlp.down_proj.weight.mul_(2)
    assert not torch.equal(_logits(twin, ids), _logits(model, ids))
    rla.unalign(model)
    pickle.dumps(model)


def test_float_after_align_warns_once_at_the_next_forward():
    model = tiny_model("qwen2")
    ids = torch.randint(0, model.config.vocab_size, (1, 8), generator=torch.Generator().manual_seed(0))
    rla.align(model, "vllm")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _logits(model, ids)  # bf16: no warning
    model.float()
    with pytest.warns(RuntimeWarning, match=r"aligned in bfloat16 and now runs in float32.*does nothing"):
        _logits(model, ids)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _logits(model, ids)  # once
    rla.unalign(model)
    assert not model.model._forward_pre_hooks  # the guard goes with the alignment


def test_align_on_the_meta_device_is_refused_before_anything_changes():
    import transformers

    from align_spec import tiny_config

    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(tiny_config("qwen2")).to(torch.bfloat16)
    with pytest.raises(ValueError, match="meta device .* Align after loading .* allow_meta=True"):
        rla.align(model, "vllm")
    assert rla.alignment_of(model) is None
    rla.unalign(model)  # nothing to undo: no error


def test_a_meta_copy_aligned_with_allow_meta_then_filled_in_is_the_aligned_model_bit_for_bit():
    """verl's non-rank-0 worker in miniature: the model is built on the meta device and cast
    (``module.to(bf16)`` rounds ``inv_freq`` there, a forward-only reference's case), aligned,
    then materialized and given rank 0's weights and buffers (what FSDP1's sync_module_states and
    verl's fsdp2_load_full_state_dict broadcast). The two aligned copies must hold the same
    buffers in the same dtypes (a broadcast pairs them by name and size), compute the same logits
    bit for bit, and unalign to the same buffers."""
    import transformers

    from align_spec import tiny_config, tokens

    real = transformers.AutoModelForCausalLM.from_config(tiny_config("qwen2"), attn_implementation="eager")
    real.to(torch.bfloat16)  # verl's cast: inv_freq bf16 on rank 0 too
    with torch.device("meta"):
        meta = transformers.AutoModelForCausalLM.from_config(tiny_config("qwen2"), attn_implementation="eager")
    meta.to(torch.bfloat16)
    rla.align(real, "vllm")
    report = rla.align(meta, "vllm", allow_meta=True)
    assert [h.name for h in report.hazards] == ["bf16 inv_freq"] and "not measured" in report.hazards[0].detail
    bufs = {n: (b.dtype, b.shape) for n, b in meta.named_buffers()}
    assert bufs == {n: (b.dtype, b.shape) for n, b in real.named_buffers()}
    assert bufs["model.rotary_emb.inv_freq"][0] == torch.float32  # replaced on the meta copy as on rank 0's
    meta.to_empty(device="cpu")
    with torch.no_grad():  # rank 0's broadcast
        for (n, t), (m, u) in zip(real.state_dict(keep_vars=True).items(), meta.state_dict(keep_vars=True).items()):
            u.copy_(t)
        for (n, t), (m, u) in zip(real.named_buffers(), meta.named_buffers()):
            u.copy_(t)
    ids = tokens(vocab=tiny_config("qwen2").vocab_size)
    assert torch.equal(_logits(meta, ids), _logits(real, ids))
    rla.unalign(real)
    rla.unalign(meta)
    for (n, t), (m, u) in zip(real.named_buffers(), meta.named_buffers()):
        assert n == m and not u.is_meta and u.dtype == t.dtype == torch.bfloat16 and torch.equal(u, t), n
