"""Where an aligned training step's time and memory go, op kind by op kind (issue #36).

The step is ``rla bench e2e``'s (``rla.bench.e2e``: random-init Qwen2.5-1.5B 4x4096, Qwen3-1.7B
2x4096, Qwen2.5-7B 1x4096, sdpa, forward + HF's next-token loss + backward, no optimizer), for the
variants below, in one process, every model built before the first is measured and the order of
the variants alternated between the two timing passes:

  hf-bf16              HF eager in bf16 (the baseline)
  rla-vllm             rla.align(model, "vllm"): fp32_sum norms, the fp32_carry residual, (Qwen3) the
                       fp32 q/k norm -> RoPE chain
  rla-vllm-eager       rla.align(model, "vllm-eager"): rounded sums, the lp residual stream
  liger                Liger's RoPE, RMSNorm, SwiGLU (apply_liger_kernel_to_<family>(model=...), HF's loss)
  liger-flce           the same plus Liger's fused linear cross-entropy
  rla-vllm+liger-flce  liger-flce's model aligned to "vllm" (Liger's loss kept; ``rla.alignment.liger``)

The three HF-class variants share one model (aligned and unaligned in turn, as ``rla bench e2e``
does); ``liger`` has its own model, ``liger-flce`` and ``rla-vllm+liger-flce`` share another.
Liger also replaces module globals of the modeling module (``apply_rotary_pos_emb``, the norm and
MLP classes) for the whole process: they are swapped in only while a Liger variant runs.

What each part measures (``--parts``):

  a  saved tensors: every tensor autograd keeps for backward in one forward (saved_tensors_hooks),
     attributed to the innermost module that was running (forward hooks) and to the autograd node
     that holds it (a walk of the graph before backward), with dtype and shape. Storages are
     deduplicated: bytes are storage bytes, counted once, on the first saver in forward order (a
     view of a larger buffer costs the whole buffer; ``shared`` counts later savers). Parameter
     storages are reported apart (they are held anyway). Per layer and per op kind, and as bytes
     per token, layer and hidden element.
  b  allocator peaks (CUDA): max_memory_allocated over the forward (+ loss), over the backward and
     over a whole step, the statistics reset between phases; and what is held between them.
  c  kernel times (CUDA): one profiled step (torch.profiler), each kernel put in an op kind
     (rope, norm, residual add, swiglu/act, gemm, attention, loss/lm head, copies/casts, other) by
     its name first (GEMM, attention, the Triton kernels of rla and Liger), else by the op that
     launched it: the aten op, the module it ran in (forward), or the autograd node it ran for
     (backward; linked to its forward op by sequence number). On CPU the leaf aten ops stand for
     kernels, which only checks the grouping.
  d  host time: seconds the host spends issuing one step (no synchronisation inside it) against
     the GPU time of the step (CUDA events), median of ``--reps`` per pass, two passes in
     alternating order. A host time well under the GPU time means a GPU-bound step; one close to
     it means either a host-bound step or a full launch queue the host waited on (the profile of
     part c tells which: idle gaps between kernels).

``--tokens B S`` and ``--vocab V`` replace the batch, sequence length and vocabulary (a CPU run at
the models' real widths: per-element saved bytes do not depend on them, the loss's do).
``--layers N`` builds the models with N decoder layers (the LM head and loss unchanged): per-layer
saved bytes do not depend on the depth (every layer but the first saves the same set), so they
scale; the step's totals, peaks and times do not (the loss and the LM head stay full size), and the
report says so beside them. ``--shape tiny`` (CPU) uses a small model of each family.

Usage (GPU, repo root):  python lab/bench/e2e_breakdown.py --out $OUT/e2e_breakdown
CPU (part a only):       python lab/bench/e2e_breakdown.py --device cpu --shape tiny --parts a \
                             --variants hf-bf16 rla-vllm rla-vllm-eager --out results/...
Writes ``e2e_breakdown.json`` and ``e2e_breakdown.md`` in ``--out``.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import re
import statistics
import time
from collections import defaultdict
from pathlib import Path

import torch

from rla.bench.common import write_results
from rla.bench.e2e import BATCH, CONFIG_DEFAULTS, MODELS, training_step
from rla.environment import env_markdown, environment

VARIANTS = ("hf-bf16", "rla-vllm", "rla-vllm-eager", "liger", "liger-flce", "rla-vllm+liger-flce")
KINDS = ("rope", "norm", "residual add", "swiglu/act", "gemm", "attention", "loss/lm head", "copies/casts", "other")
#: Small models of each family for a CPU run of part a: the same head_dim (128) and kv grouping
#: kinds, hidden and intermediate cut so a 2-layer forward takes a second.
TINY = {
    "qwen2.5-1.5b": dict(hidden_size=256, intermediate_size=1536, num_attention_heads=2, num_key_value_heads=1,
                         vocab_size=2048),
    "qwen3-1.7b": dict(hidden_size=256, intermediate_size=768, num_attention_heads=2, num_key_value_heads=1,
                       head_dim=128, vocab_size=2048),
    "qwen2.5-7b": dict(hidden_size=512, intermediate_size=2688, num_attention_heads=4, num_key_value_heads=1,
                       vocab_size=2048),
}
TINY_BATCH = (2, 256)


# ------------------------------------------------------------------------------------------------
# Models and variants
# ------------------------------------------------------------------------------------------------


def build(name: str, device, layers: int | None, tiny: bool, vocab: int | None = None):
    from transformers import AutoConfig, AutoModelForCausalLM

    shape = dict(MODELS[name])
    if tiny:
        shape.update(TINY[name])
    if layers:
        shape["num_hidden_layers"] = layers
    if vocab:
        shape["vocab_size"] = vocab
    family = shape.pop("family", "qwen2")
    cfg = AutoConfig.for_model(family, **{**CONFIG_DEFAULTS, **shape})
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa", dtype=torch.bfloat16)
    return model.train()


class LigerGlobals:
    """Liger's patch of a model's family, its module-global replacements swapped in on demand."""

    def __init__(self, model, flce: bool):
        import liger_kernel.transformers as lk

        family = model.config.model_type
        self.module = importlib.import_module(f"transformers.models.{family}.modeling_{family}")
        prefix = {"qwen2": "Qwen2", "qwen3": "Qwen3"}[family]
        self.names = ("apply_rotary_pos_emb", f"{prefix}RMSNorm", f"{prefix}MLP")
        self.original = {n: getattr(self.module, n) for n in self.names}
        getattr(lk, f"apply_liger_kernel_to_{family}")(rope=True, rms_norm=True, swiglu=True, cross_entropy=False,
                                                       fused_linear_cross_entropy=flce, model=model)
        self.liger = {n: getattr(self.module, n) for n in self.names}
        self.off()

    def on(self):
        for n, v in self.liger.items():
            setattr(self.module, n, v)

    def off(self):
        for n, v in self.original.items():
            setattr(self.module, n, v)


class Arms:
    """The models of one shape and how to enter and leave each variant."""

    def __init__(self, name, variants, device, layers, tiny, vocab=None):
        self.models, self.liger = {}, {}
        if any(v in ("hf-bf16", "rla-vllm", "rla-vllm-eager") for v in variants):
            self.models["hf"] = build(name, device, layers, tiny, vocab)
        if "liger" in variants:
            self.models["liger"] = m = build(name, device, layers, tiny, vocab)
            self.liger["liger"] = LigerGlobals(m, flce=False)
        if "liger-flce" in variants or "rla-vllm+liger-flce" in variants:
            self.models["flce"] = m = build(name, device, layers, tiny, vocab)
            self.liger["flce"] = LigerGlobals(m, flce=True)

    def enter(self, variant):
        """-> (model, leave)."""
        from rla.alignment import align, unalign

        key = {"liger": "liger", "liger-flce": "flce", "rla-vllm+liger-flce": "flce"}.get(variant, "hf")
        model, lg = self.models[key], self.liger.get(key)
        if lg is not None:
            lg.on()
        profile = {"rla-vllm": "vllm", "rla-vllm-eager": "vllm-eager", "rla-vllm+liger-flce": "vllm"}.get(variant)
        if profile:
            align(model, profile)

        def leave():
            if profile:
                unalign(model)
            if lg is not None:
                lg.off()
            model.zero_grad(set_to_none=True)

        return model, leave


# ------------------------------------------------------------------------------------------------
# Op kinds
# ------------------------------------------------------------------------------------------------

#: (pattern, kind) on a kernel's, an autograd node's or an aten op's name, first match wins.
_BY_NAME = (
    (r"gemm|cutlass|xmma|nvjet|cublas|sm\d\d_|aten::(mm|addmm|bmm|matmul|linear)\b|^(Mm|Addmm|Bmm)Backward", "gemm"),
    (r"flash|fmha|attention|attn|aten::_?scaled_dot_product|ScaledDotProduct", "attention"),
    (r"cross_entropy|nll_loss|log_softmax|NllLoss|LogSoftmax|_fused_linear|flce|CrossEntropy", "loss/lm head"),
    (r"softmax|Softmax", "attention"),  # an eager attention's (the loss's log_softmax is matched above)
    (r"rope|rotary|Rope|Rotary", "rope"),
    (r"carry_add|_CarryAdd", "residual add"),
    (r"rms|norm|RMSNorm", "norm"),
    (r"swiglu|silu|Silu|SiLU|SwiGLU|geglu|gelu|Gelu", "swiglu/act"),
    (r"copy|cast|Memcpy|Memset|ToCopy|aten::(to|_to_copy|copy_|contiguous|clone)\b|CloneBackward", "copies/casts"),
)
#: module class name -> kind for elementwise work with no kind of its own name.
_BY_MODULE = ((r"RotaryEmbedding", "rope"), (r"RMSNorm", "norm"), (r"MLP", "swiglu/act"), (r"Attention", "rope"),
              (r"DecoderLayer", "residual add"), (r"ForCausalLM|Embedding|lm_head", "loss/lm head"))


def kind_of_name(name: str) -> str | None:
    for pattern, kind in _BY_NAME:
        if re.search(pattern, name):
            return kind
    return None


def kind_of_module(module_class: str | None) -> str:
    for pattern, kind in _BY_MODULE:
        if module_class and re.search(pattern, module_class):
            return kind
    return "other"


class ModuleStack:
    """Forward hooks that keep the running module's path and class, and (optionally) a profiler
    range named after it, so kernels and saved tensors can be put in their module."""

    RANGE = "e2e_breakdown::"

    def __init__(self, model, ranges: bool):
        self.stack: list[tuple[str, str]] = []
        self.handles, self.ranges = [], ranges
        for path, mod in model.named_modules():
            self.handles.append(mod.register_forward_pre_hook(self._pre(path, type(mod).__name__)))
            self.handles.append(mod.register_forward_hook(self._post(), always_call=True))

    def _pre(self, path, cls):
        def hook(mod, args):
            rf = torch.autograd.profiler.record_function(f"{self.RANGE}{cls}::{path}") if self.ranges else None
            if rf is not None:
                rf.__enter__()
            self.stack.append((path, cls, rf))
        return hook

    def _post(self):
        def hook(mod, args, out):
            if self.stack:
                _, _, rf = self.stack.pop()
                if rf is not None:
                    rf.__exit__(None, None, None)
        return hook

    def top(self) -> tuple[str, str]:
        return self.stack[-1][:2] if self.stack else ("", "")

    def remove(self):
        for h in self.handles:
            h.remove()


def layer_of(path: str) -> int | None:
    m = re.search(r"layers\.(\d+)", path)
    return int(m.group(1)) if m else None


# ------------------------------------------------------------------------------------------------
# a: saved tensors
# ------------------------------------------------------------------------------------------------


def _storage_key(t: torch.Tensor):
    s = t.untyped_storage()
    return (str(t.device), s.data_ptr(), s.nbytes())


def saved_tensors(model, ids) -> dict:
    """One forward + loss under saved_tensors_hooks, then a walk of the graph naming each saved
    tensor's autograd node; -> the records and their sums (see the module docstring, part a)."""
    params = {_storage_key(p) for p in model.parameters()}
    records, current = [], [None]
    stack = ModuleStack(model, ranges=False)

    def pack(t):
        path, cls = stack.top()
        records.append(dict(module=path, module_class=cls, dtype=str(t.dtype).replace("torch.", ""),
                            shape=list(t.shape), view_bytes=t.numel() * t.element_size(), key=_storage_key(t),
                            node=None))
        # detached: the pack hook gets the live tensor, grad_fn and all; keeping that of a saved
        # output makes a cycle through C++ (the node owns the packed object, which owns the output,
        # whose grad_fn is the node) that gc.collect() cannot see, so without a backward the whole
        # graph below it stayed alive: part a leaked one step's saved tensors per variant (H200,
        # 2026-12-02: rla-vllm OOM after hf-bf16 and liger). Unpacking re-attaches the grad_fn.
        return len(records) - 1, t.detach()

    def unpack(packed):
        i, t = packed
        if current[0] is not None and records[i]["node"] is None:
            records[i]["node"] = current[0]
        return t

    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
            loss = model(input_ids=ids, labels=ids).loss
    finally:
        stack.remove()
    seen, todo = set(), [loss.grad_fn]
    while todo:
        node = todo.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        current[0] = type(node).__name__
        names = [a for a in dir(node) if a.startswith("_saved_")]
        for a in names:
            try:
                getattr(node, a)
            except Exception:  # an undefined optional tensor, a freed buffer
                pass
        if not names and hasattr(node, "saved_tensors"):  # a Python autograd.Function's node
            try:
                node.saved_tensors
            except Exception:
                pass
        todo.extend(fn for fn, _ in node.next_functions)
    current[0] = None
    node = None  # the last node walked
    # The walk's sets hold every node, and through them every saved tensor; rla's and Liger's
    # autograd.Function contexts can sit in reference cycles that only the collector frees. Drop
    # both here: on the H200 the next part (peaks) ran out of memory with a whole step's saved
    # tensors still held (2026-12-02, Qwen2.5-1.5B at 4 x 4096).
    del loss, seen, todo, node
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return summarise_saved(records, params, model.config.num_hidden_layers - 1)


