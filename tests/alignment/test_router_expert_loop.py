"""The router region's expert loop learns its tokens with one host sync per MoE block, and computes
what the per-expert ``nonzero`` loop it replaced computed, bit for bit.

The loop before (kept here as :func:`_where_loop`, HF's eager ``for expert_idx in expert_hit``
shape): ``one_hot`` of the ids, ``nonzero`` for the experts hit, then per expert ``torch.where``
for its (slot, token) pairs and the weights indexed by a 0-d tensor: ~4 host waits per expert and
block on a GPU. Now a stable sort of the ids gives every expert's pairs in the same order (so each
expert's GEMM sees the same rows in the same order: cuBLAS may round otherwise for another M), and
one ``tolist`` of the run bounds is the block's only host sync. Route capture keeps each forward's
routes on the device; the sampler copies them to the host once per rollout.
"""

from __future__ import annotations

import collections

import pytest
import torch
import torch.nn.functional as F
from packaging.version import Version
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

import rla
from rla.alignment import capture_routes, compat, router
from rla.alignment.core import ROUTER_MIN_TRANSFORMERS
from rla.profiles import REGIONS, get
from rla.rollout import sampler as sampler_mod
from rla.rollout.sampler import Sampler, SamplingParams

import moe_models as M

from align_spec import single_thread  # noqa: F401

pytestmark = pytest.mark.skipif(compat.TRANSFORMERS_VERSION < Version(ROUTER_MIN_TRANSFORMERS),
                                reason=f"the router region is refused below transformers {ROUTER_MIN_TRANSFORMERS}")

E = 8


def _where_loop(experts, x, ids, points):
    """The expert loop as it was (commit f8123a5): the reference, one host wait per nonzero/item."""
    t, k = ids.shape
    fp32 = points.expert_out == "fp32"
    out = x.new_zeros(t, k, x.shape[-1], dtype=torch.float32 if fp32 else x.dtype)
    with torch.no_grad():
        mask = F.one_hot(ids, num_classes=experts.num_experts + 1).permute(2, 1, 0)
        hit = torch.greater(mask.sum(dim=(-1, -2)), 0).nonzero()
    for e in hit:
        e = e[0]
        if e == experts.num_experts:
            continue
        pos, tok = torch.where(mask[e])
        h = experts._apply_gate(F.linear(x[tok], experts.gate_up_proj[e]))
        down = experts.down_proj[e]
        out[tok, pos] = F.linear(h.float(), down.float()) if fp32 else F.linear(h, down)
    return out


def _ids(t, k, seed, sentinel=False):
    g = torch.Generator().manual_seed(seed)
    ids = torch.stack([torch.randperm(E, generator=g)[:k] for _ in range(t)])
    if k == 1:
        ids[ids == 5] = 6  # leave expert 5 unhit
    if sentinel:
        ids[::3, -1] = E  # the id HF's loop skips (expert parallelism's padding)
    return ids


@pytest.mark.parametrize("t,k,sentinel", [(1, 2, False), (7, 1, False), (24, 3, True), (128, 2, False)])
def test_each_expert_gets_the_pairs_torch_where_gave_it_in_that_order(t, k, sentinel):
    ids = _ids(t, k, seed=t + k, sentinel=sentinel)
    tok, pos, bounds = router._expert_slices(ids, E)
    mask = F.one_hot(ids, num_classes=E + 1).permute(2, 1, 0)
    assert len(bounds) == E + 2 and bounds[0] == 0 and bounds[-1] == t * k
    for e in range(E + 1):
        want_pos, want_tok = torch.where(mask[e])
        got_tok, got_pos = tok[bounds[e]:bounds[e + 1]], pos[bounds[e]:bounds[e + 1]]
        assert torch.equal(got_tok, want_tok) and torch.equal(got_pos, want_pos), e
        assert got_tok.dtype == want_tok.dtype == torch.int64


def test_expert_ids_out_of_range_are_refused():
    for bad in (-1, E + 1):
        ids = _ids(4, 2, seed=0)
        ids[2, 1] = bad
        with pytest.raises(RuntimeError, match=r"expert ids must lie in \[0, 8\]"):
            router._expert_slices(ids, E)


