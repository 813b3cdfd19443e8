"""The model-level search (rla.engines.live_calibration) against a stand-in engine whose row is
known: a small Qwen2 aligned under a calibrated row produces the "engine" logprobs, and the search
must find a row that reproduces them bit for bit, deciding every point the model exercises as that
row has it. Norm weights are drawn around 1 (HF initialises them to 1, where per_op and fused
norms coincide and the norm points could not be decided)."""

import pytest
import torch

from rla import profiles
from rla.alignment import aligned
from rla.engines import live_calibration as L
from rla.models import build_model, tiny_config
from rla.rollout.rollouts import RolloutRecord


@pytest.fixture(scope="module")
def model():
    m = build_model(tiny_config("qwen2", num_hidden_layers=2), torch.bfloat16, seed=0).eval()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in m.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.2 * torch.randn(p.shape, generator=g))
    return m


def _engine(model, row, prompt, response):
    with aligned(model, row):
        pre = [L.train_logprobs(model, prompt).tolist()]
        full = L.train_logprobs(model, prompt[:24] + response)[23:].tolist()
    rec = RolloutRecord(prompt_ids=prompt[:24], response_ids=response, logprobs=full, temperature=1.0,
                        top_p=1.0, top_k=-1, engine="vllm")
    return pre, [rec]


def test_the_search_finds_the_row_that_made_the_engine_logprobs(model):
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, model.config.vocab_size, (64,), generator=g).tolist()
    response = torch.randint(0, model.config.vocab_size, (8,), generator=g).tolist()
    truth = profiles.get("vllm-0.33-eager")
    pre, records = _engine(model, truth, prompt, response)
    start = profiles.get("vllm-0.33")
    assert L.score(model, start, [prompt], pre, records)["prefill"]["equal"] < 0.5  # the start is wrong
    best, s, tried, flips = L.search(model, start, [prompt], pre, records, log=lambda m: None)
    assert s["prefill"]["equal"] == 1.0 and s["prefill"]["k3"] == 0.0
    # a point the prefill leaves tied may still differ on the decode record: not asserted equal
    decided = {p for p, f in flips.items() if f.get("decided")}
    assert {"rope_apply", "swiglu", "norm_weight", "norm_residual", "residual_stream"} <= decided
    assert all(getattr(best, p) == getattr(truth, p) for p in decided)
    assert not flips["qk_norm_out"]["decided"]  # Qwen2 has no q/k norms: the point ties
    assert len(tried) > len(profiles.POINTS)


def test_stats_count_bit_equality_and_k3_in_fp64():
    t = [torch.tensor([-1.0, -2.0, -3.0], dtype=torch.float64)]
    e = [torch.tensor([-1.0, -2.5, -3.0], dtype=torch.float64)]
    s = L.stats(t, e, [0])
    assert s["equal"] == pytest.approx(2 / 3) and s["max_abs"] == 0.5
    d = torch.tensor(0.5, dtype=torch.float64)
    assert s["k3"] == pytest.approx(float(torch.exp(d) - 1 - d) / 3, rel=1e-15)
    assert list(s["by_position"]) == ["0-1024"]


def test_variant_points_are_offered_to_the_families_that_have_them():
    from types import SimpleNamespace

    def of(model_type):
        return L.variant_points(SimpleNamespace(config=SimpleNamespace(model_type=model_type)))

    assert of("gemma3_text") == ("zero_centred_norm", {"post_norm_out": ("round", "fp32")})
    assert of("gemma4_text") == ("gemma4", {"post_norm_out": ("round", "fp32")})
    assert of("qwen3_5_text") == of("qwen3_5_moe_text") == ("qwen3_5", {"attn_gate": ("per_op", "fused")})
    for model_type, kind in (("qwen2", None), ("gpt_oss", "gpt_oss"), ("nope", None)):
        assert of(model_type) == (kind, {}), model_type


def test_the_search_decides_gemmas_post_norm_out_and_the_row_carries_it():
    """A tiny Gemma 3 aligned under vllm-0.33 (post_norm_out='fp32') is the engine; the search starts
    from the row with the post-norms rounded and finds fp32 in the zero_centred_norm variant, decided
    by its flip; the written row has it there with live evidence and keeps the start's other variants."""
    from gemma_spec import tiny_gemma3
    from rla.engines.live_profile import live_row, settle

    model = tiny_gemma3()
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, model.config.vocab_size, (40,), generator=g).tolist()
    response = torch.randint(0, model.config.vocab_size, (6,), generator=g).tolist()
    truth = profiles.get("vllm-0.33")
    pre, records = _engine(model, truth, prompt, response)
    start = truth.replace_variant("zero_centred_norm", name="start", post_norm_out="round")
    best, s, tried, flips = L.search(model, start, [prompt], pre, records, log=lambda m: None)
    assert s["prefill"]["equal"] == 1.0
    assert best.variant("zero_centred_norm").post_norm_out == "fp32"
    assert flips["post_norm_out"]["kind"] == "zero_centred_norm" and flips["post_norm_out"]["decided"]
    assert all("post_norm_out" in t["points"] for t in tried)
    best, s = settle(model, start, best, s, flips, [prompt], pre, records)
    row = live_row({"name": "vllm", "version": "0.33.0", "mode": "default"}, start, tried[0], best, s, flips,
                   {"family": "gemma3_text"}, date="d", gpu="cpu", torch="t", command="c", name="vllm-0.33-test")
    assert row.variants["zero_centred_norm"]["post_norm_out"] == "fp32"
    assert row.variant_evidence["zero_centred_norm"]["post_norm_out"].evidence == "live"
    assert row.variants["gpt_oss"] == truth.variants["gpt_oss"]  # the start's other variants, with their evidence
    assert profiles.from_dict(profiles.to_dict(row)).variant("zero_centred_norm").post_norm_out == "fp32"
    from rla.commands.calibrate_live import summary

    assert "| post_norm_out (zero_centred_norm) | round | fp32 | live |" in summary(row, start)
