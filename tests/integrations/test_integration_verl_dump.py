"""rla.rollout.framework_dumps.read_verl on what verl 0.9.1 itself writes.

- A generation batch laid out as verl's agent loop lays it out (``AgentLoopWorker._postprocess``:
  prompts left-padded, responses right-padded, ``response_mask``, ``attention_mask``,
  ``position_ids``, ``rollout_log_probs``), built as verl's own ``DataProto`` and written with
  ``DataProto.save_to_disk``, the writer ``RolloutSkip`` dumps with. (The agent-loop module
  itself does not import in the low environment: ``verl.workers.rollout.router`` needs
  ``cachetools``, which verl does not declare.)
- A ``trainer.rollout_data_dir`` file written by verl's own ``RayPPOTrainer._write_generations``,
  read from verl's source and run as it is (its module does not import here, for the same reason):
  text only, which the reader refuses naming what is missing.
"""

from __future__ import annotations

import ast
import json
import os
from importlib.util import find_spec

import pytest
import torch

pytest.importorskip("verl", reason="the verl readers are tested where verl is installed (README)")

from verl.protocol import DataProto  # noqa: E402

from rla.rollout.framework_dumps import DumpFormatError, Sampling, read_verl  # noqa: E402

PROMPTS = [[5, 6, 7], [8, 9], [10, 11, 12, 13]]
RESPONSES = [[20, 21], [22, 23, 24, 25], [26]]
P, R, PAD = 4, 4, 0


def _batch(position_shift=0):
    g = torch.Generator().manual_seed(0)
    B = len(PROMPTS)
    prompts = torch.full((B, P), PAD)
    responses = torch.full((B, R), PAD)
    attn = torch.zeros(B, P + R, dtype=torch.int64)
    rmask = torch.zeros(B, R, dtype=torch.int64)
    for i, (p, r) in enumerate(zip(PROMPTS, RESPONSES)):
        prompts[i, P - len(p):] = torch.tensor(p)
        responses[i, :len(r)] = torch.tensor(r)
        attn[i, P - len(p):P + len(r)] = 1
        rmask[i, :len(r)] = 1
    position_ids = (torch.cumsum(attn, 1) - 1).clamp(min=0)
    position_ids[1] += position_shift
    roll = -torch.rand(B, R, generator=g) * rmask
    old = roll + 1e-3 * rmask
    return DataProto.from_dict(
        tensors={"prompts": prompts, "responses": responses, "response_mask": rmask, "attention_mask": attn,
                 "input_ids": torch.cat([prompts, responses], 1), "position_ids": position_ids,
                 "rollout_log_probs": roll, "old_log_probs": old},
        non_tensors={"__num_turns__": [2, 2, 2]}, meta_info={"temperature": 0.8}), roll, old


def test_a_saved_verl_batch_reads_into_records_with_the_actors_logprobs(tmp_path):
    data, roll, old = _batch()
    data.save_to_disk(tmp_path / "batch.pkl")
    dump = read_verl(tmp_path / "batch.pkl", Sampling(top_p=1.0, top_k=-1))
    assert [r.prompt_ids for r in dump.records] == PROMPTS
    assert [r.response_ids for r in dump.records] == RESPONSES
    for i, (rec, tl) in enumerate(zip(dump.records, dump.trainer_logprobs)):
        n = len(RESPONSES[i])
        assert rec.logprobs == roll[i, :n].double().tolist() and tl == old[i, :n].double().tolist()
        assert rec.temperature == 0.8  # verl's meta_info, the temperature its actor scores with
    assert dump.trainer_field == "old_log_probs" and dump.bad_positions == []
    assert dump.unused == {"__num_turns__": "non-tensor field, not part of a rollout record"}
    with pytest.raises(DumpFormatError, match="meta_info.temperature'.*0.8, the given one 1.0"):
        read_verl(tmp_path / "batch.pkl", Sampling(temperature=1.0, top_p=1.0, top_k=-1))


def test_position_ids_that_disagree_with_the_mask_are_named():
    from rla.rollout.framework_dumps import from_verl_batch

    data, _, _ = _batch(position_shift=1)
    assert from_verl_batch(data, Sampling(top_p=1.0, top_k=-1)).bad_positions == [1]


def test_a_batch_without_rollout_logprobs_is_refused_naming_the_switch(tmp_path):
    data, _, _ = _batch()
    data.batch.pop("rollout_log_probs")
    data.save_to_disk(tmp_path / "b.pkl")
    with pytest.raises(DumpFormatError, match="field 'rollout_log_probs'.*calculate_log_probs=True"):
        read_verl(tmp_path / "b.pkl", Sampling(top_p=1.0, top_k=-1))


def _write_generations():
    """verl's own ``RayPPOTrainer._write_generations``, from its source file."""
    path = os.path.join(find_spec("verl").submodule_search_locations[0], "trainer", "ppo", "ray_trainer.py")
    source = open(path).read()
    cls = next(n for n in ast.parse(source).body if isinstance(n, ast.ClassDef) and n.name == "RayPPOTrainer")
    fn = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "_write_generations")
    fn.decorator_list = []  # @staticmethod
    namespace = {"json": json, "os": os}
    exec(compile(ast.Module([fn], []), path, "exec"), namespace)
    return namespace["_write_generations"]


def test_rollout_data_dir_text_is_refused_naming_what_it_lacks(tmp_path):
    _write_generations()(["1+1="], ["2"], [None], [1.0], {"acc": [1.0]}, str(tmp_path), 3)
    line = json.loads((tmp_path / "3.jsonl").read_text())
    assert sorted(line) == ["acc", "gts", "input", "output", "score", "step"]  # what verl writes: text
    with pytest.raises(DumpFormatError, match=r"3.jsonl: field 'rollout_log_probs': a verl rollout_data_dir line "
                                              r"\(fields acc, gts, input, output, score, step\) holds decoded text"):
        read_verl(tmp_path / "3.jsonl", Sampling(top_p=1.0, top_k=-1))


def test_health_reads_verls_rollout_corr_as_verl_computes_them():
    from verl.trainer.ppo.rollout_corr_helper import compute_rollout_corr_metrics_from_logprobs

    from rla.diagnosis.health import health

    data, roll, old = _batch()
    mask = data.batch["response_mask"].bool()
    ours = {r.key: r.value for r in health([old[i][mask[i]] for i in range(3)], [roll[i][mask[i]] for i in range(3)])
            if r.framework == "verl"}
    theirs = compute_rollout_corr_metrics_from_logprobs(old.double(), roll.double(), mask)  # verl's code, in fp64
    for key in ("rollout_corr/k3_kl", "rollout_corr/kl"):
        assert ours[key] == pytest.approx(theirs[key], rel=1e-9), key
    # on its fp32 batch, verl's exp(x) - x - 1 cancels: k3 of 1e-3 deltas (5.0e-7) comes out 4.77e-7 = 2^-21
    fp32 = compute_rollout_corr_metrics_from_logprobs(old, roll, mask)["rollout_corr/k3_kl"]
    assert abs(fp32 - ours["rollout_corr/k3_kl"]) > 0.01 * ours["rollout_corr/k3_kl"]
