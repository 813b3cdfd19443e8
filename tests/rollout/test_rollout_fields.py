"""Rollout records: every numeric field finite and in range, every id list against the vocabulary.

``1e999`` is valid JSON that Python parses as ``inf`` without calling ``parse_constant``, so the
finite checks of the fields themselves (not the JSON parser) must reject it.
"""

from __future__ import annotations

import json

import pytest

from rla.rollout.rollouts import FORMAT, RolloutFormatError, RolloutRecord, load, to_padded

GOOD = {"prompt_ids": [1, 2], "response_ids": [3, 4, 5], "logprobs": [-0.1, -2.5, -0.0],
        "temperature": 1.0, "top_p": 1.0, "top_k": -1, "engine": "vllm", "reward": 0.5}


def _write(path, **overrides):
    d = {"format": FORMAT, **GOOD, **overrides}
    # hand-written numbers, as an engine's JSON writer might print them
    text = json.dumps(d)
    for key, raw in overrides.items():
        if isinstance(raw, float) and raw == float("inf"):
            text = text.replace(f'"{key}": Infinity', f'"{key}": 1e999')
        if isinstance(raw, float) and raw == float("-inf"):
            text = text.replace(f'"{key}": -Infinity', f'"{key}": -1e999')
    assert "Infinity" not in text
    path.write_text(text + "\n")
    return path


@pytest.mark.parametrize("field", ["temperature", "top_p", "reward"])
@pytest.mark.parametrize("value", [float("inf"), float("-inf")], ids=["1e999", "-1e999"])
def test_overflowing_numbers_are_rejected_on_load(tmp_path, field, value):
    path = _write(tmp_path / "r.jsonl", **{field: value})
    assert "1e999" in path.read_text()
    with pytest.raises(RolloutFormatError, match=rf":1: field '{field}': expected a finite number"):
        load(path)


def test_overflowing_logprob_is_rejected_on_load(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps({"format": FORMAT, **GOOD}).replace("-2.5", "-1e999") + "\n")
    with pytest.raises(RolloutFormatError, match=r":1: field 'logprobs': element 1 is -inf, not a finite"):
        load(path)


@pytest.mark.parametrize("field", ["temperature", "top_p", "reward"])
@pytest.mark.parametrize("value", [float("inf"), float("nan")], ids=["inf", "nan"])
def test_non_finite_numbers_are_rejected_in_memory(field, value):
    with pytest.raises(RolloutFormatError, match=rf"field '{field}': expected a finite number"):
        RolloutRecord(**{**GOOD, field: value})


@pytest.mark.parametrize("field,value,match", [
    ("temperature", 0.0, "must be > 0"),
    ("temperature", -1.0, "must be > 0"),
    ("top_p", 0.0, r"must be in \(0, 1\]"),
    ("top_p", 1.0000001, r"must be in \(0, 1\]"),
    ("top_k", -2, "must be an int >= 1"),
    ("top_k", 2.0, "must be an int >= 1"),
])
def test_out_of_range_numbers_are_rejected(field, value, match):
    with pytest.raises(RolloutFormatError, match=rf"field '{field}': {match}"):
        RolloutRecord(**{**GOOD, field: value})


@pytest.mark.parametrize("field", ["prompt_ids", "response_ids"])
def test_every_id_list_is_checked_against_the_vocabulary_on_load(tmp_path, field):
    ids = list(GOOD[field])
    ids[-1] = 99
    path = _write(tmp_path / "r.jsonl", **{field: ids})
    assert getattr(load(path, vocab_size=100)[0], field) == ids
    with pytest.raises(RolloutFormatError, match=rf":1: field '{field}': element {len(ids) - 1} is 99 >= vocab_size 99"):
        load(path, vocab_size=99)


@pytest.mark.parametrize("field", ["prompt_ids", "response_ids"])
def test_to_padded_checks_ids_and_pad_against_the_vocabulary(field):
    ok = RolloutRecord(**GOOD)
    bad = RolloutRecord(**{**GOOD, field: [*GOOD[field][:-1], 50]})
    assert to_padded([ok, bad], vocab_size=51)["input_ids"].max().item() == 50
    with pytest.raises(RolloutFormatError, match=rf"record 1: field '{field}': element .* is 50 >= vocab_size 50"):
        to_padded([ok, bad], vocab_size=50)
    with pytest.raises(ValueError, match="pad_id 50 >= vocab_size 50"):
        to_padded([ok], pad_id=50, vocab_size=50)
    with pytest.raises(ValueError, match="vocab_size must be a positive int"):
        to_padded([ok], vocab_size=0)
    # without a vocabulary, nothing is assumed about the ids
    assert to_padded([bad])["input_ids"].max().item() == 50
