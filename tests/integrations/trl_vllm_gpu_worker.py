"""TRL's production path with rla, on a GPU (not a test file; run by test_integration_trl_vllm_gpu.py).

    python tests/integrations/trl_vllm_gpu_worker.py OUT.json

``GRPOTrainer(use_vllm=True, vllm_mode="colocate")`` on the bundled tiny Qwen2 with the real vLLM
engine in the same process, ``attach(trainer, "vllm")``, three GRPO steps. Writes TRL's log
history and the attach report to OUT.json; exits 0 when step-1 KL is exactly 0 (policy and
reference aligned alike), ``mismatch/*`` is logged every step from vLLM's logprobs, and TRL's own
keys are all there.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from importlib.resources import files

import torch


def reward(completions, **_):
    return [float(sum(map(ord, c)) % 7) for c in completions]


def main(out: str) -> int:
    import trl
    import vllm
    from datasets import Dataset
    from transformers import AutoTokenizer

    from rla.integrations import trl as rla_trl

    model = str(files("rla") / "assets" / "tiny-qwen2")
    args = trl.GRPOConfig(
        output_dir=tempfile.mkdtemp(), per_device_train_batch_size=8, num_generations=4, max_completion_length=16,
        max_steps=3, beta=0.1, report_to=[], logging_steps=1, save_strategy="no", learning_rate=5e-3, seed=0,
        bf16=True, model_init_kwargs={"dtype": torch.bfloat16}, disable_tqdm=True,
        use_vllm=True, vllm_mode="colocate", vllm_gpu_memory_utilization=0.2, vllm_max_model_length=256,
    )
    prompts = ["1+1=", "2+3=", "4+4=", "7+1=", "9+9=", "3+5=", "6+2=", "8+1="] * 2
    trainer = trl.GRPOTrainer(model=model, reward_funcs=reward, args=args,
                              processing_class=AutoTokenizer.from_pretrained(model),
                              train_dataset=Dataset.from_dict({"prompt": prompts}))
    attachment = rla_trl.attach(trainer, profile="vllm")
    print(attachment, flush=True)
    trainer.train()
    logs = [h for h in trainer.state.log_history if "loss" in h]
    checks = {
        "steps": len(logs) == 3,
        "step1_kl_zero": bool(logs) and logs[0].get("kl") == 0.0,
        "mismatch_every_step": all("mismatch/k3" in h and h.get("mismatch/n_tokens", 0) > 0 for h in logs),
        "trl_keys_kept": all({"loss", "kl", "reward"} <= set(h) for h in logs),
    }
    with open(out, "w") as f:
        json.dump({"vllm": vllm.__version__, "trl": trl.__version__, "torch": torch.__version__,
                   "gpu": torch.cuda.get_device_name(), "attach": str(attachment), "checks": checks,
                   "log_history": trainer.state.log_history}, f, indent=1, default=str)
    print(json.dumps(checks), flush=True)
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    sys.exit(main(sys.argv[1]))
