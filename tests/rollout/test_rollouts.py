"""rla.rollout.rollouts: exact round trip, every validation rule, line-numbered errors, atomic save."""

from __future__ import annotations

import json
import math
import os
import struct

import numpy as np
import pytest
import torch

import rla.rollout.rollouts as ro
from rla.rollout.rollouts import FORMAT, RolloutFormatError, RolloutRecord, iter_load, load, save, to_padded


def make_records(n: int = 5, seed: int = 0) -> list[RolloutRecord]:
    rng = np.random.default_rng(seed)
    recs = []
    for i in range(n):
        p, r = int(rng.integers(1, 6)), int(rng.integers(1, 9))
        lps = (-rng.exponential(1.0, r)).tolist()  # full-precision doubles
        lps[0] = -0.0 if i == 0 else lps[0]
        recs.append(
            RolloutRecord(
                prompt_ids=rng.integers(0, 1000, p).tolist(),
                response_ids=rng.integers(0, 1000, r).tolist(),
                logprobs=lps,
                temperature=float(rng.uniform(0.1, 1.5)),
                top_p=1.0 if i % 2 else 0.95,
                top_k=-1 if i % 3 else 50,
                engine="vllm" if i % 2 else "sglang",
                reward=None if i == 1 else float(rng.random()),
                metadata={"task": f"t/{i}", "nested": {"x": [1, 2.5, None]}} if i % 2 else None,
            )
        )
    return recs


def bits(x: float) -> bytes:
    return struct.pack("<d", x)


def good_line(**overrides) -> dict:
    d = {"format": FORMAT, "prompt_ids": [1, 2], "response_ids": [3, 4, 5],
         "logprobs": [-0.1, -2.5, -0.0], "temperature": 1.0, "top_p": 1.0, "top_k": -1,
         "engine": "vllm"}
    d.update(overrides)
    return d


def write_lines(path, objs) -> None:
    with open(path, "w") as f:
        for o in objs:
            f.write((o if isinstance(o, str) else json.dumps(o)) + "\n")


def test_round_trip_is_exact(tmp_path):
    recs = make_records()
    path = tmp_path / "r.jsonl"
    save(path, recs)
    back = load(path)
    assert back == recs
    for a, b in zip(recs, back):
        assert [bits(x) for x in a.logprobs] == [bits(x) for x in b.logprobs]  # -0.0 included
        assert bits(a.temperature) == bits(b.temperature)
    assert math.copysign(1.0, back[0].logprobs[0]) == -1.0
    lines = path.read_text().splitlines()
    assert len(lines) == len(recs)
    assert all(json.loads(line)["format"] == FORMAT for line in lines)
    assert "reward" not in json.loads(lines[1]) and "metadata" not in json.loads(lines[0])
    assert path.read_bytes().endswith(b"\n")
    save(path, back)  # saving what was loaded writes the same bytes
    assert path.read_text().splitlines() == lines


def test_iter_load_streams_until_the_bad_line(tmp_path):
    path = tmp_path / "r.jsonl"
    write_lines(path, [good_line(), good_line(temperature=-1.0)])
    it = iter_load(path)
    assert next(it).response_ids == [3, 4, 5]
    with pytest.raises(RolloutFormatError, match=r"r\.jsonl:2: field 'temperature'"):
        next(it)


def test_corrupt_middle_line_reported_with_line_number(tmp_path):
    path = tmp_path / "r.jsonl"
    write_lines(path, [good_line(), '{"format": "rla.rollout/1", "prompt_ids": [1,', good_line()])
    with pytest.raises(RolloutFormatError, match=r"r\.jsonl:2: not valid JSON") as e:
        load(path)
    assert "truncated" not in str(e.value) and e.value.line == 2


def test_truncated_last_line_reported(tmp_path):
    path = tmp_path / "r.jsonl"
    save(path, make_records(3))
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 20])  # a writer died mid-line
    with pytest.raises(RolloutFormatError, match=r"r\.jsonl:3: not valid JSON.*truncated"):
        load(path)


