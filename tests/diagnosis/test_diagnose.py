"""Diagnosis on the bundled model: attribution, detection, doctor, reports, CLI."""

import dataclasses
import json
import math

import pytest
from profile_rows import DISTINCT
import torch

import rla
from rla import profiles
from rla.rollout import rollouts
from rla.diagnosis.core import detect_profile, diagnose
from rla.diagnosis.doctor import doctor, inv_freq_angle_error
from rla.diagnosis.report import to_markdown, write_report
from rla.models import bundled_path
from rla.rl.bundled import bundled_task, load_bundled
from rla.rollout.sampler import Sampler, SamplingParams
from rla.rollout.train_logprobs import logprobs


@pytest.fixture(scope="module")
def bundled():
    torch.manual_seed(0)
    model, tok = load_bundled()
    task = bundled_task()
    problems = task.sample(0, 12)
    prompts = [[tok.bos_token_id] + tok(p.prompt, add_special_tokens=False)["input_ids"] for p in problems]
    return model, prompts


def sample(model, prompts, profile, seed=0):
    return Sampler(model, profile).generate(prompts, SamplingParams(max_new_tokens=48, seed=seed))


@pytest.mark.parametrize("region,changes", [
    ("rope", dict(rope_apply="fused")),
    ("swiglu", dict(swiglu="fused")),
    ("rmsnorm", dict(norm_weight="fused", norm_residual="fp32_sum")),
])
def test_attribution_finds_the_one_perturbed_region(bundled, region, changes):
    """Rollouts from a stack that differs from HF eager in one region only: the attribution puts
    that region first with all of the share, the others get exactly zero (aligning them to a
    point equal to HF's changes nothing), and the Shapley values sum to m(none) - m(all).

    The records' logprobs are the perturbed stack's own teacher-forced forward of the sampled
    tokens, so aligning every region reproduces them bit for bit (m(all) = 0) and the answer does
    not depend on the CPU's kernels. With the sampler's own (decode) logprobs, a decode-vs-prefill
    difference of this CPU's GEMMs is added to every subset alike; its size moves with the CPU
    (the swiglu share was above a quarter of m(none) on the CPU this test was first written on, 18% on
    an Intel AVX-512 Xeon)."""
    model, prompts = bundled
    prof = dataclasses.replace(profiles.get("hf"), name=f"hf-but-{region}", **changes)
    recs = sample(model, prompts, prof)
    with rla.aligned(model, profile=prof):
        mu = logprobs(model, recs)
    recs = [dataclasses.replace(r, logprobs=[float(x) for x in m]) for r, m in zip(recs, mu)]
    d = diagnose(model, recs, prof, detect=False)
    for metric in ("mismatch/k3", "mismatch/abs/mean"):
        phi = d.attribution[metric]
        total = d.metrics["none"][metric] - d.metrics["all"][metric]
        assert d.metrics["all"][metric] == 0.0 and total > 0
        assert math.isclose(sum(phi.values()), total, rel_tol=1e-9, abs_tol=1e-15)
        assert max(phi, key=phi.get) == region
        assert all(phi[r] == 0.0 for r in phi if r != region)
        assert phi[region] == pytest.approx(total, rel=1e-9)  # all of what alignment explains


def test_detection_names_the_rollout_profile(bundled):
    model, prompts = bundled
    """The lowest-k3 row is the one that sampled the rollouts, and detection never names a wrong
    row with confidence. On 12 sequences of this tiny model nothing is called (z 1.0-1.3; two
    standard errors are needed), and one row is not even ranked first: the sampler's decode (KV
    cache, one token per step) differs from the teacher-forced forward by more under
    vllm-0.33-eager's fused norm weight than the rows differ (k3 7.1e-5 against 3.0e-5 to
    vllm-0.33; the same 7.1e-5 under the code before the row existed). Detection must say it cannot
    tell, not guess."""
    for name in DISTINCT:  # each way of rounding once: equal rows are one group in the ranking
        det = detect_profile(model, sample(model, prompts, name, seed=1))
        assert name in det.best or not det.called, f"rollouts from {name} confidently detected as {det.best}"
        if name not in ("vllm-0.33-eager", "vllm-0.26-eager"):  # the same points: one group
            assert name in det.best, f"rollouts from {name} detected as {det.best}: {det.ranking}"
        if name in ("sglang-0.5.23", "rla"):  # identical rounding points: reported together
            assert det.best == ("sglang-0.5.23", "rla") and det.best_label == "sglang-0.5.23 = rla"


