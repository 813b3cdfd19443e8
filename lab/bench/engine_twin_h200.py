"""GPU evidence for the engine twin, the RoPE tables and the kernels' arithmetic order.

Stages (``--stages``):

- ``tables``: ``rla.align``'s rotary tables (``rope_inv_freq`` device and host) against vLLM's own
  cos/sin cache built on the GPU, every position, Qwen2 (theta 1e6, 32k) and Llama-3.1 (llama3
  scaling, 131k): fraction of equal fp32 and bf16 entries.
- ``order``: per op and shape, the fraction of bit-equal outputs between rla's reference, rla's
  fused Triton kernels, vLLM's native op compiled by Inductor and vLLM's CUDA kernel.
- ``twin``: realistic-width random-init Qwen2 (QKV bias), Qwen3 (q/k norms), Llama-3.1 (llama3
  scaling) and the bundled trained tiny Qwen2, against the vLLM twin in ``--modes``; sides: HF
  eager, aligned with rla's fused kernels, aligned with rla's reference ops, and (eager mode)
  aligned with vLLM's own kernels forward (``rla.engines.backed``); (default mode) the
  engine-backed forward of the twin's compiled pieces (``rla.engines.vllm_forward``).
- ``families``: the twin of Gemma 3 and Gemma 4 (hidden 2560), GLM-4 MoE (2048), GPT-OSS (2880), Qwen3.5 dense
  and Qwen3.5 MoE (2048), 4 layers, in ``--modes``, against HF eager, the aligned model and the oracles of the chains
  the CPU twin found (``lab/bench/twin_families.py``; ``--only`` picks among its models). Needs the tests' oracles
  on the path (``PYTHONPATH=src:tests``) and, in both modes, the kernel library (the MoE twins run
  vLLM's CUDA activation for the routed experts, as its fused MoE does).

Writes one JSON per stage into ``--out`` (``families``: ``twin_families.json``). Needs CUDA, the vLLM files (``--wheel``) and, for eager
mode and ``order``, vLLM's kernel library (``--library``).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import torch
import transformers

from rla import profiles
from rla.engines.twin_compare import aligned_side, compare, hf_side
from rla.engines import vllm
from rla.ops import fused, reference

BF16 = torch.bfloat16
DEV = "cuda"
LAYERS, SCALE = 4, 1.0
ONLY: list = []


def stamp(args) -> dict:
    try:
        import triton
    except ImportError:
        triton = type("none", (), {"__version__": None})
    return {
        "gpu": torch.cuda.get_device_name() if DEV == "cuda" else f"none (cpu: {platform.processor()})", "torch": torch.__version__, "triton": triton.__version__,
        "transformers": transformers.__version__, "python": platform.python_version(),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "command": " ".join(sys.argv),
    }


def configs() -> dict:
    common = dict(vocab_size=32000, num_hidden_layers=LAYERS, rms_norm_eps=1e-6, tie_word_embeddings=False)
    w = lambda n: max(128, int(n * SCALE) // 128 * 128)
    return {
        "qwen2-h1536": transformers.Qwen2Config(
            hidden_size=w(1536), intermediate_size=w(8960), num_attention_heads=w(1536) // 128, num_key_value_heads=2 if SCALE == 1 else 1,
            max_position_embeddings=32768, rope_parameters={"rope_type": "default", "rope_theta": 1e6}, **common),
        "qwen3-h2048": transformers.Qwen3Config(
            hidden_size=w(2048), intermediate_size=w(6144), num_attention_heads=w(2048) // 128, num_key_value_heads=8 if SCALE == 1 else 1, head_dim=128,
            max_position_embeddings=40960, rope_parameters={"rope_type": "default", "rope_theta": 1e6}, **common),
        "llama31-h2048": transformers.LlamaConfig(
            hidden_size=w(2048), intermediate_size=w(8192), num_attention_heads=w(2048) // 128, num_key_value_heads=8 if SCALE == 1 else 1,
            max_position_embeddings=131072,
            rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                             "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}, **common),
    }


def random_model(cfg, seed=0, attention="sdpa", model_class=None):
    """A random-init bf16 model of ``cfg`` (``model_class``: a transformers class name to build instead of
    what AutoModelForCausalLM builds, e.g. a multimodal checkpoint's own class)."""
    torch.manual_seed(seed)
    build = transformers.AutoModelForCausalLM.from_config if model_class is None else getattr(transformers, model_class)._from_config
    model = build(cfg, dtype=BF16, attn_implementation=attention).to(DEV).eval()
    g = torch.Generator(device=DEV).manual_seed(seed + 1)
    with torch.no_grad():  # HF initialises norm weights to 1, where per_op and fused coincide
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.2 * torch.randn(p.shape, generator=g, device=DEV))
    return model


