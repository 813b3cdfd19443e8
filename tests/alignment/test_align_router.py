"""The router region: aligned MoE blocks equal the router points' own definition, bit for bit.

Four families (Qwen2-MoE with its gated shared expert, Qwen3-MoE, Mixtral, DeepSeek-V3's sigmoid
grouped router with correction bias and routed scaling), top-3 of 8 experts so the three sum
orders differ. Each engine row is held to ``router_spec`` (written from the points' definitions,
not from ``rla.ops.routing``): expert ids, routing weights and the block's output, bitwise; HF's
own values reproduce HF's module bitwise under the eager and the grouped_mm experts.
"""

from __future__ import annotations

import pytest
import torch

import rla
from rla.alignment.families import FAMILIES
from rla.alignment.router import hf_router_points
from rla.profiles import ROUTER_POINTS, get

import moe_models as M
import router_spec

from align_spec import single_thread  # noqa: F401
from packaging.version import Version

from rla.alignment import compat
from rla.alignment.core import ROUTER_MIN_TRANSFORMERS

CHECKED = compat.TRANSFORMERS_VERSION >= Version(ROUTER_MIN_TRANSFORMERS)
pytestmark = pytest.mark.skipif(not CHECKED, reason=f"the router region is refused below transformers "
                                f"{ROUTER_MIN_TRANSFORMERS} (test_the_router_region_is_refused_on_older_transformers)")


def _inputs(block, seed=0, n=24):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n, block.gate.weight.shape[1], generator=g)).bfloat16()


@pytest.mark.parametrize("impl", ["eager", "grouped_mm"])
def test_hf_values_reproduce_hf_and_unalign_restores_it(impl):
    ids = M.tokens()
    for family in M.FAMILIES:
        model = M.model(family, experts=impl)
        with torch.no_grad():
            plain = model(ids).logits
            report = rla.align(model, "hf", regions=("router",))
            assert report.counts["router"] == {"MoE blocks": len(M.blocks(model))}
            assert torch.equal(model(ids).logits, plain), family
            rla.align(model, "vllm", regions=("router",))
            assert not torch.equal(model(ids).logits, plain), family  # the row moves the output
            rla.unalign(model)
            assert torch.equal(model(ids).logits, plain), family


def test_hf_values_per_family():
    want = {"qwen2_moe": ("lp", "lp"), "qwen3_moe": ("lp", "lp"), "mixtral": ("lp", "fp32"), "deepseek_v3": ("fp32", "fp32")}
    for family, (logits, weights) in want.items():
        for impl, term, comb in (("eager", "lp", "lp_expert_order"), ("grouped_mm", None, "fp32_slot_order")):
            block = M.blocks(M.model(family, experts=impl))[0]
            p = hf_router_points(block, FAMILIES[family])
            assert (p.logits, p.weights, p.combine) == (logits, weights, comb), (family, impl)
            assert p.weighted_term == (term or ("fp32" if weights == "fp32" else "lp")), (family, impl)


@pytest.mark.parametrize("profile", ["vllm-0.33", "sglang-0.5.23", "rla"])
def test_aligned_block_equals_the_rows_definition(profile):
    points = get(profile).router
    for family in M.FAMILIES:
        fam = FAMILIES[family]
        model = M.model(family)
        block = M.blocks(model)[0]
        x = _inputs(block)
        with torch.no_grad():
            hf = block(x[None])[0]
            rla.align(model, profile, regions=("router",))
            captured = []
            block.__dict__["_rla_router"].capture = captured
            got = block(x[None])[0]
        ids, weights = captured[0]
        want_ids, want_w = router_spec.route(block, x, points, fam.router)
        assert torch.equal(ids, want_ids), (family, profile)
        assert torch.equal(weights, router_spec.route(block, x, points, fam.router, raw=True)[1]), (family, profile)
        want = router_spec.block_output(block, x, want_ids, want_w, points, fam.router, fam.shared_expert)
        assert torch.equal(got, want), (family, profile, (got.float() - want.float()).abs().max())
        assert not torch.equal(got, hf), (family, profile)


