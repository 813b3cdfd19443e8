"""The per-op benchmark's isolated mode: each measurement in its own process, failures reported.

The timing itself needs a GPU (results/benchmarks); what runs here is the process plumbing: a
worker that cannot measure hands its error back to the row instead of the row going missing.
"""

import pytest
import torch

from rla.bench import ops


def test_worker_error_comes_back_in_the_row():
    r = ops._measure_isolated("rope", "nope", tokens=16, reps=1, timeout_s=120)
    assert set(r) == {"error"}
    assert "rope has no implementation 'nope'" in r["error"] and "rla" in r["error"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the worker measures (h200_session.sh)")
def test_worker_without_cuda_reports_why():
    r = ops._measure_isolated("swiglu", "rla", tokens=16, reps=1, timeout_s=120)
    assert "worker exited with 1" in r["error"] and "CUDA" in r["error"]


def test_rope_case_tables_give_every_implementation_the_same_rotation():
    """rope_case hands each implementation different tables (rla: fp32 half, as rla.align's rotary
    returns them; HF/Liger: HF's bf16 table; naive: fp32 full): rla's vllm numbers must equal the
    naive fp32 expression of the vllm profile bit for bit, and HF eager must rotate the same q."""
    case = ops.rope_case(2, 24, 4, 2, 64)
    data = case.make(torch.device("cpu"))
    q, k = data["inputs"]
    assert data["consts"][0].shape[-1] == 32 and data["consts"][2].shape[-1] == 64
    assert data["consts"][4].dtype == torch.bfloat16
    rla, naive, hf = (case.impls[name](q, k, *data["consts"]) for name in ("rla", "naive", "hf"))
    for a, b in zip(rla, naive):
        assert torch.equal(a, b)
    for a, b in zip(rla, hf):  # per-op rounding in HF: close, not equal
        assert (a.float() - b.float()).abs().max() < 0.05 * b.float().abs().max()
        assert not torch.equal(a, b)


def _tiny_qwen2(layers=2):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(hidden_size=64, intermediate_size=128, num_hidden_layers=layers, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=97, rms_norm_eps=1e-6)
    return Qwen2ForCausalLM(cfg).to(torch.bfloat16)  # rounds inv_freq: rla.align fixes it under both ops


def test_naive_upcast_arm_is_rla_align_with_naive_ops():
    """e2e's naive-upcast arm goes through the public alignment API (no patch of its own): the
    forward equals rla.align's vllm numbers bit for bit on the CPU, autograd reaches every weight
    with gradients close to rla's, HF's module globals stay untouched, and unalign restores HF."""
    import transformers.models.qwen2.modeling_qwen2 as mq

    from rla.alignment import align, alignment_of, unalign

    model = _tiny_qwen2()
    ids = torch.randint(0, 97, (2, 40))
    hf_logits = model(input_ids=ids).logits
    before = mq.apply_rotary_pos_emb

    def run(**kw):
        report = align(model, "vllm", **kw)
        out = model(input_ids=ids, labels=ids)
        out.loss.backward()
        grads = {n: p.grad.float() for n, p in model.named_parameters()}
        model.zero_grad(set_to_none=True)
        unalign(model)
        return report, out.logits.detach(), grads

    rep_rla, logits_rla, grads_rla = run()
    rep_naive, logits_naive, grads_naive = run(ops=ops.NAIVE_UPCAST)
    assert rep_naive.ops == ops.NAIVE_UPCAST.name and rep_rla.ops == "rla.ops"
    assert rep_naive.counts == rep_rla.counts
    assert not torch.equal(logits_rla, hf_logits)  # the alignment changes something ...
    assert torch.equal(logits_naive, logits_rla)  # ... and the naive ops change it the same way
    for name, g in grads_rla.items():  # straight-through fp32 gradient vs autograd through bf16 roundings
        assert grads_naive[name].abs().sum() > 0, name
        assert (grads_naive[name] - g).norm() <= 0.05 * g.norm() + 1e-6, name
    assert mq.apply_rotary_pos_emb is before
    assert alignment_of(model) is None and torch.equal(model(input_ids=ids).logits, hf_logits)


def test_naive_upcast_ops_refuse_a_profile_that_rounds_elsewhere():
    from rla.alignment import align

    model = _tiny_qwen2(layers=1)
    align(model, "hf", ops=ops.NAIVE_UPCAST)  # aligning checks nothing of the ops' numbers ...
    with pytest.raises(ValueError, match=r"'hf' differs .*rope_apply.*'per_op', 'fused'"):
        model(input_ids=torch.randint(0, 97, (1, 8)))  # ... the first op call refuses hf's points


def test_e2e_naive_upcast_variant_aligns_and_undoes():
    from rla.alignment import alignment_of
    from rla.bench import e2e

    model = _tiny_qwen2(layers=1)
    undo, how = e2e._align(model, "naive-upcast")
    assert alignment_of(model).ops == ops.NAIVE_UPCAST.name and "NAIVE_UPCAST" in how
    undo()
    assert alignment_of(model) is None
