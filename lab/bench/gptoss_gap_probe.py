"""Where GPT-OSS's eager twin and ``rla.align(model, "vllm-0.33-eager")`` part, stage by stage (one device call).

The H200 run of ``lab/bench/twin_families.py`` found ``gptoss-h2880`` in eager mode 10-15% bit-equal in the
logits and 35-54% at the second layer's input, the other families 100%
(results/benchmarks/twin_families_h200_2026-12-03/). This probe builds the same model
(``twin_families.configs`` / ``twin_families.build``: seed 0, 2 layers by default, random init), the twin
(``build_twin``, eager mode on CUDA, native mode on the CPU where vLLM's kernels do not exist) and the aligned
model (the row ``vllm-0.33-eager`` on CUDA; on the CPU the native row of
tests/engines/test_vllm_twin_families.py: ``hf`` with ``norm_residual='fp32_sum'``, no variants), runs one prompt
(twin_families' 1 x 512 ids at position 0) through both and reports, per layer, the fraction of bit-equal
elements at each stage both sides expose:

- the RoPE tables over every position: vLLM's fp32 YaRN cache (the twin's ``rope_module``, built on the
  device) against the aligned rotary's fp32 tables under ``rope_inv_freq`` host and device, fp32 and rounded
  to bf16 (the eager kernel reads the bf16 cache); and the YaRN ``inv_freq`` itself (vLLM's
  ``_compute_inv_freq`` on the device against HF's init function on host / device, ``compat.rope_init``);
- the input norm; q/k before RoPE; q/k after RoPE and v (as the attention function receives them:
  both sides call HF's ``eager_attention_forward``, wrapped for the run); the attention output before
  o_proj; o_proj's output; the residual after attention and the post-attention norm's output; the
  router's logits, top-k indices and weights (the HF router module, on both sides); the experts'
  gate_up and activation outputs (every expert call in order, concatenated); the MoE block output;
  the layer output; the logits;
- ``isolated:`` rows: one op of the aligned side on the twin's own inputs (RoPE on the twin's q/k with
  the aligned tables and with the twin's, the layer-0 add + norm on the twin's o_proj output and
  embeddings, the clamped SwiGLU on the twin's gate_up, the aligned MoE block on the twin's
  post-attention norm output), so a stage's own gap reads apart from what flows into it.

The twin is observed through its public attributes (``norm``, ``add_norm``, ``rope``, ``cache_for``,
``attend``, ``expert_act``, ``blocks[i].routed``), wrapped on the instance; the aligned model through
module hooks and, for the fused add + norm and the clamped SwiGLU (no module of their own), ``rla.ops``'
``add_rms_norm`` / ``swiglu_oai`` wrapped for the run. All restored afterwards.

CUDA with ``--library``: also vLLM's ``_C.silu_and_mul`` against ``rla.ops.swiglu`` (the row's ``per_op``
and ``fused``, rla's Triton kernel on CUDA) and the reference ops, and ``_C.swigluoai_and_mul`` against
``rla.ops.swiglu_oai``, on random bf16 8192 x 2*2880: fraction of bit-equal elements and of rows with a
difference. Skipped with a message on the CPU.

Usage (the lead's GPU call; PYTHONPATH=src:tests:lab/bench, transformers 5.24)::

    python lab/bench/gptoss_gap_probe.py --wheel <vllm-0.33 wheel> --library <_C_stable_libtorch.abi3.so.xz> \
        --out <dir> --device cuda

CPU self-check (every stage 100%): ``--device cpu`` (``--tokens``/``--scale``/``--layers`` shrink it).
``--profile NAME`` aligns under another row (the probe's table then says where that row parts from the twin).
Writes ``<out>/gptoss_gap_probe.json``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # twin_families and its configs, beside this file

NAME = "gptoss-h2880"
SEED_IDS = 1 * 7919  # + tokens: twin_families' 1 x S prompt (engine_twin_h200.twin_rows seeds b * 7919 + s)


def native_row():
    """The row vLLM's native ops run eagerly equal (tests/engines/test_vllm_twin_families.py's ``_native_row``
    without variants): HF's per-op rounding, the add + norm normalising the fp32 sum."""
    from rla import profiles

    return profiles.get("hf").replace(name="vllm-native-eager", norm_residual="fp32_sum", variants={},
                                      variant_evidence={})