def summarise_saved(records: list[dict], params: set, last_layer: int) -> dict:
    """Dedupe by storage (first saver in forward order pays), split parameters off, and sum per
    (layer, op kind), and per (module class, node, dtype, shape) in the last layer and outside the
    layers."""
    owner, out = {}, []
    for r in records:
        key = r.pop("key")
        r["param"] = key in params
        if key in owner:
            owner[key]["shared"] += 1
            continue
        r["bytes"], r["shared"] = key[2], 0
        r["kind"] = kind_of_name(r["node"] or "") or kind_of_module(r["module_class"])
        r["layer"] = layer_of(r["module"])
        owner[key] = r
        out.append(r)
    act = [r for r in out if not r["param"]]
    per_layer = defaultdict(lambda: defaultdict(int))
    for r in act:
        per_layer["outside" if r["layer"] is None else r["layer"]][r["kind"]] += r["bytes"]
    groups = defaultdict(lambda: dict(bytes=0, count=0))
    for r in act:
        if r["layer"] is None or r["layer"] == last_layer:
            g = groups[("last layer" if r["layer"] is not None else "outside", r["module_class"], r["node"] or "?",
                        r["dtype"], tuple(r["shape"]))]
            g["bytes"] += r["bytes"]
            g["count"] += 1
    return {
        "activation_bytes": sum(r["bytes"] for r in act),
        "param_bytes": sum(r["bytes"] for r in out if r["param"]),
        "per_layer": {str(k): dict(v) for k, v in per_layer.items()},
        "groups": [dict(where=k[0], module_class=k[1], node=k[2], dtype=k[3], shape=list(k[4]), **v)
                   for k, v in sorted(groups.items(), key=lambda kv: -kv[1]["bytes"])],
    }


