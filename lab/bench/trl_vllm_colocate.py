"""TRL's production path with rla: ``GRPOTrainer(use_vllm=True, vllm_mode="colocate")`` with the real
vLLM engine in the same process, ``attach(trainer, "vllm")``, a few GRPO steps (issue #35, item 7).

    python lab/bench/trl_vllm_colocate.py OUT_DIR [--steps 3] [--attention-backend TRITON_ATTN|auto]

Writes ``OUT_DIR/trl_vllm_colocate.json``: the stamp (GPU, versions, date, command), the attach
report, the arguments TRL gave ``vllm.LLM`` (and what this script added), the torch.distributed
variables TRL set for vLLM's ``external_launcher``, TRL's log history and the per-step metrics
(``steps``: one dict per logged step, every key TRL and rla logged), and the checks; exits 0 when
they all hold:

- ``steps``: TRL logged ``--steps`` training steps;
- ``step1_kl_zero``: step 1's KL is exactly 0 (policy and TRL's reference, same weights, aligned
  alike; before any update the two stacks must give equal logprobs);
- ``mismatch_every_step``: rla's ``mismatch/k3`` logged every step over a nonzero token count
  (``mismatch/n_tokens``): vLLM's own sampled-token logprobs reached the metrics hook;
- ``trl_keys_kept``: TRL's own ``loss``, ``kl`` and ``reward`` are still logged;
- ``weights_synced``: TRL's colocate weight sync (``load_weights`` into vLLM's model runner) ran
  before every step's generation (step 1's too: TRL's ``_last_loaded_step`` starts at -1), i.e.
  vLLM 0.26 kept the attribute path TRL 1.16 walks
  (``llm.llm_engine.model_executor.driver_worker.model_runner.model``).

The one thing added to TRL's own call: TRL 1.16 passes vLLM no attention settings, and vLLM 0.26
reads no attention-backend environment variable (``VLLM_ATTENTION_BACKEND`` is gone; it is
``LLM(attention_config={"backend": ...})``). ``--attention-backend TRITON_ATTN`` (the default: the
backend rla's ``vllm-0.26`` rows were calibrated under, ``profiles/data/vllm-0.26.json``, and the
one the device's vLLM carries, without FlashAttention's libraries) wraps the ``LLM`` name in TRL's
``trl.generation.vllm_generation`` module to add that one argument; ``auto`` leaves TRL's call as
it is. Everything else (``distributed_executor_backend="external_launcher"``, the RANK / WORLD_SIZE
/ LOCAL_RANK / MASTER_ADDR / MASTER_PORT it sets, ``logprobs_mode="processed_logprobs"``, the
weight sync) is TRL's own code. ``VLLM_ENABLE_V1_MULTIPROCESSING=0``: TRL's weight sync reaches
vLLM's model through the in-process engine core only (``LLMEngine.model_executor`` exists only
then); vLLM 0.26 sets it itself for ``external_launcher`` (``vllm/config/parallel.py``), the script
sets the same value before vLLM is imported. ``VLLM_USE_FLASHINFER_SAMPLER=0``: FlashInfer is not
on the device. Sleep mode stays off (TRL's default), lengths small (``--max-model-len 256``, 16
completion tokens).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import time
import traceback

#: vLLM environment this run needs (set before vLLM is imported; see the module docstring).
ENGINE_ENV = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_USE_FLASHINFER_SAMPLER": "0"}
#: The torch.distributed variables vLLM's external_launcher reads (TRL sets them in colocate mode).
DIST_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
PROMPTS = ["1+1=", "2+3=", "4+4=", "7+1=", "9+9=", "3+5=", "6+2=", "8+1="]


def reward(completions, **_):
    """A deterministic, text-dependent reward (any will do: the run checks plumbing and KL, not learning)."""
    return [float(sum(map(ord, c)) % 7) for c in completions]


def grpo_config(output_dir: str, steps: int, max_model_len: int):
    """GRPOConfig for the colocate run: bf16 weights, beta > 0 (TRL builds and keeps a reference
    model, whose KL to the policy is logged), vLLM in this process, sleep mode off."""
    import torch
    import trl

    return trl.GRPOConfig(
        output_dir=output_dir, per_device_train_batch_size=8, num_generations=4, max_completion_length=16,
        max_steps=steps, beta=0.1, report_to=[], logging_steps=1, save_strategy="no", learning_rate=5e-3, seed=0,
        bf16=True, model_init_kwargs={"dtype": torch.bfloat16}, disable_tqdm=True,
        use_vllm=True, vllm_mode="colocate", vllm_gpu_memory_utilization=0.2, vllm_max_model_length=max_model_len,
        vllm_enable_sleep_mode=False,
    )


def wrap_llm(backend: str | None, record: dict) -> None:
    """Replace the ``LLM`` name TRL's colocate code calls with one that records TRL's arguments and
    the distributed variables at that moment, and adds ``attention_config={"backend": backend}``
    (``backend=None``: adds nothing)."""
    from trl.generation import vllm_generation

    engine_llm = vllm_generation.LLM

    def llm(*args, **kwargs):
        record["trl_llm_kwargs"] = {k: repr(v) if not isinstance(v, (int, float, str, bool, type(None))) else v
                                    for k, v in kwargs.items()}
        record["dist_env_at_llm"] = {k: os.environ.get(k) for k in DIST_ENV}
        if backend:
            if "attention_config" in kwargs:
                raise ValueError("TRL now passes attention_config itself; run with --attention-backend auto")
            kwargs["attention_config"] = {"backend": backend}
            record["added_llm_kwargs"] = {"attention_config": {"backend": backend}}
        return engine_llm(*args, **kwargs)

    vllm_generation.LLM = llm


def count_weight_syncs(trainer, record: dict) -> None:
    """Count TRL's colocate weight syncs (``VLLMGeneration.sync_weights``, TRL's own code, run as is)."""
    gen = trainer.vllm_generation
    sync = gen.sync_weights
    record["weight_syncs"] = 0

    def counted(*a, **k):
        out = sync(*a, **k)
        record["weight_syncs"] += 1
        return out

    gen.sync_weights = counted


def checks_of(logs: list[dict], steps: int, syncs: int) -> dict[str, bool]:
    """The pass conditions of the module docstring, from TRL's per-step log entries."""
    return {
        "steps": len(logs) == steps,
        "step1_kl_zero": bool(logs) and logs[0].get("kl") == 0.0,
        "mismatch_every_step": bool(logs) and all("mismatch/k3" in h and h.get("mismatch/n_tokens", 0) > 0
                                                  for h in logs),
        "trl_keys_kept": bool(logs) and all({"loss", "kl", "reward"} <= set(h) for h in logs),
        # one generation per step (steps_per_generation = gradient_accumulation_steps = 1), each after a sync
        "weights_synced": syncs == steps,
    }