class Streams:
    """stage -> layer -> tensors recorded in call order (a stage called more than once per layer, the
    experts, is concatenated along dim 0 when compared)."""

    def __init__(self):
        self.data: dict[str, dict[int, list[torch.Tensor]]] = {}

    def add(self, stage, layer, t):
        self.data.setdefault(stage, {}).setdefault(int(layer), []).append(t.detach().clone())

    def get(self, stage, layer):
        ts = self.data.get(stage, {}).get(layer)
        if not ts:
            return None
        return ts[0] if len(ts) == 1 else torch.cat([t.reshape(-1, t.shape[-1]) for t in ts])


class Probe:
    """The shared state of one run: which Streams record (None: nothing), the layer the attention last ran."""

    def __init__(self):
        self.cur: Streams | None = None
        self.layer = 0
        self.after_attend = None

    def add(self, stage, layer, t):
        if self.cur is not None:
            self.cur.add(stage, layer, t)


def equal(a, b) -> dict:
    if a is None or b is None:
        return {"equal": None, "note": "not recorded on " + ("the twin" if a is None else "the aligned side")}
    a, b = a.reshape(-1), b.reshape(-1)
    if a.numel() != b.numel():
        return {"equal": None, "note": f"sizes differ ({a.numel()} vs {b.numel()})"}
    note = "" if a.dtype == b.dtype else f"{b.dtype} cast to {a.dtype}"
    b = b.to(a.dtype)
    d = (a.double() - b.double()).abs()
    return {"equal": float((a == b).double().mean()), "max_abs": float(d.max()) if d.numel() else 0.0,
            "n": a.numel(), **({"note": note} if note else {})}


# -- instrumenting both sides --------------------------------------------------------------------------


