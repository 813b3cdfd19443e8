"""Rollouts of stale weights are named, not read as rounding (issue 38, item 1's last case).

The policy one optimizer step earlier (Adam, lr 1e-5) leaves k3 inside the rounding scale on the
bundled model, so only the records' ``policy`` field (the fingerprint of the weights that sampled
them, rla.rollout.fingerprint) can tell it from rounding: ``rla diagnose`` compares it with the
checkpoint's before any forward. The fingerprint rule is checked against an independent
expression of its spec (bf16 rounding by integer arithmetic on the fp32 bits, hashlib, numpy).
"""

import copy
import dataclasses
import hashlib
import json

import numpy as np
import pytest
import torch

import rla.diagnosis.core as core
from rla.diagnosis.core import diagnose
from rla.diagnosis.report import to_markdown
from rla.rollout import rollouts
from rla.rollout.fingerprint import SAMPLE, weights_fingerprint
from rla.rollout.rollouts import RolloutFormatError, RolloutRecord
from bundled_rollouts import one_adam_step


def _bf16_bits(x: np.ndarray) -> np.ndarray:
    """fp32 -> bf16 bits, round to nearest even, by integer arithmetic (no torch)."""
    b = x.astype("<f4").view("<u4").astype(np.uint64)
    return ((b + 0x7FFF + ((b >> 16) & 1)) >> 16).astype("<u2")


