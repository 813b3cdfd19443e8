"""Shared by the rollout tests: the tiny test model, and the per-token sampling loop the token loop
must equal (written out, so comparisons do not lean on anything the token loop changed)."""

import torch
from transformers import AutoModelForCausalLM, Qwen2Config

from rla.rollout.sampler import Sampler, SamplingParams
from rla.rollout.sampling import process_logits
from rla.rollout.static_decode import StaticDecoder, bucket


def tiny_model(seed=0, vocab=96):
    torch.manual_seed(seed)
    cfg = Qwen2Config(
        vocab_size=vocab, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
        eos_token_id=1, pad_token_id=0, tie_word_embeddings=False,
    )
    m = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    with torch.no_grad():  # larger logits than the default init: a peaked, LM-like distribution
        m.lm_head.weight.mul_(8)
    return m.eval()


@torch.no_grad()
def per_token_generate(sampler: Sampler, prompts, params: SamplingParams, check_every: int = 8):
    """-> [(response ids, logprobs)] as the pre-change sampler computed them."""
    from transformers import DynamicCache

    model, n, dev = sampler.model, len(prompts), sampler.device
    longest = max(len(p) for p in prompts)
    ids = torch.full((n, longest), sampler.pad_id, dtype=torch.long)
    mask = torch.zeros((n, longest), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, longest - len(p):] = torch.tensor(p)
        mask[i, longest - len(p):] = 1
    ids, mask = ids.to(dev), mask.to(dev)
    gen = torch.Generator(device=dev).manual_seed(params.seed)
    stops = sorted(set(() if params.ignore_eos else sampler.eos_ids) | set(params.stop_token_ids))
    stops_t = torch.tensor(stops, dtype=torch.long, device=dev)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    kw = sampler._cache_kw
    if sampler.cache == "static":
        dec = StaticDecoder(model, kw, n, bucket(longest + params.max_new_tokens), capture=False)
        logits = dec.prefill(ids, mask, positions)
    else:
        cache = DynamicCache(config=model.config)
        logits = model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True,
                       logits_to_keep=1, **{kw: cache}).logits[:, -1]
    done = torch.zeros(n, dtype=torch.bool, device=dev)
    out_ids, out_lp = [], []
    for step in range(params.max_new_tokens):
        logp = process_logits(logits.clone(), params.temperature, params.top_k, params.top_p)
        nxt = torch.multinomial(logp.exp(), 1, generator=gen).squeeze(-1)
        lp = logp.gather(-1, nxt[:, None]).squeeze(-1)
        nxt = torch.where(done, torch.full_like(nxt, sampler.pad_id), nxt)
        out_ids.append(nxt)
        out_lp.append(torch.where(done, torch.zeros_like(lp), lp))
        done = done | torch.isin(nxt, stops_t)
        if step == params.max_new_tokens - 1 or (step % check_every == check_every - 1 and bool(done.all())):
            break
        positions = positions[:, -1:] + 1
        if sampler.cache == "static":
            logits = dec.decode(nxt[:, None], positions, longest + step)
        else:
            mask = torch.cat([mask, mask.new_ones((n, 1))], dim=1)
            logits = model(input_ids=nxt[:, None], attention_mask=mask, position_ids=positions, use_cache=True,
                           logits_to_keep=1, **{kw: cache}).logits[:, -1]
    all_ids = torch.stack(out_ids, 1).cpu()
    all_lp = torch.stack(out_lp, 1).double().cpu()
    out = []
    for i in range(n):
        resp, lps = [], []
        for t in range(all_ids.shape[1]):
            resp.append(int(all_ids[i, t]))
            lps.append(float(all_lp[i, t]))
            if resp[-1] in stops:
                break
        out.append((resp, lps))
    return out


def records(recs):
    """(response ids, logprobs) of each record, for comparing two runs."""
    return [(r.response_ids, r.logprobs) for r in recs]
