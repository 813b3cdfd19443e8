import json

from rla.cli import main


def test_profiles_table_and_json(capsys):
    assert main(["profiles", "--evidence"]) == 0
    out = capsys.readouterr().out
    assert "vllm-0.33-eager" in out and "fp32_sum" in out and "vllm-eager -> vllm-0.33-eager" in out
    assert "vllm-0.33-eager: evidence per point" in out and "kernel" in out  # versions and evidence
    # the table (a row per point, a column per profile) shows every value whole in 80 columns
    from rla import profiles

    rows = {line.split()[0]: line.split()[1:] for line in out.splitlines() if line.split() and line.split()[0] in profiles.POINTS}
    names = list(profiles.all_profiles())
    assert set(rows) == set(profiles.POINTS)
    for point, cells in rows.items():
        assert cells == [getattr(profiles.get(n), point) for n in names], point
    assert main(["profiles", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [r["name"] for r in data["profiles"]] == ["hf", "sglang-0.5.23", "vllm-0.33", "vllm-0.33-eager", "rla"]
    assert data["aliases"]["vllm"] == "vllm-0.33"
    assert data["profiles"][3]["calibration"]["points"]["swiglu"]["evidence"] == "kernel"


def test_check_ops_reports_every_profile_and_region(capsys):
    assert main(["check-ops", "--tokens", "16", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert len(rows) == 5 * 4
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


def test_top_level_entry_points_are_the_functions():
    import rla
    import rla.diagnosis
    import rla.rollout.train_logprobs

    assert rla.logprobs is rla.rollout.train_logprobs.logprobs
    assert rla.diagnose is rla.diagnosis.diagnose and rla.doctor is rla.diagnosis.doctor
    assert callable(rla.align) and callable(rla.detect_profile)
