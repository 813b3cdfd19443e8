"""One torchrun worker of tests/integrations/test_integration_verl_fsdp_gpu.py (not a test file).

    torchrun --nproc_per_node N tests/integrations/verl_fsdp_gpu_worker.py {fsdp,fsdp2} MODEL_PATH {actor,ref} OUT_DIR

verl 0.9.1's own FSDPEngine (``HFModelConfig`` importing ``external_lib=rla.integrations.verl``,
``initialize()``: load fp32, cast, align, wrap with FSDP1 ``MixedPrecision`` or FSDP2
``MixedPrecisionPolicy``) on a tiny Qwen2 (tied or untied LM head: verl builds an untied one on
the meta device on ranks other than 0), on CUDA with NCCL. Checks, on every rank: the wrapped
model is aligned; no FSDP unit casts forward inputs; its logits (plain and under bf16 autocast)
and every gradient equal the bf16-loaded aligned model's bit for bit
(``fsdp_compare.compare_with_unsharded``, the check the CPU tests run). Writes
``OUT_DIR/rank<N>.json`` per rank (the ranks' stdout interleaves) and prints ``OK`` on success.
``ref``: verl's forward-only reference engine (bf16, and under FSDP1
``CPUOffload(offload_params=True)``, which pins memory and so cannot run on a CPU), logits only.
Needs ``tests/`` on ``PYTHONPATH`` (for ``fsdp_compare``).
"""

from __future__ import annotations

import json
import os
import sys

import torch
import torch.distributed as dist


def main(strategy: str, model_path: str, role: str, out_dir: str) -> int:
    rank = int(os.environ["RANK"])
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl")
    import transformers
    import verl
    from fsdp_compare import compare_with_unsharded
    from verl.trainer.config import CheckpointConfig
    from verl.workers.config import FSDPEngineConfig, FSDPOptimizerConfig, HFModelConfig
    from verl.workers.engine.fsdp import transformer_impl

    import rla

    model_config = HFModelConfig(path=model_path, external_lib="rla.integrations.verl",
                                 override_config={"attn_implementation": "eager"},
                                 use_remove_padding=False, enable_gradient_checkpointing=False)
    engine = transformer_impl.FSDPEngine(model_config, FSDPEngineConfig(strategy=strategy, forward_only=role == "ref"),
                                         FSDPOptimizerConfig(lr=1e-5), CheckpointConfig())
    engine.initialize()
    module = engine.module
    report = rla.alignment_of(module)
    if strategy == "fsdp":
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        units = [m for m in module.modules() if isinstance(m, FSDP)]
        casts = [bool(m.mixed_precision.cast_forward_inputs) for m in units]
    else:
        from torch.distributed.fsdp import FSDPModule

        units = [m for m in module.modules() if isinstance(m, FSDPModule)]
        casts = [bool(m._get_fsdp_state()._mp_policy.cast_forward_inputs) for m in units]
    ids = torch.randint(3, 60, (2, 24), generator=torch.Generator().manual_seed(0)).cuda()
    result = {"rank": rank, "world_size": dist.get_world_size(), "strategy": strategy, "aligned": report is not None,
              "meta_rank": bool(report and any("meta device" in n for n in report.notes)),
              "fsdp_units": len(units), "any_input_cast": any(casts), "torch": torch.__version__,
              "verl": verl.__version__, "transformers": transformers.__version__,
              "gpu": torch.cuda.get_device_name()}
    result.update(compare_with_unsharded(module, model_path, report.profile, ids, backward=role == "actor"))
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(result, f)
    ok = (report is not None and units and not any(casts) and result["logits_equal_plain"]
          and result["logits_equal_autocast"] and not result.get("grads_unequal") and not result.get("grads_missing"))
    dist.destroy_process_group()
    if ok and rank == 0:
        print("OK", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:5]))
