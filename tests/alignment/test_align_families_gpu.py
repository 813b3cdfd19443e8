"""The newer families aligned on CUDA: rla's fused kernels where they exist (RoPE, SwiGLU, GeGLU,
the clamped SwiGLU, the plain norms), the PyTorch reference for the zero-centred norms, against
each family's oracle run on the same GPU.

Gemma 3 and Qwen3.5 (dense and MoE) under every row: their norms run the reference, and the fused
RoPE / SwiGLU / GeGLU kernels equal the reference bit for bit (tests/ops/test_gated_triton.py for
GeGLU), so the logits must be bit-equal; Qwen3.5 MoE with the router region too (its pinned sums are
loops of adds in the stated order, tests/alignment/test_align_router.py's GPU case). GPT-OSS, GLM-4 MoE, Gemma 4 and DeepSeek-V3 (its MLA's latent norms and rope half too)
under ``vllm-0.33-eager``: their plain norms run the fused kernel in vLLM's block order, which the
oracle's ``vllm_mean_square`` reproduces; under the ``unpinned`` rows the fused norm's tree and
PyTorch's mean differ by an ulp now and then, so those rows are not compared here.
"""

from __future__ import annotations

import pytest
import torch

import rla
from packaging.version import Version

from rla.alignment import compat
from align_spec import PROFILES, SPEC

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def _case(name):
    if name == "gemma3":
        from gemma_spec import gemma_points, spec_forward, tiny_gemma3
        return tiny_gemma3(), gemma_points, spec_forward
    if name == "gemma4":
        from gemma4_spec import gemma4_points, spec_forward, tiny_gemma4
        return tiny_gemma4(), gemma4_points, spec_forward
    if name == "qwen3_5":
        from qwen3_5_spec import qwen3_5_points, spec_forward, tiny_qwen3_5
        return tiny_qwen3_5(), qwen3_5_points, spec_forward
    if name == "qwen3_5_moe":
        from qwen3_5_spec import qwen3_5_points, spec_forward, tiny_qwen3_5_moe
        return tiny_qwen3_5_moe(), qwen3_5_points, spec_forward
    if name == "gpt_oss":
        from gpt_oss_spec import gpt_oss_points, spec_forward, tiny_gpt_oss
        return tiny_gpt_oss(), gpt_oss_points, spec_forward
    if name.startswith("deepseek_v3"):  # deepseek_v3:<config of deepseek_v3_spec.CONFIGS>
        from deepseek_v3_spec import spec_forward, tiny_deepseek_v3
        return tiny_deepseek_v3(name.split(":")[1]), lambda p: SPEC[p], spec_forward
    from glm4_moe_spec import spec_forward, tiny_glm4_moe
    return tiny_glm4_moe(), lambda p: SPEC[p], spec_forward


@pytest.mark.parametrize("name, profiles", [
    ("gemma3", PROFILES), ("qwen3_5", PROFILES), ("qwen3_5_moe", PROFILES), ("gpt_oss", ("vllm-0.33-eager",)),
    ("glm4_moe", ("vllm-0.33-eager",)),
    ("gemma4", ("vllm-0.33-eager",)),
    ("deepseek_v3:interleaved", ("vllm-0.33-eager",)), ("deepseek_v3:yarn_released", ("vllm-0.33-eager",)),
])
def test_aligned_on_cuda_equals_the_oracle_on_cuda(name, profiles):
    if name != "gemma3" and compat.TRANSFORMERS_VERSION < Version("5.24"):
        pytest.skip(f"{name}: rla.align reads its 5.24 layout")
    model, points, spec_forward = _case(name)
    model = model.cuda()
    ids = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(5)).cuda()
    with torch.no_grad():
        before = model(ids).logits
        for profile in profiles:
            rla.align(model, profile)
            try:
                got = model(ids).logits
            finally:
                rla.unalign(model)
            want = spec_forward(model, ids, points(profile))
            assert torch.equal(got, want), f"{name} {profile}: {(got == want).float().mean():.4f} of logits equal"
        assert torch.equal(model(ids).logits, before)