def per_element(saved: dict, tokens: int, hidden: int, layers: int) -> dict:
    """Bytes per token, layer and hidden element: every layer, the last layer alone (layers past
    the first save the same set), and per op kind in the last layer."""
    per = saved["per_layer"]
    in_layers = [v for k, v in per.items() if k != "outside"]
    last = per.get(str(layers - 1), {})
    scale = tokens * hidden
    return {
        "all_layers": sum(sum(v.values()) for v in in_layers) / (scale * layers),
        "last_layer": sum(last.values()) / scale,
        "last_layer_by_kind": {k: v / scale for k, v in sorted(last.items())},
        "outside_layers_bytes": sum(per.get("outside", {}).values()),
    }


# ------------------------------------------------------------------------------------------------
# b: allocator peaks; c: kernel times; d: host time
# ------------------------------------------------------------------------------------------------


def peaks(model, ids) -> dict:
    gib = 2**30
    torch.cuda.synchronize()
    gc.collect()
    start = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    loss = model(input_ids=ids, labels=ids).loss
    torch.cuda.synchronize()
    fwd_peak, held = torch.cuda.max_memory_allocated(), torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    loss.backward()
    torch.cuda.synchronize()
    bwd_peak = torch.cuda.max_memory_allocated()
    del loss
    model.zero_grad(set_to_none=True)
    gc.collect()
    torch.cuda.reset_peak_memory_stats()
    training_step(model, ids)()
    torch.cuda.synchronize()
    step_peak = torch.cuda.max_memory_allocated()
    return {"start_gib": start / gib, "forward_peak_gib": fwd_peak / gib, "held_after_forward_gib": held / gib,
            "backward_peak_gib": bwd_peak / gib, "step_peak_gib": step_peak / gib,
            "held_after_forward_above_start_gib": (held - start) / gib}


