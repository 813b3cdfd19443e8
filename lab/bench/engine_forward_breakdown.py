"""Where the engine-backed default forward's training step spends its time (issue #36, item 3).

``rla.engines.vllm_forward.engine_forward(vllm, 'default')`` runs vLLM's Inductor-compiled pieces in
the forward and, in the backward, recomputes each piece from its two saved [tokens, hidden] inputs
with ``rla.ops`` (the reference) and differentiates that. One step (forward + HF's next-token loss
+ backward, no optimizer) of ``rla bench e2e``'s shapes (Qwen2.5-1.5B 4x4096, Qwen3-1.7B 2x4096,
Qwen2.5-7B 1x4096, random init, sdpa), on one model per shape aligned in turn:

  hf-bf16            HF eager
  rla-vllm           rla.align(model, "vllm"): rla.ops in HF's layers, autograd saves what they keep
  pieces             rla.align(model, <engine row>, ops=engine_forward(vllm, "default")): today's default
  pieces+aot_eager   the same, engine_forward(..., compile_backward="aot_eager")
  pieces+inductor    the same, compile_backward="inductor" (not in the default --variants: its compile
                     costs ~the forward pieces' again; run it at one shape, see Usage)

Per variant: the step's GPU time and host issue time (CUDA events, median of --reps), peak memory
(``e2e_breakdown.peaks``), bytes saved for backward per decoder layer (saved_tensors_hooks, storages
deduplicated, parameters excluded, the first saver pays: attention's output, which the next piece
saves too, counts as attention's; for the pieces split into the pieces' own saves and attention's),
and one profiled step's kernel time by range. The ranges come from wrapping, for the length of the
profiled step, ``vllm_forward.engine_backed`` (the whole piece and, inside its backward, the
recomputed reference) and ``VllmTwin.attend``, plus a hook on the decoder body; src is not edited:

  fwd pieces        the engine's compiled pieces          bwd recompute        the reference forward in the backward
  fwd attention     HF's attention function (sdpa)        bwd through pieces   autograd.grad through the recomputed piece
  fwd body other    masks, positions, views               bwd attention        SDPA's backward node
  fwd lm_head+loss  outside the decoder body              bwd body other       other nodes whose forward ran in the body
                                                          bwd lm_head+loss     nodes whose forward ran outside it
  gaps = step GPU ms (unprofiled) - the profiled step's kernel sum: host and launch idle time.
  Each kernel is put in the range of the op that launched it (its linked correlation id, read from the
  raw Kineto events: e2e_breakdown.attribute_kernels); the ranges' own GPU spans are not kernels. A
  kernel with no known launching op is 'unattributed' (in busy, shown beside it).

The pieces+X variants' parameter gradients are compared with ``pieces``' bit for bit (same ids,
same weights): ``exact`` is the fraction of parameters whose gradient is equal, with the max abs diff.

Cheaper backwards, and whether each keeps today's gradient bit for bit:

(a) compile the recomputation (``compile_backward``): FLOPs unchanged (the GEMMs are recomputed
    either way), host dispatch cut. ``aot_eager`` runs the same aten ops in the order autograd
    recorded them: exact (CPU test, ``tests/engines/test_vllm_forward_compile_backward.py``).
    ``inductor``: on CUDA rla's ops are opaque custom ops (their Triton kernels unchanged) and F.linear
    stays an extern cuBLAS mm, but Inductor fuses the glue: the gradient of a tensor read three times
    (q/k/v from one norm output) is summed in one fp32 kernel instead of two bf16 adds, an addmm may be
    split into mm + bias add, a bias gradient is Inductor's reduction; so not exact in general. On CPU
    (tiny Qwen2 / Qwen3, 2026-12-02) it is not: 5 of 27 / 5 of 25 parameter gradients equal, but there
    rla's ops are traced too (the PyTorch reference, not custom ops). This script measures the CUDA
    case. No compile removes the recomputed GEMMs: the recomputed piece's outputs are all returned, so
    even the GEMMs no backward reads (v, and Qwen2/Llama's q/k, whose RoPE backward is linear; ~7% of a
    layer's GEMMs) still run.
(b) reuse the engine forward's GEMM outputs (save them, no recomputation): the gradient is then taken
    at the engine's activations instead of the reference's; equal bits only where every region output
    of the engine equals the reference's, which default mode does not give (Inductor's reduction order:
    the reason these pieces exist). Not exact; memory back to HF's saved set. Only o_proj's output
    (a GEMM of a saved input) is the same on both sides: ~5% of a layer's GEMM FLOPs.
(c) run the reference with grad in the forward and keep its graph: the same FLOPs moved to the forward,
    HF's saved set on top of the pieces'. Exact, no gain.
So the recomputation (~one forward of the decoder's GEMMs, ~1/4 to 1/3 of the step) is the price of
the exact gradient of the reference at its own point; what compiling can win is host time.

Usage (GPU; vLLM importable from PYTHONPATH, or its wheel named by RLA_ENGINE_WHEEL, as rla.bench.e2e):
  PYTHONPATH=$PWD/src:/tmp/site:/tmp/deps python lab/bench/engine_forward_breakdown.py --out $OUT/efb
  ... --models qwen2.5-1.5b --variants pieces pieces+aot_eager pieces+inductor --out $OUT/efb_inductor
CPU smoke (groups leaf aten ops' CPU time; checks the wiring, no numbers to keep):
  RLA_ENGINE_WHEEL=vllm-....whl python lab/bench/engine_forward_breakdown.py --device cpu --shape tiny \\
      --models qwen3-1.7b --layers 2 --out /tmp/efb
``--tokens B S`` replaces the batch and sequence length (the tests' CPU runs take a short one).
Writes ``engine_forward_breakdown.json`` and ``.md`` in ``--out`` (after every shape).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import statistics
import sys
import time
import traceback
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from e2e_breakdown import (  # noqa: E402
    TINY, TINY_BATCH, _kernel_records, _storage_key, build, host_and_gpu_ms, kind_of_name, peaks, run_shapes,
)

from rla.bench.e2e import BATCH, training_step  # noqa: E402
from rla.environment import env_markdown, environment  # noqa: E402

VARIANTS = ("hf-bf16", "rla-vllm", "pieces", "pieces+aot_eager", "pieces+inductor")
DEFAULT_VARIANTS = VARIANTS[:4]
CATS = ("fwd pieces", "fwd attention", "fwd body other", "fwd lm_head+loss", "bwd recompute", "bwd through pieces",
        "bwd attention", "bwd body other", "bwd lm_head+loss")
NODE = "autograd::engine::evaluate_function: "
R = "efb::"


class Ranges:
    """Profiler ranges and saved-tensor labels from wrappers (see the module doc); undone on exit."""

    def __init__(self):
        self.labels = ["outside"]

    def _ranged(self, name, fn):
        def run(*args, **kwargs):
            self.labels.append(name)
            try:
                with torch.autograd.profiler.record_function(R + name):
                    return fn(*args, **kwargs)
            finally:
                self.labels.pop()
        return run

    @contextlib.contextmanager
    def on(self, model):
        from rla.engines import vllm_forward
        from rla.engines.vllm_twin import VllmTwin

        backed, attend = vllm_forward.engine_backed, VllmTwin.attend
        vllm_forward.engine_backed = lambda engine, reference, *ts: self._ranged("pieces", backed)(
            engine, self._ranged("recompute", reference), *ts)
        VllmTwin.attend = self._ranged("attention", attend)
        body = model.model
        handles = [body.register_forward_pre_hook(lambda m, a: self._enter_body()),
                   body.register_forward_hook(lambda m, a, o: self._leave_body(), always_call=True)]
        try:
            yield self
        finally:
            vllm_forward.engine_backed, VllmTwin.attend = backed, attend
            for h in handles:
                h.remove()

    def _enter_body(self):
        self.labels.append("body")
        self._body = torch.autograd.profiler.record_function(R + "body")
        self._body.__enter__()

    def _leave_body(self):
        self._body.__exit__(None, None, None)
        self.labels.pop()


def categorize(prof, cuda: bool) -> dict:
    """Kernel microseconds per category (module doc) of one profiled step."""
    ops = []  # (sequence number, names of the op and its enclosing events) of the CPU ops
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CPU and e.sequence_nr is not None and e.sequence_nr >= 0:
            chain, p = [], e
            while p is not None:
                chain.append(p.name)
                p = p.cpu_parent
            ops.append((e.sequence_nr, chain))
    return categorize_records(_kernel_records(prof, cuda), ops, cuda)


def categorize_records(kernels, ops, cuda: bool) -> dict:
    """Pure: kernels are (name, us, chain of (name, sequence_nr) innermost first), as
    ``e2e_breakdown.attribute_kernels`` gives them; ops (sequence_nr, chain of names) of the CPU ops,
    to tell which forward ops ran in the body. On CUDA a kernel with an empty chain found no launching
    op: it goes to ``unattributed`` (in busy, in no range), not silently to the last category."""
    in_body = {seq for seq, chain in ops if R + "body" in chain and not any(n.startswith(NODE) for n in chain)}
    us = defaultdict(float)
    for kname, t, chain in kernels:
        names = [n for n, _ in chain]
        nodes = [(n, s) for n, s in chain if n.startswith(NODE)]
        if cuda and not chain:
            cat = "unattributed"
        elif R + "recompute" in names:
            cat = "bwd recompute"
        elif any(n == NODE + "_BackedBackward" for n, _ in nodes):
            cat = "bwd through pieces"
        elif nodes:
            node = nodes[0][0][len(NODE):]
            seq = next((s for n, s in chain if n == node and s is not None and s >= 0), nodes[0][1])
            if kind_of_name(node) == "attention" or kind_of_name(kname) == "attention":
                cat = "bwd attention"
            else:
                cat = "bwd body other" if seq in in_body else "bwd lm_head+loss"
        elif R + "pieces" in names:
            cat = "fwd pieces"
        elif R + "attention" in names or (R + "body" in names and kind_of_name(kname) == "attention"):
            cat = "fwd attention"
        elif R + "body" in names:
            cat = "fwd body other"
        else:
            cat = "fwd lm_head+loss"
        us[cat] += t
    out = {c: us.get(c, 0.0) for c in CATS}
    if us.get("unattributed"):
        out["unattributed"] = us["unattributed"]
    return out


def saved_bytes(model, ids, ranges: Ranges) -> dict:
    """Bytes autograd keeps in one forward + loss, by the label running when each was saved."""
    params = {_storage_key(p) for p in model.parameters()}
    seen, by = set(), defaultdict(int)

    def pack(t):
        key = _storage_key(t)
        if key not in seen and key not in params:
            seen.add(key)
            by[ranges.labels[-1]] += key[2]
        # detached, as e2e_breakdown.saved_tensors' pack: the live tensor of a saved output would
        # make a cycle through C++ that gc cannot free (no backward runs on this graph), and the
        # whole forward's saved set stayed allocated into the next variants (H200, 2026-12-02)
        return t.detach()

    with ranges.on(model), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = model(input_ids=ids, labels=ids).loss
    del loss
    gc.collect()
    return dict(by)


def profiled_step(model, ids, ranges: Ranges, cuda: bool) -> dict:
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with ranges.on(model), profile(activities=acts) as prof:
        training_step(model, ids)()
        if cuda:
            torch.cuda.synchronize()
    return categorize(prof, cuda)


def grads(model, ids) -> dict:
    model.zero_grad(set_to_none=True)
    model(input_ids=ids, labels=ids).loss.backward()
    # on the host: held on the device they would count in the next variants' peaks
    out = {n: p.grad.detach().to("cpu", copy=True) for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return out


def compare(got: dict, want: dict) -> dict:
    equal = sum(torch.equal(g, want[n]) for n, g in got.items())
    diff = max(((g.float() - want[n].float()).abs().max().item() for n, g in got.items()), default=0.0)
    return {"equal_params": equal, "params": len(want), "exact": equal / max(len(want), 1), "max_abs_diff": diff}


def run_shape(name, variants, engine, device, layers, tiny, reps, warmup, tokens=None) -> list[dict]:
    from rla.alignment import align, unalign
    from rla.engines.vllm_forward import engine_forward

    cuda = device.type == "cuda"
    model = build(name, device, layers, tiny)
    cfg = model.config
    batch, seq = tokens or (TINY_BATCH if tiny else BATCH[name]["default"])
    torch.manual_seed(1)
    ids = torch.randint(0, cfg.vocab_size, (batch, seq)).to(device)
    ranges, rows, base, shared = Ranges(), [], None, None
    for v in variants:
        row = dict(model=name, variant=v, batch=batch, seq=seq, layers=cfg.num_hidden_layers, hidden=cfg.hidden_size)
        if v.startswith("pieces"):
            backend = v.split("+", 1)[1] if "+" in v else None
            impl = engine_forward(engine, "default", compile_backward=backend)
            if shared is not None:  # one set of compiled forward pieces serves every pieces variant
                impl._twins = shared
            shared = impl._twins
            align(model, impl.profile.name, ops=impl)
            row["aligned_by"] = f"engine_forward(vllm {engine.version}, 'default', compile_backward={backend!r})"
        elif v == "rla-vllm":
            align(model, "vllm")
            row["aligned_by"] = "rla.align(model, 'vllm')"
        try:
            t0 = time.perf_counter()
            for _ in range(warmup):  # compiles (the pieces, the recomputation, Triton) happen here
                training_step(model, ids)()
            if cuda:
                torch.cuda.synchronize()
            row["warmup_s"] = time.perf_counter() - t0
            if v.startswith("pieces"):
                g = grads(model, ids)
                if v == "pieces":
                    base = g
                    # the control: the same variant's gradient again; where it is not equal to itself (SDPA's
                    # CUDA backwards accumulate dq with atomics) no other variant's can be judged by equality
                    row["repeat"] = compare(grads(model, ids), base)
                elif base is not None:
                    row["vs_pieces"] = compare(g, base)
                del g
            before = torch.cuda.memory_allocated() if cuda else 0
            sb = saved_bytes(model, ids, ranges)
            if cuda:  # 0 unless something still holds the saved-bytes forward's graph
                row["left_allocated_gib"] = (torch.cuda.memory_allocated() - before) / 2**30
            act = sum(sb.values()) - sb.get("outside", 0)
            scale = batch * seq * cfg.hidden_size
            row["saved"] = {"by_label_bytes": sb, "per_layer_bytes": act / cfg.num_hidden_layers,
                            "per_layer_per_token_hidden": act / cfg.num_hidden_layers / scale}
            if cuda:
                row["peaks"] = peaks(model, ids)
                t = host_and_gpu_ms(model, ids, reps)
                row["time"] = {"gpu_ms_all": t["gpu_ms"], "host_ms_all": t["host_ms"],
                               "gpu_ms": statistics.median(t["gpu_ms"]), "host_ms": statistics.median(t["host_ms"])}
            row["kernels_us"] = profiled_step(model, ids, ranges, cuda)
            busy = sum(row["kernels_us"].values()) / 1e3
            row["busy_ms"] = busy
            if cuda:
                row["gaps_ms"] = row["time"]["gpu_ms"] - busy
        except Exception as e:  # recorded, the other variants still run (the traceback goes to the log)
            traceback.print_exc()
            row["error"] = f"{type(e).__name__}: {str(e)[:200]}"
        finally:
            unalign(model)
            model.zero_grad(set_to_none=True)
            gc.collect()
            if cuda:
                torch.cuda.empty_cache()
        rows.append(row)
        print(f"{name} {v}: " + (row.get("error") or f"busy {row['busy_ms']:.1f} ms"
                                  + (f", step {row['time']['gpu_ms']:.1f} ms" if cuda else "")
                                  + (f", unattributed {row['kernels_us']['unattributed'] / 1e3:.1f} ms"
                                     if "unattributed" in row["kernels_us"] else "")
                                  + (f", left allocated {row['left_allocated_gib']:.2f} GiB"
                                     if "left_allocated_gib" in row else "")), flush=True)
    del model, base
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
    return rows


def markdown(payload: dict) -> str:
    a, rows = payload["args"], payload["results"]
    cuda = a["device"] == "cuda"
    unit = "kernel ms, one profiled step" if cuda else "CPU ms of leaf aten ops (wiring check only, not timings)"
    lines = [f"# Engine-backed forward: where the step goes ({payload['env'].get('gpu')})\n", env_markdown(payload["env"]),
             f"vLLM {payload['vllm']} ({payload['vllm_source']}). Command: `{payload['command']}`. "
             + (f"Models built with {a['layers']} decoder layers (the LM head and loss full size).\n" if a["layers"]
                else "Full depth.\n"),
             f"## Time by range ({unit})\n",
             "| model | variant | " + " | ".join(CATS) + " | busy | step GPU ms | host ms | gaps | vs hf step |",
             "|---|---|" + "---|" * (len(CATS) + 5)]
    hf = {r["model"]: r for r in rows if r["variant"] == "hf-bf16" and "time" in r}
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['model']} | {r['variant']} | {r['error'][:80]} |" + " |" * (len(CATS) + 4))
            continue
        k, t = r["kernels_us"], r.get("time")
        b = hf.get(r["model"])
        lines.append(f"| {r['model']} | {r['variant']} | " + " | ".join(f"{k[c] / 1e3:.1f}" for c in CATS)
                     + f" | {r['busy_ms']:.1f}"
                     + (f" ({k['unattributed'] / 1e3:.1f} in no range)" if k.get("unattributed") else "") + " | "
                     + (f"{t['gpu_ms']:.1f} | {t['host_ms']:.1f} | {r['gaps_ms']:.1f} | "
                                                      + (f"{t['gpu_ms'] / b['time']['gpu_ms']:.3f} |" if b else " |")
                                                      if t else " | | | |"))
    lines += ["", "## Memory and exactness\n",
              "| model | variant | peak GiB (step) | saved / layer MiB | saved B / token / layer / hidden | of which "
              "pieces / attention MiB per layer | grads equal to pieces' (pieces: its own second step) | max abs diff | warm-up s |",
              "|---|---|---|---|---|---|---|---|---|"]
    # pieces' own row: its gradient against itself, a second step (the control for the others' equality)
    for r in rows:
        if "error" in r:
            continue
        s, L = r["saved"], r["layers"]
        lab = s["by_label_bytes"]
        split = (f"{lab.get('pieces', 0) / L / 2**20:.1f} / {lab.get('attention', 0) / L / 2**20:.1f}"
                 if r["variant"].startswith("pieces") else "")
        vs = r.get("vs_pieces") or r.get("repeat")
        lines.append(f"| {r['model']} | {r['variant']} | "
                     + (f"{r['peaks']['step_peak_gib']:.2f}" if "peaks" in r else "") + " | "
                     f"{s['per_layer_bytes'] / 2**20:.1f} | {s['per_layer_per_token_hidden']:.2f} | {split} | "
                     + (f"{vs['equal_params']}/{vs['params']} | {vs['max_abs_diff']:.3g}" if vs else " | ")
                     + f" | {r['warmup_s']:.1f} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="*", default=list(TINY), choices=list(TINY))
    ap.add_argument("--variants", nargs="*", default=list(DEFAULT_VARIANTS), choices=list(VARIANTS))
    ap.add_argument("--layers", type=int, default=None, help="decoder layers per model (default: the model's)")
    ap.add_argument("--shape", choices=("bench", "tiny"), default="bench", help="tiny: e2e_breakdown's small models")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--reps", type=int, default=3, help="timed steps per variant")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--tokens", nargs=2, type=int, metavar=("BATCH", "SEQ"), default=None,
                    help="batch and sequence length (default: the bench's, or 2 x 256 for --shape tiny)")
    ap.add_argument("--sdpa", choices=("default", "math"), default="default",
                    help="math: SDPA's math backend only (deterministic backward, so gradients can be compared by "
                    "equality; slower and heavier, its times are not the default's)")
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    device = torch.device(a.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: no CUDA device here (--device cpu --shape tiny checks the wiring)")
    engine = None
    if any(v.startswith("pieces") for v in a.variants):
        from rla.engines import vllm

        engine = vllm.load(os.environ.get("RLA_ENGINE_WHEEL"))  # as rla.bench.e2e's -pieces variant
    payload = {"env": environment(), "vllm": getattr(engine, "version", None),
               "vllm_source": os.environ.get("RLA_ENGINE_WHEEL") or "installed vllm",
               "command": "python lab/bench/engine_forward_breakdown.py "
               + " ".join(sys.argv[1:] if argv is None else argv), "args": vars(a)}
    backends = contextlib.nullcontext()
    if a.sdpa == "math":
        from torch.nn.attention import SDPBackend, sdpa_kernel

        backends = sdpa_kernel(SDPBackend.MATH)
    with backends:
        _run(payload, a, engine, device)
    return 0


def _run(payload, a, engine, device) -> None:
    run_shapes(payload, a.models, lambda name: run_shape(name, a.variants, engine, device, a.layers, a.shape == "tiny",
                                                        a.reps, a.warmup, a.tokens),
               Path(a.out), "engine_forward_breakdown", markdown)


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