def stage_tables(engine, out):
    rows = []
    for name in ("qwen2-h1536", "llama31-h2048"):
        cfg = configs()[name]
        cfg.num_hidden_layers = 1
        model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=BF16).to(DEV).eval()
        rp = cfg.rope_parameters
        scaling = None if rp["rope_type"] == "default" else rp
        P = cfg.max_position_embeddings
        eng32 = engine.cos_sin_cache(128, 128, P, rp["rope_theta"], scaling, dtype=torch.float32, device=DEV)
        eng16 = engine.cos_sin_cache(128, 128, P, rp["rope_theta"], scaling, dtype=BF16, device=DEV)
        positions = torch.arange(P, device=DEV)[None]
        import rla
        for where in ("device", "host"):
            p = profiles.get("vllm-0.33").replace(name=f"vllm-0.33-{where}", rope_inv_freq=where)
            rla.align(model, p)
            cos, sin = model.model.rotary_emb(torch.zeros(1, device=DEV, dtype=BF16), positions)
            rla.unalign(model)
            ours32 = torch.cat((cos[0], sin[0]), dim=-1)
            rows.append({
                "model": name, "positions": P, "rope_inv_freq": where,
                "fp32_equal": float((ours32 == eng32).double().mean()),
                "bf16_equal": float((ours32.to(BF16) == eng16).double().mean()),
                "bf16_max_abs": float((ours32.to(BF16).float() - eng16.float()).abs().max()),
            })
            print(rows[-1], flush=True)
    out.write_text(json.dumps({"environment": STAMP, "rows": rows}, indent=2))


def stage_order(engine, kernels, out):
    """Fraction of bit-equal outputs between implementations of the same profile point."""
    torch.manual_seed(0)
    torch._dynamo.config.recompile_limit = 64  # one compiled native op per probe shape
    compiled = {
        "norm": torch.compile(engine.rms_norm_native, fullgraph=True, dynamic=False),
        "add_norm": torch.compile(engine.fused_add_rms_norm_native, fullgraph=True, dynamic=False),
        "silu_mul": torch.compile(engine.silu_and_mul_native, fullgraph=True, dynamic=False),
    }
    dflt, eager = profiles.get("vllm-0.33"), profiles.get("vllm-0.33-eager")
    rows = []
    eq = lambda a, b: float((a == b).double().mean())
    unpinned = eager.replace(name="vllm-0.33-eager-unpinned", norm_reduction="unpinned")
    for rows_n, n in ((4096, 1536), (17, 1536), (4096, 2048), (4096, 3584), (64, 3584), (4096, 4096),
                      (1024, 5120), (65536, 128), (1269, 92)):
        x = torch.randn(rows_n, n, device=DEV).to(BF16)
        r = torch.randn(rows_n, n, device=DEV).to(BF16)
        w = (1 + 0.2 * torch.randn(n, device=DEV)).to(BF16)
        ref_d = reference.rms_norm(x, w, 1e-6, dflt)
        ref_e = reference.rms_norm(x, w, 1e-6, eager)
        tri = fused.rms_norm(x, w, 1e-6, dflt)
        ind = compiled["norm"](x, w, 1e-6)
        row = {"op": "rms_norm", "shape": [rows_n, n],
               "reference_vs_inductor": eq(ref_d, ind), "triton_vs_inductor": eq(tri, ind), "reference_vs_triton": eq(ref_d, tri)}
        if kernels is not None:
            k = kernels.rms_norm(x, w, 1e-6)
            row.update({"reference_vs_vllm_kernel": eq(ref_e, k), "triton_vs_vllm_kernel": eq(fused.rms_norm(x, w, 1e-6, eager), k),
                        "triton_unpinned_vs_vllm_kernel": eq(fused.rms_norm(x, w, 1e-6, unpinned), k)})
        rows.append(row)
        a_ref = reference.add_rms_norm(x, r, w, 1e-6, dflt)[0]
        a_tri = fused.add_rms_norm(x, r, w, 1e-6, dflt)[0]
        a_ind = compiled["add_norm"](x, r, w, 1e-6)[0]
        row = {"op": "add_rms_norm", "shape": [rows_n, n],
               "reference_vs_inductor": eq(a_ref, a_ind), "triton_vs_inductor": eq(a_tri, a_ind), "reference_vs_triton": eq(a_ref, a_tri)}
        if kernels is not None:
            k = kernels.fused_add_rms_norm(x, r, w, 1e-6)[0]
            row.update({"reference_vs_vllm_kernel": eq(reference.add_rms_norm(x, r, w, 1e-6, eager)[0], k),
                        "triton_vs_vllm_kernel": eq(fused.add_rms_norm(x, r, w, 1e-6, eager)[0], k),
                        "triton_unpinned_vs_vllm_kernel": eq(fused.add_rms_norm(x, r, w, 1e-6, unpinned)[0], k),
                        "triton_after_add_vs_vllm_kernel_zero_residual": eq(
                            fused.rms_norm(x, w, 1e-6, eager, after_add=True),
                            kernels.fused_add_rms_norm(x, torch.zeros_like(x), w, 1e-6)[0])})
        rows.append(row)
        print(rows[-2], rows[-1], flush=True)
    for rows_n, n in ((4096, 8960), (4096, 18944)):
        g = torch.randn(rows_n, n, device=DEV).to(BF16)
        u = torch.randn(rows_n, n, device=DEV).to(BF16)
        ind = compiled["silu_mul"](torch.cat((g, u), -1))
        row = {"op": "swiglu", "shape": [rows_n, n],
               "reference_vs_inductor": eq(reference.swiglu(g, u, dflt), ind), "triton_vs_inductor": eq(fused.swiglu(g, u, dflt), ind)}
        if kernels is not None:
            k = kernels.silu_and_mul(torch.cat((g, u), -1))
            row.update({"reference_vs_vllm_kernel": eq(reference.swiglu(g, u, eager), k),
                        "triton_vs_vllm_kernel": eq(fused.swiglu(g, u, eager), k)})
        rows.append(row)
        print(row, flush=True)
    out.write_text(json.dumps({"environment": STAMP, "rows": rows}, indent=2))


