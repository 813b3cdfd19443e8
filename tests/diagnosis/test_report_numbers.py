"""The diagnosis report's derived numbers: "share of k3", "X% less", "left unexplained".

A hand-made Diagnosis whose numbers are chosen so that every derived figure is a round,
distinct percentage: a share divided by the wrong denominator (the k3 removed instead of the
unaligned total, or the aligned total) prints a different number and fails.

none: k3 = 1.0e-3; all regions aligned: 2.0e-4 (unexplained 20%, so "80% less").
Shapley values (they sum to none - all = 8.0e-4): rope 5.0e-4 (50% of k3), swiglu 2.0e-4
(20%), rmsnorm 1.0e-4 (10%). Removed k3 is 8.0e-4, so dividing by it would print 62%/25%/12%.
"""

import re

import pytest

from rla.diagnosis.core import Diagnosis
from rla.diagnosis.report import explain, rich_tables, to_markdown


def _metrics(k3, absmean):
    return {
        "mismatch/k3": k3,
        "mismatch/abs/mean": absmean,
        "mismatch/abs/p99": 3 * absmean,
        "mismatch/abs/max": 10 * absmean,
        "mismatch/clip_leak/0.2": 0.0125,
        "mismatch/seq/log_ratio/std": 0.5 * absmean,
        "mismatch/bitwise/equal": 0.25,
    }


@pytest.fixture
def diagnosis():
    phi_k3 = {"rope": 5.0e-4, "swiglu": 2.0e-4, "rmsnorm": 1.0e-4}
    phi_abs = {"rope": 4.0e-3, "swiglu": 1.0e-3, "rmsnorm": 1.0e-3}
    return Diagnosis(
        profile="vllm",
        regions=("rope", "swiglu", "rmsnorm"),
        n_sequences=3,
        n_tokens=40,
        metrics={"none": _metrics(1.0e-3, 8.0e-3), "all": _metrics(2.0e-4, 2.0e-3)},
        attribution={"mismatch/k3": phi_k3, "mismatch/abs/mean": phi_abs},
        unexplained={"mismatch/k3": 0.2, "mismatch/abs/mean": 0.25},
        per_position={},
    )


def test_markdown_shares_are_of_the_unaligned_k3(diagnosis):
    md = to_markdown(diagnosis)
    rows = {m[0]: m[1:] for m in re.findall(r"^\| (\w[\w ]*?) \| ([^|]+) \| ([^|]+) \|", md, re.M)}
    assert rows["rope"] == ("5.000e-04", "50.0%")
    assert rows["swiglu"] == ("2.000e-04", "20.0%")
    assert rows["rmsnorm"] == ("1.000e-04", "10.0%")
    # what is left: k3(all) itself, and its share of k3(none)
    assert rows["left unexplained"] == ("2.000e-04", "20.0%")
    # the order is the ranking by k3 removed
    assert md.index("| rope |") < md.index("| swiglu |") < md.index("| rmsnorm |")


def test_explain_states_reduction_and_top_share(diagnosis):
    text = explain(diagnosis)
    assert "k3 = 1.00e-03" in text
    assert "brings k3 to 2.00e-04, 80% less" in text
    assert "rope accounts for the largest part (50% of k3 by Shapley value)" in text
    assert "The remaining 20% comes from" in text
    assert "1.25% of tokens" in text


def test_rich_table_shares_match_markdown(diagnosis):
    pytest.importorskip("rich")
    _, attr = rich_tables(diagnosis)
    cols = {c.header: list(c._cells) for c in attr.columns}
    assert cols["region"][:3] == ["rope", "swiglu", "rmsnorm"]
    assert cols["share of k3"] == ["50.0%", "20.0%", "10.0%", "20.0%"]
    assert cols["k3 removed"] == ["5.000e-04", "2.000e-04", "1.000e-04", "2.000e-04"]


def test_the_report_says_when_the_weights_could_not_be_checked(diagnosis):
    """Records without a ``policy`` fingerprint: the report says the sampling weights went unchecked
    for them (a stale policy reads as rounding); all records carrying one: nothing said."""
    import dataclasses

    from rla.diagnosis.policy import PolicyCheck

    half = dataclasses.replace(diagnosis, policy=PolicyCheck("rla-weights/1:" + "0" * 32, 2, 3, {}, {}))
    assert "1 of 3 records carry no `policy` fingerprint" in to_markdown(half)
    full = dataclasses.replace(diagnosis, policy=PolicyCheck("rla-weights/1:" + "0" * 32, 3, 3, {}, {}))
    assert "carry no `policy` fingerprint" not in to_markdown(full)


def test_the_report_gives_the_full_vocabulary_kl_and_says_which_it_is(diagnosis):
    """Records carrying top_logprobs: the report and its JSON give the KL, saying exact or a lower
    bound; records without: neither says anything."""
    import dataclasses

    vocab = {"vocab_kl/per_token": [1e-4, 3e-4], "vocab_kl/mean": 2e-4, "vocab_kl/max": 3e-4, "vocab_kl/tokens": 2,
             "vocab_kl/kind": "lower_bound", "vocab_kl/records": 1}
    md = to_markdown(dataclasses.replace(diagnosis, vocab=vocab))
    assert "Full-vocabulary KL(engine || trainer): mean 0.0002, max 0.0003 over 2 tokens of 1 records" in md
    assert "a lower bound (top-k lists" in md
    exact = dataclasses.replace(diagnosis, vocab={**vocab, "vocab_kl/kind": "exact"})
    assert "exact (the records list the engine's whole distribution)" in to_markdown(exact)
    assert exact.to_dict()["vocab_kl"] == {k: v for k, v in vocab.items() if k != "vocab_kl/per_token"} | {"vocab_kl/kind": "exact"}
    assert "Full-vocabulary" not in to_markdown(diagnosis) and diagnosis.to_dict()["vocab_kl"] is None
