"""The MoE cases of the rows' ``moe_experts`` variant, shared by its tests (``test_align_moe_experts_variant.py``:
the routed experts' swiglu; ``test_align_moe_out.py``: the shared + routed sum): the default rows that carry
the variant, the prompt, and each MoE family's tiny model with the oracle and points it is checked against."""

from __future__ import annotations

import pytest
import torch
from packaging.version import Version

from rla.alignment import compat
import align_spec
import deepseek_v3_spec
import glm4_moe_spec
import qwen3_5_spec

#: The families' 5.24 layouts (older releases are refused); a test module's ``pytestmark``.
LAYOUTS = pytest.mark.skipif(compat.TRANSFORMERS_VERSION < Version("5.24"),
                             reason="the families' 5.24 layouts (older releases are refused)")

#: The rows whose ``moe_experts`` variant the tests check (the eager and SGLang rows have none).
DEFAULT_ROWS = ("vllm-0.33", "vllm-0.26")


def ids(seq=12):
    """The prompt, [2, seq] tokens of the tiny models' vocabulary."""
    return torch.randint(0, 128, (2, seq), generator=torch.Generator().manual_seed(4))


def _spec_points(profile):
    return align_spec.SPEC[profile]


#: family -> (its tiny model, a row's points for its oracle, the oracle's forward)
_FAMILIES = {
    "qwen2_moe": (lambda: align_spec.tiny_model("qwen2_moe"), _spec_points, align_spec.spec_forward),
    "qwen3_moe": (lambda: align_spec.tiny_model("qwen3_moe"), _spec_points, align_spec.spec_forward),
    "mixtral": (lambda: align_spec.tiny_model("mixtral"), _spec_points, align_spec.spec_forward),
    "glm4_moe": (glm4_moe_spec.tiny_glm4_moe, _spec_points, glm4_moe_spec.spec_forward),
    "deepseek_v3": (lambda: deepseek_v3_spec.tiny_deepseek_v3(next(iter(deepseek_v3_spec.CONFIGS))), _spec_points,
                    deepseek_v3_spec.spec_forward),
    "qwen3_5_moe": (qwen3_5_spec.tiny_qwen3_5_moe, qwen3_5_spec.qwen3_5_points, qwen3_5_spec.spec_forward),
}
FAMILIES = tuple(_FAMILIES)


def family(name):
    """(a fresh tiny model, points of a row, oracle forward) for the MoE family ``name``."""
    make, points_of, oracle = _FAMILIES[name]
    return make(), points_of, oracle


def tiny(name):
    """A fresh tiny model of the MoE family ``name``."""
    return _FAMILIES[name][0]()


def first_moe_block(model):
    """The model's first MoE block (the first layer whose MLP has experts)."""
    return next(layer.mlp for layer in model.model.layers if hasattr(layer.mlp, "experts"))
