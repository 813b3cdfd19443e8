"""`rla verify --live --replay-routes`: the engine's routes travel from its outputs to the replayed
sides of the report, without vLLM.

The stand-in engine is a tiny Qwen2-MoE whose first layer is dense (``mlp_only_layers=[0]``: the
MoE blocks sit at decoder layers 1 and 2, so a route read at the wrong layer shows) and which routes
a third of the tokens differently from the model's own top-k (the last slot set to another expert):
its logprobs are the model's forward under those routes (``rla.replay_routes``), its records' routes
cover all tokens but the last sampled one, as vLLM's do. So the HF side is not the engine, and the HF
side replayed with the engine's routes must be the engine in every bit, prefill and decode: a route
off by one position, read at the wrong layer or dropped shows as a logprob that differs. Replay's own
correctness (the forward follows the recorded experts) is tests/rollout/test_routing_replay.py's.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from rla.alignment.replay import capture_routes, moe_decoder_layers, replay_routes
from rla.cli import main
from rla.engines import live_verify as V
from rla.engines.live_calibration import train_logprobs
from rla.engines.vllm_live import routes_of
from rla.rollout.rollouts import RolloutRecord

import moe_models as M

LAYERS = [1, 2]


class RouteEngine:
    """The model routing every third token (from the second) to another expert than its own top-k."""

    def __init__(self, model):
        self.model = model
        self.metadata = {"name": "vllm", "version": "0.26.0", "mode": "eager",
                         "settings": {"mode": "eager", "attention_backend": "TRITON_ATTN"}}

    def routes(self, ids: list[int]) -> torch.Tensor:
        """[tokens, moe_layers, k]: the model's own experts, the last slot moved on every third token."""
        with torch.no_grad(), capture_routes(self.model) as cap:
            self.model(torch.tensor(ids)[None])
        e = cap.ids().permute(1, 0, 2).clone()
        n_experts = self.model.config.num_experts
        for t in range(1, e.shape[0], 3):
            for layer in range(e.shape[1]):
                e[t, layer, -1] = min(set(range(n_experts)) - set(e[t, layer].tolist()))
        return e

    def logprobs(self, ids, experts):
        with replay_routes(self.model, experts[None]):
            return train_logprobs(self.model, ids)

    def prompt_logprobs(self, prompts):
        return self.prefill(prompts, None)[0]

    def prefill(self, prompts, route_layers):
        assert route_layers in (None, LAYERS)
        routes = [self.routes(p) for p in prompts]
        return [self.logprobs(p, e).tolist() for p, e in zip(prompts, routes)], [e.tolist() for e in routes]

    def sample(self, prompts, *, max_tokens, seed, route_layers=None):
        assert route_layers in (None, LAYERS)
        g = torch.Generator().manual_seed(seed)
        out = []
        for p in prompts:
            response = torch.randint(3, self.model.config.vocab_size, (max_tokens,), generator=g).tolist()
            e = self.routes(p + response)
            lps = self.logprobs(p + response, e)[len(p) - 1:].tolist()
            routes = None if route_layers is None else {"version": 1, "experts": e[:-1].tolist()}
            out.append(RolloutRecord(prompt_ids=p, response_ids=response, logprobs=lps, temperature=1.0, top_p=1.0,
                                     top_k=-1, engine="vllm", engine_version="0.26.0",
                                     metadata={"engine": self.metadata}, routes=routes))
        return out


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    path = tmp_path_factory.mktemp("replay") / "ckpt"
    M.model("qwen2_moe", seed=3, gate_scale=0.02, num_hidden_layers=3, mlp_only_layers=[0]).save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def model(ckpt):
    """The checkpoint as the command loads it (its attention and experts implementations: the command's sides
    must compute what the stand-in engine's do)."""
    from rla.hf import load_model

    return load_model(str(ckpt))


@pytest.fixture(scope="module")
def data(model):
    vocab = model.config.vocab_size
    return V.collect(RouteEngine(model), V.random_prompts(vocab, [40, 24]), V.random_prompts(vocab, [12, 12], seed=1),
                     max_new_tokens=8, route_layers=moe_decoder_layers(model))


def test_the_moe_layers_are_the_decoder_layers_with_an_moe_block(model):
    assert moe_decoder_layers(model) == LAYERS
    assert moe_decoder_layers(M.model("qwen2_moe")) == [0, 1]


def test_the_replayed_hf_side_is_the_engine_in_every_bit(model, data):
    rows = {r["side"]: r for r in V.compare(model, {"hf": None}, data, replay=True)}
    assert list(rows) == ["hf", "hf" + V.REPLAYED]
    hf, replayed = rows["hf"], rows["hf+routes"]
    assert hf["prefill"]["equal"] < 1.0 and hf["decode"]["equal"] < 1.0  # other experts on a third of the tokens
    for phase in ("prefill", "decode"):
        assert replayed[phase]["equal"] == 1.0 and replayed[phase]["k3"] == 0.0 and replayed[phase]["max_abs"] == 0.0
    assert replayed["routes"] == "engine" and "routes" not in hf
    assert replayed["prefill"]["tokens"] == 39 + 23 and replayed["decode"]["tokens"] == 16
    text = V.render(V.report(data, list(rows.values()), V.model_info(model.config)))
    assert "| hf+routes | 100.000% | 0.00e+00 |" in text and "routing replay" in text
    assert "routing replay" not in V.render(V.report(data, [hf], V.model_info(model.config)))


