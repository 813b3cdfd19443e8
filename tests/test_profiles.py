import dataclasses

import pytest

from rla import profiles


def test_builtins_are_the_rounding_md_table():
    table = {
        "hf": ("round", "per_op", "per_op", "per_op", "rounded_sum"),
        "vllm": ("round", "fused", "fused", "fused", "fp32_sum"),
        "vllm-eager": ("round", "fused", "per_op", "per_op", "rounded_sum"),
        "sglang": ("fp32", "fused", "fused", "fused", "fp32_sum"),
        "rla": ("fp32", "fused", "fused", "fused", "fp32_sum"),
    }
    assert profiles.names() == list(table)
    for name, row in table.items():
        assert tuple(profiles.get(name).points().values()) == row


def test_every_field_is_documented():
    import inspect

    import re

    src = inspect.getsource(profiles.RoundingProfile)
    for f in dataclasses.fields(profiles.RoundingProfile):
        # the field's declaration line is followed by its docstring
        assert re.search(rf"\n    {f.name}: [^\n]+\n    \"\"\"\S", src), f"{f.name} has no docstring"


def test_unknown_name_lists_known_ones():
    with pytest.raises(KeyError, match="hf, vllm, vllm-eager, sglang, rla"):
        profiles.get("trtllm")


def test_custom_profile_by_replace_and_validation():
    mine = dataclasses.replace(profiles.get("vllm"), name="vllm-0.11", swiglu="per_op")
    assert mine.swiglu == "per_op" and profiles.get("vllm").swiglu == "fused"
    assert mine.differs_from(profiles.get("vllm")) == ("swiglu",)
    assert profiles.resolve(mine) is mine
    with pytest.raises(ValueError, match="swiglu='fp64'"):
        dataclasses.replace(mine, swiglu="fp64")
    with pytest.raises(dataclasses.FrozenInstanceError):
        mine.swiglu = "fused"


def test_differs_from():
    assert profiles.get("vllm").differs_from(profiles.get("sglang")) == ("rope",)
    assert profiles.get("sglang").same_rounding(profiles.get("rla"))
    assert set(profiles.get("hf").differs_from(profiles.get("vllm"))) == {"rope", "swiglu", "rmsnorm"}