def test_invalid_utf8_reported_with_line_number(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_bytes(json.dumps(good_line()).encode() + b"\n" + b'{"engine": "\xff"}\n')
    with pytest.raises(RolloutFormatError, match=r":2: not valid JSON"):
        load(path)


BAD_FIELDS = [
    ("prompt_ids", 5, "list of ints"),
    ("prompt_ids", [], "must not be empty"),
    ("prompt_ids", [1, -1], "element 1 is -1"),
    ("prompt_ids", [1, 2.0], "element 1 is 2.0"),
    ("prompt_ids", [True], "element 0 is True"),
    ("response_ids", [], "must not be empty"),
    ("response_ids", [3, 4, "5"], "element 2"),
    ("logprobs", [-0.1, -2.5], "2 logprobs for 3 response tokens"),
    ("logprobs", [-0.1, -2.5, 1e-3], "element 2 is 0.001 > 1e-06"),
    ("logprobs", [-0.1, "x", -1.0], "element 1 is 'x'"),
    ("logprobs", "abc", "list of floats"),
    ("temperature", 0.0, "must be > 0"),
    ("temperature", -1, "must be > 0"),
    ("temperature", "1.0", "finite number"),
    ("temperature", None, "finite number"),
    ("top_p", 0.0, r"\(0, 1\]"),
    ("top_p", 1.5, r"\(0, 1\]"),
    ("top_k", -2, "int >= 1"),
    ("top_k", 1.5, "int >= 1"),
    ("engine", "", "non-empty string"),
    ("engine", 3, "non-empty string"),
    ("reward", "high", "finite number"),
    ("metadata", [1, 2], "expected an object"),
    ("format", "rla.rollout/2", "unsupported format 'rla.rollout/2'"),
    ("logprob", [-1.0], r"unknown field\(s\) \['logprob'\]"),
]


@pytest.mark.parametrize("field, value, message", BAD_FIELDS)
def test_each_validation_rule_names_file_line_and_field(tmp_path, field, value, message):
    path = tmp_path / "r.jsonl"
    write_lines(path, [good_line(), good_line(**{field: value})])
    with pytest.raises(RolloutFormatError, match=rf"r\.jsonl:2: field '{field}': .*{message}") as e:
        load(path)
    assert (e.value.line, e.value.field) == (2, field)


@pytest.mark.parametrize("field", ["prompt_ids", "response_ids", "logprobs", "temperature",
                                   "top_p", "top_k", "engine", "format"])
def test_missing_required_field(tmp_path, field):
    path = tmp_path / "r.jsonl"
    obj = good_line()
    del obj[field]
    write_lines(path, [obj])
    with pytest.raises(RolloutFormatError, match=rf":1: field '{field}': missing"):
        load(path)


def test_vocab_size_and_nonstandard_constants(tmp_path):
    path = tmp_path / "r.jsonl"
    write_lines(path, [good_line(response_ids=[3, 4, 99])])
    assert load(path, vocab_size=100)[0].response_ids == [3, 4, 99]
    with pytest.raises(RolloutFormatError, match=r":1: field 'response_ids': element 2 is 99 >= "):
        load(path, vocab_size=99)
    write_lines(path, ['{"format": "rla.rollout/1", "logprobs": [NaN]}'])
    with pytest.raises(RolloutFormatError, match=":1: not valid JSON: non-standard JSON constant"):
        load(path)


def test_tolerance_and_top_k_conventions(tmp_path):
    path = tmp_path / "r.jsonl"
    write_lines(path, [good_line(logprobs=[-0.0, 5e-7, -3], top_k=0, temperature=1)])
    rec = load(path)[0]
    assert rec.logprobs == [0.0, 5e-7, -3.0] and all(type(x) is float for x in rec.logprobs)
    assert rec.top_k == -1 and type(rec.temperature) is float
    with pytest.raises(RolloutFormatError, match="field 'top_p'"):
        RolloutRecord([1], [2], [-1.0], 1.0, 0.0, -1, "vllm")


def test_blank_lines_and_empty_files(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps(good_line()) + "\n\n  \n")
    assert len(load(path)) == 1  # trailing blank lines are fine
    path.write_text(json.dumps(good_line()) + "\n\n" + json.dumps(good_line()) + "\n")
    with pytest.raises(RolloutFormatError, match=r":2: blank line between records"):
        load(path)
    for text in ("", "\n\n"):
        path.write_text(text)
        with pytest.raises(RolloutFormatError, match="empty file"):
            load(path)
    with pytest.raises(RolloutFormatError, match="no records to save"):
        save(tmp_path / "new.jsonl", [])
    assert sorted(os.listdir(tmp_path)) == ["r.jsonl"]


def _crash_on_third_dumps(monkeypatch):
    real = json.dumps
    calls = {"n": 0}

    def dumps(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("simulated crash while writing record 3")
        return real(*args, **kwargs)

    monkeypatch.setattr(ro.json, "dumps", dumps)


def _crash_on_replace(monkeypatch):
    def replace(*args):
        raise OSError("simulated crash before rename")

    monkeypatch.setattr(ro.os, "replace", replace)


def _crash_on_fsync(monkeypatch):
    def fsync(fd):
        raise OSError("simulated disk error")

    monkeypatch.setattr(ro.os, "fsync", fsync)


@pytest.mark.parametrize("crash", [_crash_on_third_dumps, _crash_on_replace, _crash_on_fsync])
def test_crash_mid_save_leaves_original_intact(tmp_path, monkeypatch, crash):
    path = tmp_path / "r.jsonl"
    save(path, make_records(4, seed=1))
    os.chmod(path, 0o640)
    before = path.read_bytes()
    with monkeypatch.context() as m:
        crash(m)
        with pytest.raises((RuntimeError, OSError), match="simulated"):
            save(path, make_records(5, seed=2))
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["r.jsonl"]  # no temp file left behind
    save(path, make_records(5, seed=2))  # and a normal save still works, keeping the mode
    assert load(path) == make_records(5, seed=2)
    assert os.stat(path).st_mode & 0o777 == 0o640


def test_invalid_record_mid_save_leaves_original_intact(tmp_path):
    path = tmp_path / "r.jsonl"
    save(path, make_records(2))
    before = path.read_bytes()
    recs = make_records(4, seed=3)
    recs[2].logprobs.append(-1.0)  # mutated after construction: one logprob too many
    with pytest.raises(RolloutFormatError, match="record 2: field 'logprobs': 6 logprobs for 5"):
        save(path, recs)
    recs[2].logprobs.pop()
    recs[3].metadata = {"obj": object()}
    with pytest.raises(RolloutFormatError, match="record 3: field 'metadata': not JSON-serialisable"):
        save(path, recs)
    assert path.read_bytes() == before and os.listdir(tmp_path) == ["r.jsonl"]


def test_to_padded_layout():
    recs = [
        RolloutRecord([11, 12, 13], [21, 22], [-0.5, -0.25], 1.0, 1.0, -1, "vllm"),
        RolloutRecord([14], [23, 24, 25, 26], [-1.0, -2.0, -3.0, -0.125], 0.7, 0.9, 20, "sglang"),
    ]
    b = to_padded(recs, pad_id=7)
    P = 3
    assert b["response_start"] == P
    assert b["input_ids"].tolist() == [[11, 12, 13, 21, 22, 7, 7], [7, 7, 14, 23, 24, 25, 26]]
    assert b["attention_mask"].tolist() == [[1, 1, 1, 1, 1, 0, 0], [0, 0, 1, 1, 1, 1, 1]]
    assert b["position_ids"][0, :5].tolist() == [0, 1, 2, 3, 4]
    assert b["position_ids"][1, 2:].tolist() == [0, 1, 2, 3, 4]
    assert b["response_mask"].tolist() == [[True, True, False, False], [True] * 4]
    assert b["rollout_logprobs"].dtype == torch.float64
    assert b["rollout_logprobs"].tolist() == [[-0.5, -0.25, 0.0, 0.0], [-1.0, -2.0, -3.0, -0.125]]
    # response token j of every row sits at column P + j
    resp = b["input_ids"][:, P:]
    assert resp[b["response_mask"]].tolist() == [21, 22, 23, 24, 25, 26]
    assert b["temperature"].tolist() == [1.0, 0.7] and b["top_k"].tolist() == [-1, 20]
    assert b["input_ids"].dtype == torch.long and b["response_mask"].dtype == torch.bool
    with pytest.raises(ValueError, match="at least one record"):
        to_padded([])
