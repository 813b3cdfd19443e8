"""``rla triage``: the dump is read and its problems named before any model is loaded; a broken
input's verdict is the exit status and the JSON report."""

from __future__ import annotations

import dataclasses
import json

import torch

import rla
from rla.cli import main
from rla.models import load_bundled_model
from rla.rollout import rollouts
from rla.rollout.train_logprobs import logprobs


def test_missing_sampling_settings_exit_2_before_the_model(tmp_path, capsys):
    path = tmp_path / "outs.pt"
    torch.save([], path)
    assert main(["triage", "--from", "vllm", str(path), "--model", str(tmp_path / "absent"), "--temperature", "1"]) == 2
    assert "field 'top_p'" in capsys.readouterr().err


def test_shifted_records_exit_10_with_the_evidence(tmp_path):
    engine = load_bundled_model()
    rla.align(engine, "vllm")
    g = torch.Generator().manual_seed(0)
    recs = [rollouts.RolloutRecord(prompt_ids=[1] + torch.randint(3, 60, (5,), generator=g).tolist(),
                                   response_ids=torch.randint(3, 60, (8,), generator=g).tolist(), logprobs=[-1.0] * 8,
                                   temperature=1.0, top_p=1.0, top_k=-1, engine="vllm") for _ in range(4)]
    recs = [dataclasses.replace(r, logprobs=lp.double().tolist()) for r, lp in zip(recs, logprobs(engine, recs))]
    shifted = [dataclasses.replace(r, response_ids=r.response_ids[:-1], logprobs=r.logprobs[1:]) for r in recs]
    rollouts.save(tmp_path / "r.jsonl", shifted)
    out = tmp_path / "t.json"
    code = main(["triage", "--from", "rla", str(tmp_path / "r.jsonl"), "--model", "bundled", "--alone", "0",
                 "--json", str(out)])
    report = json.loads(out.read_text())
    assert (code, report["verdict"]) == (10, "shifted_positions"), report
    shift = report["findings"][0]
    assert shift["check"] == "shift" and shift["evidence"]["k3_shifted_+1"] * 4 <= shift["evidence"]["k3_unshifted_same_tokens_+1"]
