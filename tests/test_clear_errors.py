"""Inputs that used to end in a traceback, or be taken silently, now get a clear error naming the
problem (issue 38, item 6). The fuzz versions are in tests/test_fuzz.py; docs/diagnosis.md's
bad-input table lists what each case gives (tests/diagnosis/bad_input_cases.py)."""

import json
import shutil

import pytest
import torch

from rla.cli import main
from rla.models import bundled_path
from rla.rollout import rollouts

GOOD = {"format": "rla.rollout/1", "prompt_ids": [1, 2], "response_ids": [3], "logprobs": [-0.5],
        "temperature": 1.0, "top_p": 1.0, "top_k": -1, "engine": "vllm"}
BIG = 10**400


def _load_line(tmp_path, line: str):
    path = tmp_path / "r.jsonl"
    path.write_text(line + "\n")
    return rollouts.load(path, vocab_size=64)


@pytest.mark.parametrize("field,value,message", [
    ("temperature", BIG, "field 'temperature': expected a finite number, got 1000"),
    ("top_p", -BIG, "field 'top_p': expected a finite number, got -1000"),
    ("reward", BIG, "field 'reward': expected a finite number"),
    ("logprobs", [-BIG], "field 'logprobs': element 0 is -1000"),
    ("top_k", BIG, "field 'top_k': must be an int >= 1 (at most 2147483647)"),
], ids=["temperature", "top_p", "reward", "logprobs", "top_k"])
def test_a_400_digit_number_in_a_numeric_field_is_a_format_error(tmp_path, field, value, message):
    with pytest.raises(rollouts.RolloutFormatError, match="r.jsonl:1: ") as e:
        _load_line(tmp_path, json.dumps({**GOOD, field: value}))
    assert message in str(e.value) and ("(401 chars)" in str(e.value) or "(402 chars)" in str(e.value))  # cut short
    path = tmp_path / "ids.jsonl"
    path.write_text(json.dumps({**GOOD, "prompt_ids": [BIG]}) + "\n")
    with pytest.raises(rollouts.RolloutFormatError, match="out of range for a token id"):
        rollouts.load(path)  # no vocab_size to compare with: still refused


def test_deeply_nested_metadata_is_a_format_error_not_a_recursion_error(tmp_path):
    deep = "{\"a\":" * 100_000 + "1" + "}" * 100_000
    with pytest.raises(rollouts.RolloutFormatError, match=r"r.jsonl:1: not valid JSON: nested more than 200"):
        _load_line(tmp_path, json.dumps(GOOD)[:-1] + ',"metadata":' + deep + "}")
    nested: dict = {}
    for _ in range(5000):
        nested = {"a": nested}
    rec = rollouts.RolloutRecord(**{k: v for k, v in GOOD.items() if k != "format"}, metadata=nested)
    with pytest.raises(rollouts.RolloutFormatError, match="record 0: field 'metadata': nested too deeply"):
        rollouts.save(tmp_path / "o.jsonl", [rec])
    assert not (tmp_path / "o.jsonl").exists()


def test_a_duplicate_json_key_is_refused_naming_the_key_and_line(tmp_path):
    line = json.dumps(GOOD)[:-1] + ', "temperature": 0.5}'
    with pytest.raises(rollouts.RolloutFormatError, match=r"r.jsonl:1: key 'temperature' appears twice"):
        _load_line(tmp_path, line)
    from rla.profiles import registry

    text = json.dumps(registry.to_dict(registry.get("vllm")), indent=1)
    path = tmp_path / "p.json"
    path.write_text(text[:-2] + ',\n "name": "another"\n}')
    line_no = path.read_text().count("\n")
    with pytest.raises(ValueError, match=rf"p.json: key 'name' appears twice in one object \(line {line_no}\)"):
        registry.load(path)


def _profile_with(tmp_path, change):
    from rla.profiles import registry

    d = registry.to_dict(registry.get("vllm"))
    change(d)
    path = tmp_path / "p.json"
    path.write_text(json.dumps(d))
    return path


