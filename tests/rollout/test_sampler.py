"""The rollout stack: reproducible, honours its parameters, leaves the training model alone."""

import math

import pytest
import torch

import rla
from rla.rollout.train_logprobs import logprobs as train_logprobs
from rla.rollout.sampler import Sampler, SamplingParams
from rla.rollout.sampling import process_logits
from rollout_oracles import tiny_model

PROMPTS = [[5, 6, 7], [8, 9, 10, 11, 12, 13], [20]]


def test_reproducible_under_seed_and_seed_matters():
    s = Sampler(tiny_model(), "vllm")
    a = s.generate(PROMPTS, SamplingParams(max_new_tokens=12, seed=3))
    b = s.generate(PROMPTS, SamplingParams(max_new_tokens=12, seed=3))
    c = s.generate(PROMPTS, SamplingParams(max_new_tokens=12, seed=4))
    assert [r.response_ids for r in a] == [r.response_ids for r in b]
    assert [r.logprobs for r in a] == [r.logprobs for r in b]
    assert [r.response_ids for r in a] != [r.response_ids for r in c]
    for r, p in zip(a, PROMPTS):
        assert r.prompt_ids == p and r.engine == "vllm-0.33" and len(r.logprobs) == len(r.response_ids)  # the exact row
        assert all(lp <= 0 for lp in r.logprobs)


def test_stop_tokens_max_new_tokens_and_top_k():
    s = Sampler(tiny_model(), "hf")
    recs = s.generate(PROMPTS, SamplingParams(max_new_tokens=5, seed=0))
    assert all(1 <= len(r.response_ids) <= 5 for r in recs)
    every = tuple(range(96))
    recs = s.generate(PROMPTS, SamplingParams(max_new_tokens=5, stop_token_ids=every, seed=0))
    assert all(len(r.response_ids) == 1 for r in recs)  # the first token stops, and is kept
    greedy = s.generate(PROMPTS, SamplingParams(max_new_tokens=6, top_k=1, seed=0))
    # top-k keeps every logit tied with the k-th (as vLLM does): with k=1 a token's logprob is
    # -log(m) for the m tied maxima, 0 unless bf16 logits tie (they did on one CPU)
    ties = [math.exp(-lp) for r in greedy for lp in r.logprobs]
    assert all(abs(m - round(m)) < 1e-5 and round(m) >= 1 for m in ties)  # fp32 log(2): ~1e-7 and greedy[0].top_k == 1
    assert sum(round(m) == 1 for m in ties) > len(ties) // 2


def test_recorded_logprob_is_the_engine_convention_on_the_engine_forward():
    """Each recorded logprob equals process_logits of the engine copy's own full-sequence forward,
    up to decode-vs-prefill differences.

    Tolerance: decode (KV cache) and prefill run different GEMM shapes, so a bf16 logit may land
    one ulp apart; one logit moved by one ulp moves a logprob by at most ulp/T. The ulp is that of
    the largest |logit| of the record (bf16: 2^-7 relative; 2^-5 = 0.031 at the measured scale ~4.5,
    so ulp/T ~ 0.039). Such flips are rare (torch 2.13 CPU: 1 of 24 tokens, by 0.0135), while a
    systematic error (temperature left out, top-p mass not renormalised) moves every token: the mean
    difference must stay below an eighth of the per-token bound.
    """
    model = tiny_model()
    s = Sampler(model, "vllm")
    temperature = 0.8
    params = SamplingParams(max_new_tokens=10, temperature=temperature, top_p=0.9, seed=1)
    recs = s.generate(PROMPTS, params)
    diffs = []
    for r in recs:
        ids = torch.tensor([r.prompt_ids + r.response_ids])
        with torch.no_grad():
            logits = s.model(input_ids=ids).logits[0, len(r.prompt_ids) - 1 : -1]
        assert logits.dtype == torch.bfloat16
        lp = process_logits(logits, temperature, -1, 0.9).gather(-1, ids[0, len(r.prompt_ids):, None]).squeeze(-1)
        ulp = 2.0 ** (math.floor(math.log2(logits.abs().max().item())) - 7)
        diff = (lp.double() - torch.tensor(r.logprobs, dtype=torch.float64)).abs()
        assert diff.max().item() <= ulp / temperature, (diff.max().item(), ulp / temperature)
        diffs.append((diff, ulp / temperature))
    mean = torch.cat([d for d, _ in diffs]).mean().item()
    assert mean <= min(b for _, b in diffs) / 8, mean


