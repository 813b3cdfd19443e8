"""Where the live engine's remaining mismatch sits: attention, GEMM shapes, batching, the LM head.

The mode-matched row removes half of HF eager's prefill k3 against live vLLM 0.26 and leaves the
rest outside the three regions (``results/benchmarks/vllm026_live_h200_2026-12-01``). This script
measures what that rest is made of by intervention: each side below changes ONE more thing of the
training forward to what the engine does, on top of the mode-matched row, and scores it against
the engine's own prompt logprobs and rollouts (``rla.engines.live_calibration.score``):

- ``row``                the mode-matched row (``vllm-0.33`` for default mode, ``-eager`` for eager)
- ``row+vllm_attn``      attention by vLLM's own Triton kernel (``unified_attention``, the
                         ``TRITON_ATTN`` backend the engine ran), on a paged bf16 KV cache as the
                         engine keeps it; loaded from the installed vllm at run time
- ``row+merged``         q/k/v and gate/up as ONE GEMM each (vLLM's ``QKVParallelLinear`` /
                         ``MergedColumnParallelLinear``), then split: cuBLAS picks its kernel by shape
- ``row+vllm_attn+merged``  both
- ``row+fp32_attn``      sdpa on fp32 q/k/v, output rounded to bf16: how large attention's own
                         rounding is (a magnitude, not the engine)
- ``row+fp32_head``      the LM head in fp32: how much the head's rounding moves the logprobs
- ``hf+vllm_attn``       HF eager with the engine's attention only

Stage ``engine-solo`` reruns the live engine with every prompt sent alone and
``max_num_batched_tokens`` above the longest prompt (no chunked prefill, no batching with other
prompts), so a GEMM's M is the prompt's length as on the training side. Comparing its logprobs
with the batched run's (``engine-*.json`` of the committed results, same checkpoint) measures the
engine's own batch variance, which no training-side choice can reproduce.

Stage ``twin`` asks whether the twin (``rla.engines.vllm_twin``) is the live engine once it
attends with the engine's kernel: its prompt logprobs against the live engine's, eager mode
(vLLM's ``_C`` kernels) and default mode compiled three ways: stock Inductor, vLLM's own
``CompilationConfig().inductor_compile_config`` (read from the installed vllm), and that with
q/k/v and gate/up merged into one GEMM each as vLLM's linear layers compute them.

Needs CUDA; the ``vllm_attn`` sides and ``engine-solo`` need vLLM 0.26 importable. The checkpoints
are rebuilt from the same seeds as the committed runs (``vllm_live_h200.build_checkpoint``), and
the first line of each model's output compares HF eager's score with the committed one, so a
different checkpoint shows at once.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tarfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))

from vllm_live_h200 import BF16, DEV, build_checkpoint, stamp  # noqa: E402

from rla import profiles  # noqa: E402
from rla.engines.live_calibration import stats, train_logprobs  # noqa: E402
from rla.engines.vllm_attention import attention_forward  # noqa: E402

# -- attention sides ------------------------------------------------------------------------------

vllm_attention = attention_forward
"""vLLM's ``unified_attention`` as an HF attention function (``rla.engines.vllm_attention``)."""


def fp32_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    out, w = sdpa_attention_forward(module, query.float(), key.float(), value.float(), attention_mask,
                                    scaling=scaling, dropout=dropout, **kwargs)
    return out.to(query.dtype), w


