"""FSDP2 data parallel on two CPU processes (gloo): gradients equal the single-process ones on the
same global batch, GRPO steps run with each rank sampling its share, and a stopped FSDP run
resumes to the bitwise state of an uninterrupted one (its checkpoint is in the single-process
format, by parameter name)."""

import os

import pytest
import torch
import torch.multiprocessing as mp

from rla.rl.runlog import deterministic_part, read_log

from free_port import free_port

pytestmark = pytest.mark.skipif(
    not torch.distributed.is_available() or not torch.distributed.is_gloo_available(),
    reason="needs torch.distributed with gloo",
)


def _grads_match_single_process(rank: int, world: int) -> None:
    from rla import models
    from rla.rl.distributed import Dist
    from rla.rl.forward import make_micro_batch
    from rla.rl.precision import Policy

    def policy(fsdp: bool):
        model = models.build_model(models.tiny_config("qwen3", "micro"), dtype=torch.float32, seed=0)
        return Policy(model, precision="aligned", rollout_profile="vllm", align_regions=("rope", "swiglu", "rmsnorm"),
                      temperature=1.0, top_k=-1, top_p=1.0, chunk=4,
                      dist=Dist(rank, world, rank, fsdp=fsdp))

    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(3, 52, (3 + i,), generator=g).tolist() for i in range(4)]
    responses = [torch.randint(3, 52, (6 - i,), generator=g).tolist() for i in range(4)]
    n_tokens = sum(len(r) for r in responses)
    mine = [2 * rank, 2 * rank + 1]

    sharded = policy(True)
    mb = make_micro_batch([prompts[i] for i in mine], [responses[i] for i in mine], [0, 1])
    lp, _ = sharded.forward(mb)
    (lp.sum() / n_tokens * world).backward()  # the trainer's global token mean; FSDP averages over ranks
    got = {n: (p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad) for n, p in sharded.named_parameters()}

    single = policy(False)
    lp1, _ = single.forward(make_micro_batch(prompts, responses, list(range(4))))
    (lp1.sum() / n_tokens).backward()
    single.accumulate_grads()
    for name, p in single.named_parameters():
        # the same bf16 forward per sequence; the backward sums bf16 partial gradients in another
        # order (2 + 2 sequences reduced in fp32 vs 4 in one bf16 backward): errors of bf16's
        # 2^-9 relative rounding, ~0.2% in L1. A wrong loss scale over ranks would be 100%.
        diff = (got[name] - p.grad).abs()
        rel = float(diff.sum() / p.grad.abs().sum())
        assert rel < 1e-2 and float(diff.max()) < 2e-2 * float(p.grad.abs().max()), (name, rel)
    torch.distributed.barrier()


def _worker(rank: int, world: int, port: int, out: str) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world)
    torch.set_num_threads(1)
    from toy_runs import toy_config

    from rla.rl.trainer import Trainer

    _grads_match_single_process(rank, world)
    common = dict(fsdp=True, train_precision="aligned", steps=3, prompts_per_step=4, checkpoint_every=1)
    # close() would tear the process group down: close the log and give the folder's lock back instead
    t = Trainer(toy_config(f"{out}/full", **common), log=None)
    t.train()
    t.runlog and t.runlog.close()
    t.lock and t.lock.release()
    t = Trainer(toy_config(f"{out}/resumed", **common), log=None)
    t.train(until_step=2)
    t.runlog and t.runlog.close()
    t.lock and t.lock.release()
    t = Trainer(toy_config(f"{out}/resumed", **common), resume=True, log=None)
    assert t.step == 2
    t.train()
    t.close()


def test_fsdp2_two_cpu_ranks(tmp_path):
    mp.spawn(_worker, args=(2, free_port(), str(tmp_path)), nprocs=2, join=True)
    full, resumed = read_log(tmp_path / "full" / "log.jsonl"), read_log(tmp_path / "resumed" / "log.jsonl")
    assert len(full) == 3
    assert [deterministic_part(r) for r in full] == [deterministic_part(r) for r in resumed]
    assert full[0]["mismatch/n_seqs"] == 16  # both ranks' rollouts (2 prompts x 4 each) are measured
    assert all(r["train/grad_norm"] > 0 for r in full)

    from toy_runs import assert_same_run

    assert_same_run(tmp_path / "full", tmp_path / "resumed")
