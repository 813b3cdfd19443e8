"""verl's default strategy, FSDP1 (``strategy: fsdp``), and FSDP2, sharded over two processes (gloo, CPU).

Two ranks run verl 0.9.1's own ``FSDPEngine.initialize()`` (``verl_cpu``: verl's CPU platform,
two device shims) on the tiny checkpoint with an untied LM head. verl builds such a model on the
meta device on rank 1 (``get_init_weight_context_manager``); the integration aligns that copy as
rank 0's (``rla.align(..., allow_meta=True)``), and FSDP1's ``sync_module_states`` fills it in
from rank 0 when verl wraps it (``FULL_SHARD``: each rank holds half of every flat parameter;
FSDP2: verl's ``fsdp2_load_full_state_dict`` broadcasts rank 0's weights and buffers).
On both ranks the logits (plain and under verl's bf16 autocast) and every gradient must equal
the unsharded aligned model's, bit for bit (``fsdp_compare.compare_with_unsharded``).

verl's forward-only reference (bf16) is built the same way; FSDP1 puts it under
``CPUOffload(offload_params=True)``, whose pinned memory needs an accelerator, so on CPU only its
build is checked (both ranks aligned, the same fp32 RoPE buffers); its logits are checked in
``test_integration_verl_fsdp_gpu.py``.

The ranks are forked from the test process (they inherit its imports: no second start of torch,
transformers and verl), one intra-op thread each. The one-process case (``NO_SHARD``) is in
``test_integration_verl.py``.
"""

from __future__ import annotations

import multiprocessing
import os
import queue
import traceback
from importlib.resources import files

import pytest
import torch

pytest.importorskip("verl", reason="the verl integration is tested where verl is installed (README)")

from verl_cpu import fsdp1_on_cpu  # noqa: E402  (registers verl's CPU platform first)
from fsdp_compare import compare_with_unsharded, untied_checkpoint  # noqa: E402
from free_port import free_port  # noqa: E402

# imported here, in the test process, so the forked ranks inherit them (torch._dynamo: FSDPEngine
# wraps its entropy function in torch.compile, verl's default)
import torch._dynamo  # noqa: E402,F401
import torch.distributed as dist  # noqa: E402
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP  # noqa: E402
from verl.trainer.config import CheckpointConfig  # noqa: E402
from verl.workers.config import FSDPEngineConfig, FSDPOptimizerConfig, HFModelConfig  # noqa: E402
from verl.workers.engine.fsdp import transformer_impl  # noqa: E402

import rla  # noqa: E402
import rla.integrations.verl  # noqa: E402,F401  (the external_lib verl imports; installed before the fork)

MODEL = str(files("rla") / "assets" / "tiny-qwen2")
IDS = torch.randint(3, 60, (1, 12), generator=torch.Generator().manual_seed(0))


def _model_config(model_path: str):
    return HFModelConfig(path=model_path, external_lib="rla.integrations.verl",
                         override_config={"attn_implementation": "eager"},
                         use_remove_padding=False, enable_gradient_checkpointing=False)


def _rank(rank: int, world: int, port: int, model_path: str, strategy: str, role: str, results) -> None:
    try:
        if dist.is_initialized():
            raise RuntimeError("the test process holds a process group; a forked rank cannot start its own")
        torch.set_num_threads(1)
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                          LOCAL_RANK=str(rank))
        dist.init_process_group("gloo", rank=rank, world_size=world)
        engine = transformer_impl.FSDPEngine(_model_config(model_path), FSDPEngineConfig(strategy=strategy, forward_only=role == "ref"),
                                             FSDPOptimizerConfig(lr=1e-5), CheckpointConfig())
        with fsdp1_on_cpu():
            engine.initialize()
        report = rla.alignment_of(engine.module)
        if role == "ref":  # FSDP1 puts the reference under CPUOffload (pinned memory): no CPU forward
            result = {"buffers": {n.replace("_fsdp_wrapped_module.", ""): (str(b.dtype), b.tolist())
                                  for n, b in engine.module.named_buffers()}}
        else:
            result = compare_with_unsharded(engine.module, model_path, report.profile, IDS)
        result.update(rank=rank, sharding=str(getattr(engine.module, "sharding_strategy", "fsdp2")),
                      meta_note=any("meta device" in n for n in report.notes),
                      units=sum(isinstance(m, FSDP) for m in engine.module.modules()))
        dist.destroy_process_group()
    except BaseException:  # noqa: BLE001 (reported to the test, which fails on it)
        result = {"rank": rank, "error": traceback.format_exc()[-3000:]}
    results.put(result)


@pytest.mark.parametrize("strategy,role", [("fsdp", "actor"), ("fsdp2", "actor"), ("fsdp", "ref")])
def test_two_ranks_with_a_meta_built_rank_are_aligned_and_exact(strategy, role, tmp_path):
    model_path = untied_checkpoint(tmp_path / "untied", MODEL)
    _model_config(model_path)  # transformers' lazy imports (tokenizer, model class) happen here, once, not per rank
    ctx = multiprocessing.get_context("fork")
    results = ctx.Queue()
    port = free_port()
    ranks = [ctx.Process(target=_rank, args=(r, 2, port, model_path, strategy, role, results)) for r in range(2)]
    for p in ranks:
        p.start()
    got = []
    try:
        for _ in ranks:
            got.append(results.get(timeout=300))
    except queue.Empty:
        pass
    finally:
        for p in ranks:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    assert len(got) == 2 and not [r["error"] for r in got if "error" in r], got
    got.sort(key=lambda r: r["rank"])
    assert [r["meta_note"] for r in got] == [False, True]  # rank 1 was built on the meta device
    if role == "ref":  # verl's bf16 reference: rank 1's meta copy holds rank 0's fp32 RoPE buffers after the wrap
        assert got[0]["buffers"] == got[1]["buffers"] and got[0]["buffers"]
        assert {dtype for dtype, _ in got[0]["buffers"].values()} == {"torch.float32"}
        return
    expected = {"logits_equal_plain": True, "logits_equal_autocast": True, "grads_compared": 75,
                "grads_unequal": [], "grads_max_abs_diff": 0.0, "grads_missing": [],
                "sharding": "ShardingStrategy.FULL_SHARD" if strategy == "fsdp" else "fsdp2",
                "units": 7 if strategy == "fsdp" else 0}
    assert [{k: v for k, v in r.items() if k not in ("rank", "meta_note")} for r in got] == [expected, expected]