def register(name: str, fn) -> None:
    """``fn`` as an HF attention implementation, on SDPA's causal mask (one sequence, no padding)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(name, fn)
    AttentionMaskInterface.register(name, sdpa_mask)


@contextlib.contextmanager
def attention(model, name: str | None):
    if name is None:
        yield
        return
    fn = {"vllm_attn": vllm_attention, "fp32_attn": fp32_attention}[name]
    register(f"rla_{name}", fn)
    old = model.config._attn_implementation
    model.config._attn_implementation = f"rla_{name}"
    try:
        yield
    finally:
        model.config._attn_implementation = old


# -- GEMM and head sides --------------------------------------------------------------------------

def _merge(mods) -> None:
    """One GEMM for ``mods`` (called in order on the same input), split into their outputs."""
    w = torch.cat([m.weight for m in mods])
    bias = torch.cat([m.bias for m in mods]) if all(m.bias is not None for m in mods) else None
    sizes = [m.weight.shape[0] for m in mods]
    state: dict = {}

    def make(i):
        def fwd(x):
            if state.get("x") is not x:
                state["x"], state["y"] = x, F.linear(x, w, bias).split(sizes, -1)
            return state["y"][i].contiguous()
        return fwd
    for i, m in enumerate(mods):
        m.forward = make(i)


@contextlib.contextmanager
def merged(model, on: bool):
    if not on:
        yield
        return
    touched = []
    for layer in model.model.layers:
        a, m = layer.self_attn, layer.mlp
        groups = [[a.q_proj, a.k_proj, a.v_proj], [m.gate_proj, m.up_proj]]
        for g in groups:
            _merge(g)
            touched += g
    try:
        yield
    finally:
        for m in touched:
            del m.forward  # back to the class's forward


@contextlib.contextmanager
def fp32_head(model, on: bool):
    if not on:
        yield
        return
    head = model.lm_head
    head.forward = lambda h: F.linear(h.float(), head.weight.float())
    try:
        yield
    finally:
        del head.forward


SIDES = {  # name: (row?, attention, merged, fp32 head)
    "hf": (False, None, False, False),
    "row": (True, None, False, False),
    "row+vllm_attn": (True, "vllm_attn", False, False),
    "row+merged": (True, None, True, False),
    "row+vllm_attn+merged": (True, "vllm_attn", True, False),
    "row+fp32_attn": (True, "fp32_attn", False, False),
    "row+fp32_head": (True, None, False, True),
    "hf+vllm_attn": (False, "vllm_attn", False, False),
}


def score(model, prompts, pre, records) -> dict:
    """``live_calibration.score`` of the model as it is, the decode side only where there are records."""
    tp = [train_logprobs(model, p) for p in prompts]
    out = {"prefill": stats(tp, [torch.tensor(x, dtype=torch.float64) for x in pre], [0] * len(tp))}
    if records:
        td = [train_logprobs(model, r.prompt_ids + r.response_ids)[len(r.prompt_ids) - 1:] for r in records]
        out["decode"] = stats(td, [torch.tensor(r.logprobs, dtype=torch.float64) for r in records])
    return out


# -- stages ---------------------------------------------------------------------------------------

def engine_solo(path: Path, mode: str, prompts: list[list[int]], out: Path) -> None:
    from rla.engines.vllm_live import LiveSettings, LiveVllm

    longest = max(len(p) for p in prompts)
    settings = LiveSettings(mode=mode, max_model_len=max(8192, longest + 64), gpu_memory_utilization=0.45,
                            max_num_batched_tokens=longest + 64)
    t0 = time.time()
    engine = LiveVllm(str(path), settings)
    pre = [engine.prompt_logprobs([p])[0] for p in prompts]
    out.write_text(json.dumps({"environment": stamp(), "engine": engine.metadata, "model": path.name,
                               "prompts": prompts, "prompt_logprobs": pre, "solo": True,
                               "seconds": time.time() - t0}))
    print(f"{path.name} {mode} solo: {time.time() - t0:.0f}s", flush=True)
    engine.close()


def vllm_inductor_options() -> dict:
    """The Inductor configuration vLLM compiles its pieces under, from its own config code."""
    from vllm.config.compilation import CompilationConfig

    opts = CompilationConfig().inductor_compile_config
    return {k: v for k, v in opts.items() if isinstance(v, (bool, int, float, str))}


TWINS = {  # name: (twin mode, vLLM's Inductor options?, merged GEMMs?)
    "twin-eager": ("eager", False, False),
    "twin-eager+merged": ("eager", False, True),
    "twin-default-stock": ("default", False, False),
    "twin-default-vllm_opts": ("default", True, False),
    "twin-default-vllm_opts+merged": ("default", True, True),
}


def twin_rows(engine_file: Path, ckpt: Path) -> list[dict]:
    import transformers

    from rla.engines import vllm as vllm_code
    from rla.engines.vllm_twin import VllmTwin

    data = json.loads(engine_file.read_text())
    mode = data["engine"]["mode"]
    model = transformers.AutoModelForCausalLM.from_pretrained(str(ckpt), dtype=BF16,
                                                               attn_implementation="sdpa").to(DEV).eval()
    register("rla_vllm_attn", vllm_attention)
    model.config._attn_implementation = "rla_vllm_attn"
    code = vllm_code.load()
    engine_pre = [torch.tensor(x, dtype=torch.float64) for x in data["prompt_logprobs"]]
    rows = []
    for name, (tmode, opts, merge) in TWINS.items():
        if tmode != mode:
            continue
        t0 = time.time()
        try:
            options = vllm_inductor_options() if opts else None
            twin = VllmTwin(model, code, tmode, inductor_options=options, merged_gemms=merge)
            got = []
            for p in data["prompts"]:
                ids = torch.tensor(p, device=DEV)[None]
                logits = twin(ids).logits[0, :-1]
                lp = torch.cat([logits[i:i + 4096].log_softmax(-1, dtype=torch.float32)
                                .gather(-1, ids[0, i + 1:i + 4097, None])[:, 0] for i in range(0, len(p) - 1, 4096)])
                got.append(lp.double().cpu())
            s = {"prefill": stats(got, engine_pre, [0] * len(got))}
        except Exception as e:  # noqa: BLE001 - a twin that fails is a result
            rows.append({"model": data["model"], "mode": mode, "engine": engine_file.name, "side": name,
                         "error": f"{type(e).__name__}: {e}"})
            print(f"{data['model']} {mode} {name}: FAILED {type(e).__name__}: {e}", flush=True)
            continue
        rows.append({"model": data["model"], "mode": mode, "engine": engine_file.name, "side": name,
                     "inductor_options": options, "merged_gemms": merge, **s})
        print(f"{data['model']:18s} {mode:7s} {engine_file.name[-30:]:30s} {name:30s} prefill eq "
              f"{s['prefill']['equal']:.4%} k3 {s['prefill']['k3']:.3e} max {s['prefill']['max_abs']:.2e} "
              f"({time.time() - t0:.1f}s)", flush=True)
        del twin
    del model
    torch.cuda.empty_cache()
    return rows


def engine_vs_engine(a: list[list[float]], b: list[list[float]]) -> dict:
    x, y = torch.tensor(sum(a, []), dtype=torch.float64), torch.tensor(sum(b, []), dtype=torch.float64)
    d = x - y
    return {"tokens": int(d.numel()), "equal": float((d == 0).double().mean()),
            "k3": float((torch.exp(d) - 1 - d).mean()), "max_abs": float(d.abs().max())}


def compare(engine_file: Path, ckpt: Path, sides: list[str], committed: dict | None) -> list[dict]:
    import transformers

    from rla.alignment import aligned
    from rla.rollout import rollouts

    data = json.loads(engine_file.read_text())
    mode = data["engine"]["mode"]
    rec_file = engine_file.with_suffix(".rollouts.jsonl")
    records = rollouts.load(rec_file) if rec_file.is_file() else []
    model = transformers.AutoModelForCausalLM.from_pretrained(str(ckpt), dtype=BF16,
                                                               attn_implementation="sdpa").to(DEV).eval()
    row = profiles.get("vllm-0.33-eager" if mode == "eager" else "vllm-0.33")
    rows = []
    for side in sides:
        use_row, attn, merge, head = SIDES[side]
        t0 = time.time()
        try:
            with contextlib.ExitStack() as st:
                if use_row:
                    st.enter_context(aligned(model, row))
                st.enter_context(attention(model, attn))
                st.enter_context(merged(model, merge))
                st.enter_context(fp32_head(model, head))
                s = score(model, data["prompts"], data["prompt_logprobs"], records)
        except Exception as e:  # noqa: BLE001 - one side failing is a result, the others still run
            rows.append({"model": data["model"], "mode": mode, "engine": engine_file.name, "side": side,
                         "error": f"{type(e).__name__}: {e}"})
            print(f"{data['model']} {mode} {side}: FAILED {type(e).__name__}: {e}", flush=True)
            continue
        r = {"model": data["model"], "mode": mode, "engine": engine_file.name, "side": side,
             "row": row.name if use_row else None, **s}
        if side == "hf" and committed is not None:
            r["committed_hf_prefill_k3"] = committed.get((data["model"], mode))
        rows.append(r)
        dec = s.get("decode") or {}
        print(f"{data['model']:18s} {mode:7s} {engine_file.name[-30:]:30s} {side:22s} prefill eq "
              f"{s['prefill']['equal']:.4%} k3 {s['prefill']['k3']:.3e} max {s['prefill']['max_abs']:.2e}"
              + (f" | decode eq {dec['equal']:.4%} k3 {dec['k3']:.3e}" if dec else "")
              + f" ({time.time() - t0:.1f}s)", flush=True)
    del model
    torch.cuda.empty_cache()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("stage", choices=("engine-solo", "compare", "twin"))
    ap.add_argument("--committed", default="results/benchmarks/vllm026_live_h200_2026-12-01",
                    help="the committed live results (engine_outputs_l4.tgz, compare_l4*.json)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--models", default="/tmp/rla-live-models")
    ap.add_argument("--names", default="qwen2-h1536-L4,qwen3-h2048-L4")
    ap.add_argument("--modes", default="eager,default")
    ap.add_argument("--sides", default=",".join(SIDES))
    a = ap.parse_args()
    out, committed = Path(a.out), Path(a.committed)
    out.mkdir(parents=True, exist_ok=True)
    batched = out / "batched"
    if not batched.is_dir():
        batched.mkdir()
        with tarfile.open(committed / "engine_outputs_l4.tgz") as t:
            t.extractall(batched, filter="data")
    names, modes = a.names.split(","), a.modes.split(",")
    if a.stage == "engine-solo":
        for name in names:
            for mode in modes:
                src = json.loads((batched / f"engine-{name}-{mode}.json").read_text())
                layers = int(name.rsplit("-L", 1)[1])
                path = build_checkpoint(name.rsplit("-L", 1)[0], layers, Path(a.models))
                engine_solo(path, mode, src["prompts"], out / f"solo-{name}-{mode}.json")
        return
    if a.stage == "twin":
        rows = []
        for name in names:
            ckpt = build_checkpoint(name.rsplit("-L", 1)[0], int(name.rsplit("-L", 1)[1]), Path(a.models))
            for mode in modes:
                for eng in (batched / f"engine-{name}-{mode}.json", out / f"solo-{name}-{mode}.json"):
                    if eng.is_file():
                        rows += twin_rows(eng, ckpt)
                (out / "twin.json").write_text(json.dumps({"environment": stamp(), "rows": rows}, indent=1))
        return
    hf = {}
    for f in committed.glob("compare_l4*.json"):
        for r in json.loads(f.read_text())["rows"]:
            if r["side"] == "hf":
                hf[(r["model"], r["mode"])] = r["prefill"]["k3"]
    rows, pairs = [], []
    for name in names:
        layers = int(name.rsplit("-L", 1)[1])
        ckpt = build_checkpoint(name.rsplit("-L", 1)[0], layers, Path(a.models))
        for mode in modes:
            eng = batched / f"engine-{name}-{mode}.json"
            rows += compare(eng, ckpt, a.sides.split(","), hf)
            solo = out / f"solo-{name}-{mode}.json"
            if solo.is_file():
                rows += compare(solo, ckpt, a.sides.split(","), None)
                pairs.append({"model": name, "mode": mode, "batched_vs_solo": engine_vs_engine(
                    json.loads(eng.read_text())["prompt_logprobs"], json.loads(solo.read_text())["prompt_logprobs"])})
                print(f"{name} {mode} engine batched vs solo: {pairs[-1]['batched_vs_solo']}", flush=True)
            (out / "attribution.json").write_text(json.dumps(
                {"environment": stamp(), "rows": rows, "engine_batch_variance": pairs}, indent=1))


if __name__ == "__main__":
    main()
