"""GRPO end to end on a tiny model on CPU: rollouts from the engine-profile sampler, rewards, logs,
checkpoints, and a run stopped (in process) or killed (SIGKILL, through the CLI) that resumes to
the bitwise-identical state of an uninterrupted run.

The task is the toy of ``toy_runs.py`` (a graded reward, so a resume bug shows up in the weights,
not only in the log).
"""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from rla.rl import checkpoint as ckpt
from rla.rl.runlog import read_log
from rla.rl.trainer import Trainer, train

from repo_root import ROOT
from toy_runs import HERE, assert_same_run, toy_config

def test_grpo_steps_end_to_end(uninterrupted):
    out, result = uninterrupted
    assert result["finished"] and result["step"] == 4
    log = read_log(out / "log.jsonl")
    assert len(log) == 4
    for rec in log:
        # the docs/metrics.md mismatch of the forward before the update, and the training figures
        for key in ("mismatch/k3", "mismatch/abs/mean", "mismatch/clip_leak/0.2", "mismatch/seq/chi2",
                    "reward/mean", "reward/std", "train/entropy", "train/grad_norm", "train/clip_frac",
                    "response/length/mean", "train/lr", "collapse/fired"):
            assert key in rec, key
        assert rec["mismatch/k3"] >= 0 and rec["train/entropy"] > 0 and rec["train/lr"] == 3e-3
        assert 0 < rec["response/length/mean"] <= 8
    rewards = [rec["reward/mean"] for rec in log]
    assert any(r > 0 for r in rewards) and any(rec["reward/std"] > 0 for rec in log)
    assert all(rec["train/grad_norm"] > 0 for rec in log) and any(rec["train/loss"] != 0 for rec in log)
    # bf16 trainer vs vllm-profile bf16 engine on the same weights: the ratio is not 1 at step 0
    assert log[0]["mismatch/abs/mean"] > 0 and log[0]["mismatch/bitwise/equal"] < 1
    # weights change, and the sampler follows them (step 1's rollouts come from updated weights)
    assert log[1]["train/ratio/mean"] != 1.0
    steps = [s for s, _ in ckpt.list_checkpoints(out / "checkpoints")]
    assert steps == [2, 4]  # checkpoint_every=2, keep_checkpoints=2
    summary = json.loads((out / "summary.json").read_text())
    assert summary["finished"] and summary["steps"] == 4 and summary["step0"]["k3"] == log[0]["mismatch/k3"]
    assert (out / "config.yaml").is_file()


def test_stop_and_resume_is_bitwise_identical(uninterrupted, tmp_path):
    ref, _ = uninterrupted
    cfg = toy_config(tmp_path, checkpoint_every=3)  # resume from a checkpoint that is not the stop step's
    t = Trainer(cfg, log=None)
    t.train(until_step=2)  # stops after step 2, checkpointed
    t.close()
    # a line of step 2 written after the last checkpoint is rewritten on resume
    assert [s for s, _ in ckpt.list_checkpoints(tmp_path / "checkpoints")] == [2]
    with pytest.raises(ValueError, match="already holds a run"):
        Trainer(cfg, log=None)
    with pytest.raises(ValueError, match="different config"):
        Trainer(cfg.replace(lr=1e-3), resume=True, log=None)
    t = Trainer(cfg, resume=True, log=None)
    assert t.step == 2
    t.train()
    t.close()
    assert_same_run(ref, tmp_path)


def test_kill_during_training_and_resume_through_the_cli(uninterrupted, tmp_path):
    """SIGKILL a real ``rla train`` process mid-run (checkpointing every step, so the kill may land
    in a checkpoint write), then resume it."""
    ref, _ = uninterrupted
    cfg = toy_config(tmp_path, checkpoint_every=1)
    path = tmp_path / "run.yaml"
    path.write_text(cfg.to_yaml())
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), str(HERE), str(ROOT / "tests"), env.get("PYTHONPATH", "")])
    cmd = [sys.executable, "-m", "rla.cli", "train", str(path)]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while len(read_log(tmp_path / "log.jsonl")) < 2 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    output = proc.communicate()[0].decode(errors="replace")
    assert proc.returncode == -signal.SIGKILL, output
    done = len(read_log(tmp_path / "log.jsonl"))
    assert 2 <= done < 4, f"the run was not killed mid-way ({done} steps logged)"
    said = []
    result = train(cfg, resume=True, log=said.append)  # in process: a second interpreter costs ~5 s
    # the killed process's lock (flock, dropped by the kernel at its death) is taken over, and said so
    assert result["finished"] and len(said) == 2 and said[1].startswith("resumed from"), said
    assert f"taking over the lock of pid {proc.pid} on host" in said[0] and "no longer running" in said[0], said
    assert_same_run(ref, tmp_path)


