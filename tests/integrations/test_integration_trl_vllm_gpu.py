"""TRL ``use_vllm=True`` (colocate) with the real vLLM engine and ``attach``, on a GPU (issue #35, item 7).

Runs ``trl_vllm_gpu_worker.py`` in its own process (vLLM takes the GPU and a process group). Needs a
CUDA GPU, TRL 1.16 and a vLLM its ``vllm`` extra accepts (>=0.22, <=0.31). Writes the log history to
``$RLA_TRL_VLLM_OUT`` if set (e.g. a results folder), else to the test's tmp folder.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
pytest.importorskip("trl")
pytest.importorskip("vllm", reason="vLLM is installed on the GPU machine only")

WORKER = Path(__file__).with_name("trl_vllm_gpu_worker.py")
SRC = Path(__file__).resolve().parents[2] / "src"


def test_grpo_with_vllm_colocate_attached(tmp_path):
    out = Path(os.environ.get("RLA_TRL_VLLM_OUT") or tmp_path / "trl_vllm.json")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]))
    run = subprocess.run([sys.executable, str(WORKER), str(out)], env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    checks = json.loads(out.read_text())["checks"]
    assert all(checks.values()), checks
