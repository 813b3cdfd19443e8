"""The oracle of ``tests/align_spec.py`` checked itself: its profile table is rla's, and under the
``hf`` points its forward is the unaligned HF model bit for bit (so it can judge the other profiles)."""

import pytest
import torch

from align_spec import FAMILIES, MOE_OUT, PROFILES, SPEC, single_thread, spec_forward, tiny_model, tokens  # noqa: F401


def test_spec_table_is_rla_profiles():
    from rla.profiles import get, names

    assert tuple(names()) == PROFILES
    for name in PROFILES:
        assert get(name).points() == SPEC[name]
        assert get(name).variant("moe_experts").moe_out == (MOE_OUT.get(name) or "round"), name


@pytest.mark.parametrize("family", FAMILIES)
def test_spec_under_hf_points_is_the_unaligned_model(family):
    """The oracle reproduces HF eager bit for bit, so it can judge the other profiles."""
    model = tiny_model(family)
    ids = tokens()
    with torch.no_grad():
        assert torch.equal(model(ids).logits, spec_forward(model, ids, SPEC["hf"]))
        # ... and it is not blind: another profile's points change the logits.
        assert not torch.equal(spec_forward(model, ids, SPEC["vllm"]), spec_forward(model, ids, SPEC["hf"]))
