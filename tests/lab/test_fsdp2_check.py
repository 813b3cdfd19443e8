"""The FSDP2 GPU job, validated on CPU: ``lab/bench/fsdp2_x2.sh`` itself, in its CPU mode
(``DEVICE=cpu SHAPE=micro``): ``lab/bench/fsdp2_check.py`` and the trainer command under torchrun
with two gloo processes, micro shapes, results read back from its ``results.tgz``.

- The check script's JSON reports the sharded aligned model's RoPE and SwiGLU outputs equal to
  the unsharded aligned bf16 model's bit for bit, fp32 cos/sin, the loss, one call per layer, and
  the named error under ``cast_forward_inputs=True``.
- Its capture and comparison can tell outputs apart (in process: ``vllm`` vs ``sglang`` differ).
- ``torchrun -m rla.cli train configs/grpo_fsdp2_1p5b.yaml fsdp=true`` runs (size=micro, CPU):
  the config file, the CLI and torchrun's environment, which tests/rl/test_trainer_fsdp.py (Trainer
  objects under mp.spawn) does not go through.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import torch

from repo_root import ROOT

pytestmark = [
    pytest.mark.skipif(not torch.distributed.is_available() or not torch.distributed.is_gloo_available(),
                       reason="needs torch.distributed with gloo"),
    pytest.mark.skipif(not all(shutil.which(t) for t in ("bash", "timeout", "tar")),
                       reason="the job script needs bash, timeout and tar"),
]


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    """``lab/bench/fsdp2_x2.sh`` on CPU (no env stage: it needs nvidia-smi); -> the unpacked r/ folder."""
    out = tmp_path_factory.mktemp("job")
    env = dict(os.environ, OUT=str(out), DEVICE="cpu", SHAPE="micro", STAGES="check train", OMP_NUM_THREADS="1",
               TRAIN_OVERRIDES="size=micro device=cpu steps=2", TRAIN_DIR=str(out / "grpo"),
               PATH=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))
    proc = subprocess.run(["bash", "lab/bench/fsdp2_x2.sh"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    with tarfile.open(out / "results.tgz") as tar:
        kw = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
        tar.extractall(out / "unpacked", **kw)
    r = out / "unpacked" / "r"
    for name in ("check", "train"):
        assert f"{name} rc=0" in proc.stdout, (name, proc.stdout[-3000:], (r / f"{name}.log").read_text()[-3000:])
    return r


def _check_module():
    spec = importlib.util.spec_from_file_location("fsdp2_check", ROOT / "lab" / "bench" / "fsdp2_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_check_script_two_gloo_ranks(job):
    out = job / "check"
    res = json.loads((out / "fsdp2_check.json").read_text())
    assert (out / "fsdp2_check.md").read_text().startswith("# FSDP2 check")
    assert res["errors"] == [] and res["failed_checks"] == []
    assert res["environment"]["world_size"] == 2 and res["environment"]["backend"] == "gloo"
    s = res["sharded"]
    layers = res["master"]["layers"]
    for region in ("rope", "swiglu"):
        assert s[region]["calls"] == s[region]["reference_calls"] == layers > 0, region
        assert s[region]["bitwise_equal"] and s[region]["equal_fraction"] == 1.0, region
        assert s[region]["max_abs_diff"] == 0.0, region
    assert s["rope"]["q"]["elements"] > 0 and s["rope"]["k"]["elements"] > 0
    assert s["cos_sin_dtypes_sharded"] == [["float32", "float32"]]
    assert s["logits"]["bitwise_equal"] and s["all_ranks_logits_equal_rank0"]
    assert s["loss_rel_diff"] <= 2.0**-20 and s["loss_sharded"] > 0
    t = res["throughput"]
    for variant in ("baseline", "aligned"):
        assert len(t[variant]["per_rank"]) == 2 and t[variant]["tokens_per_s_per_gpu_mean"] > 0
        assert t[variant]["peak_mem_gib_max"] is None  # CPU: n/a
    assert "vllm" in t["aligned"]["aligned"] and t["baseline"]["aligned"].startswith("no")
    c = res["cast_forward_inputs_true"]
    assert c["align_raised"] is None  # align cannot see the policy; the first forward raises
    assert c["error_type"] == "RuntimeError" and "cast_forward_inputs=False" in c["error"]
    assert "decoder layer 1" in c["error"]
    assert c["cos_sin_dtypes_seen"] == [["bfloat16", "bfloat16"]]  # layer 0 got cos/sin cast to bf16
    assert c["layer0_rope_equals_reference"]  # ... which vllm rounds to bf16 anyway
    assert all(r["error_type"] == "RuntimeError" for r in c["all_ranks"])
    assert all(res["checks"].values()) and len(res["checks"]) >= 8


def test_capture_and_compare_tell_profiles_apart():
    import rla
    from rla import models

    check = _check_module()
    model = models.build_model(models.tiny_config("qwen2", "micro"), dtype=torch.bfloat16, seed=0)
    ids = torch.randint(3, 64, (2, 16), generator=torch.Generator().manual_seed(0))
    caps = {}
    for profile in ("vllm", "sglang"):
        rla.align(model, profile)
        caps[profile] = check.Capture()
        with torch.no_grad(), caps[profile].installed():
            model(input_ids=ids)
    rla.unalign(model)
    assert rla.ops.rope.__module__ == "rla.ops"  # restored
    a, b = caps["vllm"], caps["sglang"]
    assert a.rope_calls == a.swiglu_calls == b.rope_calls == 2
    # vllm rounds cos/sin to bf16, sglang keeps them fp32: RoPE differs from layer 0 on, and
    # through attention so does every SwiGLU input
    rope = check.compare([q for q, _ in a.rope], [q for q, _ in b.rope])
    assert not rope["bitwise_equal"] and rope["equal_fraction"] < 1 and rope["max_abs_diff"] > 0
    assert rope["first_unequal_call"] == 0
    swiglu = check.compare(a.swiglu, b.swiglu)
    assert not swiglu["bitwise_equal"] and swiglu["max_abs_diff"] > 0
    assert check.compare(a.swiglu, a.swiglu)["bitwise_equal"]
    assert not check.compare(a.swiglu, a.swiglu[:1])["bitwise_equal"]  # a missing call is a failure
    assert not check.compare([], [])["bitwise_equal"]  # so is no call at all
    assert a.cos_sin_dtypes == b.cos_sin_dtypes == [("float32", "float32")] * 2


def test_trainer_command_two_gloo_ranks(job):
    out = job / "train"
    commands = (job / "commands.txt").read_text().splitlines()
    assert any("-m rla.cli train configs/grpo_fsdp2_1p5b.yaml fsdp=true" in c for c in commands)
    assert any("lab/bench/fsdp2_check.py" in c and "--device cpu" in c for c in commands)
    assert commands[0].startswith("# ") and "NCCL_NVLS_ENABLE=0" in commands[0]
    from rla.rl.runlog import read_log

    log = read_log(out / "log.jsonl")
    assert [r["step"] for r in log] == [0, 1]
    for r in log:
        assert r["mismatch/n_seqs"] == 32  # 8 prompts x 4 responses: both ranks' rollouts measured
        assert r["train/updates"] == 1 and r["mismatch/k3"] >= 0 and r["time/sync_s"] > 0
    import yaml

    cfg = yaml.safe_load((out / "config.yaml").read_text())
    assert cfg["fsdp"] and cfg["train_precision"] == "aligned" and cfg["size"] == "micro"
    assert json.loads((out / "summary.json").read_text())["finished"]
