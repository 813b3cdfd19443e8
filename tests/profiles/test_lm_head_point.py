"""The ``lm_head`` point as data (rla.profiles.head): in every row, with its evidence; derived rows for the switches."""

from __future__ import annotations

import pytest

from rla import profiles

READ_IN = {  # the function each engine row's evidence names (docs/rounding.md, "The LM head")
    "vllm": "LogitsProcessor._apply_head", "sglang": "LogitsProcessor._compute_lm_head",
    "transformers": "Qwen3ForCausalLM", "rla": "recipe",
}


def test_every_row_has_the_engines_default_head_with_evidence():
    assert profiles.POINTS["lm_head"] == ("lp", "fp32") == profiles.HEAD_POINTS["lm_head"]
    for name, row in profiles.all_profiles().items():
        assert row.lm_head == "lp", name
        ev = row.calibration.points["lm_head"]
        engine = row.calibration.engine
        assert ev.evidence == ("definition" if engine in ("transformers", "rla") else "source"), name
        assert READ_IN[engine] in ev.note, name
        if engine in ("vllm", "sglang"):
            assert "row.replace(lm_head='fp32')" in ev.note, name  # how to say the switch


def test_a_run_with_the_switch_is_a_derived_row():
    row = profiles.get("sglang")
    fp32 = row.replace(name="sglang-0.5.23+fp32-lm-head", lm_head="fp32")
    assert fp32.lm_head == "fp32" and not fp32.same_rounding(row)
    assert fp32.differs_from(row) == ()  # no region's point
    assert {k: v for k, v in fp32.points().items() if k != "lm_head"} == {
        k: v for k, v in row.points().items() if k != "lm_head"}
    back = profiles.from_dict(profiles.to_dict(fp32), "derived")
    assert back.lm_head == "fp32" and back == fp32


def test_a_file_without_the_point_or_with_another_value_is_refused():
    data = profiles.to_dict(profiles.get("vllm"))
    del data["points"]["lm_head"]
    with pytest.raises(ValueError, match=r"missing \['lm_head'\]"):
        profiles.from_dict(data, "old.json")
    data["points"]["lm_head"] = "bf16"
    with pytest.raises(ValueError, match=r"lm_head='bf16' is not one of \('lp', 'fp32'\)"):
        profiles.from_dict(data, "bad.json")
