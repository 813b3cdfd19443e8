"""Data parallel training under FSDP2 (``torch.distributed.fsdp.fully_shard``), launched by torchrun.

Each rank samples its share of the step's prompts with its own sampler (a full, unsharded engine
copy, as each vLLM instance of a colocated setup holds), computes the loss of its own rollouts,
and FSDP2 reduce-scatters the gradients. Everything the log reports is gathered to rank 0.

Mixed precision is ``MixedPrecisionPolicy(param_dtype=lp, reduce_dtype=fp32,
cast_forward_inputs=False)``: parameters are all-gathered as RN(fp32 shard), the same numbers a
bf16 engine loads, gradients are reduced in fp32 into the fp32 sharded master weights.
``cast_forward_inputs=False`` matters: ``rla.align`` passes fp32 cos/sin and fp32 residual sums
between modules, and casting module inputs would round them (docs/rounding.md's hazards).

Sharding units: every decoder layer, then the root ``PolicyForward`` wrapper holding the
embedding, final norm and LM head (tied or not), which stay unsharded for the whole forward and
for the chunked head's backward recomputation.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

__all__ = ["Dist", "init_distributed", "shard", "full_state_dict"]


@dataclass
class Dist:
    """Who this process is. ``world == 1`` and ``fsdp == False`` on a plain single-process run."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0
    fsdp: bool = False

    @property
    def main(self) -> bool:
        return self.rank == 0

    @property
    def active(self) -> bool:
        return self.fsdp and torch.distributed.is_initialized()

    def all_reduce(self, t: torch.Tensor, op: str = "sum") -> torch.Tensor:
        if self.active:
            ops = {"sum": torch.distributed.ReduceOp.SUM, "max": torch.distributed.ReduceOp.MAX}
            torch.distributed.all_reduce(t, op=ops[op])
        return t

    def gather_objects(self, obj) -> list:
        """Every rank's ``obj`` on rank 0 (rank order); ``[obj]`` without distribution; [] elsewhere."""
        if not self.active:
            return [obj]
        out = [None] * self.world if self.main else None
        torch.distributed.gather_object(obj, out, dst=0)
        return out if self.main else []

    def broadcast_object(self, obj):
        """Rank 0's ``obj`` on every rank (``obj`` itself without distribution)."""
        if not self.active:
            return obj
        box = [obj]
        torch.distributed.broadcast_object_list(box, src=0)
        return box[0]

    def barrier(self) -> None:
        if self.active:
            torch.distributed.barrier()


def init_distributed(fsdp: bool, device: torch.device) -> Dist:
    """Join the process group torchrun set up (``RANK``/``WORLD_SIZE`` in the environment)."""
    if not fsdp:
        return Dist()
    import torch.distributed as dist

    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        raise ValueError(
            "fsdp=true runs under torchrun (RANK and WORLD_SIZE are unset): "
            "torchrun --nproc_per_node N -m rla.cli train CONFIG fsdp=true"
        )
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return Dist(rank=rank, world=world, local_rank=local, fsdp=True)


def shard(module: torch.nn.Module, decoder_layers, param_dtype: torch.dtype | None, *,
          cast_forward_inputs: bool = False) -> None:
    """``fully_shard`` each decoder layer, then the root, with the mixed-precision policy above.

    ``cast_forward_inputs=True`` (FSDP2's default) exists only to reproduce the hazard it causes
    (``lab/bench/fsdp2_check.py``); training always uses False.
    """
    try:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    except ImportError as e:  # torch < 2.6 keeps FSDP2 under _composable
        raise NotImplementedError(f"this torch ({torch.__version__}) has no FSDP2 fully_shard: {e}") from None
    mp = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32,
                              cast_forward_inputs=cast_forward_inputs)
    for layer in decoder_layers:
        fully_shard(layer, mp_policy=mp)
    fully_shard(module, mp_policy=mp)


def full_state_dict(module: torch.nn.Module, prefix: str = "") -> dict[str, torch.Tensor]:
    """``module.state_dict()`` unsharded (``DTensor.full_tensor()``), on every rank.

    Tied weights appear under each of their names, as a plain ``state_dict`` has them (what
    ``Sampler.load_weights`` compares against). Names drop ``prefix`` (e.g. the ``"lm."`` of the
    ``PolicyForward`` wrapper). Collective under FSDP: every rank must call it.
    """
    out = {}
    for name, t in module.state_dict().items():
        t = t.detach()
        if hasattr(t, "full_tensor"):
            t = t.full_tensor()
        out[name[len(prefix):] if prefix and name.startswith(prefix) else name] = t
    return out