@pytest.mark.parametrize("family", M.FAMILIES)
@pytest.mark.parametrize("profile", ["vllm-0.33", "hf"])
def test_block_output_and_gradients_equal_the_where_loop(family, profile, monkeypatch):
    def run(loop):
        monkeypatch.setattr(router, "_expert_outputs", loop)
        model = M.model(family, seed=1, gate_scale=0.02)
        rla.align(model, profile, regions=("router",))
        block = M.blocks(model)[0]
        x = torch.randn(40, model.config.hidden_size, generator=torch.Generator().manual_seed(3)).bfloat16()
        x.requires_grad_(True)
        out = block(x[None])
        (out.float() * torch.linspace(-1, 1, out.numel()).view_as(out)).sum().backward()
        return [out.detach(), x.grad] + [p.grad for p in block.parameters() if p.grad is not None]

    new = run(router._expert_outputs)
    old = run(_where_loop)
    assert len(new) == len(old) > 3
    assert all(torch.equal(a, b) for a, b in zip(new, old))


class _Syncs(TorchDispatchMode):
    """Counts the ops that make the host wait when their input is on a GPU, and the host copies."""

    def __init__(self):
        super().__init__()
        self.n = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if str(func) in ("aten._local_scalar_dense.default", "aten.nonzero.default"):
            self.n[str(func)] += 1
        return func(*args, **(kwargs or {}))


class _Copies(TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.n = collections.Counter()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", "") in ("cpu", "tolist", "numpy", "item"):
            self.n[func.__name__] += 1
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("family", M.FAMILIES)
def test_a_routed_block_waits_on_the_device_once(family):
    model = M.model(family, seed=1)
    rla.align(model, "vllm-0.33", regions=("router",))
    block = M.blocks(model)[0]
    x = torch.randn(1, 64, model.config.hidden_size, generator=torch.Generator().manual_seed(0)).bfloat16()
    with torch.no_grad(), capture_routes(model) as cap:
        syncs, copies = _Syncs(), _Copies()
        with syncs, copies:
            block(x)
    assert len(cap.per_layer[0]) == 1  # the block was captured
    assert sum(syncs.n.values()) == 0, syncs.n  # no nonzero, no item (0-d indexing, one_hot's check)
    assert copies.n == {"tolist": 1}, copies.n  # the run bounds; capture copies nothing


def _old_record_routes(capture, row, padded_prompt, prompt_len, response_len):
    """The per-row assembly as it was (commit f8123a5): the reference for the record layout."""
    experts, weights = [], []
    for forwards in capture.per_layer:
        pre_ids, pre_w = forwards[0]
        start = row * padded_prompt + padded_prompt - prompt_len
        ids = [pre_ids[start: start + prompt_len]] + [f[0][row: row + 1] for f in forwards[1: response_len]]
        w = [pre_w[start: start + prompt_len]] + [f[1][row: row + 1] for f in forwards[1: response_len]]
        experts.append(torch.cat(ids))
        weights.append(torch.cat(w))
    return {"version": 1, "experts": torch.stack(experts, 1).tolist(), "weights": torch.stack(weights, 1).tolist()}


def test_routes_come_to_the_host_once_and_as_the_per_row_assembly_laid_them_out():
    from rla.alignment.replay import RouteCapture

    rows, padded, layers, k, decodes = 5, 6, 3, 2, 4
    g = torch.Generator().manual_seed(0)
    cap = RouteCapture([[(torch.randint(0, E, (n, k), generator=g), torch.rand(n, k, generator=g))
                         for n in [rows * padded] + [rows] * decodes] for _ in range(layers)])
    routes_of = sampler_mod._routes_on_host(cap, (rows, padded))
    for row, (p, r) in enumerate([(6, 5), (1, 1), (3, 2), (2, 5), (4, 3)]):
        assert routes_of(row, p, r) == _old_record_routes(cap, row, padded, p, r)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_seeded_rollout_is_bit_identical_to_the_where_loops(dtype, monkeypatch):
    def rollout():
        model = M.model("qwen3_moe", dtype=torch.float32, gate_scale=0.02)
        s = Sampler(model, profile="vllm-0.33", dtype=dtype, cache="dynamic", regions=(*REGIONS, "router"),
                    record_routes=True)
        recs = s.generate([[1, 5, 9, 17, 3], [1, 40], [1, 7, 100], [2] * 7],
                          SamplingParams(max_new_tokens=9, seed=3, ignore_eos=True))
        return [(r.response_ids, torch.tensor(r.logprobs, dtype=torch.float64), r.routes) for r in recs]

    new = rollout()
    monkeypatch.setattr(router, "_expert_outputs", _where_loop)
    old = rollout()
    for (ids_a, lp_a, routes_a), (ids_b, lp_b, routes_b) in zip(new, old):
        assert ids_a == ids_b and torch.equal(lp_a, lp_b)
        assert routes_a == routes_b  # Python ints and floats: equal is bitwise
    assert get("vllm-0.33").router is not None
