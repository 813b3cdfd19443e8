"""FSDP2 ``fully_shard`` with bf16 mixed precision, two CPU processes on gloo.

Sharded fp32 master weights with ``MixedPrecisionPolicy(param_dtype=bf16, cast_forward_inputs=False)``
compute with RN(w), so the aligned sharded model must give the logits of the aligned bf16 model
bit for bit -- aligned before sharding, and re-aligned after it (FSDP2 swaps each module's class
for an ``FSDP<Class>`` subclass). With the default ``cast_forward_inputs=True`` the fp32 residual
sum that ``fp32_sum`` profiles hand between layers is rounded by FSDP; that must be a clear error.
"""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import rla

from align_spec import single_thread, tiny_model, tokens  # noqa: F401
from free_port import free_port

pytestmark = pytest.mark.skipif(
    not dist.is_available() or not dist.is_gloo_available(), reason="needs torch.distributed with gloo"
)


def _shard(model, cast_forward_inputs):
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    from torch.distributed.device_mesh import init_device_mesh

    policy = MixedPrecisionPolicy(
        param_dtype=torch.bfloat16, reduce_dtype=torch.float32, cast_forward_inputs=cast_forward_inputs
    )
    # a CPU mesh: without one, fully_shard takes the accelerator where there is one (a GPU box)
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    return model


def _worker(rank, world, port, out_dir):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        ids = tokens()
        result = {}
        model = tiny_model("qwen3", dtype=torch.float32)
        rla.align(model, "vllm")  # aligned before sharding
        _shard(model, cast_forward_inputs=False)
        with torch.no_grad():
            result["vllm"] = model(ids).logits
        model.train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        losses = []
        finite = torch.ones(())
        for _ in range(3):
            opt.zero_grad()
            loss = model(ids, labels=ids).loss
            loss.backward()
            for p in model.parameters():
                finite *= torch.isfinite(p.grad.to_local()).all()
            opt.step()
            losses.append(loss.item())
        dist.all_reduce(finite, op=dist.ReduceOp.MIN)  # every rank's shards
        result["finite"], result["losses"] = bool(finite), losses
        model.eval()

        model2 = _shard(tiny_model("qwen3", dtype=torch.float32), cast_forward_inputs=False)
        result["report"] = str(rla.align(model2, "sglang"))  # aligned after sharding (FSDP classes)
        with torch.no_grad():
            result["sglang"] = model2(ids).logits

        model3 = _shard(tiny_model("qwen3", dtype=torch.float32), cast_forward_inputs=True)
        rla.align(model3, "vllm")
        try:
            with torch.no_grad():
                model3(ids)
            result["cast_error"] = None
        except RuntimeError as e:
            result["cast_error"] = str(e)
        # FSDP2 issued the next layer's all-gather before the error: wait for every rank's pending
        # collectives, or destroying the group under them aborts the process (seen under load)
        dist.barrier()
        if rank == 0:
            torch.save(result, os.path.join(out_dir, "result.pt"))
    finally:
        dist.destroy_process_group()


def test_fsdp2_two_cpu_processes(tmp_path):
    mp.spawn(_worker, args=(2, free_port(), str(tmp_path)), nprocs=2, join=True)
    result = torch.load(tmp_path / "result.pt", weights_only=False)
    ids = tokens()
    engine = tiny_model("qwen3", dtype=torch.float32).to(torch.bfloat16)  # RN(master)
    with torch.no_grad():
        for profile in ("vllm", "sglang"):
            rla.align(engine, profile)
            assert torch.equal(result[profile], engine(ids).logits), profile
    assert "2 decoder layers" in result["report"]
    assert result["finite"] and result["losses"][-1] < result["losses"][0]
    assert result["cast_error"] is not None and "cast_forward_inputs=False" in result["cast_error"]
