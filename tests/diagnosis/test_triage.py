"""rla.diagnosis.triage on deliberately broken inputs of the bundled model: each gets its verdict,
none is called rounding, and docs/triage.md's table is the render of the cases.

The engine stand-in is the bundled model in bf16 aligned to the vLLM profile (the rollout stack of
``rla.rollout.sampler``). Two sets are sampled by it (plain and top-p 0.8); the other broken
inputs are those tokens scored by the same stand-in under the broken condition (another
temperature, other weights, another prompt), which is what an engine so configured reports for
them, at a tenth of the cost of sampling each set.
"""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

import rla
from rla.diagnosis import positions as P
from rla.diagnosis.triage import EXIT_CODES, triage
from rla.models import load_bundled_model
from rla.rollout.fingerprint import weights_fingerprint
from rla.rollout.sampler import Sampler, SamplingParams
from rla.rollout.train_logprobs import logprobs

from bundled_rollouts import bundled_prompts
from triage_cases import CASES, DOC, render, section

N, TOKENS = 6, 12


@pytest.fixture(scope="module")
def lab():
    model, prompts = bundled_prompts()
    prompts = prompts[:N]
    engine = copy.deepcopy(model)
    rla.align(engine, "vllm")
    sampler = Sampler(model, "vllm")
    plain = sampler.generate(prompts, SamplingParams(max_new_tokens=TOKENS, seed=0))
    top_p = sampler.generate(prompts, SamplingParams(max_new_tokens=TOKENS, seed=0, top_p=0.8))
    return dict(bf16=model, fp32=load_bundled_model(dtype=torch.float32), engine=engine, plain=plain, top_p=top_p,
                noisy_engine=_noisy(engine))


def _scored(model, records, **change):
    """``records`` with ``change`` applied, their logprobs those ``model`` gives the tokens."""
    changed = [dataclasses.replace(r, **change) for r in records]
    return [dataclasses.replace(r, logprobs=lp.double().tolist()) for r, lp in zip(changed, logprobs(model, changed))]


def _noisy(model, scale=0.05):
    noisy = copy.deepcopy(model)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in noisy.parameters():
            p.mul_(1 + scale * torch.randn(p.shape, generator=g).to(p.dtype))
    return noisy


def _shape_dependent(model):
    """A trainer whose forward depends on the micro-batch's shape, as kernels whose reduction order
    follows the batch do: noise seeded by (rows, length) on the final hidden states."""
    planted = copy.deepcopy(model)

    def hook(_, __, out):
        g = torch.Generator().manual_seed(out.shape[0] * 100003 + out.shape[1])
        return out + 2.0 * torch.randn(out.shape, generator=g).to(out.dtype)

    planted.model.norm.register_forward_hook(hook)
    return planted


def _with_top_logprobs(records, engine, k=4):
    """The records carrying ``engine``'s top-``k`` per response token (fp32 log-softmax of its logits)."""
    out = []
    for r in records:
        ids = torch.tensor([r.prompt_ids + r.response_ids])
        with torch.no_grad():
            q = engine(input_ids=ids, use_cache=False).logits[0, len(r.prompt_ids) - 1:-1].float().log_softmax(-1)
        top = q.topk(k, -1)
        lists = [[[int(i), float(v)] for i, v in zip(ix, vs)] for ix, vs in zip(top.indices, top.values)]
        out.append(dataclasses.replace(r, top_logprobs={"version": 1, "complete": False, "response": lists}))
    return out


def _ragged(records):
    """The records with responses cut to 12, 10, 8, ... tokens (their first tokens and logprobs): rows
    of several lengths, as left padding needs."""
    return [dataclasses.replace(r, response_ids=r.response_ids[:max(2, TOKENS - 2 * i)], logprobs=r.logprobs[:max(2, TOKENS - 2 * i)])
            for i, r in enumerate(records)]


