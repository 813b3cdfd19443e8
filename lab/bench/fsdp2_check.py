"""FSDP2 check: an aligned model sharded with ``fully_shard`` computes what the unsharded aligned
bf16 model computes, bit for bit; and what alignment costs under FSDP2 (tokens/s, peak memory).

    torchrun --nproc_per_node 2 lab/bench/fsdp2_check.py --out DIR [--shape 1.5b|micro] [--device cuda|cpu]

Legs, in this order (every rank runs every leg; the reference only on rank 0):

1. **Master.** The same random-init fp32 model on every rank (``rla.models.build_model``, seeded,
   built on the run's device), then rank 0's weights broadcast to the others; whether the seeded
   builds already agreed is recorded. ``--shape 1.5b``: Qwen2.5-1.5B's width and depth
   (``rla.models`` size ``1.5b``) with its 151,936-token vocabulary, so that the embedding / LM
   head (233M of the 1.54B parameters, the largest FSDP2 unit) and the fp32 loss over the full
   vocabulary weigh in the timing and the memory as they do in a real Qwen2.5-1.5B run.
   ``--shape micro``: the test suite's 2-layer model (vocabulary 64), for the CPU test.
2. **Reference** (rank 0): a bf16 model built from the config (never ``.to(bf16)``, which would
   round RoPE's ``inv_freq``) loaded with RN(master), ``rla.align(ref, PROFILE)``, unsharded.
3. **Sharded**: the fp32 master, ``rla.align(master, PROFILE)``, then ``fully_shard`` per decoder
   layer and the root with ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32,
   cast_forward_inputs=False)`` (``rla.rl.distributed.shard``, what ``rla train fsdp=true`` uses).
   On one fixed seeded batch (the same on every rank) both forwards run with ``rla.ops.rope`` and
   ``rla.ops.swiglu`` wrapped (the aligned attention and MLP look them up on the ``rla.ops``
   module at every call, so the wrappers see every call): every call's outputs (q and k after
   rotation; the SwiGLU product) and the dtypes of the cos/sin handed to RoPE are captured.
   Compared, sharded (rank 0) vs reference: each region's outputs (``torch.equal``, fraction of
   equal elements, max |diff|), the logits (same), the mean token cross-entropy in fp32 (relative
   difference), and every rank's sharded logits against rank 0's.
4. **Throughput**: baseline (unaligned) and aligned, each a freshly sharded master under the same
   policy with AdamW: ``--warmup`` then ``--steps`` timed forward + loss + backward + optimizer
   steps on ``--batch x --seq`` tokens per rank. Tokens/s and peak memory
   (``torch.cuda.max_memory_allocated`` over the timed steps) per GPU; n/a on CPU.
5. **cast_forward_inputs=True** (FSDP2's default): a fresh master aligned the same way and sharded
   with that one flag changed; what its forward does is recorded (expected: decoder layer 1 raises
   rla's RuntimeError naming ``cast_forward_inputs=False``, because the fp32 residual sum that
   ``vllm``'s ``fp32_sum`` hands between layers arrives rounded; ``rla.align`` itself cannot see
   the policy, so the error comes from the first forward, not from ``align``). Last, so that a
   forward aborted inside FSDP2 cannot touch the other legs.

Rank 0 writes ``fsdp2_check.json`` and ``fsdp2_check.md`` under ``--out`` after every leg (a
later failure leaves the earlier numbers). Exit status 1 when a check fails (the files are
written first), 2 when a leg raised.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import gc
import os
import shlex
import sys
import time
import traceback
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

import rla
import rla.ops
from rla import models
from rla.rl.distributed import shard

#: shape -> (rla.models size, vocabulary, check batch x seq, throughput batch x seq per rank)
SHAPES = {
    "1.5b": ("1.5b", 151936, (2, 2048), (4, 2048)),
    "micro": ("micro", models.VOCAB_SIZE, (2, 24), (2, 32)),
}
#: the loss "matches to fp32 rounding": |loss_sharded - loss_ref| <= LOSS_RTOL * |loss_ref|
#: (8 ulps of fp32 at the loss's magnitude; with bitwise equal logits the difference is 0)
LOSS_RTOL = 2.0**-20
STEM = "fsdp2_check"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="folder for fsdp2_check.json / .md (rank 0 writes)")
    p.add_argument("--shape", choices=sorted(SHAPES), default="1.5b")
    p.add_argument("--arch", choices=models.ARCHS, default="qwen2")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--profile", default="vllm", help="engine rounding profile to align to")
    p.add_argument("--vocab", type=int, default=None, help="vocabulary size (default: the shape's)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--check-batch", type=int, default=None, help="rows of the fixed check batch")
    p.add_argument("--check-seq", type=int, default=None, help="tokens per row of the fixed check batch")
    p.add_argument("--batch", type=int, default=None, help="rows per rank in the throughput leg")
    p.add_argument("--seq", type=int, default=None, help="tokens per row in the throughput leg")
    p.add_argument("--warmup", type=int, default=3, help="untimed training steps per variant")
    p.add_argument("--steps", type=int, default=10, help="timed training steps per variant")
    p.add_argument("--lr", type=float, default=1e-5, help="AdamW learning rate in the throughput leg")
    p.add_argument("--timeout-s", type=int, default=300, help="collective timeout of the process group")
    args = p.parse_args(argv)
    size, vocab, check, bench = SHAPES[args.shape]
    args.size = size
    args.vocab = args.vocab or vocab
    args.check_batch = args.check_batch or check[0]
    args.check_seq = args.check_seq or check[1]
    args.batch = args.batch or bench[0]
    args.seq = args.seq or bench[1]
    if args.steps < 1 or args.warmup < 0:
        p.error("--steps must be >= 1 and --warmup >= 0")
    return args


# --------------------------------------------------------------------------------------------
# process group, models, batches
# --------------------------------------------------------------------------------------------


def init(args) -> tuple[int, int, torch.device]:
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        if key not in os.environ:
            raise SystemExit(f"fsdp2_check.py runs under torchrun ({key} is unset): "
                             "torchrun --nproc_per_node 2 lab/bench/fsdp2_check.py --out DIR")
    # NVLink multicast stays off on the lent machines, whatever the environment says (it can take
    # the host's shared GPUs out of service); fsdp2_x2.sh exports the same
    for key, value in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"), ("NVSHMEM_DISABLE_NVLS", "1")):
        os.environ[key] = value
    rank, world, local = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ["LOCAL_RANK"])
    if args.device == "cuda":
        if not torch.cuda.is_available():
            raise SystemExit("--device cuda but CUDA is not available; use --device cpu (gloo)")
        device = torch.device("cuda", local)
        torch.cuda.set_device(device)
        backend = "nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=args.timeout_s))
    return rank, world, device


def model_config(args):
    return models.tiny_config(args.arch, args.size, vocab_size=args.vocab, use_cache=False)


@torch.no_grad()
def build_master(args, device) -> tuple[torch.nn.Module, bool]:
    """The seeded fp32 model on ``device``, made identical on every rank (rank 0's weights).

    Returns ``(model, agreed)``: whether every rank's seeded build already equalled rank 0's.
    """
    with torch.device(device):
        model = models.build_model(model_config(args), dtype=torch.float32, seed=args.seed)
    model.to(device)
    agreed = torch.ones((), device=device)
    for t in list(model.parameters()) + list(model.buffers()):
        src = t.detach().clone()
        dist.broadcast(src, 0)
        agreed *= float(torch.equal(src, t))
        t.copy_(src)
    dist.all_reduce(agreed, op=dist.ReduceOp.MIN)
    return model, bool(agreed.item())


@torch.no_grad()
def build_reference(args, master, device) -> tuple[torch.nn.Module, dict]:
    """A bf16 model built from the config (its inv_freq stays fp32), weights RN(master)."""
    with torch.device(device):
        ref = models.build_model(model_config(args), dtype=torch.bfloat16, seed=args.seed)
    ref.to(device)
    src = dict(master.named_parameters())
    dst = dict(ref.named_parameters())
    if src.keys() != dst.keys():
        raise RuntimeError(f"reference and master parameters differ: {sorted(src.keys() ^ dst.keys())[:5]}")
    for name, p in dst.items():
        p.copy_(src[name])  # fp32 -> bf16 copy rounds to nearest even: RN(master)
    inv_ref = ref.get_decoder().rotary_emb.inv_freq
    inv_master = master.get_decoder().rotary_emb.inv_freq
    info = {"ref_inv_freq_dtype": str(inv_ref.dtype), "ref_inv_freq_equals_master": bool(torch.equal(inv_ref, inv_master))}
    return ref.eval(), info


def fixed_batch(args, device, rows, cols, offset=1) -> torch.Tensor:
    g = torch.Generator().manual_seed(args.seed + offset)
    return torch.randint(3, args.vocab, (rows, cols), generator=g).to(device)


def mean_ce(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy over the batch, in fp32."""
    v = logits.shape[-1]
    return F.cross_entropy(logits[:, :-1].float().reshape(-1, v), ids[:, 1:].reshape(-1))


# --------------------------------------------------------------------------------------------
# capture of rla.ops.rope / rla.ops.swiglu
# --------------------------------------------------------------------------------------------


class Capture:
    """Every call's outputs of ``rla.ops.rope`` / ``rla.ops.swiglu`` while installed (``keep``),
    the calls counted and the dtypes of the cos/sin reaching RoPE.

    The aligned attention calls ``ops.rope(...)`` and the aligned MLP ``ops.swiglu(...)`` through
    the ``rla.ops`` module object (``rla/alignment/rope.py``, ``swiglu.py``), so replacing the
    module attributes reaches every call; nothing else is patched.
    """

    def __init__(self, keep: bool = True):
        self.keep = keep
        self.rope: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.swiglu: list[torch.Tensor] = []
        self.cos_sin_dtypes: list[tuple[str, str]] = []
        self.rope_calls = 0
        self.swiglu_calls = 0

    @contextlib.contextmanager
    def installed(self):
        rope0, swiglu0 = rla.ops.rope, rla.ops.swiglu

        def rope(q, k, cos, sin, profile, unsqueeze_dim=1, dtype=None):
            self.rope_calls += 1
            self.cos_sin_dtypes.append((str(cos.dtype).replace("torch.", ""), str(sin.dtype).replace("torch.", "")))
            out = rope0(q, k, cos, sin, profile, unsqueeze_dim=unsqueeze_dim, dtype=dtype)
            if self.keep:
                self.rope.append((out[0].detach().clone(), out[1].detach().clone()))
            return out

        def swiglu(gate, up, profile):
            self.swiglu_calls += 1
            out = swiglu0(gate, up, profile)
            if self.keep:
                self.swiglu.append(out.detach().clone())
            return out

        rla.ops.rope, rla.ops.swiglu = rope, swiglu
        try:
            yield self
        finally:
            rla.ops.rope, rla.ops.swiglu = rope0, swiglu0


def compare(a: list[torch.Tensor], b: list[torch.Tensor]) -> dict:
    """Calls and elements of ``a`` (sharded) against ``b`` (reference), in call order."""
    out = {"calls": len(a), "reference_calls": len(b), "elements": 0, "equal_elements": 0,
           "max_abs_diff": 0.0, "first_unequal_call": None}
    for i, (x, y) in enumerate(zip(a, b)):
        if x.shape != y.shape or x.dtype != y.dtype:
            raise RuntimeError(f"call {i}: sharded {tuple(x.shape)} {x.dtype} vs reference {tuple(y.shape)} {y.dtype}")
        eq = x == y
        out["elements"] += eq.numel()
        out["equal_elements"] += int(eq.sum())
        out["max_abs_diff"] = max(out["max_abs_diff"], float((x.float() - y.float()).abs().max()))
        if out["first_unequal_call"] is None and not torch.equal(x, y):
            out["first_unequal_call"] = i
    out["equal_fraction"] = out["equal_elements"] / max(out["elements"], 1)
    out["bitwise_equal"] = bool(out["calls"] == out["reference_calls"] > 0 and out["first_unequal_call"] is None)
    return out


# --------------------------------------------------------------------------------------------
# legs
# --------------------------------------------------------------------------------------------


def leg_correctness(args, rank, world, device, res: dict) -> dict:
    """Legs 1-3. Returns rank 0's reference layer-0 RoPE outputs (for leg 5); {} elsewhere."""
    n_layers = model_config(args).num_hidden_layers
    master, agreed = build_master(args, device)
    res["master"] = {"parameters": sum(p.numel() for p in master.parameters()), "seeded_builds_agreed": agreed,
                     "layers": n_layers, "vocab": args.vocab}
    ids = fixed_batch(args, device, args.check_batch, args.check_seq)
    keep = {}
    ref_cap = Capture()
    if rank == 0:
        ref, info = build_reference(args, master, device)
        res["reference"] = info
        res["reference"]["align"] = str(rla.align(ref, args.profile))
        with torch.no_grad(), ref_cap.installed():
            ref_logits = ref(input_ids=ids, use_cache=False).logits
        ref_loss = float(mean_ce(ref_logits, ids))
        keep["rope0"] = ref_cap.rope[0] if ref_cap.rope else None
        del ref
        gc.collect()
    dist.barrier()

    report = rla.align(master, args.profile)
    shard(master, master.get_decoder().layers, torch.bfloat16)
    master.eval()
    cap = Capture(keep=rank == 0)  # the other ranks count calls and dtypes only
    with torch.no_grad(), cap.installed():
        logits = master(input_ids=ids, use_cache=False).logits
    loss = float(mean_ce(logits, ids))

    # every rank's sharded logits against rank 0's
    first = logits.clone()
    dist.broadcast(first, 0)
    same = torch.tensor(float(torch.equal(first, logits)), device=device)
    dist.all_reduce(same, op=dist.ReduceOp.MIN)
    del first
    calls = torch.tensor([cap.rope_calls, cap.swiglu_calls], device=device)
    calls_min, calls_max = calls.clone(), calls.clone()
    dist.all_reduce(calls_min, op=dist.ReduceOp.MIN)
    dist.all_reduce(calls_max, op=dist.ReduceOp.MAX)

    if rank == 0:
        rope = compare([t for pair in cap.rope for t in pair], [t for pair in ref_cap.rope for t in pair])
        rope["q"] = compare([q for q, _ in cap.rope], [q for q, _ in ref_cap.rope])
        rope["k"] = compare([k for _, k in cap.rope], [k for _, k in ref_cap.rope])
        rope["calls"] = cap.rope_calls
        rope["reference_calls"] = ref_cap.rope_calls
        swiglu = compare(cap.swiglu, ref_cap.swiglu)
        lg = compare([logits], [ref_logits])
        seen = sorted(set(cap.cos_sin_dtypes))
        res["sharded"] = {
            "align": str(report),
            "policy": "MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32, "
                      "cast_forward_inputs=False); fully_shard per decoder layer, then the root",
            "batch": [args.check_batch, args.check_seq],
            "rope": rope, "swiglu": swiglu,
            "logits": {k: lg[k] for k in ("elements", "equal_elements", "equal_fraction", "max_abs_diff", "bitwise_equal")},
            "cos_sin_dtypes_sharded": seen,
            "cos_sin_dtypes_reference": sorted(set(ref_cap.cos_sin_dtypes)),
            "loss_sharded": loss, "loss_reference": ref_loss,
            "loss_rel_diff": abs(loss - ref_loss) / abs(ref_loss),
            "all_ranks_logits_equal_rank0": bool(same.item()),
            "calls_per_rank_min_max": {"rope": [int(calls_min[0]), int(calls_max[0])],
                                       "swiglu": [int(calls_min[1]), int(calls_max[1])]},
        }
        res["checks"].update({
            "rope_outputs_bitwise": rope["bitwise_equal"],
            "swiglu_outputs_bitwise": swiglu["bitwise_equal"],
            "logits_bitwise": lg["bitwise_equal"],
            "cos_sin_fp32": seen == [("float32", "float32")],
            "loss_matches_fp32": res["sharded"]["loss_rel_diff"] <= LOSS_RTOL,
            "calls_one_per_layer_every_rank": bool(
                int(calls_min[0]) == int(calls_max[0]) == n_layers and int(calls_min[1]) == int(calls_max[1]) == n_layers
                and ref_cap.rope_calls == ref_cap.swiglu_calls == n_layers),
            "all_ranks_logits_equal": bool(same.item()),
        })
    del master, logits, cap, ref_cap
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    dist.barrier()
    return keep


def leg_throughput(args, rank, world, device, res: dict) -> None:
    rows = {}
    ids = fixed_batch(args, device, args.batch, args.seq, offset=100 + rank)  # each rank its own data
    for variant in ("baseline", "aligned"):
        master, _ = build_master(args, device)
        report = rla.align(master, args.profile) if variant == "aligned" else None
        shard(master, master.get_decoder().layers, torch.bfloat16)
        master.train()
        opt = torch.optim.AdamW(master.parameters(), lr=args.lr)

        def step():
            loss = master(input_ids=ids, labels=ids, use_cache=False).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            return loss.detach()

        losses = [step() for _ in range(args.warmup)]
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            torch.cuda.reset_peak_memory_stats(device)
        dist.barrier()
        times = []
        for _ in range(args.steps):
            t0 = time.perf_counter()
            losses.append(step())
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            times.append(time.perf_counter() - t0)
        total = sum(times)
        mine = {
            "tokens_per_s": args.batch * args.seq * args.steps / total,
            "step_s_median": sorted(times)[len(times) // 2],
            "peak_mem_gib": torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None,
            "peak_reserved_gib": torch.cuda.max_memory_reserved(device) / 2**30 if device.type == "cuda" else None,
            "losses": [float(x) for x in losses],
        }
        per_rank = [None] * world
        dist.all_gather_object(per_rank, mine)
        rows[variant] = {
            "aligned": str(report) if report is not None else "no (HF eager rounding)",
            "per_rank": per_rank,
            "tokens_per_s_per_gpu_mean": sum(r["tokens_per_s"] for r in per_rank) / world,
            "peak_mem_gib_max": (max(r["peak_mem_gib"] for r in per_rank) if device.type == "cuda" else None),
            "losses_finite": all(x == x and abs(x) != float("inf") for r in per_rank for x in r["losses"]),
        }
        del master, opt, losses
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
        dist.barrier()
    b, a = rows["baseline"], rows["aligned"]
    rows["aligned_vs_baseline"] = {
        "tokens_per_s": a["tokens_per_s_per_gpu_mean"] / b["tokens_per_s_per_gpu_mean"],
        "peak_mem": (a["peak_mem_gib_max"] / b["peak_mem_gib_max"]) if device.type == "cuda" else None,
    }
    if rank == 0:
        res["throughput"] = {"batch_x_seq_per_rank": [args.batch, args.seq], "warmup": args.warmup,
                             "timed_steps": args.steps, "optimizer": f"AdamW(lr={args.lr})", **rows}
        res["checks"]["throughput_losses_finite"] = b["losses_finite"] and a["losses_finite"]


def leg_cast_forward_inputs(args, rank, world, device, res: dict, keep: dict) -> None:
    master, _ = build_master(args, device)
    ids = fixed_batch(args, device, args.check_batch, args.check_seq)
    out = {"policy": "MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32, "
                     "cast_forward_inputs=True)", "aligned_before_sharding": True}
    try:
        out["align"] = str(rla.align(master, args.profile))
        out["align_raised"] = None
    except Exception as e:  # recorded: the expectation is that align itself cannot see the policy
        out["align_raised"] = f"{type(e).__name__}: {e}"
    shard(master, master.get_decoder().layers, torch.bfloat16, cast_forward_inputs=True)
    master.eval()
    cap = Capture(keep=rank == 0)
    try:
        with torch.no_grad(), cap.installed():
            master(input_ids=ids, use_cache=False)
        out["forward"] = "completed without an error"
        out["error_type"], out["error"] = None, None
    except Exception as e:
        out["forward"] = "raised"
        out["error_type"], out["error"] = type(e).__name__, str(e)
    out["rope_calls_before_end"] = cap.rope_calls
    out["swiglu_calls_before_end"] = cap.swiglu_calls
    out["cos_sin_dtypes_seen"] = sorted(set(cap.cos_sin_dtypes))
    if rank == 0 and keep.get("rope0") is not None and cap.rope:
        # layer 0 ran with cos/sin cast to bf16; vllm rounds cos/sin to bf16 anyway (rope_cos_sin='round')
        out["layer0_rope_equals_reference"] = bool(
            torch.equal(cap.rope[0][0], keep["rope0"][0]) and torch.equal(cap.rope[0][1], keep["rope0"][1]))
    outs = [None] * world
    dist.all_gather_object(outs, {k: out[k] for k in ("forward", "error_type", "error")})
    if rank == 0:
        out["all_ranks"] = outs
        res["cast_forward_inputs_true"] = out
        res["checks"]["cast_forward_inputs_true_raises_named_error"] = all(
            o["error_type"] == "RuntimeError" and "cast_forward_inputs=False" in (o["error"] or "") for o in outs)
    del master, cap
    gc.collect()
    dist.barrier()


# --------------------------------------------------------------------------------------------
# results
# --------------------------------------------------------------------------------------------


def environment(args, world, device) -> dict:
    from rla.environment import environment as bench_env

    env = bench_env(device if device.type == "cuda" else None)  # versions, date, the fused kernels' launch parameters
    env["command"] = (f"torchrun --nproc_per_node {os.environ.get('LOCAL_WORLD_SIZE', world)} "
                      + " ".join(shlex.quote(a) for a in sys.argv))
    env["world_size"] = world
    env["backend"] = dist.get_backend()
    env["device"] = args.device
    for key in ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS"):
        env[key] = os.environ.get(key)
    if device.type == "cuda":
        env["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        names = [None] * world
        dist.all_gather_object(names, torch.cuda.get_device_name(device))
        env["gpus"] = names
    else:
        dist.barrier()
        env["gpu"] = None
    return env


def _f(x, spec=".4g"):
    return "n/a" if x is None else format(x, spec)


def markdown(res: dict) -> str:
    env = res["environment"]
    lines = [f"# FSDP2 check: aligned ({res['args']['profile']}) sharded vs unsharded, {res['args']['shape']} shapes", ""]
    for k in ("gpu", "gpus", "date", "torch", "cuda", "nccl", "triton", "transformers", "python", "world_size",
              "backend", "NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS", "command"):
        if k in env:
            lines.append(f"- {k}: `{env[k]}`")
    m = res.get("master")
    if m:
        lines += ["", f"Model: random-init {res['args']['arch']} `{res['args']['size']}` "
                  f"({m['parameters']:,} parameters, {m['layers']} layers, vocabulary {m['vocab']}), "
                  f"seed {res['args']['seed']}; seeded builds agreed on every rank: {m['seeded_builds_agreed']}."]
    lines += ["", "## Checks", "", "| check | result |", "|---|---|"]
    lines += [f"| {k} | {'PASS' if v else 'FAIL'} |" for k, v in res["checks"].items()]
    s = res.get("sharded")
    if s:
        lines += ["", f"## Sharded (rank 0) vs unsharded reference, batch {s['batch'][0]}x{s['batch'][1]}", "",
                  f"Sharding: {s['policy']}.", "",
                  "| output | calls (sharded / ref) | elements | equal fraction | max abs diff | bitwise |",
                  "|---|---|---|---|---|---|"]
        for name, r in (("rope q+k", s["rope"]), ("rope q", s["rope"]["q"]), ("rope k", s["rope"]["k"]),
                        ("swiglu", s["swiglu"])):
            lines.append(f"| {name} | {r['calls']} / {r['reference_calls']} | {r['elements']:,} | "
                         f"{r['equal_fraction']:.6f} | {r['max_abs_diff']:.3g} | {r['bitwise_equal']} |")
        lg = s["logits"]
        lines.append(f"| logits | 1 / 1 | {lg['elements']:,} | {lg['equal_fraction']:.6f} | {lg['max_abs_diff']:.3g} | "
                     f"{lg['bitwise_equal']} |")
        lines += ["", f"- cos/sin dtypes reaching rope: sharded {s['cos_sin_dtypes_sharded']}, reference "
                  f"{s['cos_sin_dtypes_reference']}",
                  f"- loss (mean token CE, fp32): sharded {s['loss_sharded']!r}, reference {s['loss_reference']!r}, "
                  f"relative difference {s['loss_rel_diff']:.3g} (tolerance {LOSS_RTOL:.3g})",
                  f"- every rank's sharded logits equal rank 0's: {s['all_ranks_logits_equal_rank0']}; calls per rank "
                  f"(min, max): {s['calls_per_rank_min_max']}"]
    t = res.get("throughput")
    if t:
        lines += ["", f"## Throughput per GPU: {t['batch_x_seq_per_rank'][0]}x{t['batch_x_seq_per_rank'][1]} tokens "
                  f"per rank, fwd + loss + bwd + {t['optimizer']}, {t['warmup']} warm-up + {t['timed_steps']} timed steps",
                  "", "| variant | tok/s per GPU (mean of ranks) | per rank | peak GiB (max of ranks) | per rank | median step s |",
                  "|---|---|---|---|---|---|"]
        for v in ("baseline", "aligned"):
            r = t[v]
            lines.append(f"| {v} | {r['tokens_per_s_per_gpu_mean']:.0f} | "
                         f"{', '.join(format(x['tokens_per_s'], '.0f') for x in r['per_rank'])} | "
                         f"{_f(r['peak_mem_gib_max'], '.2f')} | {', '.join(_f(x['peak_mem_gib'], '.2f') for x in r['per_rank'])} | "
                         f"{', '.join(format(x['step_s_median'], '.4f') for x in r['per_rank'])} |")
        ab = t["aligned_vs_baseline"]
        lines += ["", f"Aligned / baseline: tokens/s {ab['tokens_per_s']:.3f}, peak memory {_f(ab['peak_mem'], '.3f')}."]
    c = res.get("cast_forward_inputs_true")
    if c:
        lines += ["", "## The default cast_forward_inputs=True", "",
                  f"- policy: {c['policy']}, rla.align before fully_shard; rla.align raised: {c['align_raised']}",
                  f"- forward: {c['forward']}" + (f": {c['error_type']}: {c['error']}" if c["error"] else ""),
                  f"- rope calls before the end: {c['rope_calls_before_end']}, swiglu calls: "
                  f"{c['swiglu_calls_before_end']}; cos/sin dtypes that reached rope: {c['cos_sin_dtypes_seen']}"]
        if "layer0_rope_equals_reference" in c:
            lines.append(f"- layer 0's rope outputs (cos/sin arrived rounded) equal the reference's: "
                         f"{c['layer0_rope_equals_reference']}")
    if res.get("errors"):
        lines += ["", "## Errors", ""] + [f"- {e.splitlines()[-1]}" for e in res["errors"]]
    return "\n".join(lines) + "\n"


def write(res: dict, out: Path) -> None:
    import json

    out.mkdir(parents=True, exist_ok=True)
    (out / f"{STEM}.json").write_text(json.dumps(res, indent=1, default=str) + "\n")
    (out / f"{STEM}.md").write_text(markdown(res))


def main(argv=None) -> int:
    args = parse_args(argv)
    rank, world, device = init(args)
    out = Path(args.out)
    res = {"args": vars(args), "checks": {}, "errors": []}
    legs = (
        ("correctness", lambda state: state.update(leg_correctness(args, rank, world, device, res))),
        ("throughput", lambda state: leg_throughput(args, rank, world, device, res)),
        ("cast_forward_inputs", lambda state: leg_cast_forward_inputs(args, rank, world, device, res, state)),
    )
    try:
        res["environment"] = environment(args, world, device)
        state: dict = {}
        for name, leg in legs:
            if rank == 0:
                write(res, out)
                print(f"[fsdp2_check] {name} ...", flush=True)
            t0 = time.perf_counter()
            leg(state)
            res.setdefault("leg_seconds", {})[name] = round(time.perf_counter() - t0, 2)
    except Exception:
        # No more collectives: the other ranks may be waiting in one; torchrun stops them when
        # this process exits. Rank 0 keeps the legs that finished.
        res["errors"].append(f"rank {rank}: {traceback.format_exc()}")
        print(res["errors"][-1], file=sys.stderr, flush=True)
        if rank == 0:
            res["failed_checks"] = [k for k, v in res["checks"].items() if not v]
            write(res, out)
        sys.stdout.flush()
        os._exit(2)
    status = 0
    if rank == 0:
        res["failed_checks"] = [k for k, v in res["checks"].items() if not v]
        write(res, out)
        print(markdown(res), flush=True)
        status = 1 if res["failed_checks"] else 0
    dist.barrier()
    dist.destroy_process_group()
    return status


if __name__ == "__main__":
    sys.exit(main())
