"""MoE in the GRPO trainer: routing replay through right-padded micro-batches, the routing metrics
of each step, and the refusals.

``micro_batch_routing`` is checked against routes it could not have computed itself (random
distinct experts per token): the forward under replay must take exactly those, at every real
token of every row, whatever the row's padding; the router's gate still gets a gradient. The
trainer run checks the whole path (sampler routes -> records -> micro-batches of one row each ->
replay -> capture -> ``routing/*`` in the log line) on a micro Qwen3-MoE.
"""

from __future__ import annotations

import json

import pytest
import torch
from packaging.version import Version

from rla.alignment import capture_routes, compat
from rla.alignment.core import ROUTER_MIN_TRANSFORMERS
from rla.alignment.replay import RoutesMissingError
from rla.rl.config import TrainConfig
from rla.rl.forward import make_micro_batch
from rla.rl.routes import micro_batch_routing
from rla.rl.trainer import train

import moe_models as M
from toy_runs import toy_config

from align_spec import single_thread  # noqa: F401

pytestmark = pytest.mark.skipif(compat.TRANSFORMERS_VERSION < Version(ROUTER_MIN_TRANSFORMERS),
                                reason=f"the router region is refused below transformers {ROUTER_MIN_TRANSFORMERS}")


def _random_routes(n_tokens, layers, k, experts, seed):
    g = torch.Generator().manual_seed(seed)
    ids = torch.stack([torch.stack([torch.randperm(experts, generator=g)[:k] for _ in range(layers)])
                       for _ in range(n_tokens)])
    return {"version": 1, "experts": ids.tolist(), "weights": torch.rand(ids.shape, generator=g).tolist()}


@pytest.mark.parametrize("mode", ["experts", "weights"])
def test_replay_takes_the_recorded_experts_in_padded_rows_and_trains_the_gate(mode):
    model = M.model("qwen3_moe").train()
    layers, k, n_exp = len(M.blocks(model)), model.config.num_experts_per_tok, model.config.num_experts
    prompts, responses = [[1, 5, 9], [1, 7, 3, 2, 8, 6]], [[4, 4], [9, 10, 11, 12]]
    # row 0 records one route fewer than its tokens (the engine never fed its last token)
    routes = [_random_routes(len(p) + len(r) - (1 - i), layers, k, n_exp, i)
              for i, (p, r) in enumerate(zip(prompts, responses))]
    mb = make_micro_batch(prompts, responses, [0, 1])
    longest = mb.input_ids.shape[1]
    with micro_batch_routing(model, mode, routes, [3, 6], [2, 4], longest, capture=True) as stats:
        out = model(input_ids=mb.input_ids, position_ids=mb.position_ids).logits
    for row, s in enumerate(stats):
        want = torch.tensor(routes[row]["experts"]).numpy()
        assert (s.train_ids == want).all()  # every real token, in slot order: 100%
        assert (s.roll_ids == want).all()
        if mode == "weights":
            assert abs(s.train_weights - torch.tensor(routes[row]["weights"]).numpy()).max() < 1e-6
    out.float().logsumexp(-1).sum().backward()
    assert all(float(b.gate.weight.grad.abs().sum()) > 0 for b in M.blocks(model))
    # not a forward of its own: without the replay the same rows route elsewhere
    with torch.no_grad(), capture_routes(model) as cap:
        model(input_ids=mb.input_ids, position_ids=mb.position_ids)
    own = cap.ids().reshape(layers, 2, longest, k)[:, 1, :10].permute(1, 0, 2).numpy()
    assert (own != torch.tensor(routes[1]["experts"]).numpy()).any()


def test_a_row_without_routes_is_named():
    model = M.model("qwen3_moe")
    with pytest.raises(RoutesMissingError, match="row 1 has no routes"):
        with micro_batch_routing(model, "experts", [_random_routes(3, 2, 3, 8, 0), None], [2, 2], [1, 1], 3, False):
            pass


def test_replay_run_routes_every_token_as_recorded_and_logs_routing(tmp_path):
    cfg = toy_config(tmp_path / "run", arch="qwen3_moe", steps=1, max_tokens=30, routing_replay="weights")
    train(cfg, log=None)
    rec = json.loads((tmp_path / "run" / "log.jsonl").read_text().splitlines()[0])
    layers = 2  # micro: 2 decoder layers, each an MoE block
    assert rec["routing/set_differs"] == rec["routing/order_differs"] == [0.0] * layers
    assert rec["routing/any_layer_set_differs"] == 0.0
    assert rec["routing/weight_abs_max"] == [0.0] * layers
    assert rec["mismatch/k3"] >= 0


def test_replay_is_refused_without_moe_blocks_and_under_fsdp(tmp_path):
    with pytest.raises(ValueError, match="routing_replay='experts' with fsdp=true"):
        TrainConfig(routing_replay="experts", fsdp=True)
    with pytest.raises(ValueError, match="has no MoE block"):
        train(toy_config(tmp_path / "dense", routing_replay="experts"), log=None)


def test_capturing_hf_blocks_leaves_their_forward_as_it_is():
    model = M.model("qwen3_moe", experts="grouped_mm")
    prompts, responses = [[1, 5, 9], [1, 7, 3, 2]], [[4, 4], [9, 10]]
    mb = make_micro_batch(prompts, responses, [0, 1])
    with torch.no_grad():
        plain = model(input_ids=mb.input_ids).logits
        routes = [_random_routes(5, 2, 3, 8, 0), _random_routes(6, 2, 3, 8, 1)]
        with micro_batch_routing(model, "none", routes, [3, 4], [2, 2], 6, capture=True) as stats:
            seen = model(input_ids=mb.input_ids).logits
        with capture_routes(model) as cap:
            model(input_ids=mb.input_ids)
    assert torch.equal(seen, plain)  # a hook on the gate, not rla's router forward
    ids = cap.ids().reshape(2, 2, 6, 3).permute(1, 2, 0, 3).numpy()
    assert (stats[1].train_ids == ids[1, :6]).all() and (stats[0].train_ids == ids[0, :5]).all()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("arm", [
    dict(routing_replay="experts"),
    dict(init="sft", sft_steps=2, sft_batch_size=8, task="addition", difficulty=2, max_new_tokens=0),
    dict(train_precision="aligned", align_regions=["rope", "swiglu", "rmsnorm", "router"], routing_replay="experts"),
])
def test_moe_steps_on_cuda_replay_every_route_and_log_routing(tmp_path, arm):
    # the experiment's path on the GPU: an SFT warm start of the MoE (fp32 grouped_mm experts under
    # autocast), dynamic-cache rollouts with the router aligned and routes recorded, grouped_mm
    # experts in the bf16 arm's training forward, replay through micro-batches
    cfg = toy_config(tmp_path / "run", arch="qwen3_moe", steps=2, max_tokens=30, device="cuda", **arm)
    train(cfg, log=None)
    lines = [json.loads(line) for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    for rec in lines:
        assert len(rec["routing/set_differs"]) == 2 and rec["mismatch/k3"] >= 0
        if arm.get("routing_replay"):
            assert rec["routing/set_differs"] == rec["routing/order_differs"] == [0.0, 0.0]