def _spec(state: dict) -> str:
    digests = set()
    for t in state.values():
        if not t.is_floating_point():
            continue
        flat = t.detach().float().reshape(-1).numpy()
        n = flat.size
        k = min(n, SAMPLE)
        idx = [(i * n) // k for i in range(k)]
        digests.add(hashlib.sha256(("x".join(map(str, t.shape)) + ";").encode() + _bf16_bits(flat[idx]).tobytes()).digest())
    return "rla-weights/1:" + hashlib.sha256(b"".join(sorted(digests))).hexdigest()[:32]


def test_the_fingerprint_is_its_documented_rule():
    g = torch.Generator().manual_seed(0)
    state = {"w": torch.randn(300, 70, generator=g) * 0.02, "b": torch.randn(5, generator=g),
             "s": torch.tensor(1.5), "ids": torch.arange(7), "h": torch.randn(3, 4, generator=g).half()}
    assert weights_fingerprint(state) == _spec(state)
    # fp32 master and its bf16 copy agree; names do not count; a tied tensor listed twice counts once
    bf16 = {f"module.{k}": (v.to(torch.bfloat16) if v.is_floating_point() else v) for k, v in state.items()}
    assert weights_fingerprint(bf16) == weights_fingerprint(state) == weights_fingerprint(state | {"tied": state["w"]})
    moved = dict(state, w=state["w"].clone())
    moved["w"].view(-1)[(5 * 21000) // SAMPLE] += 0.01  # one sampled element
    assert weights_fingerprint(moved) != weights_fingerprint(state)


@pytest.mark.parametrize("bad, said", [
    ("x", "expected an object"), ({"weights": "rla-weights/1:" + "0" * 32, "epoch": 1}, "unknown key"),
    ({"step": 3}, "missing 'weights'"), ({"weights": "abc"}, "32 hex digits"),
    ({"weights": "rla-weights/1:" + "0" * 32, "step": -1}, "'step': expected an int >= 0"),
    ({"weights": "rla-weights/1:" + "0" * 32, "step": True}, "'step': expected an int >= 0")])
def test_the_policy_field_is_validated_naming_it(tmp_path, bad, said):
    good = RolloutRecord([1], [2], [-0.5], 1.0, 1.0, -1, "vllm", policy={"weights": "rla-weights/1:" + "a" * 32,
                                                                         "step": 4})
    rollouts.save(tmp_path / "r.jsonl", [good])
    assert rollouts.load(tmp_path / "r.jsonl")[0].policy == good.policy
    line = json.loads((tmp_path / "r.jsonl").read_text()) | {"policy": bad}
    (tmp_path / "r.jsonl").write_text(json.dumps(line) + "\n")
    with pytest.raises(RolloutFormatError, match=f"r.jsonl:1: field 'policy': .*{said}"):
        rollouts.load(tmp_path / "r.jsonl")


@pytest.fixture(scope="module")
def clean(bundled):
    """Four short rollouts of rla's sampler on the bundled model's own weights (the verdicts here
    read only the records' policy field; no forward measures them)."""
    from rla.rollout.sampler import Sampler, SamplingParams

    model, prompts = bundled
    return Sampler(model, "vllm").generate(prompts[:4], SamplingParams(max_new_tokens=8, seed=0))


@pytest.fixture(scope="module")
def stepped(bundled, clean):
    """The checkpoint one Adam step (lr 1e-5) after the weights that sampled ``clean``."""
    return one_adam_step(bundled[0], clean)


def test_one_adam_step_changes_the_bundled_models_fingerprint(bundled, clean, stepped):
    model, _ = bundled
    assert all(r.policy == {"weights": weights_fingerprint(model)} for r in clean)  # the sampler's own weights
    assert weights_fingerprint(stepped) != weights_fingerprint(model)
    assert weights_fingerprint(copy.deepcopy(model).float()) == weights_fingerprint(model)  # master == bf16 copy


def _no_forward(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("a forward ran before the stale_weights verdict")
    monkeypatch.setattr(core, "forward_pass", refuse)
    monkeypatch.setattr(core, "fp32_reference", refuse)


def test_rollouts_of_the_policy_one_step_earlier_are_named_before_any_forward(clean, stepped, monkeypatch):
    _no_forward(monkeypatch)
    d = diagnose(stepped, clean, "vllm", regions=("rope",), detect=False)
    assert not d.verdict.ok and (d.verdict.kind, d.verdict.cause) == ("beyond_rounding", "stale_weights")
    assert "within what rounding produces" not in d.verdict.message and "4 name weights" in d.verdict.message
    assert d.verdict.flagged == list(range(4)) and d.verdict.ratio is None
    assert d.policy.checkpoint == weights_fingerprint(stepped) and d.policy.carried == 4
    md = to_markdown(d)
    assert "NOT ROUNDING" in md and "Shapley" not in md
    json.dumps(d.to_dict(), allow_nan=False)


def test_mixed_checkpoints_are_named_with_the_steps_they_record(bundled, clean, stepped, monkeypatch):
    _no_forward(monkeypatch)
    model, _ = bundled
    later = [dataclasses.replace(r, policy={"weights": weights_fingerprint(stepped), "step": 1}) for r in clean[2:]]
    d = diagnose(model, clean[:2] + later, "vllm", regions=("rope",), detect=False)
    assert d.verdict.cause == "stale_weights" and d.verdict.flagged == [2, 3]
    assert "2 different weights" in d.verdict.message and "(step 1)" in d.verdict.message


def test_a_fingerprint_of_another_rule_is_refused(bundled, clean):
    bad = [dataclasses.replace(r, policy={"weights": "rla-weights/2:" + "0" * 32}) for r in clean]
    with pytest.raises(ValueError, match=r"record 0, field 'policy'.*rule 'rla-weights/2'"):
        diagnose(bundled[0], bad, "vllm", regions=("rope",), detect=False)


def test_cli_exits_3_on_stale_weights(clean, stepped, tmp_path, capsys):
    from rla.cli import main

    stepped_dir = tmp_path / "ckpt"
    stepped.save_pretrained(stepped_dir)
    from rla.models import bundled_path

    for f in bundled_path().iterdir():  # the tokenizer and task files beside the stepped weights
        if not (stepped_dir / f.name).exists() and f.is_file():
            (stepped_dir / f.name).write_bytes(f.read_bytes())
    rollouts.save(tmp_path / "r.jsonl", clean)
    assert main(["diagnose", "--model", str(stepped_dir), "--rollouts", str(tmp_path / "r.jsonl"), "--profile", "vllm",
                 "--out", str(tmp_path / "rep")]) == 3
    out = capsys.readouterr().out.replace("\n", " ")
    assert "other weights than this checkpoint" in out and "within what rounding produces" not in out
    rep = json.loads((tmp_path / "rep" / "report.json").read_text())
    assert rep["verdict"]["cause"] == "stale_weights" and rep["policy_check"]["stale"] is True
    assert sorted(p.name for p in (tmp_path / "rep").iterdir() if not p.name.startswith(".")) == ["report.json",
                                                                                                 "report.md"]


def test_the_sampler_records_the_step_it_was_given(bundled):
    from rla.rollout.sampler import Sampler

    model, prompts = bundled
    s = Sampler(model, "vllm", step=0)
    assert s.policy == {"weights": weights_fingerprint(model), "step": 0}
    m2 = copy.deepcopy(model)
    with torch.no_grad():
        next(m2.parameters()).mul_(1.5)
    s.load_weights(m2, step=7)
    from rla.rollout.sampler import SamplingParams

    r = s.generate(prompts[:1], SamplingParams(max_new_tokens=2, seed=0))[0]
    assert r.policy == {"weights": weights_fingerprint(m2), "step": 7} and r.policy["weights"] != weights_fingerprint(model)
    with pytest.raises(ValueError, match="step must be an int >= 0"):
        s.load_weights(m2, step=-1)
