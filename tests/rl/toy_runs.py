"""Shared by the rl tests: a toy task with a graded reward, the tiny run configuration that trains
on it, the check that two runs ended in the same state, and a small experiment grid.

The toy task (prompts ``say:<digit>=``, reward = the share of digits in the response, up to 4)
gives a randomly initialised model rewards that differ within a group, so every step has a
non-zero gradient and a resume bug shows up in the weights, not only in the log.
"""

import random
from pathlib import Path

import torch
from safetensors.torch import load_file

from rla.rl import checkpoint as ckpt
from rla.rl.config import TrainConfig
from rla.rl.runlog import deterministic_part, read_log

#: This module's folder: a run in a subprocess imports the task "toy_runs:ToyTask" from it, so its
#: PYTHONPATH carries this folder.
HERE = Path(__file__).resolve().parent


class ToyTask:
    """Prompts ``say:<digit>=``; reward = min(4, digits in the response) / 4."""

    name = "toy"

    def __init__(self, difficulty: int = 1):
        self.difficulty = difficulty

    def sample(self, rng, n):
        from rla.rl.tasks import Problem

        rng = rng if isinstance(rng, random.Random) else random.Random(rng)
        out = []
        for _ in range(n):
            d = str(rng.randrange(10))
            out.append(Problem(prompt=f"say:{d}=", answer=d, solution=f">{d}"))
        return out

    def reward(self, problem, response):
        return min(4, sum(c.isdigit() for c in response)) / 4

    def max_length(self):
        return 8

    def spec(self):
        return {"name": self.name, "difficulty": self.difficulty}


def toy_config(out, **kw) -> TrainConfig:
    values = dict(arch="qwen2", size="micro", init="random", task="toy_runs:ToyTask", difficulty=1, steps=4,
                  prompts_per_step=2, group_size=4, max_new_tokens=8, out_dir=str(out), device="cpu",
                  progress=False, lr=3e-3, checkpoint_every=2, keep_checkpoints=2)
    values.update(kw)
    return TrainConfig(**values)


def final_state(out):
    path = ckpt.latest(Path(out) / "checkpoints")
    return load_file(str(path / "model.safetensors")), load_file(str(path / "optimizer.safetensors")), path


def assert_same_run(a, b):
    log_a, log_b = read_log(Path(a) / "log.jsonl"), read_log(Path(b) / "log.jsonl")
    assert [r["step"] for r in log_a] == [r["step"] for r in log_b] == list(range(len(log_a)))
    assert [deterministic_part(r) for r in log_a] == [deterministic_part(r) for r in log_b]
    model_a, opt_a, pa = final_state(a)
    model_b, opt_b, pb = final_state(b)
    assert pa.name == pb.name
    assert model_a.keys() == model_b.keys() and opt_a.keys() == opt_b.keys()
    for k in model_a:
        assert torch.equal(model_a[k], model_b[k]), k
    for k in opt_a:
        assert torch.equal(opt_a[k], opt_b[k]), k


def write_grid(path: Path, steps: int) -> Path:
    path.write_text(f"""
base:
  arch: qwen2
  size: micro
  init: random
  task: "toy_runs:ToyTask"
  difficulty: 1
  prompts_per_step: 2
  group_size: 4
  max_new_tokens: 8
  device: cpu
  lr: 3.0e-3
  checkpoint_every: 1
overrides: {{steps: {steps}}}
models:
  micro: {{}}
arms:
  bf16: {{train_precision: bf16}}
  rope: {{train_precision: aligned, align_regions: [rope]}}
seeds: [0]
""")
    return path
