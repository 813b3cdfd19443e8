"""Routing replay: the training forward routes to the recorded experts, its logprobs move toward
the recording side's, the gradient still reaches the router; records carry routes in a versioned
field, and records without them get an error that names the record.

The recording side is an engine stand-in: the same weights with the router region aligned to the
``vllm-0.33`` row (rla's reference of vLLM's router points, not vLLM itself). Routers are made
near-uniform (``gate_scale=0.02``) so the two sides choose different experts for some tokens.
"""

from __future__ import annotations

import copy

import pytest
import torch

import rla
from rla.alignment.replay import RoutesMissingError, capture_routes, replay_routes, routes_from_records
from rla.metrics import routing_mismatch
from rla.rollout import rollouts

import moe_models as M

from align_spec import single_thread  # noqa: F401

B, S, PROMPT = 4, 32, 8


def _sides(family, seed):
    train = M.model(family, seed=seed, gate_scale=0.02)
    engine = copy.deepcopy(train)
    rla.align(engine, "vllm-0.33", regions=("router",))
    return train, engine


def _token_logprobs(model, ids):
    return model(ids).logits.float().log_softmax(-1)[:, :-1].gather(-1, ids[:, 1:, None])[..., 0]


def _layout(cap, batch=B):  # [layers, batch*S, k] -> [batch, S, layers, k]
    e = cap.ids()
    return e.permute(1, 0, 2).reshape(batch, S, e.shape[0], e.shape[2])


@pytest.mark.parametrize("family,seed", [("qwen3_moe", 0), ("mixtral", 1)])
def test_replay_follows_the_record_and_moves_logprobs_toward_it(family, seed):
    # 16 x 32 tokens: the sides' routes differ on a few of them (at 4 x 32, on one: the logprob
    # comparison then read one token's rounding noise, and went either way)
    train, engine = _sides(family, seed)
    batch = 16
    ids = M.tokens(batch=batch, seq=S, seed=seed)
    with torch.no_grad():
        with capture_routes(engine) as rec:
            lp_engine = _token_logprobs(engine, ids)
        with capture_routes(train) as own:
            lp_train = _token_logprobs(train, ids)
        with replay_routes(train, _layout(rec, batch)), capture_routes(train) as replayed:
            lp_replay = _token_logprobs(train, ids)
    mism = routing_mismatch(own.ids(), rec.ids())
    assert mism["routing/any_layer_set_differs"] > 0  # the sides disagree without replay
    assert torch.equal(replayed.ids(), rec.ids())  # 100% of tokens, every layer
    assert routing_mismatch(replayed.ids(), rec.ids())["routing/any_layer_set_differs"] == 0.0
    before = (lp_train - lp_engine).abs().mean()
    after = (lp_replay - lp_engine).abs().mean()
    assert after < before, (float(before), float(after))
    with replay_routes(train, _layout(rec, batch)), capture_routes(train) as again:
        train(ids)
    assert torch.equal(again.ids(), rec.ids())  # and it leaves nothing behind
    with capture_routes(train) as plain, torch.no_grad():
        train(ids)
    assert torch.equal(plain.ids(), own.ids())


def test_replayed_weights_and_the_gradient_through_the_router():
    train, engine = _sides("mixtral", 1)  # fp32 routing weights on both sides
    ids = M.tokens(batch=B, seq=S, seed=1)
    with torch.no_grad(), capture_routes(engine) as rec:
        engine(ids)
    w = rec.weights().permute(1, 0, 2).reshape(B, S, -1, 3)
    with replay_routes(train, _layout(rec), w), capture_routes(train) as got:
        loss = -_token_logprobs(train, ids).mean()
        loss.backward()
    assert torch.equal(got.weights(), rec.weights())  # the recorded values in the forward
    grads = [b.gate.weight.grad for b in M.blocks(train)]
    assert all(g is not None and g.abs().sum() > 0 for g in grads)  # ... and the router's gradient


