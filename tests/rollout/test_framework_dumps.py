"""rla.rollout.framework_dumps on the frameworks' own objects: vLLM's logprob containers and
OpenRLHF's Experience, built by the packages' own code, read back into records exactly.

vLLM 0.26: ``vllm/logprobs.py`` (``Logprob``, ``FlatLogprobs``, ``create_sample_logprobs``,
``append_logprobs_for_next_position``, what vLLM's ``LogprobsProcessor`` fills) is loaded from the
wheel and runs on CPU. ``RequestOutput`` / ``CompletionOutput`` (``vllm/outputs.py``) do not
import without vLLM's runtime dependencies (``vllm.lora.request`` needs ``msgspec``), so the
requests here are namespaces with their attribute names, holding vLLM's own logprob objects.

OpenRLHF 0.11.2: ``SamplesGenerator._process_response_into_experience`` (its one place that turns
an engine response into an ``Experience``) imports Ray and vLLM at the top of its module, which
are registered as empty modules for the import only (it calls neither here), and batched with
``Experience.concat_experiences``, OpenRLHF's own merge.
"""

from __future__ import annotations

import importlib.machinery
import sys
import types
import zipfile
from types import SimpleNamespace

import pytest
import torch

from rla.rollout.framework_dumps import DumpFormatError, Sampling, from_openrlhf, from_trl_rollout, from_vllm

S = Sampling(temperature=0.7, top_p=0.9, top_k=-1)


def _vllm_logprobs_module(wheel):
    with zipfile.ZipFile(wheel) as z:
        source = z.read("vllm/logprobs.py").decode()
    module = types.ModuleType("vllm_logprobs_from_wheel")
    sys.modules[module.__name__] = module  # dataclasses resolve annotations through it
    try:
        exec(compile(source, f"{wheel}!vllm/logprobs.py", "exec"), module.__dict__)
    finally:
        del sys.modules[module.__name__]
    return module


@pytest.mark.parametrize("flat", [False, True])
def test_vllm_request_outputs_read_exactly(vllm_uncalibrated_wheel, flat):
    L = _vllm_logprobs_module(vllm_uncalibrated_wheel)
    g = torch.Generator().manual_seed(0)
    outs = []
    for r in range(3):
        comps = []
        for c in range(2):
            ids = torch.randint(0, 50, (4 + c,), generator=g).tolist()
            lps = (-torch.rand(len(ids), generator=g, dtype=torch.float64) * 3).tolist()
            sample = L.create_sample_logprobs(flat)
            for tok, lp in zip(ids, lps):  # the sampled token first, then one top-1 alternative (logprobs=1)
                L.append_logprobs_for_next_position(sample, [tok, 99], [lp, -0.01], [None, None], 3, 1)
            comps.append(SimpleNamespace(index=c, token_ids=ids, logprobs=sample, text="", cumulative_logprob=None))
        outs.append(SimpleNamespace(request_id=str(r), prompt_token_ids=[1, 2, r + 3], outputs=comps))
    dump = from_vllm(outs, S, logprobs_mode="processed_logprobs")
    assert len(dump.records) == 6
    rec = dump.records[3]  # request 1, completion 1
    assert rec.prompt_ids == [1, 2, 4] and rec.response_ids == list(outs[1].outputs[1].token_ids)
    want = [outs[1].outputs[1].logprobs[j][t].logprob for j, t in enumerate(rec.response_ids)]
    assert rec.logprobs == want and rec.metadata["logprobs_mode"] == "processed_logprobs"
    assert (rec.temperature, rec.top_p, rec.top_k) == (0.7, 0.9, -1)

    outs[0].outputs[0].logprobs = None
    with pytest.raises(DumpFormatError, match=r"row 0: field 'logprobs': None: sample with SamplingParams\(logprobs=0\)"):
        from_vllm(outs, S)


@pytest.mark.parametrize("flat", [False, True])
def test_vllm_top_logprobs_and_prompt_logprobs_become_the_records_top_logprobs(vllm_uncalibrated_wheel, flat):
    """logprobs=k / prompt_logprobs=k as vLLM's LogprobsProcessor stores them (the sampled token,
    then the top k); logprobs=-1 over a vocabulary of 6 is complete; logprobs=0 gives no field."""
    L = _vllm_logprobs_module(vllm_uncalibrated_wheel)
    V = 6
    g = torch.Generator().manual_seed(1)

    def position(container, sampled, k):
        lp = torch.randn(V, generator=g, dtype=torch.float64).log_softmax(-1)
        order = lp.argsort(descending=True).tolist()
        top = order if k == -1 else order[:k]
        L.append_logprobs_for_next_position(container, [sampled, *top], [float(lp[sampled]), *map(float, lp[top])],
                                            [None] * (1 + len(top)), order.index(sampled) + 1, k)
        return {t: float(lp[t]) for t in [sampled, *top]}

    outs, want = [], []
    for k in (3, -1, 0):
        ids, prompt = [2, 5, 1], [4, 0, 3, 3]
        sample, prompt_lps = L.create_sample_logprobs(flat), L.create_prompt_logprobs(flat)
        want.append(([position(sample, t, k) for t in ids], [position(prompt_lps, t, k) for t in prompt[1:]]))
        comp = SimpleNamespace(index=0, token_ids=ids, logprobs=sample, text="", cumulative_logprob=None)
        outs.append(SimpleNamespace(request_id=str(k), prompt_token_ids=prompt, outputs=[comp],
                                    prompt_logprobs=prompt_lps))
    recs = from_vllm(outs, S, logprobs_mode="processed_logprobs", vocab_size=V).records
    for rec, (resp, prm), complete in zip(recs[:2], want[:2], (False, True)):
        top = rec.top_logprobs
        assert top["version"] == 1 and top["complete"] is complete
        assert [dict(map(tuple, pos)) for pos in top["response"]] == resp
        assert [dict(map(tuple, pos)) for pos in top["prompt"]] == prm
    assert recs[2].top_logprobs is None  # logprobs=0: the sampled token alone, the record as before
    assert from_vllm(outs[:1], S).records[0].top_logprobs["complete"] is False  # no vocab_size: a bound