def twin_rows(twin, sides, shapes, model, name, mode, prof, device, width=14) -> list[dict]:
    """The twin against each side on each (batch, tokens, first position) of ``shapes``: one row per side
    and shape (bit-equal logits, k3, KL, max |dlogprob|, per-layer equality), printed as it goes."""
    rows = []
    for b, s, off in shapes:
        g = torch.Generator().manual_seed(b * 7919 + s)
        ids = torch.randint(0, model.config.vocab_size, (b, s), generator=g).to(device)
        pos = (torch.arange(s) + off)[None].expand(b, s).to(device)
        t0 = time.time()
        o = twin(ids, pos)
        res = compare((o.logits, o.layers), sides, ids, pos)
        for side in res.sides:
            rows.append({"model": name, "mode": mode, "profile": prof.name, "batch": b, "tokens": s,
                         "position_offset": off, "side": side.name, "logits_equal": side.logits_equal,
                         "k3": side.k3, "kl": side.kl, "max_abs_dlogprob": side.max_abs_delta,
                         "first_diverging_layer": side.first_diverging_layer(),
                         "layers_equal": [r["equal"] for r in side.layers]})
            print(f"{name:18s} {mode:7s} {b}x{s}@{off:<6d} {side.name:{width}s} eq={side.logits_equal:.4%} "
                  f"k3={side.k3:.2e} kl={side.kl:.2e} layers={[round(r['equal'], 4) for r in side.layers]}", flush=True)
        print(f"  ({time.time() - t0:.1f}s)", flush=True)
    return rows