def run(model: str, args, record: dict) -> None:
    """Build TRL's trainer (its vLLM engine with it), attach, train; fills ``record`` as it goes."""
    import trl
    from datasets import Dataset
    from transformers import AutoTokenizer

    from rla.integrations import trl as rla_trl

    t0 = time.perf_counter()
    trainer = trl.GRPOTrainer(model=model, reward_funcs=reward,
                              args=grpo_config(tempfile.mkdtemp(), args.steps, args.max_model_len),
                              processing_class=AutoTokenizer.from_pretrained(model),
                              train_dataset=Dataset.from_dict({"prompt": PROMPTS * args.steps}))
    record["trainer_init_s"] = round(time.perf_counter() - t0, 1)
    attachment = rla_trl.attach(trainer, profile="vllm")
    record["attach"] = str(attachment)
    print(attachment, flush=True)
    count_weight_syncs(trainer, record)
    t0 = time.perf_counter()
    try:
        trainer.train()
    finally:
        record["train_s"] = round(time.perf_counter() - t0, 1)
        record["log_history"] = trainer.state.log_history
        record["steps"] = [h for h in trainer.state.log_history if "loss" in h]
    record["checks"] = checks_of(record["steps"], args.steps, record["weight_syncs"])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", help="folder for trl_vllm_colocate.json")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--max-model-len", type=int, default=256)
    ap.add_argument("--attention-backend", default="TRITON_ATTN",
                    help="vLLM's attention_config.backend, added to TRL's LLM(...) call; 'auto': TRL's call unchanged")
    ap.add_argument("--model", default=None, help="HF checkpoint folder (default: rla's bundled tiny Qwen2)")
    args = ap.parse_args(argv)
    if args.steps < 2:
        ap.error("--steps must be at least 2 (step 2 is the first generation with updated weights)")
    os.makedirs(args.out, exist_ok=True)
    os.environ.update(ENGINE_ENV)
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    # `timeout` stops a stuck run with SIGTERM: exit through Python so the JSON below is still written
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(f"stopped by SIGTERM ({time.strftime('%H:%M:%S')})"))

    import torch
    import trl
    import vllm

    import rla.models
    from rla.environment import environment

    model = args.model or str(rla.models.bundled_path())
    record: dict = {"stamp": environment(), "vllm": vllm.__version__, "trl": trl.__version__,
                    "model": model, "attention_backend": args.attention_backend, "engine_env": ENGINE_ENV}
    wrap_llm(None if args.attention_backend == "auto" else args.attention_backend, record)
    path = os.path.join(args.out, "trl_vllm_colocate.json")
    try:
        run(model, args, record)
    except BaseException:  # a one-shot GPU run: what got this far, and the error, still come back
        record["error"] = traceback.format_exc()[-6000:]
        record["checks"] = {"ran": False}
        raise
    finally:
        if torch.cuda.is_available():
            record["gpu_peak_memory_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
        with open(path, "w") as f:
            json.dump(record, f, indent=1, default=str)
    for h in record["steps"]:
        print(json.dumps({k: h.get(k) for k in ("step", "loss", "kl", "reward", "mismatch/k3", "mismatch/n_tokens")}))
    print(json.dumps(record["checks"]), flush=True)
    return 0 if all(record["checks"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