def test_missing_sampling_settings_are_named():
    with pytest.raises(DumpFormatError, match="field 'top_p'.*sampling settings top_p, top_k"):
        from_vllm([], Sampling(temperature=1.0))


def _openrlhf_process():
    """OpenRLHF's own response -> Experience step, imported with Ray and vLLM as empty modules."""
    pytest.importorskip("openrlhf")
    stubs = {"ray": {}, "vllm": {"SamplingParams": object},
             "openrlhf.trainer.ray": {}, "openrlhf.trainer.ray.vllm_engine": {"batch_vllm_engine_call": None}}
    added = [n for n in stubs if n not in sys.modules]
    for n in added:
        m = types.ModuleType(n)
        m.__spec__ = importlib.machinery.ModuleSpec(n, None)
        m.__dict__.update(stubs[n])
        sys.modules[n] = m
    try:
        from openrlhf.trainer.ppo_utils.samples_generator import SamplesGenerator
        from openrlhf.trainer.ppo_utils.experience import Experience
    finally:
        for n in added:
            del sys.modules[n]
        sys.modules.pop("openrlhf.trainer.ppo_utils.samples_generator", None)
    return SamplesGenerator._process_response_into_experience, Experience


def test_openrlhf_experiences_read_exactly():
    process, Experience = _openrlhf_process()
    g = torch.Generator().manual_seed(1)
    responses, want = [], []
    for i in range(3):
        prompt = torch.randint(1, 60, (3 + i,), generator=g).tolist()
        action = torch.randint(1, 60, (5 - i,), generator=g).tolist()
        lps = (-torch.rand(len(action), generator=g) * 2).tolist()
        # OpenRLHF's agent (utils/agent.py): one logprob per observation token, 0.0 on the prompt
        responses.append({"observation_tokens": prompt + action, "action_ranges": [(len(prompt), len(prompt) + len(action))],
                          "rollout_log_probs": [0.0] * len(prompt) + lps, "reward": float(i), "prompt": "p", "label": "l"})
        want.append((prompt, action, torch.tensor(lps).tolist()))
    exps = [process(None, r, max_len=64) for r in responses]
    batch = Experience.concat_experiences(exps, pad_token_id=0)
    batch.action_log_probs = batch.rollout_log_probs + 1e-3 * batch.action_mask
    dump = from_openrlhf(batch, S)
    for rec, (prompt, action, lps), trainer in zip(dump.records, want, dump.trainer_logprobs):
        assert rec.prompt_ids == prompt and rec.response_ids == action and rec.logprobs == lps
        assert trainer == pytest.approx([x + 1e-3 for x in lps], abs=1e-6)
    assert [r.reward for r in dump.records] == [0.0, 1.0, 2.0]
    assert dump.trainer_field == "action_log_probs" and "info" in dump.unused


def test_openrlhf_multi_turn_holes_are_refused_naming_the_row():
    process, _ = _openrlhf_process()
    r = {"observation_tokens": list(range(1, 12)), "action_ranges": [(3, 5), (8, 11)],
         "rollout_log_probs": [-0.5] * 11, "reward": 0.0, "prompt": "p", "label": "l"}
    with pytest.raises(DumpFormatError, match=r"row 0: field 'action_mask': .*not one run \(multi-turn"):
        from_openrlhf(process(None, r, max_len=64), S)


def test_trl_rollout_func_output_and_its_nan_tokens(tmp_path):
    out = {"prompt_ids": [[1, 2], [3]], "completion_ids": [[4, 5], [6]], "logprobs": [[-0.1, -0.2], [-0.3]],
           "env_mask": [[1, 1], [1]]}
    dump = from_trl_rollout(out, S)
    assert [r.logprobs for r in dump.records] == [[-0.1, -0.2], [-0.3]]
    assert dump.unused == {"env_mask": "rollout_func extra field, not part of a rollout record"}
    import json

    from rla.rollout.framework_dumps import read

    path = tmp_path / "rollout.json"
    path.write_text(json.dumps(out))
    assert [r.response_ids for r in read("trl", path, S).records] == [[4, 5], [6]]
    out["logprobs"][1] = [None]  # how vLLM hands TRL a token it could not score
    with pytest.raises(DumpFormatError, match="row 1: field 'logprobs': NaN logprob"):
        from_trl_rollout(out, S)
