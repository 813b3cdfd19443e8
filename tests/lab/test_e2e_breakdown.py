"""lab/bench/e2e_breakdown.py on CPU: the saved-tensor accounting of part a against what each
region saves by definition (HF's RMSNorm keeps an fp32 x and a bf16 x*rstd, rla's keeps its input
and one fp32 rstd per row), storages counted once; and the kernel grouping runs (part c's CPU form)."""

import pytest
import torch

import rla
from align_spec import tiny_model, tokens
from lab.bench import e2e_breakdown as B


def _last_layer(profile, ids):
    model = tiny_model("qwen2").train()
    if profile:
        rla.align(model, profile)
    cfg = model.config
    saved = B.saved_tensors(model, ids)
    return B.per_element(saved, ids.numel(), cfg.hidden_size, cfg.num_hidden_layers)["last_layer_by_kind"], cfg


def test_saved_bytes_per_element_are_the_regions_definitions():
    ids = tokens(batch=2, seq=16)
    hf, cfg = _last_layer(None, ids)
    vllm, _ = _last_layer("vllm", ids)
    eager, _ = _last_layer("vllm-eager", ids)
    h, i, rstd = cfg.hidden_size, cfg.intermediate_size, 4 / cfg.hidden_size  # rstd: 4 bytes per row
    assert hf["norm"] == pytest.approx(2 * (4 + 2 + rstd))  # two norms: fp32 x, bf16 x*rstd, rstd
    assert eager["norm"] == pytest.approx(2 * (2 + rstd))  # bf16 input; the add + norm's rounded sum
    # the fp32 sum s (kept by the input norm, and by the add + norm in place of r = RN(s)) and attn_out
    assert vllm["norm"] == pytest.approx(4 + 2 + 2 * rstd)
    assert hf["swiglu/act"] == pytest.approx(3 * 2 * i / h)  # gate, silu(gate), up
    assert vllm["swiglu/act"] == eager["swiglu/act"] == pytest.approx(2 * 2 * i / h)  # gate, up
    assert vllm["gemm"] == eager["gemm"] == hf["gemm"]


def test_a_storage_is_counted_once_and_parameters_apart():
    x = torch.zeros(4, 8)
    w = torch.zeros(8)

    def rec(t, node):
        return dict(module="model.layers.1.mlp", module_class="Qwen2MLP", dtype="float32", shape=list(t.shape),
                    view_bytes=t.numel() * 4, key=B._storage_key(t), node=node)

    out = B.summarise_saved([rec(x, "MulBackward0"), rec(x[1:], "SiluBackward0"), rec(w, "MmBackward0")],
                            {B._storage_key(w)}, last_layer=1)
    assert out["activation_bytes"] == x.numel() * 4 and out["param_bytes"] == w.numel() * 4
    assert out["per_layer"] == {"1": {"swiglu/act": x.numel() * 4}}


def test_kernel_grouping_runs_on_cpu():
    model = tiny_model("qwen2").train()
    rla.align(model, "vllm")
    got = B.kernel_times(model, tokens(batch=1, seq=8), cuda=False)
    assert set(got["us"]) == set(B.KINDS) and got["us"]["norm"] > 0 and got["us"]["gemm"] > 0
