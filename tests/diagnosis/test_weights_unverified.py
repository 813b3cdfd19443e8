"""Records that do not say which weights sampled them are not called rounding (issue 38, item 1).

Rollouts of the policy one optimizer step earlier are inside the rounding scale, and everything
``rla diagnose`` measures is measured on the rollouts, so without the records' ``policy``
fingerprint a rounding-sized mismatch is ``rounding_weights_unverified``: for the stale case and
for true rounding alike (neither can be verified), with the attribution given as conditional.
With the fingerprint of the checkpoint in every record the verdict is ``rounding``, the
measurement unchanged. Built from the bundled model's own rollouts (rla's sampler) and the
checkpoint one Adam step after them.
"""

import dataclasses
import json
from pathlib import Path

import pytest

from rla.diagnosis.core import diagnose
from rla.diagnosis.policy import MEASURED, MEASURED_IN, PolicyCheck
from rla.diagnosis.report import explain, to_markdown
from rla.diagnosis.scale import FAR
from rla.rollout import rollouts
from bundled_rollouts import one_adam_step, sample, unrecorded

ROOT = Path(__file__).resolve().parents[2]
UNVERIFIED = "rounding_weights_unverified"


@pytest.fixture(scope="module")
def clean(bundled):
    """Four rollouts of rla's sampler on the checkpoint's own weights (they carry its fingerprint)."""
    model, prompts = bundled
    return sample(model, prompts[:4])


def _diagnose(model, recs):
    return diagnose(model, recs, "vllm", regions=("rope",), detect=False)


def _unverified(d):
    v = d.verdict
    assert (v.kind, v.cause, v.ok, v.attributed) == (UNVERIFIED, None, False, True), v.message
    assert "within what rounding produces" not in v.message and "cannot be told apart from rounding" in v.message
    assert "weights_fingerprint" in v.message and "rla/policy" in v.message  # how to add the field
    md = to_markdown(d)
    assert "ROUNDING-SIZED, WEIGHTS UNVERIFIED: " in md and "OK: " not in md
    assert "Shapley" in md and "holds only if these weights sampled the records" in md  # conditional attribution
    assert explain(d).startswith(v.message)


def test_rollouts_of_the_policy_one_step_earlier_without_the_field_are_not_rounding(bundled, clean):
    stepped = one_adam_step(bundled[0], clean)
    d = _diagnose(stepped, unrecorded(clean))
    assert d.verdict.ratio < FAR and not d.verdict.flagged  # rounding-sized: the size tests alone said rounding
    _unverified(d)
    assert d.policy.carried == 0 and not d.policy.stale and not d.policy.verified
    assert "none of the 4 records carries a `policy` fingerprint" in d.verdict.message


def test_true_rounding_is_unverified_without_the_field_and_rounding_with_it(bundled, clean):
    model, _ = bundled
    with_field = _diagnose(model, clean)
    assert (with_field.verdict.kind, with_field.verdict.ok) == ("rounding", True)
    assert with_field.policy.verified and "within what rounding produces" in with_field.verdict.message
    assert "WEIGHTS UNVERIFIED" not in to_markdown(with_field) and "OK: " in to_markdown(with_field)
    without = _diagnose(model, unrecorded(clean))
    _unverified(without)
    # the verdict changes, not the measurement
    assert without.metrics == with_field.metrics and without.attribution == with_field.attribution
    assert without.verdict.ratio == with_field.verdict.ratio
    # one record without the field is enough to leave the weights unverified
    part = _diagnose(model, clean[:3] + unrecorded(clean[3:]))
    _unverified(part)
    assert "1 of the 4 records carry no `policy` fingerprint (the 3 that do name this checkpoint's" in part.verdict.message


def test_cli_exits_0_with_the_unverified_verdict_in_report_json(bundled, clean, tmp_path, capsys):
    from rla.cli import main
    from rla.models import bundled_path

    rollouts.save(tmp_path / "r.jsonl", unrecorded(clean))
    assert main(["diagnose", "--model", str(bundled_path()), "--rollouts", str(tmp_path / "r.jsonl"), "--profile",
                 "vllm", "--out", str(tmp_path / "rep")]) == 0
    out = capsys.readouterr().out.replace("\n", " ")
    assert f"rla diagnose: {UNVERIFIED}:" in out and "within what rounding produces" not in out
    rep = json.loads((tmp_path / "rep" / "report.json").read_text())
    assert (rep["verdict"]["kind"], rep["verdict"]["ok"], rep["verdict"]["attributed"]) == (UNVERIFIED, False, True)
    assert rep["policy_check"]["verified"] is False and rep["policy_check"]["records_with_policy"] == 0
    assert rep["attribution"]["mismatch/k3"].keys() == {"rope", "swiglu", "rmsnorm"}  # shown, as conditional
    assert "WEIGHTS UNVERIFIED" in (tmp_path / "rep" / "report.md").read_text()


def test_the_cited_overlap_is_the_results_files():
    rows = []
    for f in ("results/diagnosis/weight_delta.json", "results/diagnosis/seeds_4_3/weight_delta.json"):
        rows += json.loads((ROOT / f).read_text())["rows"]
    rounding = [r for r in rows if r["case"].startswith("rounding_")]
    stale = [r for r in rows if r["case"] == "stale_one_adam_step"]
    assert len(rounding) == 10 and len(stale) == 5  # two profiles and the stale case, five seeds
    k3 = lambda rs: (min(r["k3_best_profile_over_scale"] for r in rs), max(r["k3_best_profile_over_scale"] for r in rs))
    want = {"rounding_k3_over_scale": k3(rounding), "stale_k3_over_scale": k3(stale),
            "rounding_fall_max": max(r["fall"] for r in rounding), "stale_fall_min": min(r["fall"] for r in stale)}
    two = lambda x: tuple(f"{v:.2g}" for v in x) if isinstance(x, tuple) else f"{x:.2g}"
    assert {k: two(v) for k, v in MEASURED.items()} == {k: two(v) for k, v in want.items()}
    # the overlap the verdict rests on: no size and no fall threshold separates the two
    assert want["stale_k3_over_scale"][0] < want["rounding_k3_over_scale"][1]
    assert want["stale_fall_min"] < want["rounding_fall_max"]
    assert (ROOT / MEASURED_IN).is_file()


def test_which_records_leave_the_weights_unverified():
    fp = "rla-weights/1:" + "a" * 32
    assert PolicyCheck(fp, 3, 3, {fp: [0, 1, 2]}).verified and PolicyCheck(fp, 3, 3, {fp: [0, 1, 2]}).unverified() is None
    stale = PolicyCheck(fp, 3, 3, {"rla-weights/1:" + "b" * 32: [0, 1, 2]})
    assert stale.stale and not stale.verified and stale.unverified() is None  # the stale_weights verdict says it
    none = PolicyCheck(fp, 0, 3)
    assert not none.verified and "none of the 3 records carries" in none.unverified()
    d = dataclasses.asdict(none)
    assert d["carried"] == 0 and none.to_dict()["verified"] is False