def test_training_model_untouched_and_load_weights_syncs():
    model = tiny_model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    ids = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():
        out_before = model(input_ids=ids).logits
    s = Sampler(model, "vllm")
    s.generate(PROMPTS, SamplingParams(max_new_tokens=4, seed=0))
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    with torch.no_grad():
        assert torch.equal(model(input_ids=ids).logits, out_before)  # not aligned by the sampler
    with torch.no_grad():
        model.lm_head.weight.add_(1.0)
    assert not torch.equal(s.model.lm_head.weight, model.lm_head.weight)
    s.load_weights(model)
    assert torch.equal(s.model.lm_head.weight, model.lm_head.weight)
    with pytest.raises(ValueError, match="shape"):
        s.load_weights({**model.state_dict(), "lm_head.weight": torch.zeros(3, 3)})


def test_bad_prompts_and_params():
    s = Sampler(tiny_model(), "vllm")
    with pytest.raises(ValueError, match="outside the vocab"):
        s.generate([[5, 500]], SamplingParams(max_new_tokens=2))
    with pytest.raises(ValueError, match="empty"):
        s.generate([[]], SamplingParams(max_new_tokens=2))
    with pytest.raises(ValueError, match="temperature"):
        SamplingParams(temperature=0)
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(top_p=1.5)


def test_matching_profile_leaves_the_smallest_mismatch(capsys):
    """Sampler on profile X, training model aligned to X: only the decode-vs-prefill difference is
    left; aligned to another profile or not aligned, the mismatch is larger."""
    model = tiny_model(seed=1)
    prompts = [[(7 * i + j) % 90 + 2 for j in range(4 + i % 5)] for i in range(24)]
    result = {}
    for engine in ("vllm", "sglang"):
        recs = Sampler(model, engine).generate(prompts, SamplingParams(max_new_tokens=48, seed=0))
        rollout = [torch.tensor(r.logprobs, dtype=torch.float64) for r in recs]
        for train in ("hf", "vllm", "sglang"):
            with rla.aligned(model, profile=train):
                lp = train_logprobs(model, recs)
            d = torch.cat([a.double() - b for a, b in zip(lp, rollout)])
            result[engine, train] = d.abs().mean().item()
    with capsys.disabled():
        print("\nmean |delta| (rollout engine, training profile):", {k: f"{v:.2e}" for k, v in result.items()})
    for engine in ("vllm", "sglang"):
        others = [result[engine, t] for t in ("hf", "vllm", "sglang") if t != engine]
        assert result[engine, engine] < min(others)


def test_static_cache_samples_like_the_dynamic_one():
    """Same seed, same tokens: the static cache only changes how many masked keys attention sees,
    which can move logprobs in the last bits but not the sampled tokens of a short rollout."""
    model = tiny_model(seed=2)
    params = SamplingParams(max_new_tokens=16, seed=5)
    dyn = Sampler(model, "vllm").generate(PROMPTS, params)
    sta = Sampler(model, "vllm", cache="static").generate(PROMPTS, params)
    assert [r.response_ids for r in dyn] == [r.response_ids for r in sta]
    for a, b in zip(dyn, sta):
        # logits here reach ~16 where one bf16 ulp is 0.125: a last-bit change moves a logprob by
        # less than that; a wrong position or mask would move it by whole nats
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) < 0.125
    with pytest.raises(ValueError, match="needs cache='static' and a CUDA device"):
        Sampler(model, "vllm", cuda_graph=True)
    with pytest.raises(ValueError, match="needs cache='static' and a CUDA device"):
        Sampler(model, "vllm", cache="static", cuda_graph=True, device="cpu")


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_static_cache_is_reused_without_leaking_state(attn):
    """One static cache serves batches of different prompt lengths (same bucket); each call's
    rollouts equal a fresh sampler's, so nothing of the previous batch is read back."""
    model = tiny_model(seed=4)
    model.config._attn_implementation = attn
    params = SamplingParams(max_new_tokens=10, seed=7, stop_token_ids=())
    other = [[3, 4, 5, 6, 7, 8, 9, 10, 11], [30, 31], [40, 41, 42]]
    reused = Sampler(model, "vllm", cache="static")
    first = reused.generate(other, params)
    again = reused.generate(PROMPTS, params)
    assert len(reused._decoders) == 1  # both batches fit the same 64-position bucket
    fresh = Sampler(model, "vllm", cache="static").generate(PROMPTS, params)
    dyn = Sampler(model, "vllm").generate(PROMPTS, params)
    assert [r.response_ids for r in again] == [r.response_ids for r in fresh] == [r.response_ids for r in dyn]
    assert [r.logprobs for r in again] == [r.logprobs for r in fresh]
    assert [r.response_ids for r in first] != [r.response_ids for r in again]


