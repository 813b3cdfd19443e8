"""One torchrun worker of tests/integrations/test_integration_verl_fsdp_gpu.py (not a test file).

    torchrun --nproc_per_node N tests/integrations/verl_fsdp_gpu_worker.py {fsdp,fsdp2}

verl 0.9.1's own FSDPEngine (``HFModelConfig`` importing ``external_lib=rla.integrations.verl``,
``initialize()``: load fp32, cast, align, wrap with FSDP1 ``MixedPrecision`` or FSDP2
``MixedPrecisionPolicy``) on the bundled tiny Qwen2, on CUDA with NCCL. Checks, on every rank: the
wrapped model is aligned; no FSDP unit casts forward inputs; its logits equal the bf16-loaded
aligned model's bit for bit; a backward through the sharded model runs (no cast-input error) and
gives finite, nonzero gradients. Prints one JSON line per rank and ``OK`` on success.
"""

from __future__ import annotations

import json
import os
import sys
from importlib.resources import files

import torch
import torch.distributed as dist


def main(strategy: str) -> int:
    rank = int(os.environ["RANK"])
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl")
    from transformers import AutoModelForCausalLM
    from verl.trainer.config import CheckpointConfig
    from verl.workers.config import FSDPEngineConfig, FSDPOptimizerConfig, HFModelConfig
    from verl.workers.engine.fsdp import transformer_impl

    import rla

    model_path = str(files("rla") / "assets" / "tiny-qwen2")
    model_config = HFModelConfig(path=model_path, external_lib="rla.integrations.verl",
                                 override_config={"attn_implementation": "eager"},
                                 use_remove_padding=False, enable_gradient_checkpointing=False)
    engine = transformer_impl.FSDPEngine(model_config, FSDPEngineConfig(strategy=strategy),
                                         FSDPOptimizerConfig(lr=1e-5), CheckpointConfig())
    engine.initialize()
    module = engine.module
    report = rla.alignment_of(module)
    if strategy == "fsdp":
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        units = [m for m in module.modules() if isinstance(m, FSDP)]
        casts = [bool(m.mixed_precision.cast_forward_inputs) for m in units]
        param_dtypes = {str(m.mixed_precision.param_dtype) for m in units}
    else:
        from torch.distributed.fsdp import FSDPModule

        units = [m for m in module.modules() if isinstance(m, FSDPModule)]
        casts = [bool(m._get_fsdp_state()._mp_policy.cast_forward_inputs) for m in units]
        param_dtypes = {str(m._get_fsdp_state()._mp_policy.param_dtype) for m in units}
    ids = torch.randint(3, 60, (2, 24), generator=torch.Generator().manual_seed(0)).cuda()
    with torch.no_grad():
        logits = module(ids).logits
    reference = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.bfloat16,
                                                     attn_implementation="eager").cuda()
    rla.align(reference, report.profile)
    with torch.no_grad():
        expected = reference(ids).logits
    module.zero_grad(set_to_none=True)
    module(ids).logits.float().logsumexp(-1).mean().backward()
    grads = [p.grad for p in module.parameters() if p.grad is not None]
    finite = all(bool(torch.isfinite(g).all()) for g in grads)
    nonzero = any(bool(g.abs().sum() > 0) for g in grads)
    result = {
        "rank": rank, "world_size": dist.get_world_size(), "strategy": strategy, "aligned": report is not None,
        "profile": report.profile.name if report else None, "fsdp_units": len(units), "any_input_cast": any(casts),
        "param_dtypes": sorted(param_dtypes), "logits_dtype": str(logits.dtype),
        "logits_equal_bf16_aligned": bool(torch.equal(logits, expected)),
        "logits_frac_equal": float((logits == expected).float().mean()), "grads": len(grads),
        "grads_finite": finite, "grads_nonzero": nonzero, "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name(),
    }
    print(json.dumps(result), flush=True)
    ok = (report is not None and units and not any(casts) and result["logits_equal_bf16_aligned"] and grads
          and finite and nonzero)
    dist.destroy_process_group()
    if ok and rank == 0:
        print("OK", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