def wrap_attention(probe):
    """HF GPT-OSS's module-level ``eager_attention_forward``, recording q/k/v and the output; installed before
    the twin (which reads the function at construction) and rla.align (whose attention forward copies the
    module's globals) are built, so both call it. Returns the restore function."""
    from transformers.models.gpt_oss import modeling_gpt_oss as m

    original = m.eager_attention_forward

    def recorded(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
        i = module.layer_idx
        probe.layer, probe.after_attend = i, 0
        probe.add("q_rot", i, query)
        probe.add("k_rot", i, key)
        probe.add("v", i, value)
        out, weights = original(module, query, key, value, attention_mask, scaling, dropout=dropout, **kwargs)
        probe.add("attn_out", i, out)
        return out, weights

    m.eager_attention_forward = recorded
    return lambda: setattr(m, "eager_attention_forward", original)


def router_hooks(model, probe):
    hooks = []
    for i, layer in enumerate(model.model.layers):
        def hook(mod, args, out, i=i):
            probe.add("router_logits", i, out[0])
            probe.add("router_weights", i, out[1])
            probe.add("router_topk_indices", i, out[2])
        hooks.append(layer.mlp.router.register_forward_hook(hook))
    return hooks


def instrument_twin(twin, probe, n_layers):
    norm, add_norm, rope, cache_for, act = twin.norm, twin.add_norm, twin.rope, twin.cache_for, twin.expert_act
    calls = {"rope": 0}

    def t_norm(x, w, eps):
        out = norm(x, w, eps)
        probe.add("input_norm", 0, out)
        return out

    def t_add_norm(x, r, w, eps):
        out, res = add_norm(x, r, w, eps)
        if probe.after_attend == 0:  # after layer L's attention: o_proj output + residual -> post-attention norm
            probe.add("o_proj", probe.layer, x)
            probe.add("attn_residual", probe.layer, res)
            probe.add("post_norm", probe.layer, out)
            probe.after_attend = 1
        elif probe.after_attend == 1 and probe.layer + 1 < n_layers:  # the next layer's input add + norm
            probe.add("input_norm", probe.layer + 1, out)
            probe.after_attend = 2
        return out, res

    def t_rope(pos, q, k, d, cache):
        i = calls["rope"]
        calls["rope"] += 1
        probe.add("q_proj", i, q)
        probe.add("k_proj", i, k)
        return rope(pos, q, k, d, cache)

    def t_cache_for(w, query):
        cache = cache_for(w, query)
        probe.add("rope_cache", calls["rope"], cache)
        return cache

    def t_act(x):
        out = act(x)
        probe.add("experts_gate_up", probe.layer, x)
        probe.add("experts_act", probe.layer, out)
        return out

    twin.norm, twin.add_norm, twin.rope, twin.cache_for, twin.expert_act = t_norm, t_add_norm, t_rope, t_cache_for, t_act
    for i, block in enumerate(twin.blocks):
        def routed(x, f=block.routed, i=i):
            out = f(x)
            probe.add("moe_out", i, out)
            return out
        block.routed = routed


def aligned_hooks(model, probe):
    """Module hooks of the aligned model, and the two ``rla.ops`` functions wrapped -> a restore function."""
    from rla import ops

    hooks = router_hooks(model, probe)
    hidden = model.config.hidden_size
    for i, layer in enumerate(model.model.layers):
        a = layer.self_attn
        hooks += [
            layer.input_layernorm.register_forward_hook(lambda m, args, o, i=i: probe.add("input_norm", i, o)),
            a.q_proj.register_forward_hook(lambda m, args, o, i=i: probe.add("q_proj", i, o)),
            a.k_proj.register_forward_hook(lambda m, args, o, i=i: probe.add("k_proj", i, o)),
            a.o_proj.register_forward_hook(lambda m, args, o, i=i: probe.add("o_proj", i, o)),
            layer.mlp.register_forward_pre_hook(lambda m, args, i=i: probe.add("post_norm", i, args[0])),
            layer.mlp.register_forward_hook(lambda m, args, o, i=i: probe.add("moe_out", i, o[0].reshape(-1, hidden))),
            layer.register_forward_hook(
                lambda m, args, o, i=i: probe.add("layer_out", i, (o[0] if isinstance(o, tuple) else o).to(torch.bfloat16))),
        ]
    add_rms_norm, swiglu_oai = ops.add_rms_norm, ops.swiglu_oai

    def r_add_rms_norm(*args, **kwargs):
        out = add_rms_norm(*args, **kwargs)
        if isinstance(out, tuple) and probe.after_attend == 0:
            probe.add("attn_residual", probe.layer, out[1])
            probe.after_attend = 1
        return out

    def r_swiglu_oai(gate, up, *args, **kwargs):
        out = swiglu_oai(gate, up, *args, **kwargs)
        probe.add("experts_gate_up", probe.layer, torch.stack((gate, up), -1).flatten(-2))  # interleaved again
        probe.add("experts_act", probe.layer, out)
        return out

    ops.add_rms_norm, ops.swiglu_oai = r_add_rms_norm, r_swiglu_oai

    def restore():
        ops.add_rms_norm, ops.swiglu_oai = add_rms_norm, swiglu_oai
        for h in hooks:
            h.remove()

    return restore


# -- the stages --------------------------------------------------------------------------------------


def family_profile(prof):
    return prof.variant("gpt_oss") if prof.variants else prof


def table_rows(model, twin, cache32, prof, device) -> list[dict]:
    """vLLM's fp32 YaRN cache ``cache32`` (taken before the twin's first forward: ``_match_cos_sin_cache_dtype``
    keeps the cast cache in place of it) and inv_freq against the aligned rotary's, every position,
    rope_inv_freq host and device."""
    import rla
    from rla.alignment import compat

    rows = []
    P = cache32.shape[0]
    try:  # vLLM's own frequencies, evaluated on the device as its cache was
        with torch.device(device):
            vinv = twin.rope_module._compute_inv_freq(twin.rope_module.scaling_factor).float()
    except Exception as e:  # noqa: BLE001 (a report line, not a failure)
        vinv, note = None, f"vLLM's _compute_inv_freq not callable: {type(e).__name__}: {e}"
    rotary = model.model.rotary_emb
    for where in ("host", "device"):
        hinv = compat.rope_init(rotary, device if where == "device" else "cpu")[0].float().to(device)
        rows.append({"stage": f"tables: inv_freq, HF on {where}", "layer": None,
                     **(equal(vinv, hinv) if vinv is not None else {"equal": None, "note": note})})
        p = prof.replace(name=f"{prof.name}+inv_freq={where}", rope_inv_freq=where)
        rla.align(model, p)
        try:
            with torch.no_grad():
                cos, sin = rotary(torch.zeros(1, device=device, dtype=torch.bfloat16), torch.arange(P, device=device)[None])
        finally:
            rla.unalign(model)
        ours = torch.cat((cos[0], sin[0]), dim=-1).float()
        mark = " (the row's)" if where == prof.rope_inv_freq else ""
        rows.append({"stage": f"tables: cos/sin fp32, inv_freq on {where}{mark}", "layer": None, **equal(cache32, ours)})
        rows.append({"stage": f"tables: cos/sin bf16, inv_freq on {where}{mark}", "layer": None,
                     **equal(cache32.to(torch.bfloat16), ours.to(torch.bfloat16))})
    return rows


STAGES = ("input_norm", "q_proj", "k_proj", "q_rot", "k_rot", "v", "attn_out", "o_proj", "attn_residual", "post_norm",
          "router_logits", "router_topk_indices", "router_weights", "experts_gate_up", "experts_act", "moe_out",
          "layer_out")


def isolated_rows(model, twin, tw: Streams, prof, ids, positions, probe) -> list[dict]:
    """One aligned op on the twin's own inputs, per layer."""
    from rla import ops

    fam = family_profile(prof)
    cfg = model.config
    s, hd = ids.shape[1], twin.head_dim
    rows = []
    ex = model.model.layers[0].mlp.experts
    probe.cur = None  # the aligned modules below record nothing
    with torch.no_grad():
        for i in range(len(model.model.layers)):
            q, k = tw.get("q_proj", i), tw.get("k_proj", i)
            if q is not None and tw.get("q_rot", i) is not None:
                qh = q.view(1, s, -1, hd).transpose(1, 2)
                kh = k.view(1, s, -1, hd).transpose(1, 2)
                cos, sin = model.model.rotary_emb(qh, positions)  # the aligned fp32 half tables
                cache = tw.get("rope_cache", i)[positions[0]].float()
                for label, (c, sn) in (("aligned tables", (cos, sin)),
                                       ("twin's bf16 cache", (cache[None, :, : hd // 2], cache[None, :, hd // 2:]))):
                    qo, ko = ops.rope(qh, kh, c, sn, fam)
                    rows.append({"stage": f"isolated: rope(twin q, {label})", "layer": i, **equal(tw.get("q_rot", i), qo)})
                    rows.append({"stage": f"isolated: rope(twin k, {label})", "layer": i, **equal(tw.get("k_rot", i), ko)})
            gu = tw.get("experts_gate_up", i)
            if gu is not None:
                out = ops.swiglu_oai(gu[..., ::2], gu[..., 1::2], ex.alpha, ex.limit, fam)
                rows.append({"stage": "isolated: swiglu_oai(twin gate_up)", "layer": i, **equal(tw.get("experts_act", i), out)})
            h = tw.get("post_norm", i)
            if h is not None:
                out = model.model.layers[i].mlp(h.view(1, s, -1))[0].reshape(-1, cfg.hidden_size)
                rows.append({"stage": "isolated: aligned MoE block(twin post_norm)", "layer": i,
                             **equal(tw.get("moe_out", i), out)})
        o = tw.get("o_proj", 0)
        if o is not None:
            layer = model.model.layers[0]
            emb = torch.nn.functional.embedding(ids.reshape(-1), model.model.embed_tokens.weight)
            norm = layer.post_attention_layernorm
            h, r = ops.add_rms_norm(o, emb, norm.weight, norm.variance_epsilon, fam)
            rows.append({"stage": "isolated: add_rms_norm(twin o_proj, embeddings) out", "layer": 0,
                         **equal(tw.get("post_norm", 0), h)})
            rows.append({"stage": "isolated: add_rms_norm(twin o_proj, embeddings) residual", "layer": 0,
                         **equal(tw.get("attn_residual", 0), r)})
    return rows


def kernel_rows(engine, library, device) -> list[dict]:
    """vLLM's CUDA activations against rla's on random bf16 8192 x 2*2880."""
    from rla import ops, profiles
    from rla.ops import reference

    if device != "cuda" or library is None:
        print("kernels: skipped (vLLM's _C kernels need CUDA and --library)", flush=True)
        return [{"stage": "kernels", "equal": None, "note": "skipped: needs CUDA and --library"}]
    k = engine.c_ops(library)
    eager = profiles.get("vllm-0.33-eager")
    g0 = torch.Generator(device=device).manual_seed(0)
    rows = []

    def row(name, ref, out):
        e = equal(ref, out)
        e["rows_with_diff"] = float((ref != out).any(-1).double().mean())
        rows.append({"stage": name, "layer": None, **e})

    for scale in (1.0, 3.0):
        g = (scale * torch.randn(8192, 2880, device=device, generator=g0)).to(torch.bfloat16)
        u = (scale * torch.randn(8192, 2880, device=device, generator=g0)).to(torch.bfloat16)
        kern = k.silu_and_mul(torch.cat((g, u), -1))
        for point in ("per_op", "fused"):
            p = eager.replace(name=f"vllm-0.33-eager+swiglu={point}", swiglu=point)
            row(f"kernels x{scale}: _C.silu_and_mul vs rla.ops.swiglu ({point}, Triton)", kern, ops.swiglu(g, u, p))
            row(f"kernels x{scale}: _C.silu_and_mul vs reference.swiglu ({point})", kern, reference.swiglu(g, u, p))
        x = torch.stack((g, u), -1).flatten(-2)  # interleaved gate/up
        fam = eager.variant("gpt_oss")
        kern = k.swigluoai_and_mul(x, 1.702, 7.0)
        for order in ("sigmoid", "quotient"):  # the oai_glu point's two fp32 orders (the row's: quotient)
            p = dataclasses.replace(fam, name=f"{fam.name}+oai_glu={order}", oai_glu=order)
            row(f"kernels x{scale}: _C.swigluoai_and_mul vs rla.ops.swiglu_oai ({fam.swiglu}, oai_glu={order}, Triton)",
                kern, ops.swiglu_oai(g, u, 1.702, 7.0, p))
            row(f"kernels x{scale}: _C.swigluoai_and_mul vs reference.swiglu_oai ({fam.swiglu}, oai_glu={order})",
                kern, reference.swiglu_oai(g, u, 1.702, 7.0, p))
    return rows


# -- the run --------------------------------------------------------------------------------------------


def probe_rows(engine, library, device, layers, tokens, scale, profile=None) -> list[dict]:
    import rla
    import twin_families
    from rla import profiles
    from rla.engines.vllm_twin_families import build_twin

    mode = "eager" if device == "cuda" else "native"
    prof = profiles.get(profile) if profile else profiles.get("vllm-0.33-eager") if mode == "eager" else native_row()
    print(f"{NAME}: {layers} layers, {tokens} tokens, scale {scale}, twin mode {mode}, row {prof.name}", flush=True)
    t0 = time.time()
    model = twin_families.build(NAME, twin_families.configs(layers, scale)[NAME], device)
    print(f"  model built ({time.time() - t0:.1f}s)", flush=True)
    g = torch.Generator().manual_seed(SEED_IDS + tokens)
    ids = torch.randint(0, model.config.vocab_size, (1, tokens), generator=g).to(device)
    positions = torch.arange(tokens, device=device)[None]
    probe = Probe()
    restore_attention = wrap_attention(probe)
    try:
        twin = build_twin(model, engine, mode, library)
        cache32 = twin.rope_module.cos_sin_cache.clone()  # fp32 [P, D], built on the device
        instrument_twin(twin, probe, layers)
        tw, al = Streams(), Streams()
        hooks = router_hooks(model, probe)
        probe.cur = tw
        try:
            out = twin(ids, positions)
        finally:
            for h in hooks:
                h.remove()
        for i, stream in enumerate(out.layers):
            tw.add("layer_out", i, stream)
        print(f"  twin ran ({time.time() - t0:.1f}s)", flush=True)
        rows = table_rows(model, twin, cache32, prof, device)
        rla.align(model, prof)
        restore = aligned_hooks(model, probe)
        try:
            probe.cur, probe.layer, probe.after_attend = al, 0, None
            with torch.no_grad():
                logits = model(input_ids=ids, position_ids=positions).logits
            print(f"  aligned ran ({time.time() - t0:.1f}s)", flush=True)
            for i in range(layers):
                rows += [{"stage": st, "layer": i, **equal(tw.get(st, i), al.get(st, i))} for st in STAGES]
            rows.append({"stage": "logits", "layer": None, **equal(out.logits, logits)})
            rows += isolated_rows(model, twin, tw, prof, ids, positions, probe)
        finally:
            restore()
            rla.unalign(model)
    finally:
        restore_attention()
    print(f"  compared ({time.time() - t0:.1f}s)", flush=True)
    return rows, {"mode": mode, "profile": prof.name}


def table(rows) -> str:
    lines = [f"{'stage':62s} {'layer':>5s} {'bit-equal':>10s} {'max |d|':>10s}  note"]
    for r in rows:
        eq = "n/a" if r.get("equal") is None else f"{r['equal']:.4%}"
        mx = "" if r.get("max_abs") is None else f"{r['max_abs']:.3g}"
        layer = "" if r.get("layer") is None else str(r["layer"])
        extra = r.get("note", "")
        if "rows_with_diff" in r:
            extra = f"rows with a difference {r['rows_with_diff']:.2%} {extra}"
        lines.append(f"{r['stage']:62s} {layer:>5s} {eq:>10s} {mx:>10s}  {extra}")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--wheel", required=True)
    ap.add_argument("--library", default=None)
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--scale", type=float, default=1.0, help="twin_families.configs' width scale (CPU smoke runs)")
    ap.add_argument("--profile", default=None,
                    help="the aligned side's row (default: vllm-0.33-eager on CUDA, the native row on the CPU)")
    args = ap.parse_args(argv)
    import transformers
    from rla.engines import vllm

    t0 = time.time()
    engine = vllm.load(args.wheel)
    rows, meta = probe_rows(engine, args.library, args.device, args.layers, args.tokens, args.scale, args.profile)
    rows += kernel_rows(engine, args.library, args.device)
    print(table(rows), flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stamp = {"device": torch.cuda.get_device_name() if args.device == "cuda" else f"cpu ({platform.processor()})",
             "torch": torch.__version__, "transformers": transformers.__version__, "python": platform.python_version(),
             "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "command": " ".join(sys.argv),
             "seconds": round(time.time() - t0, 1)}
    path = out / "gptoss_gap_probe.json"
    path.write_text(json.dumps({"environment": stamp, "model": NAME, "layers": args.layers, "tokens": args.tokens,
                                "scale": args.scale, **meta, "provenance": engine.provenance, "rows": rows}, indent=2))
    print(f"wrote {path} ({time.time() - t0:.1f}s)", flush=True)
    return rows


if __name__ == "__main__":
    main()
