"""rla.integrations.verl on verl's older layout (``verl/workers/fsdp_workers.py``), against the
real module of verl 0.7.1, the last release that ships it next to the engine workers.

verl 0.7.1 is unpacked (``pip install --no-deps --target .verl-0.7.1 verl==0.7.1``, the README's
test command) beside the installed verl 0.9.1 and imported in a subprocess whose path puts it
first; its dependencies are verl 0.9.1's. The subprocess calls ``fsdp_workers.get_fsdp_wrap_policy``
the way ``ActorRolloutRefWorker._build_model_optimizer`` and ``RewardModelWorker._build_model``
call it (from functions of those names), after the bf16 cast those builders make.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from repo_root import ROOT

pytest.importorskip("verl", reason="verl 0.7.1's fsdp_workers runs on the dependencies of the installed verl")
LEGACY = ROOT / ".verl-0.7.1"
pytestmark = pytest.mark.skipif(
    not (LEGACY / "verl" / "workers" / "fsdp_workers.py").exists(),
    reason="verl 0.7.1 is unpacked into .verl-0.7.1 by the README's test command (second environment)",
)

SCRIPT = r"""
import json, sys, torch
import verl.workers.fsdp_workers as fw
import rla, rla.integrations.verl as rv
from importlib.resources import files
from transformers import AutoModelForCausalLM

path = str(files("rla") / "assets" / "tiny-qwen2")
load = lambda: AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager").to(torch.bfloat16)
actor, reward = load(), load()

def _build_model_optimizer():  # ActorRolloutRefWorker's builder, as fsdp_workers calls the policy
    return fw.get_fsdp_wrap_policy(module=actor, config=None, is_lora=False)

def _build_model():  # RewardModelWorker's builder
    return fw.get_fsdp_wrap_policy(module=reward, config=None)

_build_model_optimizer()
_build_model()
policy = fw.MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32, cast_forward_inputs=True)
report = rla.alignment_of(actor)
print(json.dumps({
    "fsdp_workers": fw.__file__,
    "patched": rv.install(),
    "actor": None if report is None else report.profile.name,
    "hazards": [] if report is None else [h.name for h in report.hazards],
    "reward": rla.alignment_of(reward) is not None,
    "cast_forward_inputs": policy.cast_forward_inputs,
}))
"""


def test_older_fsdp_workers_layout():
    src = ROOT / "src"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(LEGACY), str(src)]))
    run = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["fsdp_workers"].startswith(str(LEGACY))  # verl 0.7.1's module, not 0.9.1's
    assert "verl.workers.fsdp_workers" in out["patched"]
    assert out["actor"] is not None and out["actor"].startswith("vllm")
    assert "bf16 inv_freq" in out["hazards"]  # aligned after the cast: the rounded buffer was fixed
    assert out["reward"] is False  # a reward model is left as it is
    assert out["cast_forward_inputs"] is False
