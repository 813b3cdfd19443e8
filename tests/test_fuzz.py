"""Property-based tests (hypothesis): the rollout record parser, the metrics and the CLI's numeric
arguments never crash with anything but their documented error, and never accept nonsense.
Bounded example counts keep the file under a few seconds."""

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
