"""One ulp at the CPU twin level: on models built so that a one-ulp change of one region op's fp32
arithmetic flips the logits (``tests/ulp_models.py``), ``rla.align(model, "vllm-0.33")`` equals
vLLM 0.33's own region code (compiled by Inductor, as vLLM's default path runs it;
``rla.engines.vllm_twin``) bit for bit: logits and every layer's stream.

The test proves its own sensitivity: the oracle with the planted expression (an ``Arith`` of
``align_spec``) differs from the twin's logits on these inputs, while the oracle's own expression
equals them. So the twin, not only rla's reference, is pinned to the last bit of each op here: a
change of that bit in ``src/rla`` (``lab/mutation``) makes the aligned model leave the twin.
"""

import pytest
import torch

import rla
from rla.engines.twin_compare import compare, hf_side

from align_spec import SPEC, single_thread, spec_forward  # noqa: F401
from ulp_models import PLANTED, one_ulp_case


#: The cases run against the twin: the norm, the fp32_carry add and the q/k-norm chain, the three
#: points where vLLM's default path keeps an fp32 value that a bf16-only check cannot see. Each
#: twin compiles its own graphs (1.5-4 s on a 2-core CPU), so SwiGLU's silu and the cos/sin tables,
#: whose planted cases are bf16 roundings of one op, are checked against the oracle only
#: (tests/alignment/test_align_one_ulp.py); against the twin they are compared only on the random
#: inputs of tests/engines/test_vllm_twin.py, where a one-ulp change rarely shows.
TWIN_CASES = ("norm_rstd", "carry_order", "qk_norm_product")


@pytest.mark.parametrize("name", TWIN_CASES)
def test_aligned_model_equals_the_twin_where_one_ulp_shows(name, vllm_engine):
    from rla.engines.vllm_twin import VllmTwin

    model, ids, positions, planted = one_ulp_case(name)
    if positions is None:
        positions = torch.arange(ids.shape[1])[None].expand_as(ids)
    out = VllmTwin(model, vllm_engine, "default")(ids, positions)
    twin_logits = out.logits.reshape(*ids.shape, -1)
    pts = SPEC["vllm-0.33"]
    with torch.no_grad():
        want = spec_forward(model, ids, pts, positions=positions)
        other = spec_forward(model, ids, pts, positions=positions, arith=planted)
    assert torch.equal(twin_logits, want.to(twin_logits.dtype)), f"{name}: the twin is not the spec's row"
    assert not torch.equal(twin_logits, other.to(twin_logits.dtype)), f"{name}: {PLANTED[name][0]} is not seen"
    rla.align(model, "vllm-0.33")
    try:
        side = compare((out.logits, out.layers), {"side": hf_side(model)}, ids, positions).sides[0]
    finally:
        rla.unalign(model)
    assert side.logits_equal == 1.0 and side.k3 == 0.0, f"{name}: aligned {side.logits_equal:.4f} equal"
    assert [row["equal"] for row in side.layers] == [1.0] * len(out.layers)
