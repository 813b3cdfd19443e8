import json

import pytest

from rla.cli import main


def test_profiles_table_and_json(capsys):
    assert main(["profiles", "--evidence"]) == 0
    out = capsys.readouterr().out
    assert "vllm-0.33-eager" in out and "fp32_sum" in out and "vllm-eager -> vllm-0.33-eager" in out
    assert "vllm-0.33-eager: evidence per point" in out and "kernel" in out  # versions and evidence
    assert ("conditions (docs/rounding.md): sglang-0.5.23 at head size not in [64, 128, 256, 512]: "
            "rope_cos_sin=round, rope_apply=per_op") in " ".join(out.split())
    # the table (a row per point, a column per profile) shows every value whole in 80 columns
    from rla import profiles

    rows = {line.split()[0]: line.split()[1:] for line in out.splitlines() if line.split() and line.split()[0] in profiles.POINTS}
    names = list(profiles.all_profiles())
    assert set(rows) == set(profiles.POINTS)
    for point, cells in rows.items():
        assert cells == [getattr(profiles.get(n), point) for n in names], point
    assert main(["profiles", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [r["name"] for r in data["profiles"]] == ["hf", "sglang-0.5.23", "vllm-0.26", "vllm-0.26-eager", "vllm-0.33", "vllm-0.33-eager", "rla"]
    assert data["aliases"]["vllm"] == "vllm-0.33"
    assert data["profiles"][5]["calibration"]["points"]["swiglu"]["evidence"] == "kernel"
    assert data["profiles"][3]["calibration"]["points"]["swiglu"]["evidence"] == "live"


def test_check_ops_reports_every_profile_and_region(capsys):
    assert main(["check-ops", "--tokens", "16", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    from rla import profiles

    assert len(rows) == len(profiles.names()) * 4
    by = {(r["profile"], r["region"]): r for r in rows}
    assert all(by[("hf", reg)]["differs_from_hf"] == 0 for reg in ("rope", "swiglu", "rmsnorm", "add_rmsnorm"))
    assert by[("vllm-0.33", "swiglu")]["differs_from_hf"] > 0.1
    assert by[("vllm-0.33", "swiglu")]["max_abs_error"] < by[("hf", "swiglu")]["max_abs_error"]
    assert main(["check-ops", "--tokens", "16"]) == 0
    assert "differs from hf" in capsys.readouterr().out


def test_bad_input_is_one_line_not_a_traceback(capsys):
    assert main(["check-ops", "--tokens", "0"]) == 2
    err = capsys.readouterr().err
    assert "--tokens must be positive" in err and "Traceback" not in err


def test_an_unknown_profile_is_the_users_error(capsys):
    # a KeyError rla raises on purpose (an unknown name) is one line, exit 2
    assert main(["demo", "--profile", "no-such-profile", "--out", "unused"]) == 2
    err = capsys.readouterr().err
    assert "no-such-profile" in err and "Traceback" not in err and "internal error" not in err


def _planted(exc_factory):
    def run(args):
        raise exc_factory()

    return run


@pytest.mark.parametrize("make", [
    lambda: TypeError("an internal call with the wrong arguments"),
    lambda: KeyError("a missing dict key"),
    lambda: ValueError("from a dependency, not from rla"),
    lambda: AttributeError("a renamed attribute"),
])
def test_a_bug_keeps_its_traceback(make, monkeypatch, capsys):
    # raised outside rla's own raise statements (here: the test's code), these are bugs: the CLI
    # says so and lets the exception through instead of printing a one-line "error"
    import rla.commands.profiles as cmd

    monkeypatch.setattr(cmd, "run", _planted(make))
    with pytest.raises(type(make())):
        main(["profiles"])
    err = capsys.readouterr().err
    assert "internal error" in err and "please report" in err


def test_user_error_rule():
    from rla.errors import UserError, is_user_error
    from rla.rollout.rollouts import RolloutFormatError

    def caught(fn):
        try:
            fn()
        except Exception as e:  # noqa: BLE001 - the test inspects what was raised
            return e
        raise AssertionError("nothing raised")

    from rla import profiles

    assert is_user_error(caught(lambda: profiles.get("no-such-profile")))  # rla's own raise
    assert is_user_error(UserError("x")) and is_user_error(RolloutFormatError("x"))
    assert is_user_error(caught(lambda: open("/no/such/file")))  # OSError: the machine's or the user's
    assert not is_user_error(caught(lambda: int("x")))  # a builtin's ValueError, raised in this file
    assert not is_user_error(caught(lambda: {}["k"]))
    assert not is_user_error(ValueError("never raised"))  # no traceback: nothing says rla raised it


def test_top_level_entry_points_are_the_functions():
    import rla
    import rla.diagnosis
    import rla.rollout.train_logprobs

    assert rla.logprobs is rla.rollout.train_logprobs.logprobs
    assert rla.diagnose is rla.diagnosis.diagnose and rla.doctor is rla.diagnosis.doctor
    assert callable(rla.align) and callable(rla.detect_profile)