@pytest.mark.parametrize("precision", ["aligned", "fp32", "fp16"])
def test_precision_arms_share_the_rollouts_and_log_their_mismatch(uninterrupted, tmp_path, precision):
    ref, _ = uninterrupted
    cfg = toy_config(tmp_path, steps=1, train_precision=precision, align_regions=["rope", "swiglu", "rmsnorm"])
    train(cfg, log=None)
    rec, base = read_log(tmp_path / "log.jsonl")[0], read_log(ref / "log.jsonl")[0]
    assert rec["train/grad_norm"] > 0 and rec["mismatch/k3"] >= 0
    if precision == "fp16":
        # an fp16 engine: different rollouts; the loss is scaled and nothing overflowed here
        assert rec["train/loss_scale"] == 2.0**16 and rec["train/skipped_updates"] == 0
    else:
        # the same bf16 engine and seed: step 0 samples the same tokens whatever the trainer does,
        # so the arms' step-0 mismatch is a paired comparison
        assert rec["response/length/mean"] == base["response/length/mean"]
        assert rec["reward/mean"] == base["reward/mean"]
        assert rec["mismatch/k3"] != base["mismatch/k3"]


def test_one_update_moves_the_policy_towards_positive_advantages(tmp_path):
    """The trainer's loss wiring has the right sign: after one update on a rollout batch, the
    sequences with positive advantage gained log-probability relative to the negative ones."""
    t = Trainer(toy_config(tmp_path, lr=1e-2), log=None)
    ro = t._rollout(0)
    seqs = list(range(len(ro.responses)))

    def seq_logprobs():
        with torch.no_grad():
            lp, _, pos, _ = t._forward(seqs, ro)
        return torch.zeros(len(seqs)).index_add_(0, pos, lp)

    before = seq_logprobs()
    t._update(0, ro)
    gain = seq_logprobs() - before
    adv = ro.advantages
    assert (adv != 0).any()
    assert float((gain * adv).sum()) > 0
    assert gain[adv > 0].mean() > gain[adv < 0].mean()
    t.close()


def test_rounded_inv_freq_condition_rounds_only_the_training_copy(uninterrupted, tmp_path):
    """train_inv_freq=rounded is model.to(bf16)'s hazard on the training side only: the compute copy's
    inv_freq holds exactly the bf16-rounded fp32 values, the sampler keeps fp32, and the step-0
    mismatch (same rollouts as the baseline) changes. (Its size grows with position; at this toy's
    ~14 positions it is below the bf16 noise, so only the change is asserted here.)"""
    ref, _ = uninterrupted
    t = Trainer(toy_config(tmp_path / "t", train_inv_freq="rounded"), log=None)
    rotary = t.policy.compute.model.rotary_emb
    engine = t.sampler.model.model.rotary_emb
    assert engine.inv_freq.dtype == torch.float32 and rotary.inv_freq.dtype == torch.bfloat16
    assert torch.equal(rotary.inv_freq, engine.inv_freq.to(torch.bfloat16))
    assert not torch.equal(rotary.inv_freq.float(), engine.inv_freq)
    cfg = toy_config(tmp_path / "run", steps=1, train_inv_freq="rounded")
    train(cfg, log=None)
    rec, base = read_log(tmp_path / "run" / "log.jsonl")[0], read_log(ref / "log.jsonl")[0]
    assert rec["reward/mean"] == base["reward/mean"]
    assert rec["mismatch/k3"] != base["mismatch/k3"]
    with pytest.raises(ValueError, match="train_inv_freq=rounded needs train_precision bf16 or fp16"):
        toy_config(tmp_path, train_precision="aligned", train_inv_freq="rounded")