def test_records_carry_routes_and_replay_reads_them(tmp_path):
    train, engine = _sides("qwen3_moe", 0)
    ids = M.tokens(batch=B, seq=S, seed=0)
    with torch.no_grad(), capture_routes(engine) as rec:
        lp = _token_logprobs(engine, ids)
    experts = _layout(rec)
    records = [
        rollouts.RolloutRecord(
            prompt_ids=ids[i, :PROMPT].tolist(), response_ids=ids[i, PROMPT:].tolist(),
            logprobs=lp[i, PROMPT - 1:].double().clamp(max=0).tolist(), temperature=1.0, top_p=1.0, top_k=-1,
            engine="vllm", routes={"version": 1, "experts": experts[i, :S - 1].tolist()})  # the last token unrouted
        for i in range(B)
    ]
    rollouts.save(tmp_path / "r.jsonl", records)
    loaded = rollouts.load(tmp_path / "r.jsonl")
    assert loaded[0].routes == records[0].routes
    batch = rollouts.to_padded(loaded)
    replay = routes_from_records(loaded)
    assert torch.equal(batch["input_ids"], ids) and torch.equal(replay[:, :S - 1], experts[:, :S - 1])
    with torch.no_grad(), replay_routes(train, replay), capture_routes(train) as got:
        train(batch["input_ids"])
    assert torch.equal(got.ids().view(-1, B, S, 3)[:, :, :S - 1], rec.ids().view(-1, B, S, 3)[:, :, :S - 1])

    plain = copy.copy(loaded[1])
    plain.routes = None
    with pytest.raises(RoutesMissingError, match="record 1 has no routes.*enable_return_routed_experts"):
        routes_from_records([loaded[0], plain])
    with pytest.raises(RoutesMissingError, match="without weights"):
        routes_from_records(loaded, with_weights=True)
    with pytest.raises(RoutesMissingError, match="the forward has 64 tokens, the recorded routes 128"):
        with replay_routes(train, replay):
            train(batch["input_ids"][:2])


def test_bad_routes_are_refused():
    base = dict(prompt_ids=[1, 2], response_ids=[3], logprobs=[-0.5], temperature=1.0, top_p=1.0, top_k=-1,
                engine="vllm")
    ok = {"version": 1, "experts": [[[0, 1]], [[2, 3]], [[1, 0]]], "weights": [[[0.5, 0.5]]] * 3}
    assert rollouts.RolloutRecord(**base, routes=ok).routes == ok
    bad = [
        ({**ok, "version": 2}, "version 2 is not one this rla reads"),
        ({"version": 1, "experts": [[[0, 1]]]}, "one entry per token"),
        ({"version": 1, "experts": [[[0, 0]], [[1, 2]], [[1, 2]]]}, "distinct"),
        ({"version": 1, "experts": [[[0, 1]], [[1, 2, 3]], [[1, 2]]]}, "k=3"),
        ({**ok, "weights": [[[0.5, float("nan")]]] * 3}, "finite"),
    ]
    for routes, match in bad:
        with pytest.raises(rollouts.RolloutFormatError, match=match):
            rollouts.RolloutRecord(**base, routes=routes)


def test_sampler_routes_like_the_profile_when_asked():
    """rla's sampler (the engine stand-in) with the router region: its records' logprobs are the
    router-aligned model's own, bit for bit (one prefill of the whole sequence against the
    sampler's KV-cache decode; on this CPU both give the same bits)."""
    from rla.rollout.sampler import Sampler, SamplingParams

    model = M.model("qwen3_moe", seed=0, gate_scale=0.02)
    regions = ("rope", "swiglu", "rmsnorm", "router")
    sampler = Sampler(model, "vllm-0.33", regions=regions, cuda_graph=False)
    assert sampler.alignment.regions == regions
    recs = sampler.generate([[1, 2, 3, 4]] * 2, SamplingParams(max_new_tokens=6, seed=0, ignore_eos=True))
    engine = copy.deepcopy(model)
    rla.align(engine, "vllm-0.33", regions=regions)
    ids = torch.tensor([r.prompt_ids + r.response_ids for r in recs])
    with torch.no_grad():
        lp = _token_logprobs(engine, ids)[:, 3:]
    got = torch.tensor([r.logprobs for r in recs], dtype=torch.float64)
    assert torch.equal(lp.double(), got)
