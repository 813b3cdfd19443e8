"""verl's FSDP1 (``strategy: fsdp``, verl's default) and FSDP2 paths with rla, on CUDA (issue #35).

The CPU tests run verl's FSDP engine through gloo, with torch's ``sync_module_states`` device
check lifted (``tests/verl_cpu.py``); this file runs the same check unshimmed, with NCCL: verl
0.9.1's own ``FSDPEngine.initialize()`` under torchrun on 1 and 2 GPUs
(``verl_fsdp_gpu_worker.py``, each run in its own process group), the tiny checkpoint with a tied
and an untied LM head (the untied one is built on the meta device on rank 1), the actor (logits
and every gradient) and the forward-only reference (logits; FSDP1 puts it under ``CPUOffload``,
whose pinned memory needs the GPU). Needs verl 0.9.1 with a CUDA torch: the README's second
environment on a GPU (transformers 5.5.3), or the device image's transformers 5.17 with verl
installed ``--no-deps`` (outside verl's pin ``<5.11``; the CPU tests pass at 5.17 too) and
``lab/bench/verl_without_ray`` for Ray (``lab/bench/trl_verl_gpu_session.sh``).
``RLA_VERL_FSDP_OUT``: a folder that receives each case's per-rank JSON (``<case>/rank<N>.json``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib.resources import files
from pathlib import Path

import pytest
import torch
from fsdp_compare import untied_checkpoint

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA GPUs"),
]
pytest.importorskip("verl", reason="verl is installed in the README's second environment")

WORKER = Path(__file__).with_name("verl_fsdp_gpu_worker.py")
SRC = Path(__file__).resolve().parents[2] / "src"
TESTS = Path(__file__).resolve().parents[1]
MODEL = str(files("rla") / "assets" / "tiny-qwen2")


CASES = [(s, g, h, "actor") for s in ("fsdp", "fsdp2") for g in (1, 2) for h in ("tied", "untied")]
# verl's reference: bf16, FSDP1 with CPUOffload (one GPU: not meta-built; two: rank 1 is)
CASES += [(s, g, h, "ref") for s in ("fsdp", "fsdp2") for g, h in ((1, "tied"), (2, "untied"))]


@pytest.mark.parametrize("strategy,gpus,head,role", CASES)
def test_verl_engine_on_gpus_is_aligned_and_exact(strategy, gpus, head, role, tmp_path):
    if torch.cuda.device_count() < gpus:
        pytest.skip(f"needs {gpus} GPUs")
    model_path = MODEL if head == "tied" else untied_checkpoint(tmp_path / "untied", MODEL)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(SRC), str(TESTS), os.environ.get("PYTHONPATH", "")]))
    run = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={gpus}",
         str(WORKER), strategy, model_path, role, str(tmp_path)],
        env=env, capture_output=True, text=True, timeout=600,
    )
    assert run.returncode == 0 and "OK" in run.stdout.split(), run.stdout[-3000:] + run.stderr[-3000:]
    lines = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(gpus)]
    if os.environ.get("RLA_VERL_FSDP_OUT"):
        keep = Path(os.environ["RLA_VERL_FSDP_OUT"]) / f"{strategy}-{gpus}gpu-{head}-{role}"
        keep.mkdir(parents=True, exist_ok=True)
        for r, line in enumerate(lines):
            (keep / f"rank{r}.json").write_text(json.dumps(line, indent=1))
    assert len(lines) == gpus and all(r["aligned"] and not r["any_input_cast"] for r in lines)
    assert all(r["logits_equal_plain"] and r["logits_equal_autocast"] for r in lines), lines
    if role == "actor":
        assert all(not r["grads_unequal"] and not r["grads_missing"] for r in lines), lines
    # verl builds an untied model on the meta device on rank 1, and the integration aligns it there
    assert [r["meta_rank"] for r in sorted(lines, key=lambda r: r["rank"])] == [False, head == "untied"][:gpus]
