"""lab/bench/engine_forward_breakdown.py: imports without vLLM or CUDA, ``--help`` runs, and (with a
vLLM wheel: ``$RLA_ENGINE_WHEEL`` or vLLM 0.33's in the engine cache) its CPU form wires the ranges:
the recomputation and the autograd through it are seen in the backward, the pieces save less than
HF's layers, and the aot_eager recomputation's gradients equal today's bit for bit."""

import json
import os
import subprocess
import sys

import pytest

from engine_versions import VLLM_VERSION
from lab.bench import engine_forward_breakdown as B
from repo_root import ROOT


def test_help_runs_without_vllm_or_cuda():
    out = subprocess.run([sys.executable, str(ROOT / "lab/bench/engine_forward_breakdown.py"), "--help"],
                         capture_output=True, text=True, check=True, env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    assert "--variants" in out.stdout and "pieces+inductor" in out.stdout


def test_cpu_wiring(tmp_path, monkeypatch):
    from rla.engines.source import cache_dir

    wheel = os.environ.get("RLA_ENGINE_WHEEL") or next(iter(sorted(cache_dir().glob(f"vllm-{VLLM_VERSION}-*.whl"))), None)
    if wheel is None:
        pytest.skip("no vLLM wheel (RLA_ENGINE_WHEEL, or the engine cache's)")
    monkeypatch.setenv("RLA_ENGINE_WHEEL", str(wheel))
    B.main(["--device", "cpu", "--shape", "tiny", "--models", "qwen3-1.7b", "--layers", "2", "--warmup", "1",
            "--variants", "hf-bf16", "pieces", "pieces+aot_eager", "--out", str(tmp_path)])
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
    assert (tmp_path / "engine_forward_breakdown.md").read_text().count("| qwen3-1.7b |") == 6