def test_report_files_and_markdown(bundled, tmp_path):
    model, prompts = bundled
    recs = sample(model, prompts, "vllm")
    for i in (0, 1):  # two records carry their sampler's top-3 per token: the report gives the vocabulary KL's bound
        r = recs[i]
        with torch.no_grad():
            q = model(input_ids=torch.tensor([r.prompt_ids + r.response_ids]), use_cache=False).logits[0]
        top = q[len(r.prompt_ids) - 1:-1].float().log_softmax(-1).topk(3, -1)
        lists = [[[int(t), float(v)] for t, v in zip(ix, vs)] for ix, vs in zip(top.indices, top.values)]
        recs[i] = dataclasses.replace(r, top_logprobs={"version": 1, "complete": False, "response": lists})
    d = diagnose(model, recs, "vllm", detect=False)
    assert d.vocab["vocab_kl/records"] == 2 and d.vocab["vocab_kl/kind"] == "lower_bound"
    assert d.vocab["vocab_kl/tokens"] == len(recs[0].response_ids) + len(recs[1].response_ids)
    assert "Full-vocabulary KL(engine || trainer)" in to_markdown(d) and "a lower bound" in to_markdown(d)
    files = {p.name for p in write_report(d, tmp_path)}
    assert files == {"report.json", "report.md", "per_position.png", "ratio_hist.png", "attribution.png"}
    data = json.loads((tmp_path / "report.json").read_text())
    assert set(data["metrics"]) == {"none", "rope", "swiglu", "rmsnorm", "rope+swiglu", "rope+rmsnorm", "swiglu+rmsnorm", "all"}
    assert data["metrics"]["all"]["mismatch/k3"] < data["metrics"]["none"]["mismatch/k3"]
    assert data["vocab_kl"]["vocab_kl/records"] == 2 and "vocab_kl/per_token" not in data["vocab_kl"]
    assert "Shapley" in to_markdown(d)
    assert all((tmp_path / f).stat().st_size > 1000 for f in files)


def test_diagnose_refuses_an_aligned_model_and_bad_regions(bundled):
    model, prompts = bundled
    recs = sample(model, prompts[:2], "vllm")
    with rla.aligned(model, "vllm"):
        with pytest.raises(ValueError, match="unalign"):
            diagnose(model, recs, "vllm")
    with pytest.raises(ValueError, match="regions"):
        diagnose(model, recs, "vllm", regions=("attention",))
    with pytest.raises(ValueError, match="at least one"):
        diagnose(model, [], "vllm")


def test_doctor_flags_bf16_inv_freq_with_its_angle_error():
    from transformers import AutoModelForCausalLM

    path = str(bundled_path())
    clean = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16, local_files_only=True)
    assert doctor(clean) == []
    cast = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, local_files_only=True).to(torch.bfloat16)
    hazards = doctor(cast)
    assert [h.name for h in hazards] == ["low-precision inv_freq"]
    # independent: the angle error of a bf16 inv_freq at position p, in fp64, for theta and head dim
    cfg = cast.config
    d = cfg.hidden_size // cfg.num_attention_heads
    theta = cfg.rope_parameters["rope_theta"]
    inv32 = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
    want = (1000 * (inv32.to(torch.bfloat16).double() - inv32.double())).abs().max().item()
    assert inv_freq_angle_error(cast.model.rotary_emb, 1000) == pytest.approx(want, rel=1e-12)
    assert want > 0.1  # radians: the hazard is large, not a rounding curiosity
    assert f"{inv_freq_angle_error(cast.model.rotary_emb, cfg.max_position_embeddings):.3g} rad" in hazards[0].detail
    rla.align(cast, "vllm")  # alignment recomputes an fp32 inv_freq
    assert doctor(cast) == []
    rla.unalign(cast)


def test_doctor_tf32_hazard():
    model, _ = load_bundled()
    torch.set_float32_matmul_precision("high")
    try:
        assert "TF32 matmul precision" in [h.name for h in doctor(model)]
    finally:
        torch.set_float32_matmul_precision("highest")
    assert doctor(model) == []


def test_cli_diagnose_and_doctor(bundled, tmp_path, capsys):
    from rla.cli import main

    model, prompts = bundled
    rollouts.save(tmp_path / "r.jsonl", sample(model, prompts[:6], "vllm"))
    out = tmp_path / "report"
    assert main(["diagnose", "--model", str(bundled_path()), "--rollouts", str(tmp_path / "r.jsonl"),
                 "--profile", "vllm", "--out", str(out)]) == 0
    assert (out / "report.md").is_file()
    assert main(["diagnose", "--model", str(tmp_path / "nope"), "--rollouts", str(tmp_path / "r.jsonl")]) == 2
    assert "no such folder" in capsys.readouterr().err
    (tmp_path / "bad.jsonl").write_text('{"format": "rla.rollout/1", "prompt_ids": [1]\n')
    assert main(["diagnose", "--model", str(bundled_path()), "--rollouts", str(tmp_path / "bad.jsonl")]) == 2
    assert "line 1" in capsys.readouterr().err
    assert main(["doctor"]) == 0
    assert main(["doctor", "--cast-bf16"]) == 1
    assert "low-precision" in capsys.readouterr().out  # the hazard's name (rich may fold the cell)