def attribute_kernels(cpu: list[dict], device: list[dict]) -> list[tuple[str, float, list]]:
    """Each device kernel -> (name, us, chain of its launching CPU op and that op's enclosing ranges,
    innermost first, as (name, sequence_nr)). Pure: over plain records (``_profile_records``).

    ``cpu``: dicts with corr (the event's correlation id), name, seq, start, end, parent (index in
    ``cpu`` of the enclosing event, or None), frontend (a PyTorch op or record_function range, not a
    CUDA runtime call: its linked id is 0), annotation (a record_function range).
    ``device``: dicts with name, start, end, linked (the correlation id of the frontend op that was
    innermost when it was launched; 0 when unknown), annotation.

    A device event that is a range's GPU-side span (a ``gpu_user_annotation``: flagged, or named as a
    CPU range) is no kernel: it is skipped, and only used to place a kernel with no known launching
    op (time containment, innermost span first). Each kernel is counted once."""
    ops: dict[int, int] = {}
    for i, r in enumerate(cpu):
        if r["frontend"]:
            ops.setdefault(r["corr"], i)
    range_names = {r["name"] for r in cpu if r.get("annotation")}
    spans = sorted(((d["start"], d["end"], d["name"]) for d in device
                    if d.get("annotation") or d["name"] in range_names), key=lambda s: s[1] - s[0])

    def chain(i):
        names = []
        while i is not None:
            names.append((cpu[i]["name"], cpu[i]["seq"]))
            i = cpu[i]["parent"]
        return names

    out, seen = [], set()
    for d in device:
        key = (d["name"], d["start"], d["end"])
        if d.get("annotation") or d["name"] in range_names or key in seen:
            continue
        seen.add(key)
        i = ops.get(d["linked"]) if d["linked"] else None
        ch = chain(i) if i is not None else [(n, None) for s, e, n in spans if s <= d["start"] and d["end"] <= e]
        out.append((d["name"], d["end"] - d["start"], ch))
    return out


