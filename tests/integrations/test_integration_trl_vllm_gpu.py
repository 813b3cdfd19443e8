"""TRL ``use_vllm=True`` (colocate) with the real vLLM engine and ``attach``, on a GPU (issue #35, item 7).

Runs ``lab/bench/trl_vllm_colocate.py`` in its own process (vLLM takes the GPU and a process
group): the bundled tiny Qwen2, three GRPO steps, vLLM's attention backend ``TRITON_ATTN`` (the
backend rla's vLLM 0.26 rows were calibrated under). Needs a CUDA GPU, TRL 1.16 and a vLLM its
``vllm`` extra accepts (>=0.22, <=0.31). The script's JSON goes to ``$RLA_TRL_VLLM_OUT`` (a folder)
if set, else to the test's tmp folder; the test passes when every check the script makes holds
(step-1 KL exactly 0, ``mismatch/*`` every step from vLLM's logprobs, TRL's keys kept, one weight
sync per step).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from repo_root import ROOT

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
pytest.importorskip("trl")
pytest.importorskip("vllm", reason="vLLM is installed on the GPU machine only")

SCRIPT = ROOT / "lab" / "bench" / "trl_vllm_colocate.py"


def test_grpo_with_vllm_colocate_attached(tmp_path):
    out = Path(os.environ.get("RLA_TRL_VLLM_OUT") or tmp_path)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]))
    run = subprocess.run([sys.executable, str(SCRIPT), str(out), "--steps", "3"], env=env,
                         capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    result = json.loads((out / "trl_vllm_colocate.json").read_text())
    assert result["checks"] and all(result["checks"].values()), result["checks"]
    assert len(result["steps"]) == 3 and result["steps"][0]["kl"] == 0.0
