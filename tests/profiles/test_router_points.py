"""Router points in profile rows: read, validated and written back; every engine row's values
come with evidence naming the file they were read from."""

from __future__ import annotations

import pytest

from rla.profiles import ROUTER_POINTS, RouterPoints, from_dict, get, names, to_dict


def test_engine_rows_carry_router_points_with_evidence():
    for name in names():
        p = get(name)
        if p.router is None:
            assert name == "hf"  # HF's own module is the baseline (rla.alignment.router.hf_router_points)
            continue
        assert set(p.router.evidence) == set(ROUTER_POINTS), name
        if p.calibration.engine in ("vllm", "sglang"):
            for point, ev in p.router.evidence.items():
                assert ev.evidence == "source" and (".py" in ev.note or "inferred" in ev.note), (name, point)
        assert from_dict(to_dict(p)) == p and from_dict(to_dict(p)).router.evidence == p.router.evidence


def test_router_values_are_checked():
    data = to_dict(get("vllm-0.33"))
    data["router"]["points"]["combine"] = "fp16_sum"
    with pytest.raises(ValueError, match=r"router: router point combine='fp16_sum' is not one of"):
        from_dict(data, "x.json")
    data = to_dict(get("vllm-0.33"))
    del data["router"]["points"]["ties"]
    with pytest.raises(ValueError, match=r"missing \['ties'\]"):
        from_dict(data, "x.json")
    data = to_dict(get("vllm-0.33"))
    del data["router"]
    assert from_dict(data).router is None  # a file from rla calibrate: no router values claimed
    with pytest.raises(ValueError, match="needs combine='fp32_slot_order'"):
        get("vllm-0.33").router.replace(combine="lp_slot_order", routed_scale="combine")
    with pytest.raises(ValueError, match="unknown router point"):
        get("vllm-0.33").router.replace(order="x")
    assert isinstance(get("sglang").router, RouterPoints)