def stage_twin(engine, modes, library, out, quick=False):
    from rla.engines.backed import engine_ops
    from rla.engines.vllm_forward import engine_forward
    from rla.engines.vllm_twin import VllmTwin
    from rla.hf import load_model

    cases = {
        "qwen2-h1536": [(1, 512, 0), (1, 4096, 0), (2, 512, 30000), (1, 1, 31000)],
        "qwen3-h2048": [(1, 512, 0), (1, 4096, 0), (2, 512, 30000), (1, 1, 31000)],
        "llama31-h2048": [(1, 512, 0), (1, 4096, 0), (2, 512, 120000), (1, 1, 125000)],
        "tiny-qwen2-trained": [(2, 512, 0), (1, 512, 30000)],
    }
    if quick:
        cases = {k: v[:1] for k, v in cases.items()}
    if ONLY:
        cases = {k: v for k, v in cases.items() if k in ONLY}
    rows = []
    backed = engine_ops(engine, "eager", library) if "eager" in modes else None
    pieces = engine_forward(engine, "default") if "default" in modes else None
    for name, shapes in cases.items():
        if name == "tiny-qwen2-trained":
            model = load_model(str(Path(__file__).resolve().parents[2] / "src/rla/assets/tiny-qwen2"), BF16, DEV)
        else:
            model = random_model(configs()[name])
        for mode in modes:
            prof = profiles.get("vllm-0.33" if mode == "default" else "vllm-0.33-eager")
            twin = VllmTwin(model, engine, mode, library)
            sides = {"hf": hf_side(model), "rla-fused": aligned_side(model, prof),
                     "rla-reference": aligned_side(model, prof, ops=reference)}
            if mode == "eager":
                sides["vllm-kernels"] = aligned_side(model, prof, ops=backed)
            if mode == "default":  # the engine-backed default mode: the twin's compiled pieces
                sides["vllm-pieces"] = aligned_side(model, prof, ops=pieces)
            rows += twin_rows(twin, sides, shapes, model, name, mode, prof, DEV)
        del model
        torch.cuda.empty_cache()
    out.write_text(json.dumps({"environment": STAMP, "provenance": engine.provenance, "rows": rows}, indent=2))


def main():
    global STAMP
    if len(sys.argv) == 3 and sys.argv[1] == "--summarize":
        print(summarize(sys.argv[2]))
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("--stages", nargs="+", default=["tables", "order", "twin"])
    ap.add_argument("--modes", nargs="+", default=["default", "eager"])
    ap.add_argument("--wheel", required=True)
    ap.add_argument("--library", default=None)
    ap.add_argument("--out", required=True)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--only", nargs="*", default=[], help="models of the twin / families stage to run (default all)")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--scale", type=float, default=1.0, help="multiply the models' widths (a CPU smoke test uses less)")
    args = ap.parse_args()
    global DEV, LAYERS, SCALE, ONLY
    DEV, LAYERS, SCALE, ONLY = args.device, args.layers, args.scale, args.only
    STAMP = stamp(args)
    # every model shape is a graph of its own for each compiled piece (the twin's and the
    # engine-backed forward's): more than Dynamo's default 8; and never run a piece eagerly
    torch._dynamo.config.recompile_limit = 64
    torch._dynamo.config.fail_on_recompile_limit_hit = True
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    engine = vllm.load(args.wheel)
    kernels = engine.c_ops(args.library) if args.library else None
    if "tables" in args.stages:
        stage_tables(engine, out / "rope_tables.json")
    if "order" in args.stages:
        stage_order(engine, kernels, out / "arithmetic_order.json")
    if "twin" in args.stages:
        stage_twin(engine, args.modes, args.library, out / "twin.json", args.quick)
    if "families" in args.stages:
        import twin_families

        twin_families.run(engine, args.modes, args.library, out / "twin_families.json", args.quick, ONLY,
                          LAYERS, SCALE, DEV, STAMP)



def summarize(folder: str) -> str:
    """Markdown tables of a results folder's twin_*.json (the numbers its README quotes)."""
    out = []
    families = Path(folder) / "twin_families.json"
    if families.is_file():
        import twin_families

        out.append(twin_families.summarize(families))
    for mode in ("default", "eager"):
        path = Path(folder) / f"twin_{mode}.json"
        if not path.is_file():
            continue
        rows = json.loads(path.read_text())["rows"]
        sides = list(dict.fromkeys(r["side"] for r in rows))
        out.append(f"\n### {mode} mode (profile {rows[0]['profile']}): logits bit-equal / k3 of the sampled token\n")
        out.append("| model | batch x tokens @ first position | " + " | ".join(sides) + " |")
        out.append("|---|---|" + "---|" * len(sides))
        cases = list(dict.fromkeys((r["model"], r["batch"], r["tokens"], r["position_offset"]) for r in rows))
        for m, b, s, off in cases:
            cells = []
            for side in sides:
                r = next(x for x in rows if (x["model"], x["batch"], x["tokens"], x["position_offset"], x["side"]) == (m, b, s, off, side))
                cells.append(f"{r['logits_equal']:.2%} / {r['k3']:.2g}")
            out.append(f"| {m} | {b}x{s} @ {off} | " + " | ".join(cells) + " |")
    return "\n".join(out)




if __name__ == "__main__":
    main()