_USER_SCOPE = 7  # at::RecordScope::USER_SCOPE: a record_function range


def _profile_records(prof) -> tuple[list[dict], list[dict]]:
    """``attribute_kernels``' records of a CUDA profile. The device events and their links come from
    the raw Kineto events: ``FunctionEvent.linked_correlation_id`` only exists in recent torch (2.13
    has it, 2.11 does not: there every kernel read 0, found no op, and all kernel time fell into the
    last category; the ``gpu_user_annotation`` spans of the ranges were counted as kernels too)."""
    from torch.autograd.profiler_util import _filter_name

    cpu_type = torch.autograd.DeviceType.CPU
    res = prof.profiler.kineto_results
    t0 = res.trace_start_ns()
    raw = [k for k in res.events() if not _filter_name(k.name())]
    front = {(k.correlation_id(), round((k.start_ns() - t0) / 1000, 1)) for k in raw
             if k.device_type() == cpu_type and k.linked_correlation_id() == 0}
    events = [e for e in prof.events() if e.device_type == cpu_type]
    index = {id(e): i for i, e in enumerate(events)}
    cpu = [dict(corr=e.id, name=e.name, seq=e.sequence_nr, start=e.time_range.start, end=e.time_range.end,
                parent=index.get(id(e.cpu_parent)) if e.cpu_parent is not None else None,
                frontend=(e.id, round(e.time_range.start, 1)) in front,
                annotation=bool(getattr(e, "is_user_annotation", False)) or e.scope == _USER_SCOPE) for e in events]
    device = [dict(name=k.name(), start=(k.start_ns() - t0) / 1000, end=(k.end_ns() - t0) / 1000,
                   linked=k.linked_correlation_id(), annotation=bool(k.is_user_annotation()))
              for k in raw if k.device_type() != cpu_type]
    return cpu, device