def test_each_point_changes_the_output():
    """Every point of the vLLM row, switched alone, moves the block's output (a point the aligned
    forward ignored would pass the test above only where both values agree)."""
    base = get("vllm-0.33").router
    flips = {"logits": "fp32", "softmax": "divide", "renorm": "divide", "sigmoid": "torch", "sigmoid_renorm": "divide",
             "ties": "torch", "weights": "lp", "expert_out": "lp", "weighted_term": "fp32", "combine": "lp_slot_order",
             "routed_scale": "weights"}
    assert set(flips) == set(ROUTER_POINTS)
    model = M.model("deepseek_v3")
    block = M.blocks(model)[0]
    x = _inputs(block, n=256)
    rla.align(model, "vllm", regions=("router",))
    state = block.__dict__["_rla_router"]
    with torch.no_grad():
        ref = block(x[None])
        moved = {}
        for point, value in flips.items():
            state.points = base.replace(**{point: value})
            moved[point] = not torch.equal(block(x[None]), ref)
    # softmax and renorm: DeepSeek-V3's router is a sigmoid one (sigmoid_renorm is its renorm); its
    # scores are rarely tied; sigmoid and sigmoid_renorm move fp32 weights by an ulp, which reaches
    # the bf16 output only across a rounding boundary: they are held to the captured weights
    assert {p for p, m in moved.items() if not m} <= {"softmax", "ties", "renorm", "sigmoid", "sigmoid_renorm"}, moved
    assert not moved["renorm"], moved
    assert _weights_move(block, state, x, base.replace(sigmoid="torch"), base)
    for renorm in ("divide", "torch", "reciprocal"):  # warp_fp64 at k = 3 sums (w0 + w2) + w1
        assert _weights_move(block, state, x, base.replace(sigmoid_renorm=renorm), base), renorm
    model = M.model("qwen3_moe")
    block = M.blocks(model)[0]
    rla.align(model, "vllm", regions=("router",))
    state = block.__dict__["_rla_router"]
    x = _inputs(block, n=256)
    with torch.no_grad():
        ref = block(x[None])
        for point in ("softmax", "logits", "weights"):
            state.points = base.replace(**{point: flips[point]})
            assert not torch.equal(block(x[None]), ref), point
    for renorm in ("divide", "torch"):
        assert _weights_move(block, state, x, base.replace(renorm=renorm), base), renorm
    # ties: make expert 1's gate row expert 0's, so their probabilities tie exactly on every token;
    # lowest_index then never picks 1 without 0
    block.gate.weight.data[1] = block.gate.weight.data[0]
    state.points, captured = base, []
    state.capture = captured
    with torch.no_grad():
        block(x[None])
    chosen = captured[0][0]
    has0, has1 = (chosen == 0).any(1), (chosen == 1).any(1)
    assert has0.any() and not (has1 & ~has0).any()


def _weights_move(block, state, x, points, base):
    got = []
    for p in (points, base):
        state.points, state.capture = p, []
        with torch.no_grad():
            block(x[None])
        got.append(state.capture[0][1])
    state.capture = None
    return not torch.equal(*got)


def test_gradient_reaches_the_gate_through_the_aligned_router():
    points = get("vllm-0.33").router
    for family in ("qwen3_moe", "deepseek_v3"):
        fam = FAMILIES[family]
        model = M.model(family)
        block = M.blocks(model)[0]
        x = _inputs(block)
        rla.align(model, "vllm", regions=("router",))
        got = block(x[None])[0]
        (got.float() * torch.linspace(-1, 1, got.shape[-1])).sum().backward()
        g_aligned = block.gate.weight.grad.clone()
        block.gate.weight.grad = None
        ids, w = router_spec.route(block, x, points, fam.router)
        want = router_spec.block_output(block, x, ids, w, points, fam.router, fam.shared_expert)
        (want.float() * torch.linspace(-1, 1, want.shape[-1])).sum().backward()
        assert g_aligned.abs().sum() > 0, family
        # the same ops in the same order: the gradient is the definition's, bit for bit
        assert torch.equal(g_aligned, block.gate.weight.grad), family


def test_router_region_errors():
    dense = M.model("qwen3_moe")
    from glm4_moe_spec import tiny_glm4_moe
    with pytest.raises(NotImplementedError, match=r"glm4_moe supports the regions \('rope', 'swiglu', 'rmsnorm'\), "
                       r"not \('router',\)"):
        rla.align(tiny_glm4_moe(), "vllm", regions=("rope", "swiglu", "rmsnorm", "router"))
    from align_spec import tiny_model
    with pytest.raises(ValueError, match="no MoE block"):
        rla.align(tiny_model("qwen2"), "vllm", regions=("router",))
    with pytest.raises(ValueError, match="unknown region"):
        rla.align(dense, "vllm", regions=("routers",))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_router_equals_its_definition_on_cuda():
    for profile in ("vllm-0.33", "sglang-0.5.23"):
        points = get(profile).router
        for family in M.FAMILIES:
            fam = FAMILIES[family]
            model = M.model(family).cuda()
            block = M.blocks(model)[0]
            x = _inputs(block, n=512).cuda()
            rla.align(model, profile, regions=("router",))
            captured = []
            block.__dict__["_rla_router"].capture = captured
            with torch.no_grad():
                got = block(x[None])[0]
                ids, w = router_spec.route(block, x, points, fam.router)
                want = router_spec.block_output(block, x, ids, w, points, fam.router, fam.shared_expert)
            # the capture holds the routes where the block ran (detached, on its device)
            assert torch.equal(captured[0][0].cpu(), ids.cpu()), (family, profile)
            assert torch.equal(captured[0][1].cpu(), router_spec.route(block, x, points, fam.router, raw=True)[1].cpu())
            assert torch.equal(got, want), (family, profile)


def test_router_alignment_survives_deepcopy_and_pickle():
    import copy
    import io

    model = M.model("qwen3_moe")
    ids = M.tokens()
    rla.align(model, "vllm", regions=("rope", "swiglu", "rmsnorm", "router"))
    with torch.no_grad():
        want = model(ids).logits
        buf = io.BytesIO()
        torch.save(model, buf)
        buf.seek(0)
        for other in (copy.deepcopy(model), torch.load(buf, weights_only=False)):
            assert torch.equal(other(ids).logits, want)
            assert rla.alignment_of(other).regions == ("rope", "swiglu", "rmsnorm", "router")
