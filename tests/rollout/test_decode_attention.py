"""The static decoder's grouped, windowed attention attends like HF's own SDPA attention over the
whole cache, to an fp64 oracle's accuracy; and a sampler whose cache is wider than one window
(several widths, one graph each on GPU) samples what the full-width per-token loop samples."""

import math

import pytest
import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from rla.rollout.decode_attention import NAME, decode_attention_of, grouped_decode_attention
from rla.rollout.sampler import Sampler, SamplingParams
from rla.rollout.static_decode import WINDOW, StaticDecoder
from rollout_oracles import per_token_generate, records, tiny_model


class _Module(torch.nn.Module):  # what HF's attention functions read off the attention module
    def __init__(self, groups):
        super().__init__()
        self.num_key_value_groups = groups
        self.is_causal = True


def _case(seed, b=3, heads=6, kv_heads=2, d=16, max_len=96, width=64, filled=40):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, heads, 1, d, generator=g).bfloat16()
    k = torch.randn(b, kv_heads, max_len, d, generator=g).bfloat16()
    v = torch.randn(b, kv_heads, max_len, d, generator=g).bfloat16()
    mask = torch.zeros(b, max_len, dtype=torch.bool)
    mask[:, :filled] = True
    mask[0, :5] = False  # left padding of row 0
    mask[1, :1] = False
    return q, k, v, mask


def _oracle(q, k, v, mask, scale):
    """fp64 softmax(q k^T * scale) v over the mask, each query head on its K/V head."""
    b, heads, _, d = q.shape
    groups = heads // k.shape[1]
    kk = k.double().repeat_interleave(groups, 1)
    vv = v.double().repeat_interleave(groups, 1)
    s = (q.double() @ kk.transpose(-1, -2)) * scale
    s = s.masked_fill(~mask[:, None, None, :], -math.inf)
    return (s.softmax(-1) @ vv).transpose(1, 2)  # [b, 1, heads, d]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_grouped_windowed_attention_equals_hf_sdpa_over_the_whole_cache(seed):
    q, k, v, mask = _case(seed)
    scale = q.shape[-1] ** -0.5
    width = 64
    got, _ = grouped_decode_attention(_Module(3), q, k, v, mask[:, None, None, :width], scaling=scale)
    # HF's SDPA attention over all 96 columns, the columns past the window masked
    want, _ = sdpa_attention_forward(_Module(3), q, k, v, mask[:, None, None, :], scaling=scale)
    oracle = _oracle(q, k, v, mask, scale)
    assert got.shape == want.shape == oracle.shape == (3, 1, 6, 16)
    ulp = 2.0 ** -8  # bf16's relative spacing: each output is rounded to bf16 once
    assert (got.double() - oracle).abs().max() <= ulp * oracle.abs().max()
    assert (got.double() - want.double()).abs().max() <= ulp * oracle.abs().max()
    # the window is not decoration: a key past it would change the answer if it were read
    k2 = k.clone()
    k2[:, :, width:] = 1e4
    assert torch.equal(grouped_decode_attention(_Module(3), q, k2, v, mask[:, None, None, :width], scaling=scale)[0],
                       got)


def test_grouped_decode_attention_refuses_what_it_does_not_compute():
    q, k, v, mask = _case(0)
    m = mask[:, None, None, :64]
    with pytest.raises(ValueError, match="one query token"):
        grouped_decode_attention(_Module(3), q.expand(3, 6, 2, 16), k, v, m)
    with pytest.raises(ValueError, match="boolean"):
        grouped_decode_attention(_Module(3), q, k, v, m.float())
    with pytest.raises(ValueError, match="mask of 128 columns for a cache of 96"):
        grouped_decode_attention(_Module(3), q, k, v, torch.ones(3, 1, 1, 128, dtype=torch.bool))
    with pytest.raises(ValueError, match="dropout"):
        grouped_decode_attention(_Module(3), q, k, v, m, dropout=0.1)


def test_decode_attention_of_puts_the_models_attention_back():
    model = tiny_model(seed=1)
    before = model.config._attn_implementation
    with pytest.raises(RuntimeError, match="inside"):
        with decode_attention_of(model):
            assert model.config._attn_implementation == NAME
            raise RuntimeError("inside")
    assert model.config._attn_implementation == before


def test_widths_grow_with_the_filled_columns_and_stop_at_the_cache():
    sampler = Sampler(tiny_model(seed=2), "vllm", cache="static")
    dec = StaticDecoder(sampler.model, sampler._cache_kw, 2, 320, capture=False)
    assert [dec.width(n) for n in (1, WINDOW, WINDOW + 1, 300, 320)] == [WINDOW, WINDOW, 2 * WINDOW, 320, 320]
    eager = tiny_model(seed=2)
    eager.config._attn_implementation = "eager"
    full = StaticDecoder(Sampler(eager, "vllm", cache="static").model, sampler._cache_kw, 2, 320, capture=False)
    assert full.width(1) == 320  # eager attention keeps HF's attention over every column


@pytest.mark.parametrize("k", [1, 8])
def test_generate_across_several_widths_equals_the_full_width_per_token_loop(k):
    """150 tokens after prompts of up to 11: a 192-column cache read in windows of 128 then 192;
    the reference decodes every step over all 192 columns."""
    model = tiny_model(seed=11)
    sampler = Sampler(model, "vllm", cache="static", tokens_per_check=k)
    prompts = [[5, 6, 7], [8, 9, 10, 11, 12, 13], [20], [30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40]]
    params = SamplingParams(max_new_tokens=150, seed=9, ignore_eos=True)
    got = records(sampler.generate(prompts, params))
    want = per_token_generate(sampler, prompts, params)
    assert [ids for ids, _ in got] == [ids for ids, _ in want]
    lp_got = torch.tensor([lp for _, lps in got for lp in lps])
    lp_want = torch.tensor([lp for _, lps in want for lp in lps])
    # one bf16 ulp of a logit of ~16 is 0.125: a last-bit difference of the attention's sums stays
    # far below; a wrong window or mask would move logprobs by whole nats
    assert (lp_got - lp_want).abs().max() < 0.125
    assert (lp_got == lp_want).double().mean() > 0.9


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
def test_one_graph_per_width_replays_the_eager_loop_bit_for_bit():
    """On GPU every width is its own captured graph, all in one memory pool: the rollouts equal the
    eager loop's to the last bit (cuDNN's SDPA, not run-to-run deterministic, is off for the test)."""
    model = tiny_model(seed=6).cuda()
    params = SamplingParams(max_new_tokens=150, seed=1, ignore_eos=True)
    prompts = [[5, 6, 7], [8, 9, 10, 11, 12, 13], [20]]
    was = torch.backends.cuda.cudnn_sdp_enabled()
    torch.backends.cuda.enable_cudnn_sdp(False)
    try:
        graphed = Sampler(model, "vllm", cache="static")
        eager = Sampler(model, "vllm", cache="static", cuda_graph=False)
        a, b = graphed.generate(prompts, params), eager.generate(prompts, params)
        again = graphed.generate(prompts, params)
    finally:
        torch.backends.cuda.enable_cudnn_sdp(was)
    assert records(a) == records(b) == records(again)
    (dec,) = graphed._decoders.values()
    assert dec.max_len == 192 and sorted(next(iter(dec._loops.values()))) == [128, 192]