def _kernel_records(prof, cuda: bool) -> list[tuple[str, float, list]]:
    """(kernel name, us, chain of enclosing CPU events' names innermost first). On CPU the leaf
    aten ops (self time) stand in for kernels."""
    if cuda:
        return attribute_kernels(*_profile_records(prof))

    def chain(e):
        names = []
        while e is not None:
            names.append((e.name, e.sequence_nr))
            e = e.cpu_parent
        return names

    return [(e.name, e.self_cpu_time_total, chain(e.cpu_parent)) for e in prof.events()
            if e.device_type == torch.autograd.DeviceType.CPU and e.name.startswith("aten::")
            and not any(c.name.startswith("aten::") for c in e.cpu_children)]


def _module_of(chain) -> tuple[str | None, str]:
    """(class, path) of the innermost module range in a chain of enclosing events."""
    for n, _ in chain:
        if n.startswith(ModuleStack.RANGE):
            _, cls, path = n.split("::", 2)
            return cls, path
    return None, ""


def _in_layers(path: str) -> bool:
    return layer_of(path) is not None


def group_kernels(records) -> dict:
    """Microseconds per op kind (module docstring, part c) and the heaviest kernels of each. A GEMM
    outside the decoder layers (the LM head, a fused linear cross-entropy) counts as loss/lm head."""
    fwd_module = {}  # forward op's sequence number -> (module class, path) it ran in
    for _, _, ch in records:
        module = _module_of(ch)
        for n, seq in ch:
            if n.startswith("aten::") and seq is not None and seq >= 0 and module[0] and seq not in fwd_module:
                fwd_module[seq] = module
    totals, names = defaultdict(float), defaultdict(lambda: defaultdict(float))
    for kname, us, ch in records:
        kind = kind_of_name(kname)
        node = next(((n, s) for n, s in ch if n.startswith("autograd::engine::evaluate_function: ")), None)
        nname = node[0].split(": ", 1)[1] if node is not None else ""
        if node is not None:  # the node's own event (its name bare) carries its forward op's sequence number
            seq = next((q for n, q in ch if n == nname and q is not None and q >= 0), node[1])
            cls, path = fwd_module.get(seq, (None, ""))
        else:
            cls, path = _module_of(ch)
        if kind is None:
            aten = next((n for n, _ in ch if n.startswith("aten::")), "")
            # backward: the node's own name, else its forward op's module; forward: the op, the module
            kind = kind_of_name(nname) or kind_of_name(aten) or kind_of_module(cls)
        if kind == "gemm" and not _in_layers(path):
            kind = "loss/lm head"
        totals[kind] += us
        names[kind][kname[:90]] += us
    return {"us": {k: totals.get(k, 0.0) for k in KINDS},
            "top": {k: sorted(v.items(), key=lambda kv: -kv[1])[:4] for k, v in names.items()}}


def kernel_times(model, ids, cuda: bool) -> dict:
    from torch.profiler import ProfilerActivity, profile

    step = training_step(model, ids)
    stack = ModuleStack(model, ranges=True)
    try:
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
        with profile(activities=acts) as prof:
            step()
            if cuda:
                torch.cuda.synchronize()
    finally:
        stack.remove()
    return group_kernels(_kernel_records(prof, cuda))


def host_and_gpu_ms(model, ids, reps: int) -> dict:
    step = training_step(model, ids)
    host, gpu = [], []
    for _ in range(reps):
        torch.cuda.synchronize()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0 = time.perf_counter()
        s.record()
        step()
        e.record()
        host.append((time.perf_counter() - t0) * 1e3)
        e.synchronize()
        gpu.append(s.elapsed_time(e))
    return {"host_ms": host, "gpu_ms": gpu}


# ------------------------------------------------------------------------------------------------
# The run
# ------------------------------------------------------------------------------------------------


