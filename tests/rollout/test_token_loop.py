"""The token loop (sampling on static buffers, K tokens per CUDA-graph replay) returns exactly what
the per-token loop with torch.multinomial returned: same ids, same float logprobs.

``per_token_generate`` (``rollout_oracles.py``) is that loop as ``Sampler.generate`` ran it before
the token loop, written out so the comparison does not lean on anything the change touched.
"""

import pytest
import torch

from rla.rollout.sampler import Sampler, SamplingParams
from rla.rollout.static_decode import StaticDecoder
from rla.rollout.token_loop import LoopParams
from rollout_oracles import per_token_generate, records, tiny_model

PROMPTS = [[5, 6, 7], [8, 9, 10, 11, 12, 13], [20], [30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40]]
CASES = [
    SamplingParams(max_new_tokens=21, seed=3),
    SamplingParams(max_new_tokens=16, seed=4, temperature=0.7, top_k=12),
    SamplingParams(max_new_tokens=13, seed=5, temperature=1.3, top_p=0.8),
    SamplingParams(max_new_tokens=19, seed=6, top_k=30, top_p=0.9, stop_token_ids=(3, 4, 7, 9, 11, 13, 17)),
    SamplingParams(max_new_tokens=24, seed=7, ignore_eos=True),
    SamplingParams(max_new_tokens=1, seed=8),
]



@pytest.mark.parametrize("cache", ["static", "dynamic"])
@pytest.mark.parametrize("k", [1, 3, 8])
def test_generate_equals_the_per_token_multinomial_loop(cache, k):
    model = tiny_model(seed=11)
    sampler = Sampler(model, "vllm", cache=cache, tokens_per_check=k)
    sampler.eos_ids = (1, 2, 5)  # eos within reach of a random model, so some rows stop early
    stopped_early = 0
    for params in CASES:
        want = per_token_generate(sampler, PROMPTS, params)
        got = records(sampler.generate(PROMPTS, params))
        assert got == want, params
        stopped_early += sum(len(ids) < params.max_new_tokens for ids, _ in got)
        if params.ignore_eos:
            assert all(len(ids) == params.max_new_tokens for ids, _ in got)
    assert stopped_early >= 3  # the stop paths ran (pad columns after a stop, trimmed records)


def test_every_row_stopping_ends_the_loop_early_with_the_same_records():
    """All rows stop within the first chunk: the loop breaks at the first check, as before."""
    sampler = Sampler(tiny_model(seed=12), "vllm", cache="static", tokens_per_check=4)
    params = SamplingParams(max_new_tokens=40, seed=1, stop_token_ids=tuple(range(2, 96)))
    got = records(sampler.generate(PROMPTS, params))
    assert got == per_token_generate(sampler, PROMPTS, params)
    assert all(len(ids) == 1 for ids, _ in got)
    loop = sampler._decoders[(len(PROMPTS), 64)].loop
    assert int(loop.column) == 4  # one chunk, then the check saw every row done
    assert (loop.ids[:, 1:4] == sampler.pad_id).all() and (loop.logprobs[:, 1:4] == 0).all()
    assert (loop.logprobs[:, 0] < 0).all()  # the stop token keeps its logprob


def test_prompt_at_a_cache_bucket_edge():
    """prompt + max_new_tokens == the cache length: the last chunk decodes into the cache's last
    column and nothing past it (the cache is sized exactly as for the per-token loop)."""
    prompts = [list(range(3, 3 + 59)), [4, 5]]
    params = SamplingParams(max_new_tokens=5, seed=2, ignore_eos=True)
    for k in (2, 5, 8):
        sampler = Sampler(tiny_model(seed=13), "vllm", cache="static", tokens_per_check=k)
        assert records(sampler.generate(prompts, params)) == per_token_generate(sampler, prompts, params)
        assert list(sampler._decoders) == [(2, 64)]


def test_token_loop_warm_up_leaves_no_trace():
    """A capture warms the K-token loop up first; that run must leave the cache, the positions,
    the output columns, the done mask and the logits buffer exactly as they were."""
    sampler = Sampler(tiny_model(seed=14), "vllm", cache="static")
    dec = StaticDecoder(sampler.model, sampler._cache_kw, 2, 64, capture=False)
    ids = torch.tensor([[0, 5, 6, 7], [8, 9, 10, 11]])
    mask = torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]])
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    dec.begin(dec.prefill(ids, mask, pos), pos[:, -1:], 4)
    params = LoopParams(1.0, -1, 1.0, (1,))

    def everything():
        cache = [t for layer in dec.cache.layers for t in vars(layer).values() if isinstance(t, torch.Tensor)]
        return [t.clone() for t in [*cache, dec.tokens, dec.positions, dec.cache_position, *dec.loop.state()]]

    before = everything()
    dec._warm_up(run=lambda: dec._tokens(5, params))
    assert all(torch.equal(a, b) for a, b in zip(before, everything()))
    dec.run(5, params)  # and a real run does move them
    assert int(dec.loop.column) == 5 and int(dec.cache_position) == 8


def test_nan_probabilities_raise():
    model = tiny_model(seed=15)
    with torch.no_grad():
        model.lm_head.weight[7].fill_(float("nan"))
    for cache in ("static", "dynamic"):
        with pytest.raises(FloatingPointError, match="NaN"):
            Sampler(model, "vllm", cache=cache).generate(PROMPTS, SamplingParams(max_new_tokens=4, seed=0))


def test_tokens_per_check_must_be_a_positive_int():
    for bad in (0, -1, 2.0):
        with pytest.raises(ValueError, match="tokens_per_check"):
            Sampler(tiny_model(), "vllm", tokens_per_check=bad)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
def test_captured_token_loop_replays_eager_bit_for_bit_and_follows_reseeds():
    """The K-token graph samples with a registered generator: each generate reseeds it, and the
    replay must use the new seed (same seed twice: same rollouts; another seed: other rollouts,
    equal to eager's). Also equal to the per-token multinomial loop."""
    model = tiny_model(seed=6).cuda()
    graphed = Sampler(model, "vllm", cache="static", tokens_per_check=8)
    eager = Sampler(model, "vllm", cache="static", cuda_graph=False, tokens_per_check=8)
    assert graphed.cuda_graph and not eager.cuda_graph
    base = dict(max_new_tokens=37, top_k=40, top_p=0.95, ignore_eos=True)
    seen = {}
    for seed in (1, 1, 2, 1, 3):
        params = SamplingParams(seed=seed, **base)
        a = records(graphed.generate(PROMPTS, params))
        assert a == records(eager.generate(PROMPTS, params)) == per_token_generate(eager, PROMPTS, params)
        seen.setdefault(seed, a)
        assert a == seen[seed]
    assert seen[1] != seen[2] != seen[3] != seen[1]
    dec = graphed._decoders[(len(PROMPTS), 64)]
    assert len(dec._loops) == 1  # captured once, replayed on every call
    # early stops inside a replay: rows that stopped get pad columns
    params = SamplingParams(seed=4, max_new_tokens=30, stop_token_ids=(3, 4, 7, 9, 11, 13, 17))
    assert records(graphed.generate(PROMPTS, params)) == records(eager.generate(PROMPTS, params))
