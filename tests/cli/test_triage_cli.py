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


def test_vllm_outputs_with_the_whole_vocabulary_report_the_exact_kl(tmp_path):
    """``--from vllm`` on RequestOutputs whose positions list all 64 tokens (logprobs=-1): the
    checkpoint's vocab_size marks them complete and the report's vocabulary KL is exact."""
    from types import SimpleNamespace

    engine = load_bundled_model()
    rla.align(engine, "vllm")
    outs = []
    for i, (prompt, resp) in enumerate((([1, 9, 14, 5], [20, 33, 7]), ([1, 30, 4], [11, 12, 40, 6]))):
        with torch.no_grad():
            q = engine(input_ids=torch.tensor([prompt + resp]), use_cache=False).logits[0, len(prompt) - 1:-1].float().log_softmax(-1)
        positions = [{v: float(q[j, v]) for v in range(q.shape[1])} for j in range(len(resp))]
        comp = SimpleNamespace(index=0, token_ids=resp, logprobs=positions, text="", cumulative_logprob=None)
        outs.append(SimpleNamespace(request_id=str(i), prompt_token_ids=prompt, outputs=[comp]))
    torch.save(outs, tmp_path / "outs.pt")
    out = tmp_path / "t.json"
    main(["triage", "--from", "vllm", str(tmp_path / "outs.pt"), "--model", "bundled", "--temperature", "1",
          "--top-p", "1", "--top-k", "-1", "--logprobs-mode", "processed_logprobs", "--alone", "0", "--json", str(out)])
    vocab = json.loads(out.read_text())["vocab_kl"]
    assert vocab["vocab_kl/kind"] == "exact" and vocab["vocab_kl/tokens"] == 7 and vocab["vocab_kl/records"] == 2
    assert 0 < vocab["vocab_kl/mean"] < 1e-2  # the aligned engine against HF's bf16 forward: rounding-sized