def run_shape(name, variants, parts, device, layers, tiny, reps, warmup, tokens=None, vocab=None) -> list[dict]:
    cuda = device.type == "cuda"
    arms = Arms(name, variants, device, layers, tiny, vocab)
    cfg = next(iter(arms.models.values())).config
    batch, seq = tokens or (TINY_BATCH if tiny else BATCH[name]["default"])
    torch.manual_seed(1)
    ids = torch.randint(0, cfg.vocab_size, (batch, seq)).to(device)
    rows = {v: dict(model=name, variant=v, batch=batch, seq=seq, layers=cfg.num_hidden_layers,
                    hidden=cfg.hidden_size) for v in variants}
    for v in variants:  # warm-up (Triton compiles), then a, b, c once per variant
        model, leave = arms.enter(v)
        try:
            if cuda or "d" in parts:
                for _ in range(warmup):
                    training_step(model, ids)()
            if "a" in parts:
                before = torch.cuda.memory_allocated() if cuda else 0
                saved = saved_tensors(model, ids)
                if cuda:  # what part a left allocated: 0 unless something still holds its graph
                    saved["left_allocated_gib"] = (torch.cuda.memory_allocated() - before) / 2**30
                saved["per_element"] = per_element(saved, batch * seq, cfg.hidden_size, cfg.num_hidden_layers)
                rows[v]["saved"] = saved
            if "b" in parts and cuda:
                rows[v]["peaks"] = peaks(model, ids)
            if "c" in parts:
                rows[v]["kernels"] = kernel_times(model, ids, cuda)
        finally:
            leave()
        print(f"{name} {v}: " + ", ".join(k for k in ("saved", "peaks", "kernels") if k in rows[v]), flush=True)
    if "d" in parts and cuda:
        timing = {v: {"host_ms": [], "gpu_ms": []} for v in variants}
        for order in (list(variants), list(reversed(variants))):
            for v in order:
                model, leave = arms.enter(v)
                try:
                    t = host_and_gpu_ms(model, ids, reps)
                finally:
                    leave()
                for k in t:
                    timing[v][k] += t[k]
        for v in variants:
            t = timing[v]
            rows[v]["time"] = dict(t, host_ms_median=statistics.median(t["host_ms"]),
                                   gpu_ms_median=statistics.median(t["gpu_ms"]),
                                   tok_s=batch * seq / (statistics.median(t["gpu_ms"]) * 1e-3))
    del arms
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
    return list(rows.values())


