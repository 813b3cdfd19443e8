"""The ``lm_head`` point under ``rla.align`` (rla.alignment.lm_head), on CPU, tiny Qwen3 / Llama from configs.

Every expected value is an expression written here with plain torch ops (``torch.matmul`` of the
operands as the point defines them, docs/rounding.md "LM head"), never rla's own function:

- ``fp32``: logits = fp32(h) @ fp32(RN(W))^T, never rounded (vLLM ``head_dtype=float32``, SGLang
  ``--enable-fp32-lm-head``);
- ``lp``: logits = RN(h @ RN(W)^T) (every engine's default), which a head TRL cast to fp32 must
  compute again once aligned.

Gradients are checked on the head alone, with a fixed upstream gradient ``R`` (the loss
``sum(logits * R)``), against the same expressions' gradients written out: dL/dW = R^T h, dL/dh = R W.
"""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

import rla
from rla.alignment.patch import patch_of
from rla.profiles import get

BF16 = torch.bfloat16


def _model(family: str, tied: bool):
    common = dict(vocab_size=384, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, tie_word_embeddings=tied)
    torch.manual_seed(0)
    if family == "qwen3":
        m = Qwen3ForCausalLM(Qwen3Config(head_dim=16, **common))
    else:
        m = LlamaForCausalLM(LlamaConfig(**common))
    with torch.no_grad():  # logits of a few units, as a trained model's (random init gives ~0.1)
        m.lm_head.weight.mul_(40)
    return m.to(BF16).eval()


FAMILIES = [("qwen3", False), ("qwen3", True), ("llama", False)]
IDS = torch.randint(0, 384, (2, 24), generator=torch.Generator().manual_seed(1))
FP32_ROW = get("sglang").replace(name="sglang-0.5.23+fp32-lm-head", lm_head="fp32")


def _fp32_logits(h, w):
    return torch.matmul(h.float(), w.to(BF16).float().t())


def _lp_logits(h, w):
    return torch.matmul(h.to(BF16), w.to(BF16).t())


def _trl_cast(model):
    """What TRL 1.16's GRPOTrainer.__init__ does under cast_lm_head_to_fp32=True (the nested
    ``_cast_lm_head_to_fp32``, not importable; ``test_trl_cast_head`` below runs the trainer itself)."""
    head = model.lm_head.float()
    model.lm_head = head

    def cast_forward_to_fp32(hidden_states):
        return torch.nn.functional.linear(hidden_states.to(torch.float32), head.weight.to(torch.float32), None)

    head.forward = cast_forward_to_fp32
    return cast_forward_to_fp32


@pytest.mark.parametrize("family,tied", FAMILIES)
def test_fp32_head_is_the_fp32_gemm_of_the_bf16_hidden_state(family, tied):
    m = _model(family, tied)
    before = m(IDS).logits
    report = rla.align(m, FP32_ROW)
    assert report.lm_head.startswith("aligned") and "fp32 logits" in report.lm_head
    assert "lm_head fp32" in str(report)
    logits = m(IDS).logits
    h = m.model(IDS).last_hidden_state
    assert logits.dtype == torch.float32 and h.dtype == BF16
    assert torch.equal(logits, _fp32_logits(h, m.lm_head.weight))
    assert not torch.equal(logits, logits.to(BF16).float())  # the point is real: unrounded logits
    rla.unalign(m)
    assert "forward" not in m.lm_head.__dict__ and patch_of(m.lm_head) is None
    assert torch.equal(m(IDS).logits, before)


@pytest.mark.parametrize("family,tied", FAMILIES)
def test_lp_head_left_as_hf_computes_it(family, tied):
    m = _model(family, tied)
    report = rla.align(m, "vllm")
    assert report.lm_head.startswith("left as it is") and patch_of(m.lm_head) is None
    logits = m(IDS).logits
    assert logits.dtype == BF16
    assert torch.equal(logits, _lp_logits(m.model(IDS).last_hidden_state, m.lm_head.weight))