def test_routes_survive_save_and_load(data, tmp_path):
    V.save(tmp_path, data)
    back = V.load(tmp_path)
    assert back.routed and back.prompt_routes == data.prompt_routes
    assert [r.routes for r in back.records] == [r.routes for r in data.records]
    plain = V.EngineData(data.prompts, data.prompt_logprobs, data.records, data.engine)
    (tmp_path / "plain").mkdir()
    V.save(tmp_path / "plain", plain)
    assert "prompt_routes" not in json.loads((tmp_path / "plain" / "engine.json").read_text())
    assert not V.load(tmp_path / "plain").routed


def test_bad_routed_data_is_refused_naming_the_problem(model, data):
    plain = V.EngineData(data.prompts, data.prompt_logprobs, data.records, data.engine)
    with pytest.raises(ValueError, match="need the engine's routes.*--replay-routes"):
        V.compare(model, {"hf": None}, plain, replay=True)
    with pytest.raises(ValueError, match="prompt 1: 24 tokens need routes"):
        V.EngineData(data.prompts, data.prompt_logprobs, data.records, data.engine,
                     [data.prompt_routes[0], data.prompt_routes[1][:-1]])
    unrouted = [RolloutRecord(**{**r.__dict__, "routes": None}) for r in data.records]
    with pytest.raises(ValueError, match=r"records \[0, 1\] have none"):
        V.EngineData(data.prompts, data.prompt_logprobs, unrouted, data.engine, data.prompt_routes)
    with pytest.raises(ValueError, match="not scored together"):
        V.compare(model, {"hf": None}, data, replay=True, backed={"hf": object()})


def _completion(routed):
    return SimpleNamespace(routed_experts=routed)


def test_routes_of_reads_vllms_layout_at_the_moe_layers():
    """vLLM's ``CompletionOutput.routed_experts``: [tokens, num_hidden_layers, k] int, indexed by decoder layer,
    zeros where no MoE block wrote (``routed_experts_capturer.py``)."""
    rng = np.random.default_rng(0)
    routed = np.zeros((5, 3, 2), dtype=np.int32)
    routed[:, 1:] = np.stack([rng.permutation(8)[:2] for _ in range(10)]).reshape(5, 2, 2)
    r = routes_of(_completion(routed), 6, LAYERS, "completion 0")  # one fewer: the last sampled token
    assert r == {"version": 1, "experts": routed[:, 1:].tolist()}
    assert routes_of(_completion(routed), 5, LAYERS, "x")["experts"] == routed[:, 1:].tolist()
    with pytest.raises(ValueError, match="completion 0: the engine returned no routed experts"):
        routes_of(_completion(None), 5, LAYERS, "completion 0")
    with pytest.raises(ValueError, match=r"shape \(5, 3, 2\), expected \[8 or 7 tokens"):
        routes_of(_completion(routed), 8, LAYERS, "x")
    with pytest.raises(ValueError, match=r"MoE layers \[1, 3\] for routed experts of 3 layers"):
        routes_of(_completion(routed), 5, [1, 3], "x")
    routed[2, 0] = [4, 5]
    with pytest.raises(ValueError, match=r"layers the model has no MoE block in \(\[0\]\)"):
        routes_of(_completion(routed), 5, LAYERS, "x")


@pytest.fixture(scope="module")
def saved(model, data, ckpt):
    """The stand-in's run as `rla verify --live --replay-routes` leaves it, beside the checkpoint; and the same
    run without routes."""
    from rla.commands.verify_live import publish
    from rla.rollout.fingerprint import weights_fingerprint

    root = ckpt.parent
    stamped = V.with_weights(data, weights_fingerprint(model))
    rows = V.compare(model, {"hf": None}, stamped)
    publish(V.report(stamped, rows, V.model_info(model.config)), stamped, root / "run", overwrite=False)
    plain = V.EngineData(stamped.prompts, stamped.prompt_logprobs, stamped.records, stamped.engine)
    publish(V.report(plain, rows, V.model_info(model.config)), plain, root / "plain", overwrite=False)
    return root


def test_the_command_scores_the_replayed_sides_of_saved_outputs(saved, tmp_path, capsys):
    out = tmp_path / "r"
    assert main(["verify", "--live", "--engine-outputs", str(saved / "run"), "--model", str(saved / "ckpt"),
                 "--replay-routes", "--out", str(out)]) == 0
    rows = {r["side"]: r for r in json.loads((out / "report.json").read_text())["rows"]}
    assert rows["hf+routes"]["prefill"]["equal"] == 1.0 and rows["hf+routes"]["decode"]["equal"] == 1.0
    assert rows["hf"]["prefill"]["equal"] < 1.0
    assert all(name + "+routes" in rows for name in rows if not name.endswith("+routes"))
    assert V.load(out).routed  # the report folder keeps the routes: it can be scored again
    capsys.readouterr()


def test_every_replay_refusal_comes_before_the_work(saved, tmp_path, capsys):
    ckpt = str(saved / "ckpt")
    assert main(["verify", "--live", "--engine-outputs", str(saved / "plain"), "--model", ckpt, "--replay-routes",
                 "--out", str(tmp_path / "a")]) == 2
    assert "hold no routes" in capsys.readouterr().err
    assert main(["verify", "--model", ckpt, "--replay-routes"]) == 2
    assert "--replay-routes: only used with --live" in capsys.readouterr().err
    assert main(["verify", "--live", "--engine-outputs", str(saved / "run"), "--model", ckpt, "--replay-routes",
                 "--engine-forward", "--out", str(tmp_path / "b")]) == 2
    assert "--replay-routes with --engine-forward" in capsys.readouterr().err
    from rla.models import bundled_path

    bundled = str(bundled_path())
    assert main(["verify", "--live", "--model", bundled, "--replay-routes", "--out", str(tmp_path / "c")]) == 2
    assert "has no MoE block" in capsys.readouterr().err  # before vLLM is looked for
    assert not any((tmp_path / x).exists() for x in "abc")
