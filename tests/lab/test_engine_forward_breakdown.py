"""lab/bench/engine_forward_breakdown.py: imports without vLLM or CUDA, ``--help`` runs, and (with a
vLLM wheel: ``$RLA_ENGINE_WHEEL`` or vLLM 0.33's in the engine cache) its CPU form wires the ranges:
the recomputation and the autograd through it are seen in the backward, the pieces save less than
HF's layers, and the aot_eager recomputation's gradients equal today's bit for bit."""

import json
import os
import subprocess
import sys

import pytest

from lab.bench import engine_forward_breakdown as B
from repo_root import ROOT


def test_help_runs_without_vllm_or_cuda():
    out = subprocess.run([sys.executable, str(ROOT / "lab/bench/engine_forward_breakdown.py"), "--help"],
                         capture_output=True, text=True, check=True, env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    assert "--variants" in out.stdout and "pieces+inductor" in out.stdout


def test_cpu_wiring(tmp_path, monkeypatch, vllm_wheel_if_cached):
    wheel = vllm_wheel_if_cached
    if wheel is None:
        pytest.skip("no vLLM wheel (RLA_ENGINE_WHEEL, or the engine cache's)")
    monkeypatch.setenv("RLA_ENGINE_WHEEL", str(wheel))
    B.main(["--device", "cpu", "--shape", "tiny", "--models", "qwen3-1.7b", "--layers", "2", "--warmup", "1",
            "--tokens", "2", "64", "--variants", "hf-bf16", "pieces", "pieces+aot_eager", "--out", str(tmp_path)])
    rows = {r["variant"]: r for r in json.loads((tmp_path / "engine_forward_breakdown.json").read_text())["results"]}
    assert not any("error" in r for r in rows.values())
    for v in ("pieces", "pieces+aot_eager"):
        k = rows[v]["kernels_us"]
        assert k["bwd recompute"] > 0 and k["bwd through pieces"] > 0 and k["bwd body other"] < k["bwd recompute"] / 20
        assert set(rows[v]["saved"]["by_label_bytes"]) >= {"pieces", "attention"}
    assert rows["hf-bf16"]["kernels_us"]["bwd recompute"] == 0
    assert rows["pieces"]["saved"]["per_layer_bytes"] < rows["hf-bf16"]["saved"]["per_layer_bytes"] / 3
    vs = rows["pieces+aot_eager"]["vs_pieces"]
    assert vs["exact"] == 1.0 and vs["max_abs_diff"] == 0
    assert rows["pieces"]["repeat"]["exact"] == 1.0  # the control: on CPU a step's gradient equals its repeat's
    assert (tmp_path / "engine_forward_breakdown.md").read_text().count("| qwen3-1.7b |") == 6


def _chains(cpu):
    def chain(i):
        out = []
        while i is not None:
            out.append(cpu[i]["name"])
            i = cpu[i]["parent"]
        return out
    return [(r["seq"], chain(i)) for i, r in enumerate(cpu) if r["seq"] >= 0]


def test_kernels_of_a_cuda_like_profile_land_in_their_ranges():
    """The H200 run (2026-12-02, torch 2.11) put every kernel in 'fwd lm_head+loss' (no kernel found
    its launching op: FunctionEvent has no linked_correlation_id there) and counted the ranges'
    gpu_user_annotation spans as kernels (busy above the step's GPU time). Records shaped like a CUDA
    profile's: kernels are device events linked to the frontend op that launched them, the ranges
    have GPU-side spans of their own, the backward runs on another thread under the engine's nodes."""
    from lab.bench.e2e_breakdown import attribute_kernels

    R, N = B.R, B.NODE

    def op(corr, name, start, end, parent=None, seq=-1, frontend=True):
        return dict(corr=corr, name=name, seq=seq, start=start, end=end, parent=parent, frontend=frontend,
                    annotation=name.startswith(R))

    cpu = [op(1, R + "body", 0, 100),  # 0: forward, main thread
           op(2, R + "pieces", 10, 40, 0),  # 1
           op(3, "aten::mm", 12, 20, 1, seq=5),  # 2
           op(900, "cudaLaunchKernel", 13, 14, 2, frontend=False),  # 3: a runtime call, its CUPTI id
           op(4, R + "attention", 50, 80, 0),  # 4
           op(5, "aten::_scaled_dot_product_efficient_attention", 52, 70, 4, seq=6),  # 5
           op(6, "aten::linear", 110, 130, seq=7),  # 6: the LM head
           op(7, N + "MmBackward0", 200, 240),  # 7: backward thread
           op(8, "MmBackward0", 201, 239, 7, seq=5),  # 8
           op(9, "aten::mm", 202, 230, 8),  # 9
           op(10, N + "_BackedBackward", 300, 400),  # 10
           op(11, "_BackedBackward", 301, 399, 10),  # 11
           op(12, R + "recompute", 305, 350, 11),  # 12
           op(13, "aten::mm", 306, 340, 12),  # 13
           op(14, "aten::mm", 355, 390, 11)]  # 14

    def dev(name, start, end, linked, annotation=False):
        return dict(name=name, start=start, end=end, linked=linked, annotation=annotation)

    device = [dev(R + "body", 1000, 1100, 1, annotation=True),  # the ranges' GPU spans: no kernels
              dev(R + "pieces", 1005, 1045, 2),  # one not flagged as an annotation: known by its name
              dev("nvjet_tst_fwd", 1010, 1020, 3),
              dev("triton_poi_fused_0", 1020, 1025, 0),  # no known launching op: by its range's GPU span
              dev("fmha_cutlassF_bf16", 1050, 1070, 5),
              dev("nvjet_tst_lm_head", 1110, 1130, 6),
              dev("nvjet_tst_bwd", 1200, 1230, 9),
              dev("nvjet_tst_bwd", 1200, 1230, 9),  # the same kernel twice: counted once
              dev("nvjet_tst_recompute", 1300, 1340, 13),
              dev("nvjet_tst_through", 1355, 1390, 14),
              dev("Memset (Device)", 1500, 1502, 0)]  # launched outside every range: unattributed
    got = B.categorize_records(attribute_kernels(cpu, device), _chains(cpu), cuda=True)
    assert got == {"fwd pieces": 15, "fwd attention": 20, "fwd body other": 0, "fwd lm_head+loss": 20,
                   "bwd recompute": 40, "bwd through pieces": 35, "bwd attention": 0, "bwd body other": 30,
                   "bwd lm_head+loss": 0, "unattributed": 2}
    kernels = {(d["name"], d["start"]): d["end"] - d["start"] for d in device if not d["name"].startswith(R)}
    assert sum(got.values()) == sum(kernels.values())  # busy: every kernel once, no range span


def test_saved_bytes_leave_no_graph_alive():
    """saved_bytes runs a forward with no backward: its graph must go with the loss (on the H200 it
    stayed, and every variant after the first ran out of memory)."""
    import gc
    import weakref

    import torch
    from align_spec import tiny_model, tokens

    model = tiny_model("qwen2").train()
    refs = []
    for m in model.modules():
        m.register_forward_hook(lambda mod, a, out: refs.append(weakref.ref(out)) if isinstance(out, torch.Tensor)
                                else None)
    for _ in range(2):
        refs.clear()
        by = B.saved_bytes(model, tokens(batch=1, seq=16), B.Ranges())
        gc.collect()
        assert refs and by.get("body", 0) > 0
        assert [r for r in refs if r() is not None] == []


def test_sdpa_math_keeps_the_comparison(tmp_path, monkeypatch, vllm_wheel_if_cached):
    """``--sdpa math`` (the deterministic backward the GPU's exactness comparison runs under): the control
    and aot_eager's gradients are still equal to pieces' bit for bit."""
    wheel = vllm_wheel_if_cached
    if wheel is None:
        pytest.skip("no vLLM wheel (RLA_ENGINE_WHEEL, or the engine cache's)")
    monkeypatch.setenv("RLA_ENGINE_WHEEL", str(wheel))
    B.main(["--device", "cpu", "--shape", "tiny", "--models", "qwen2.5-1.5b", "--layers", "2", "--warmup", "1",
            "--tokens", "1", "64", "--variants", "pieces", "pieces+aot_eager", "--sdpa", "math", "--out", str(tmp_path)])
    payload = json.loads((tmp_path / "engine_forward_breakdown.json").read_text())
    rows = {r["variant"]: r for r in payload["results"]}
    assert payload["args"]["sdpa"] == "math" and not any("error" in r for r in rows.values())
    assert rows["pieces"]["repeat"]["exact"] == 1.0 and rows["pieces+aot_eager"]["vs_pieces"]["exact"] == 1.0