@pytest.mark.parametrize("weight_dtype", [BF16, torch.float32])
def test_fp32_head_gradients(weight_dtype):
    m = _model("qwen3", False)
    if weight_dtype == torch.float32:
        _trl_cast(m)
    rla.align(m, FP32_ROW)
    g = torch.Generator().manual_seed(2)
    h = torch.randn(5, 64, generator=g).to(BF16).requires_grad_()
    R = torch.randn(5, 384, generator=g)
    m.lm_head.weight.grad = None
    logits = m.lm_head(h)
    (logits * R).sum().backward()
    w = m.lm_head.weight.detach()
    assert torch.equal(logits.detach(), _fp32_logits(h.detach(), w))
    grad_w = torch.matmul(R.t(), h.detach().float())  # fp32; a bf16 weight receives it rounded
    assert m.lm_head.weight.grad.dtype == weight_dtype
    assert torch.equal(m.lm_head.weight.grad, grad_w.to(weight_dtype))
    assert torch.equal(h.grad, torch.matmul(R, w.to(BF16).float()).to(BF16))


def test_trl_cast_head_under_lp_computes_the_engines_bf16_gemm():
    m = _model("qwen3", False)
    trl_forward = _trl_cast(m)
    with torch.no_grad():  # an fp32 master weight off the bf16 grid, as after an update
        m.lm_head.weight.add_(torch.randn(m.lm_head.weight.shape, generator=torch.Generator().manual_seed(3)) * 1e-3)
    before = m(IDS).logits
    assert before.dtype == torch.float32
    report = rla.align(m, "vllm")
    assert report.lm_head.startswith("aligned (float32 weight; a trainer's forward")
    logits = m(IDS).logits
    h = m.model(IDS).last_hidden_state
    assert logits.dtype == BF16
    assert torch.equal(logits, _lp_logits(h, m.lm_head.weight))
    # the gradient of the bf16 GEMM reaches the fp32 master weight
    g = torch.Generator().manual_seed(4)
    x = torch.randn(3, 64, generator=g).to(BF16)
    R = torch.randn(3, 384, generator=g)
    (m.lm_head(x).float() * R).sum().backward()
    assert m.lm_head.weight.grad.dtype == torch.float32
    assert torch.equal(m.lm_head.weight.grad, torch.matmul(R.to(BF16).t(), x).float())
    rla.unalign(m)
    assert m.lm_head.__dict__["forward"] is trl_forward and m.lm_head.weight.dtype == torch.float32
    assert torch.equal(m(IDS).logits, before)


def test_trl_cast_tied_head_keeps_trls_embedding_hook():
    m = _model("qwen3", True)
    _trl_cast(m)
    hook = m.model.embed_tokens.register_forward_hook(lambda mod, args, out: out.to(BF16))
    hooks = dict(m.model.embed_tokens._forward_hooks)
    before = m(IDS).logits
    rla.align(m, FP32_ROW)
    assert torch.equal(m(IDS).logits, _fp32_logits(m.model(IDS).last_hidden_state, m.lm_head.weight))
    rla.unalign(m)
    assert dict(m.model.embed_tokens._forward_hooks) == hooks and m.lm_head.weight.dtype == torch.float32
    assert torch.equal(m(IDS).logits, before)
    hook.remove()


def test_realign_and_aligned_context_restore_the_head():
    m = _model("llama", False)
    before = m(IDS).logits
    rla.align(m, FP32_ROW)
    rla.align(m, "vllm")  # replaces the alignment: the head goes back to HF's
    assert patch_of(m.lm_head) is None and m(IDS).logits.dtype == BF16
    with rla.aligned(m, FP32_ROW):
        assert m(IDS).logits.dtype == torch.float32
    assert patch_of(m.lm_head) is None
    rla.unalign(m)
    assert torch.equal(m(IDS).logits, before)