@pytest.mark.parametrize("profile", PROFILES)
def test_qwen3_5_moe_with_the_router_region_on_cuda_equals_the_oracle_on_cuda(profile):
    if compat.TRANSFORMERS_VERSION < Version("5.24"):
        pytest.skip("qwen3_5_moe: rla.align reads its 5.24 layout")
    from qwen3_5_spec import qwen3_5_points, spec_forward, tiny_qwen3_5_moe
    from rla.profiles import get

    model = tiny_qwen3_5_moe().cuda()
    ids = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(5)).cuda()
    with torch.no_grad():
        rla.align(model, profile, regions=("rope", "swiglu", "rmsnorm", "router"))
        try:
            got = model(ids).logits
        finally:
            rla.unalign(model)
        want = spec_forward(model, ids, qwen3_5_points(profile), get(profile).router)
    assert torch.equal(got, want), f"{profile}: {(got == want).float().mean():.4f} of logits equal"


def test_gemma4_post_norm_out_fp32_on_cuda_equals_the_oracle_on_cuda():
    """Gemma 4's post-sub-block norms with an fp32 output (``post_norm_out='fp32'``, rla's norm kernels on
    CUDA) under vllm-0.33-eager's points (its vLLM block reduction, which the kernels and the oracle share)."""
    if compat.TRANSFORMERS_VERSION < Version("5.24"):
        pytest.skip("gemma4: rla.align reads its 5.24 layout")
    from rla import profiles

    model, points, spec_forward = _case("gemma4")
    model = model.cuda()
    ids = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(5)).cuda()
    row = profiles.get("vllm-0.33-eager").replace_variant("gemma4", name="eager-post-norm-fp32", post_norm_out="fp32")
    pts = points("vllm-0.33-eager")
    pts["post_norm_out"] = "fp32"
    with torch.no_grad(), rla.aligned(model, row):
        got = model(ids).logits
    with torch.no_grad():
        want = spec_forward(model, ids, pts)
    assert torch.equal(got, want), f"{(got == want).float().mean():.4f} of logits equal"


def test_gemma4_model_body_points_on_cuda_equal_the_oracle_on_cuda():
    """Gemma 4's four model-body points (ple_inputs, ple_add, stream_variance, embed_variance at the default
    rows' values) on CUDA, over vllm-0.33-eager's points with the default rows' fp32_sum / fp32_carry (the
    points ple_add and stream_variance act under) and its vLLM block reduction, which the two-input norm (rla's
    Triton kernel on CUDA, ``rla.ops._triton_norm_var``) and the oracle share: the oracle with the four chains."""
    if compat.TRANSFORMERS_VERSION < Version("5.24"):
        pytest.skip("gemma4: rla.align reads its 5.24 layout")
    from gemma4_spec import CHAIN_OF, tiny_gemma4
    from rla import profiles

    _, points, spec_forward = _case("gemma4")
    model = tiny_gemma4(hidden_size=96).cuda()  # sqrt(96) and 96**-0.5 round: every chain shows
    ids = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(5)).cuda()
    body = {p: profiles.VARIANT_POINTS[p][1] for p in CHAIN_OF}
    row = profiles.get("vllm-0.33-eager").replace(name="eager-fp32-sum-body", norm_residual="fp32_sum",
                                                   residual_stream="fp32_carry")
    row = row.replace_variant("gemma4", **body)
    pts = points("vllm-0.33-eager")
    pts.update(norm_residual="fp32_sum", residual_stream="fp32_carry", **body)
    with torch.no_grad(), rla.aligned(model, row):
        got = model(ids).logits
    with torch.no_grad():
        want = spec_forward(model, ids, pts)
        plain = spec_forward(model, ids, pts, chains=())
    assert torch.equal(got, want), f"{(got == want).float().mean():.4f} of logits equal"
    assert not torch.equal(want, plain)
