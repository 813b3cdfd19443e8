"""Property-based tests (hypothesis): the rollout record parser (numbers of any size, any nesting
depth), the metrics, the CLI's numeric arguments, truncated safetensors files and malformed profile
files never crash with anything but their documented error, and never accept nonsense.
Bounded example counts keep the file under a few seconds (on an idle machine)."""

import json

import numpy as np
import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given, settings, strategies as st  # noqa: E402

import rla.metrics as M  # noqa: E402
from rla.rollout import rollouts  # noqa: E402

FAST = settings(max_examples=60, deadline=None)

GOOD = {"format": "rla.rollout/1", "prompt_ids": [1, 2], "response_ids": [3], "logprobs": [-0.5],
        "temperature": 1.0, "top_p": 1.0, "top_k": -1, "engine": "vllm"}
values = st.one_of(st.none(), st.booleans(), st.integers(-10, 10), st.floats(allow_nan=True), st.text(max_size=3),
                   st.lists(st.integers(-2, 70), max_size=3), st.lists(st.floats(-3, 1), max_size=3))


@FAST
@given(st.dictionaries(st.sampled_from(sorted(GOOD) + ["extra"]), values, max_size=4))
def test_record_parser_accepts_only_valid_records(tmp_path_factory, changes):
    rec = {**GOOD, **changes}
    path = tmp_path_factory.mktemp("f") / "r.jsonl"
    path.write_text(json.dumps(rec) + "\n")
    try:
        [r] = rollouts.load(path, vocab_size=64)
    except rollouts.RolloutFormatError as e:
        assert "r.jsonl:1" in str(e)  # names the file and the line
        return
    # accepted: then it is valid by the documented rules and round-trips exactly
    assert len(r.logprobs) == len(r.response_ids) >= 1 and len(r.prompt_ids) >= 1
    assert all(0 <= i < 64 for i in [*r.prompt_ids, *r.response_ids]) and all(x <= 1e-6 for x in r.logprobs)
    assert r.temperature > 0 and 0 < r.top_p <= 1
    out = path.with_name("o.jsonl")
    rollouts.save(out, [r])
    assert rollouts.load(out, vocab_size=64) == [r]


@FAST
@given(st.binary(max_size=200))
def test_record_parser_on_random_bytes_raises_only_its_error(tmp_path_factory, raw):
    path = tmp_path_factory.mktemp("f") / "r.jsonl"
    path.write_bytes(raw)
    try:
        rollouts.load(path)
    except rollouts.RolloutFormatError:
        pass


rows = st.lists(st.floats(-20, 0), min_size=1, max_size=12)


@FAST
@given(st.lists(st.tuples(rows, st.floats(-0.5, 0.5)), min_size=1, max_size=5))
def test_metrics_invariants(pairs):
    mu = [np.array(r) for r, _ in pairs]
    pi = [np.minimum(np.array(r) + s, 0.0) for r, s in pairs]
    a, mask = M.pad_rows(pi)
    b, _ = M.pad_rows(mu)
    m = M.mismatch(a, b, mask)
    assert m["mismatch/k3"] >= 0 and m["mismatch/abs/mean"] >= 0 and m["mismatch/n_tokens"] == mask.sum()
    d = (a - b)[mask]
    assert m["mismatch/abs/max"] == pytest.approx(np.abs(d).max(), abs=1e-12)
    same = M.mismatch(b, b, mask)
    assert same["mismatch/k3"] == 0 and same["mismatch/bitwise/equal"] == 1


@FAST
@given(st.sampled_from(["--max-new-tokens", "-n", "--difficulty"]), st.integers(-5, 0) | st.text(max_size=4))
def test_cli_numeric_flags_refuse_nonpositive_and_junk(flag, value):
    from rla.cli import build_parser

    parser = build_parser(["demo"])
    text = str(value)
    try:
        n = int(text)
    except ValueError:
        n = None
    if n is not None and n > 0:
        return
    with pytest.raises(SystemExit) as e:
        parser.parse_args(["demo", flag, text])
    assert e.value.code == 2


# ---- issue 38: numbers out of range, nesting depth, truncated safetensors, malformed profile files