def test_deepcopy_keeps_and_unaligns_the_head():
    import copy

    m = _model("qwen3", False)
    rla.align(m, FP32_ROW)
    c = copy.deepcopy(m)
    assert c.lm_head.forward.module is c.lm_head
    assert torch.equal(c(IDS).logits, m(IDS).logits)
    rla.unalign(c)
    assert patch_of(c.lm_head) is None and c(IDS).logits.dtype == BF16


def test_fp32_head_under_autocast_with_fp32_master_weights():
    """TRL's default without the cast: fp32 weights under bf16 autocast. HF's head gives bf16 logits
    there (lp: left as it is); the fp32 row gives the fp32 GEMM of RN(h) and RN(W)."""
    m = _model("qwen3", False).float()
    report = rla.align(m, "vllm")
    assert report.lm_head.startswith("left as it is")
    with torch.autocast("cpu", dtype=BF16):
        lp = m(IDS).logits
        rla.align(m, FP32_ROW)
        fp = m(IDS).logits
        h = m.model(IDS).last_hidden_state
    assert lp.dtype == BF16 and fp.dtype == torch.float32
    assert torch.equal(fp, _fp32_logits(h.to(BF16), m.lm_head.weight))
    rla.unalign(m)


def test_pickled_model_keeps_and_unaligns_the_head(tmp_path):
    m = _model("qwen3", False)
    rla.align(m, FP32_ROW)
    want = m(IDS).logits
    torch.save(m, tmp_path / "m.pt")
    c = torch.load(tmp_path / "m.pt", weights_only=False)
    assert torch.equal(c(IDS).logits, want)
    rla.unalign(c)
    assert patch_of(c.lm_head) is None and "forward" not in c.lm_head.__dict__ and c(IDS).logits.dtype == BF16


def test_training_logprobs_read_the_aligned_head():
    """rla's own training-side logprobs (rla.rollout.train_logprobs.token_logprobs) call the head:
    under the fp32 row they are the fp32 log-softmax of the unrounded logits."""
    from rla.rollout.train_logprobs import decoder_and_head, token_logprobs

    m = _model("llama", False)
    rla.align(m, FP32_ROW)
    _, head = decoder_and_head(m)
    h = m.model(IDS).last_hidden_state[0]
    targets = IDS[0]
    got, _ = token_logprobs(head, h, targets, 1.0, -1, 1.0)
    want = _fp32_logits(h, m.lm_head.weight).log_softmax(-1).gather(-1, targets[:, None]).squeeze(-1)
    assert torch.equal(got, want)
    rla.unalign(m)


def test_own_layout_family_gemma3_gets_the_head_too():
    """Gemma 3 is aligned by its own module (rla.alignment.gemma): the head point applies there as well."""
    from gemma_spec import tiny_gemma3

    m = tiny_gemma3(layers=2)
    ids = IDS[:, :12] % 128
    before = m(ids).logits
    report = rla.align(m, FP32_ROW)
    assert report.lm_head.startswith("aligned")
    logits = m(ids).logits
    assert torch.equal(logits, _fp32_logits(m.model(ids).last_hidden_state, m.lm_head.weight))
    rla.unalign(m)
    assert torch.equal(m(ids).logits, before)


def test_engine_backed_ops_realise_the_regions_not_the_head():
    """Engine-backed ops (rla.engines.backed) realise a row's regions; the head is rla's either way,
    so a row that differs from theirs only in lm_head is accepted, one that differs in a region not."""
    from rla.alignment.core import _check_ops_profile

    class Ops:
        profile = get("vllm-0.33-eager")

    _check_ops_profile(Ops(), Ops.profile.replace(name="eager+fp32-head", lm_head="fp32"))
    with pytest.raises(ValueError, match="swiglu"):
        _check_ops_profile(Ops(), Ops.profile.replace(name="eager-fused", swiglu="fused"))