def _case(name, lab):
    plain, eng = lab["plain"], lab["engine"]
    kw = {}
    bf16 = lab["bf16"]
    if name == "rounding":
        records = _with_top_logprobs(plain, eng)
    elif name == "shift":
        records = [dataclasses.replace(r, response_ids=r.response_ids[:-1], logprobs=r.logprobs[1:]) for r in plain]
    elif name == "temperature":
        records = [dataclasses.replace(r, temperature=1.0) for r in _scored(eng, plain, temperature=2.0)]
    elif name == "raw_recorded":
        records = [dataclasses.replace(r, temperature=0.25) for r in plain]
    elif name == "vllm_raw_mode":
        records = [dataclasses.replace(r, temperature=0.7, metadata={"logprobs_mode": "raw_logprobs"}) for r in plain]
    elif name == "top_p":
        records = [dataclasses.replace(r, top_p=1.0) for r in lab["top_p"]]
    elif name == "not_renormalised":
        # at temperature 2 the kept tokens' mass is well below 1, so -log Z is beyond rounding's size
        records = [dataclasses.replace(r, top_p=0.8) for r in _scored(eng, lab["top_p"], temperature=2.0, top_p=1.0)]
    elif name == "batch_variance":
        records, bf16 = plain, _shape_dependent(lab["bf16"])
    elif name == "position_ids":
        records, kw = plain, {"bad_positions": [3]}
    elif name == "restart_positions":
        lps = logprobs(eng, plain, position_ids=P.layout("restart_at_response", plain)[1])
        records = [dataclasses.replace(r, logprobs=lp.double().tolist()) for r, lp in zip(plain, lps)]
    elif name == "left_padded_unmasked":
        ragged = _ragged(plain)
        padded = P.layout("left_padded_unmasked", ragged, pad_id=bf16.config.pad_token_id)[0]
        records = [dataclasses.replace(r, logprobs=lp.double().tolist()) for r, lp in zip(ragged, logprobs(eng, padded))]
    elif name == "left_padded_no_position_ids":
        records = _ragged(plain)
        shifted = logprobs(bf16, records, position_ids=P.layout("left_padded_no_position_ids", records)[1])
        kw = {"trainer_logprobs": [lp.double().tolist() for lp in shifted], "trainer_field": "old_log_probs"}
    elif name == "trainer_logprobs":
        other = [lp.double().tolist() for lp in logprobs(lab["noisy_engine"], plain)]
        records, kw = plain, {"trainer_logprobs": other, "trainer_field": "old_log_probs"}
    elif name == "stale_weights":
        records = _scored(lab["noisy_engine"], plain)
    elif name in ("one_step_stale", "unrecorded_stale"):
        older = copy.deepcopy(eng)  # a step of 1e-5 per weight, as Adam's first step at lr 1e-5
        g = torch.Generator().manual_seed(2)
        with torch.no_grad():
            for p in older.parameters():
                p.sub_((1e-5 * torch.randn(p.shape, generator=g).sign()).to(p.dtype))
        stamp = {"weights": weights_fingerprint(older)}
        assert stamp["weights"] != weights_fingerprint(bf16)
        records = [dataclasses.replace(r, policy=stamp if name == "one_step_stale" else None)
                   for r in _scored(older, plain)]
    elif name == "template":
        shown = [dataclasses.replace(r, prompt_ids=r.prompt_ids[:1] + [5, 6, 7, 8] + r.prompt_ids[1:]) for r in plain]
        records = [dataclasses.replace(s, prompt_ids=r.prompt_ids) for s, r in zip(_scored(eng, shown), plain)]
    else:
        raise KeyError(name)
    return triage(records, bf16=bf16, fp32=lab["fp32"], alone=2, **kw)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_broken_input_gets_its_verdict(lab, case):
    t = _case(case.name, lab)
    assert (t.verdict, t.exit_code) == (case.verdict, case.exit_code), t.summary()
    if case.name == "rounding":  # the records carry the stand-in's top-4 per token: the KL's lower bound reported
        v = t.vocab  # its numbers against an fp64 oracle: tests/diagnosis/test_vocab_kl.py
        assert v["vocab_kl/kind"] == "lower_bound" and v["vocab_kl/tokens"] == t.n_tokens and v["vocab_kl/records"] == N
        assert 0 < v["vocab_kl/mean"] < 1e-2  # rounding-sized: the stand-in is the same weights
        assert "a lower bound" in t.summary() and t.to_dict()["vocab_kl"]["vocab_kl/mean"] == v["vocab_kl/mean"]
    else:
        assert t.vocab is None and t.to_dict()["vocab_kl"] is None  # no top_logprobs: reported as before
    assert EXIT_CODES[case.verdict] == case.exit_code
    if case.name != "rounding":
        assert t.verdict != "rounding"
    checked = [f.check for f in t.findings]
    assert checked == ["shift", "settings", "self_consistency", "positions", "weights", "rounding"]
    assert t.first.evidence or t.first.check == "settings", t.summary()  # every verdict carries its numbers


def test_the_docs_table_is_the_render_of_the_cases():
    assert section(DOC.read_text()) == render(), "run: python tests/diagnosis/triage_cases.py"