huge = st.integers(min_value=-10**500, max_value=10**500) | st.floats(allow_nan=True, allow_infinity=True)


@FAST
@given(st.sampled_from(["temperature", "top_p", "top_k", "reward", "logprobs", "prompt_ids", "response_ids"]), huge)
def test_record_parser_on_numbers_of_any_size_raises_only_its_error(tmp_path_factory, name, number):
    value = [number] if name in ("logprobs", "prompt_ids", "response_ids") else number
    path = tmp_path_factory.mktemp("f") / "r.jsonl"
    path.write_text(json.dumps({**GOOD, name: value}) + "\n")  # NaN / Infinity written as JS constants
    try:
        [r] = rollouts.load(path)
    except rollouts.RolloutFormatError as e:
        assert "r.jsonl:1" in str(e) and len(str(e)) < 400 + len(str(path))  # a huge number is cut short
        return
    assert all(-2**31 <= i < 2**31 for i in [*r.prompt_ids, *r.response_ids]) and -1 <= r.top_k < 2**31
    assert all(np.isfinite([r.temperature, r.top_p, *r.logprobs]))


@FAST
@given(st.integers(1, 3000), st.sampled_from(["[", "{"]))
def test_record_parser_on_any_nesting_depth_raises_only_its_error(tmp_path_factory, depth, bracket):
    inner = ("[" * depth + "]" * depth) if bracket == "[" else ('{"a":' * depth + "1" + "}" * depth)
    path = tmp_path_factory.mktemp("f") / "r.jsonl"
    path.write_text(json.dumps(GOOD)[:-1] + ',"metadata":{"x":' + inner + "}}\n")
    try:
        [r] = rollouts.load(path)
    except rollouts.RolloutFormatError as e:
        assert depth + 2 > 200 and "nested more than 200" in str(e)
        return
    assert depth + 2 <= 200 and r.metadata is not None


@pytest.fixture(scope="module")
def small_safetensors(tmp_path_factory):
    import torch
    from safetensors.torch import save_file

    path = tmp_path_factory.mktemp("st") / "model.safetensors"
    save_file({"a": torch.arange(64, dtype=torch.float32), "b": torch.ones(3, 5)}, str(path))
    return path.read_bytes()


@FAST
@given(st.data())
def test_truncated_safetensors_are_refused_naming_the_file(tmp_path_factory, small_safetensors, data):
    from rla.hf import ModelFilesError, check_safetensors
    from rla.rl import checkpoint as ckpt

    cut = data.draw(st.integers(0, len(small_safetensors) - 1))
    folder = tmp_path_factory.mktemp("m")
    (folder / "model.safetensors").write_bytes(small_safetensors[:cut])
    with pytest.raises(ModelFilesError, match="model.safetensors: not a readable safetensors file"):
        check_safetensors(folder)
    (folder / "optimizer.safetensors").write_bytes(small_safetensors)
    (folder / "state.json").write_text("{}")
    with pytest.raises(ckpt.CheckpointError, match="model.safetensors: cannot be read"):
        ckpt.load(folder)


def _vllm_profile_dict():
    from rla.profiles import registry

    return registry.to_dict(registry.get("vllm"))


def _paths(d, prefix=()):
    yield prefix
    if isinstance(d, dict):
        for k, v in d.items():
            yield from _paths(v, prefix + (k,))


@FAST
@given(st.data(), values | huge | st.dictionaries(st.text(max_size=3), values, max_size=2))
def test_profile_reader_on_malformed_files_raises_only_value_error(tmp_path_factory, data, replacement):
    from rla.profiles import registry

    d = _vllm_profile_dict()
    where = data.draw(st.sampled_from(list(_paths(d))[1:]))
    target = d
    for k in where[:-1]:
        target = target[k]
    if data.draw(st.booleans()):
        target[where[-1]] = replacement
    else:
        del target[where[-1]]
    path = tmp_path_factory.mktemp("p") / "p.json"
    path.write_text(json.dumps(d))
    try:
        p = registry.load(path)
    except ValueError as e:
        assert str(path) in str(e)
        return
    assert registry.from_dict(registry.to_dict(p)).same_rounding(p)  # accepted: a valid profile
