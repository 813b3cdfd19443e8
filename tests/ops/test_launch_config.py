"""``rla.ops.launch_config`` / ``set_launch_config``: the public names of the fused kernels' launch
parameters. The kernel modules are read as source (``ast``), so the checks run without Triton."""

import ast
import importlib.util

import pytest

from rla.ops import launch_config, set_launch_config
from rla.ops.launch import PARAMETERS

from repo_root import ROOT

OPS = ROOT / "src" / "rla" / "ops"
HAS_TRITON = importlib.util.find_spec("triton") is not None
#: Upper-case module constants of the kernel files that are limits or the formula's numbers, not
#: launch parameters.
NOT_LAUNCH = {"MAX_COLS", "BETA", "KAPPA"}


def _constants(module: str) -> dict[str, object]:
    """Module-level ``NAME = literal`` (and ``A, B = 1, 2``) assignments of a kernel file."""
    tree = ast.parse((OPS / (module.rsplit(".", 1)[-1] + ".py")).read_text())
    out = {}
    for node in tree.body:
        if isinstance(node, ast.Assign):
            target, value = node.targets[0], node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            target, value = node.target, node.value
        else:
            continue
        names = target.elts if isinstance(target, ast.Tuple) else [target]
        values = value.elts if isinstance(value, ast.Tuple) else [value]
        for n, v in zip(names, values):
            if isinstance(n, ast.Name) and n.id.isupper() and isinstance(v, ast.Constant):
                out[n.id] = v.value
    return out


def test_every_kernel_constant_has_a_public_key_and_every_key_a_constant():
    modules = {mod for mod, _, _ in PARAMETERS.values()}
    assert modules == {"rla.ops._triton_swiglu", "rla.ops._triton_geglu", "rla.ops._triton_swiglu_oai",
                       "rla.ops._triton_rope", "rla.ops._triton_norm"}
    declared = {(mod, name) for mod in modules for name in _constants(mod) if name not in NOT_LAUNCH}
    assert declared == {(mod, name) for mod, name, _ in PARAMETERS.values()}
    for key, (mod, name, types) in PARAMETERS.items():
        assert key.split(".")[0] == mod.split("._triton_")[-1], key  # "rope.*" lives in _triton_rope
        default = _constants(mod)[name]
        assert isinstance(default, types) and not isinstance(default, bool), (key, default)


@pytest.mark.parametrize(
    "config, words",
    [
        ({"rope.numwarps": 4}, ["unknown parameter 'rope.numwarps'", "rope.num_warps"]),
        ({"rla.ops._triton_rope": {"NUM_WARPS": 4}}, ["unknown parameter 'rla.ops._triton_rope'"]),
        ({"rope.tokens": True}, ["rope.tokens must be int", "True"]),
        ({"swiglu.fwd_block": "2048"}, ["swiglu.fwd_block must be int"]),
        ({"norm.bwd_stages": 0}, ["norm.bwd_stages must be a positive integer"]),
        ({"swiglu.fwd_block": 1000}, ["swiglu.fwd_block must be a power of two", "1000"]),
        ({"norm.evict": "evict_sometimes"}, ["norm.evict must be one of"]),
        ([("rope.tokens", 2)], ["must be a mapping"]),
    ],
)
def test_bad_entries_are_refused_by_name_and_nothing_is_set(config, words):
    before = launch_config()
    with pytest.raises(ValueError) as err:
        set_launch_config({"rope.tokens": 2, **config} if isinstance(config, dict) else config)
    for w in words:
        assert w in str(err.value)
    assert launch_config() == before  # the valid entry beside the bad one was not applied


@pytest.mark.skipif(HAS_TRITON, reason="the no-Triton behaviour")
def test_without_triton_there_is_nothing_to_configure():
    assert launch_config() == {}
    with pytest.raises(ValueError, match="Triton is not installed"):
        set_launch_config({"rope.tokens": 2})
    set_launch_config({})  # an empty config asks for nothing


@pytest.mark.skipif(not HAS_TRITON, reason="needs Triton")
def test_with_triton_the_config_round_trips():
    before = launch_config()
    assert set(before) == set(PARAMETERS)
    try:
        set_launch_config({"rope.tokens": 2, "norm.fwd_warps": None})
        assert launch_config() == {**before, "rope.tokens": 2, "norm.fwd_warps": None}
    finally:
        set_launch_config(before)
    assert launch_config() == before
