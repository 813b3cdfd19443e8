import dataclasses

import pytest

from rla import profiles

try:
    from test_align_spec import SPEC
except ImportError:
    from tests.test_align_spec import SPEC


def test_builtins_are_the_rounding_md_table():
    # docs/rounding.md's table as written out, without rla, in test_align_spec (the spec the aligned
    # models are checked against): same profiles, same points in the same order, same values
    assert profiles.names() == list(SPEC)
    for name, row in SPEC.items():
        assert tuple(profiles.get(name).points().items()) == tuple(row.items())


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