@pytest.mark.parametrize("change,message", [
    (lambda d: d.update(calibration=[1, 2]), "'calibration' must be an object"),
    (lambda d: d["calibration"].update(points=["rope_cos_sin"]), "calibration 'points' must be an object"),
    (lambda d: d["calibration"]["points"].update(rope_cos_sin="kernel"), "point 'rope_cos_sin': must be an object"),
    (lambda d: d["calibration"]["points"].update(rope_cos_sin={"evidence": "kernel", "why": 1}), "needs 'evidence'"),
    (lambda d: d["calibration"]["points"].update(rope_cos_sin={"matched": 1.0}), "needs 'evidence'"),
    (lambda d: d["calibration"]["points"].update(rope_cos_sin={"evidence": "kernel", "matched": "all"}),
     "'matched' must be a fraction"),
    (lambda d: d["calibration"]["points"].update(rope_cos_sin={"evidence": "kernel", "matched": BIG}),
     "'matched' must be a fraction"),
    (lambda d: d["calibration"]["points"].update(rope_cos_sin={"evidence": "kernel", "note": 3}), "'note' must be"),
    (lambda d: d["calibration"].update(version=33), "calibration 'version' must be a string"),
    (lambda d: d["calibration"].update(extra=1), "calibration: .*unexpected keyword argument 'extra'"),
], ids=["list", "points-list", "point-str", "unknown-key", "no-evidence", "matched-str", "matched-400-digits",
        "note-int", "version-int", "extra-key"])
def test_a_malformed_calibration_block_names_the_file_and_the_part(tmp_path, change, message):
    from rla.profiles import registry

    with pytest.raises(ValueError, match=r"p.json: .*" + message):
        registry.load(_profile_with(tmp_path, change))


@pytest.mark.parametrize("damage,message", [
    ("truncate", "not a readable safetensors file"),
    ("shape", "tensor model.embed_tokens.weight has shape [63, 256], but config.json builds [64, 256]"),
])
def test_a_truncated_or_mismatched_checkpoint_is_a_clear_error_before_any_work(tmp_path, damage, message, capsys):
    from safetensors.torch import load_file, save_file

    model = tmp_path / "model"
    shutil.copytree(bundled_path(), model)
    f = model / "model.safetensors"
    if damage == "truncate":
        with open(f, "r+b") as fh:
            fh.truncate(f.stat().st_size // 2)
    else:
        w = load_file(str(f))
        w["model.embed_tokens.weight"] = w["model.embed_tokens.weight"][:-1].clone()
        save_file(w, str(f), metadata={"format": "pt"})
    roll = tmp_path / "r.jsonl"
    roll.write_text(json.dumps(GOOD) + "\n")
    assert main(["diagnose", "--model", str(model), "--rollouts", str(roll), "--out", str(tmp_path / "rep")]) == 2
    err = capsys.readouterr().err.replace("\n", "")
    assert message in err and str(f) in err and "Traceback" not in err
    assert not (tmp_path / "rep").exists()


def test_a_damaged_training_checkpoint_is_a_checkpoint_error(tmp_path):
    from rla.rl import checkpoint as ckpt

    ckpt.write_rng(tmp_path, 1, 0, {"x": 1}, {"t": torch.zeros(1)})
    ckpt.save(tmp_path, 1, model={"w": torch.ones(4)}, optimizer_state={}, state={"step": 1})
    f = tmp_path / "step_000001" / "model.safetensors"
    with open(f, "r+b") as fh:
        fh.truncate(f.stat().st_size - 3)
    with pytest.raises(ckpt.CheckpointError, match=r"model.safetensors: cannot be read .*damaged"):
        ckpt.load(tmp_path / "step_000001")


def test_the_attribution_is_not_printed_from_a_single_sequence():
    from rla.diagnosis.core import diagnose
    from rla.diagnosis.report import explain, rich_tables, to_markdown
    from rla.rl.bundled import bundled_task, load_bundled
    from rla.rollout.sampler import Sampler, SamplingParams

    torch.manual_seed(0)
    model, tok = load_bundled()
    prompts = [[tok.bos_token_id] + tok(p.prompt, add_special_tokens=False)["input_ids"]
               for p in bundled_task().sample(0, 1)]
    recs = Sampler(model, "vllm").generate(prompts, SamplingParams(max_new_tokens=8, seed=0))
    d = diagnose(model, recs, "vllm", regions=("rope", "swiglu"), detect=False)
    assert d.n_sequences == 1
    _, attribution = rich_tables(d)
    needs = "needs at least 2 distinct sequences, got 1"
    assert needs in str(attribution) and needs in explain(d)
    md = to_markdown(d)
    assert needs in md and "Shapley" not in md and "attribution.png" not in md