def markdown(payload: dict) -> str:
    a = payload["args"]
    lines = [f"# Training-step breakdown ({payload['env'].get('gpu') or a['device']})\n", env_markdown(payload["env"]),
             f"Command: `{payload['command']}`. " + (
                 f"Models built with {a['layers']} decoder layers: per-layer saved bytes scale to the full depth "
                 "(every layer but the first saves the same set); totals, peaks and times do not (the LM head and "
                 "the loss stay full size).\n" if a["layers"] else "Full depth.\n")]
    rows = payload["results"]
    if any("saved" in r for r in rows):
        lines += ["## Saved for backward: bytes per token, layer and hidden element\n",
                  "Storage bytes, deduplicated, parameters excluded; `last layer` is one layer past the first "
                  "(what every layer but layer 0 saves). Op kinds of the last layer:\n",
                  "| model | variant | all layers | last layer | " + " | ".join(KINDS) + " | outside layers MiB |",
                  "|---|---|---|---|" + "---|" * len(KINDS) + "---|"]
        for r in rows:
            if "saved" not in r:
                continue
            pe = r["saved"]["per_element"]
            by = pe["last_layer_by_kind"]
            lines.append(f"| {r['model']} | {r['variant']} | {pe['all_layers']:.3f} | {pe['last_layer']:.3f} | "
                         + " | ".join(f"{by[k]:.3f}" if k in by else "" for k in KINDS)
                         + f" | {pe['outside_layers_bytes'] / 2**20:.1f} |")
        lines += ["", "### What the last layer saves, tensor by tensor (bytes per token and hidden element)\n",
                  "| model | variant | module | autograd node | dtype | shape | tensors | bytes/token/hidden |",
                  "|---|---|---|---|---|---|---|---|"]
        for r in rows:
            if "saved" not in r:
                continue
            scale = r["batch"] * r["seq"] * r["hidden"]
            for g in r["saved"]["groups"]:
                if g["where"] == "last layer":
                    lines.append(f"| {r['model']} | {r['variant']} | {g['module_class']} | {g['node']} | {g['dtype']} "
                                 f"| {g['shape']} | {g['count']} | {g['bytes'] / scale:.3f} |")
        lines.append("")
    if any("peaks" in r for r in rows):
        lines += ["## Allocator peaks (GiB, max_memory_allocated, reset between phases)\n",
                  "| model | variant | start | forward peak | held after forward | backward peak | step peak |",
                  "|---|---|---|---|---|---|---|"]
        for r in rows:
            if "peaks" in r:
                p = r["peaks"]
                lines.append(f"| {r['model']} | {r['variant']} | {p['start_gib']:.2f} | {p['forward_peak_gib']:.2f} | "
                             f"{p['held_after_forward_gib']:.2f} | {p['backward_peak_gib']:.2f} | {p['step_peak_gib']:.2f} |")
        lines.append("")
    if any("kernels" in r for r in rows):
        unit = "kernel ms, one profiled step" if a["device"] == "cuda" else "CPU ms of leaf aten ops (grouping check only)"
        lines += [f"## Time per op kind ({unit})\n", "| model | variant | " + " | ".join(KINDS) + " | total |",
                  "|---|---|" + "---|" * len(KINDS) + "---|"]
        for r in rows:
            if "kernels" in r:
                us = r["kernels"]["us"]
                lines.append(f"| {r['model']} | {r['variant']} | " + " | ".join(f"{us[k] / 1e3:.2f}" for k in KINDS)
                             + f" | {sum(us.values()) / 1e3:.2f} |")
        lines.append("")
    if any("time" in r for r in rows):
        lines += ["## Host and GPU time per step (ms, median of both alternating passes)\n",
                  "| model | variant | GPU ms | host ms | tok/s |", "|---|---|---|---|---|"]
        for r in rows:
            if "time" in r:
                t = r["time"]
                lines.append(f"| {r['model']} | {r['variant']} | {t['gpu_ms_median']:.1f} | {t['host_ms_median']:.1f} "
                             f"| {t['tok_s']:.0f} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    import sys

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    # the Qwen shapes (each has a TINY entry); the breakdown's variants include rla over Liger, which Gemma refuses
    ap.add_argument("--models", nargs="*", default=list(TINY), choices=list(TINY))
    ap.add_argument("--variants", nargs="*", default=list(VARIANTS), choices=list(VARIANTS))
    ap.add_argument("--parts", default="abcd", help="any of a (saved), b (peaks), c (kernels), d (host time)")
    ap.add_argument("--layers", type=int, default=None, help="decoder layers per model (default: the model's)")
    ap.add_argument("--shape", choices=("bench", "tiny"), default="bench")
    ap.add_argument("--tokens", nargs=2, type=int, metavar=("BATCH", "SEQ"), default=None,
                    help="batch and sequence length (default: the bench's, or 2 x 256 for --shape tiny)")
    ap.add_argument("--vocab", type=int, default=None, help="vocabulary size (default: the model's)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--reps", type=int, default=2, help="timed steps per variant and pass (part d)")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    bad = set(a.parts) - set("abcd")
    if bad or not a.parts:
        ap.error(f"--parts takes letters of 'abcd', got {a.parts!r}")
    device = torch.device(a.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: no CUDA device here (use --device cpu --parts a for the saved bytes)")
    if any(v.startswith("liger") or "liger" in v for v in a.variants):
        importlib.import_module("liger_kernel")  # fails here, before any model is built
    payload = {"env": environment(), "command": "python lab/bench/e2e_breakdown.py " + " ".join(sys.argv[1:]
               if argv is None else argv), "args": vars(a)}
    run_shapes(payload, a.models, lambda name: run_shape(name, a.variants, a.parts, device, a.layers, a.shape == "tiny",
                                                        a.reps, a.warmup, a.tokens, a.vocab),
               Path(a.out), "e2e_breakdown", markdown)
    return 0


def run_shapes(payload: dict, names, run_one, out: Path, stem: str, render) -> dict:
    """``payload["results"]`` += ``run_one(name)`` for each shape, the results (JSON and ``render(payload)``)
    written after every shape, so a run cut short keeps the shapes it finished; prints the last render."""
    results, t0 = payload.setdefault("results", []), time.perf_counter()
    for name in names:
        results += run_one(name)
        payload["seconds"] = time.perf_counter() - t0
        write_results(out, stem, payload, render(payload))
        print(f"{name} done at {payload['seconds']:.0f} s", flush=True)
    print(render(payload))
    return payload


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
