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


def _module_output_refs(model, refs):
    """Weak references to every module's output tensor (the logits among them), as they are made."""
    import weakref

    def hook(mod, args, out):
        t = out if isinstance(out, torch.Tensor) else getattr(out, "logits", None)
        if t is None and isinstance(out, tuple) and out and isinstance(out[0], torch.Tensor):
            t = out[0]
        if isinstance(t, torch.Tensor):
            refs.append((type(mod).__name__, weakref.ref(t)))

    for m in model.modules():
        m.register_forward_hook(hook)


def test_part_a_leaves_no_graph_alive_between_variants(monkeypatch):
    """The H200 run of part a (2026-12-02) kept each variant's forward graph: the pack hook kept the
    live saved tensors, and a saved output's grad_fn made a cycle through C++ that gc cannot free."""
    import gc

    refs, alive = [], []
    build = B.build

    def built(*args, **kwargs):
        model = build(*args, **kwargs)
        _module_output_refs(model, refs)
        return model

    saved_tensors = B.saved_tensors

    def checked(model, ids):
        refs.clear()
        out = saved_tensors(model, ids)
        gc.collect()
        assert any(n == "Linear" for n, _ in refs)  # the hooks saw the forward (the LM head's logits too)
        alive.append([n for n, r in refs if r() is not None])
        return out

    monkeypatch.setattr(B, "build", built)
    monkeypatch.setattr(B, "saved_tensors", checked)
    rows = B.run_shape("qwen2.5-1.5b", ["hf-bf16", "rla-vllm", "rla-vllm-eager"], "a", torch.device("cpu"), 2, True,
                       reps=1, warmup=0, tokens=(1, 32))
    assert [r["variant"] for r in rows if "saved" in r] == ["hf-bf16", "rla-vllm", "rla-vllm-eager"]
    assert alive == [[], [], []]


def test_cuda_kernels_land_in_their_launching_op_and_ranges_are_not_kernels():
    """attribute_kernels on records shaped like a CUDA profile's: each kernel is linked to the op
    that launched it (linked correlation id), a range's gpu_user_annotation span is not a kernel."""
    R = B.ModuleStack.RANGE
    cpu = [  # corr, name, seq, start, end, parent, frontend, annotation
        dict(corr=1, name=f"{R}Qwen2DecoderLayer::model.layers.1", seq=-1, start=0, end=50, parent=None, frontend=True,
             annotation=True),
        dict(corr=2, name="aten::mm", seq=3, start=5, end=10, parent=0, frontend=True, annotation=False),
        dict(corr=700, name="cudaLaunchKernel", seq=-1, start=6, end=7, parent=1, frontend=False, annotation=False),
        dict(corr=3, name="aten::mm", seq=4, start=60, end=70, parent=None, frontend=True, annotation=False),
    ]
    device = [
        dict(name=cpu[0]["name"], start=100, end=200, linked=1, annotation=True),
        dict(name="nvjet_tst_128x256", start=110, end=150, linked=2, annotation=False),
        dict(name="nvjet_tst_128x256", start=110, end=150, linked=2, annotation=False),  # the same event twice
        dict(name="nvjet_tst_256x128", start=210, end=290, linked=3, annotation=False),
    ]
    recs = B.attribute_kernels(cpu, device)
    assert [(n, us) for n, us, _ in recs] == [("nvjet_tst_128x256", 40), ("nvjet_tst_256x128", 80)]
    assert [n for n, _ in recs[0][2]] == ["aten::mm", cpu[0]["name"]]
    got = B.group_kernels(recs)["us"]
    assert got["gemm"] == 40 and got["loss/lm head"] == 80 and sum(got.values()) == 120


def test_profile_records_read_this_torch():
    """_profile_records' reads of the profiler (raw Kineto events, FunctionEvent fields) on a CPU profile."""
    from torch.profiler import ProfilerActivity, profile

    x = torch.randn(16, 16)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        with torch.autograd.profiler.record_function(B.ModuleStack.RANGE + "Linear::lm_head"):
            x @ x
    cpu, device = B._profile_records(prof)
    assert device == []
    rng = next(i for i, r in enumerate(cpu) if r["name"].startswith(B.ModuleStack.RANGE))
    mm = next(r for r in cpu if r["name"] == "aten::mm")
    assert cpu[rng]["annotation"] and cpu[rng]["frontend"] and mm["frontend"] and not mm["annotation"]
    p = mm["parent"]
    while p is not None and p != rng:
        p = cpu[p]["parent"]
    assert p == rng