def test_ignore_eos_samples_to_max_new_tokens():
    model = tiny_model(seed=3)
    every = SamplingParams(max_new_tokens=6, seed=0, stop_token_ids=())
    s = Sampler(model, "vllm")
    s.eos_ids = tuple(range(96))  # every token is an eos: without ignore_eos, one token per rollout
    assert all(len(r.response_ids) == 1 for r in s.generate(PROMPTS, every))
    long = SamplingParams(max_new_tokens=6, seed=0, ignore_eos=True)
    assert all(len(r.response_ids) == 6 for r in s.generate(PROMPTS, long))


def test_warm_up_leaves_the_static_cache_as_it_was():
    """CUDA-graph capture runs the decode step before capturing it. transformers' static cache
    writes at its own device-side counter, so those extra steps must be undone, or every later
    write lands past the position the mask and RoPE use (what broke the first GPU run)."""
    from rla.rollout.static_decode import StaticDecoder

    sampler = Sampler(tiny_model(seed=8), "vllm", cache="static")
    engine = sampler.model
    dec = StaticDecoder(engine, sampler._cache_kw, 2, 64, capture=False)
    ids = torch.tensor([[0, 5, 6, 7], [8, 9, 10, 11]])
    mask = torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]])
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    dec.prefill(ids, mask, pos)
    before = [t.clone() for layer in dec.cache.layers for t in vars(layer).values() if isinstance(t, torch.Tensor)]
    nxt, npos = torch.tensor([[12], [13]]), pos[:, -1:] + 1
    dec.tokens.copy_(nxt), dec.positions.copy_(npos), dec.cache_position.fill_(4)
    dec._warm_up()
    after = [t for layer in dec.cache.layers for t in vars(layer).values() if isinstance(t, torch.Tensor)]
    assert len(before) == len(after) > 0 and all(torch.equal(a, b) for a, b in zip(before, after))
    warm = dec.decode(nxt, npos, 4).clone()
    fresh = StaticDecoder(engine, dec.cache_kw, 2, 64, capture=False)
    fresh.prefill(ids, mask, pos)
    assert torch.equal(warm, fresh.decode(nxt, npos, 4))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
def test_cuda_graph_decode_replays_the_eager_step_bit_for_bit():
    """The captured decode step runs the same kernels on the same buffers as the eager one: same
    tokens and the same logprobs to the last bit, on the first call (capture) and a reused one."""
    model = tiny_model(seed=6).cuda()
    params = SamplingParams(max_new_tokens=24, seed=1, stop_token_ids=())
    graphed = Sampler(model, "vllm", cache="static")
    assert graphed.cuda_graph
    eager = Sampler(model, "vllm", cache="static", cuda_graph=False)
    for prompts in (PROMPTS, [[9, 8, 7, 6], [5], [4, 3]]):
        a, b = graphed.generate(prompts, params), eager.generate(prompts, params)
        assert [r.response_ids for r in a] == [r.response_ids for r in b]
        assert [r.logprobs for r in a] == [r.logprobs for r in b]
    assert len(graphed._decoders[(3, 64)]._loops) == 1  # the token loop was captured and replayed
