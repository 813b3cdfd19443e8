"""Is vLLM 0.26's default mode reproducible on Qwen3, and which q/k-norm kernel config did it pick?

Why (``results/benchmarks/vllm026_rows_h200_2026-12-02/ENGINE_FORWARD.md``): two runs of the live
default-mode engine on the same Qwen3 checkpoint and prompts (2026-12-01, 2026-12-02) agree in
only 1.8-7.3% of prompt logprobs, where Qwen2 and Llama (no q/k norms) and eager mode agree in
100%; and the engine-backed forward (the twin's compiled pieces) is 2.6% bit-equal to the
2026-12-02 run. The suspect: Inductor's persistent reduction of a q/k norm (``r0_numel`` =
head_dim = 128 < 256) keeps several launch configs (XBLOCK 1/8/32, their num_warps) and picks one
by timing it on the device at first launch; the configs reduce the 128 squares in different
orders (PyTorch's ``torch._inductor.config.deterministic`` exists to stop exactly this). The hidden
norms (2048, 1536 > 1024) keep one config. Each run below starts with empty Inductor / Triton /
vLLM caches (the shell driver sets them), so every process autotunes afresh.

Stages (each one process; all read the same prompts, ``random_prompts(vocab, 512/2048/4096, seed 0)``,
the prompts of both committed runs):

- ``engine``: the live engine's prompt logprobs, the three prompts in one batch and then each
  alone in the same engine (same compiled kernels: batch variance apart from autotuning);
  ``--compilation-config`` JSON is passed to vllm.LLM, e.g.
  ``{"inductor_compile_config": {"deterministic": true}}``;
- ``twin``: the default-mode twin (``rla.engines.vllm_twin``, what ``engine_forward`` runs) with
  the engine's attention kernel, optionally compiled with vLLM's Inductor options read from the
  installed vllm (``--vllm-opts``), merged GEMMs, ``--deterministic`` (Inductor's deterministic
  mode), and a first call of ``--warm`` tokens (vLLM first launches its pieces on its
  16,384-token profiling batch, the twin on the first prompt);
- ``compare``: every pair of the runs' prompt logprobs, bit-equal fraction and max |d|.

Each run also lists the autotuned choice of every norm-like persistent reduction it compiled
(``*.best_config`` files in its caches with the kernel's ``r0_numel``), so the engine's and the
twin's picks can be read side by side.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

LENGTHS = (512, 2048, 4096)


def prompts_for(path: Path) -> list[list[int]]:
    from rla.engines.live_verify import random_prompts

    vocab = json.loads((path / "config.json").read_text())["vocab_size"]
    return random_prompts(vocab, LENGTHS, seed=0)


def best_configs(*roots) -> list[dict]:
    """The autotuned config of each compiled reduction under ``roots`` (Inductor writes
    ``<kernel>.best_config`` beside the kernel's source once it has benchmarked its configs)."""
    out = []
    for root in roots:
        if not root or not Path(root).is_dir():
            continue
        for bc in Path(root).rglob("*.best_config"):
            src = bc.with_suffix(".py")
            text = src.read_text(errors="replace") if src.is_file() else ""
            m = re.search(r"r0_numel = (\d+)", text)
            name = re.search(r"def (triton_\w+)\(", text)
            try:
                cfg = json.loads(bc.read_text())
            except ValueError:
                cfg = {"unreadable": bc.read_text()[:200]}
            out.append({"kernel": name.group(1) if name else bc.stem, "r0_numel": int(m.group(1)) if m else None,
                        "rsqrt": "rsqrt" in text, "persistent": "persistent_reduction" in text,
                        "config": {k: v for k, v in cfg.items() if k in ("XBLOCK", "R0_BLOCK", "num_warps", "num_stages")},
                        "file": str(bc)})
    return sorted(out, key=lambda r: (r["r0_numel"] or 0, r["kernel"]))


def _caches() -> list[str]:
    return [os.environ.get(k) for k in ("TORCHINDUCTOR_CACHE_DIR", "VLLM_CACHE_ROOT", "TRITON_CACHE_DIR")]


def run_engine(a) -> dict:
    from rla.engines.vllm_live import LiveSettings, LiveVllm

    path = Path(a.model)
    prompts = prompts_for(path)
    cc = json.loads(a.compilation_config) if a.compilation_config else None
    settings = LiveSettings(mode="default", max_model_len=4160, gpu_memory_utilization=0.45, compilation_config=cc)
    t0 = time.time()
    engine = LiveVllm(str(path), settings)
    pre = engine.prompt_logprobs(prompts)  # one batch (6,656 tokens in one step, as on 2026-12-02)
    solo = [engine.prompt_logprobs([p])[0] for p in prompts]  # same kernels, each prompt alone
    meta = engine.metadata
    engine.close()
    return {"side": a.label, "kind": "engine", "engine": meta, "compilation_config": cc,
            "prompts": prompts, "prompt_logprobs": pre, "solo_prompt_logprobs": solo,
            "seconds": round(time.time() - t0, 1)}


def vllm_options() -> dict:
    from vllm.config.compilation import CompilationConfig

    opts = CompilationConfig().inductor_compile_config
    return {k: v for k, v in opts.items() if isinstance(v, (bool, int, float, str))}


def run_twin(a) -> dict:
    import transformers

    from rla.engines import vllm as vllm_code
    from rla.engines.vllm_attention import swapped
    from rla.engines.vllm_twin import VllmTwin

    path = Path(a.model)
    prompts = prompts_for(path)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    model = transformers.AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.bfloat16,
                                                               attn_implementation="sdpa").to(dev).eval()
    options = dict(vllm_options()) if a.vllm_opts else {}
    if a.deterministic:
        if not hasattr(torch._inductor.config, "deterministic"):
            raise SystemExit(f"torch {torch.__version__} has no torch._inductor.config.deterministic")
        options["deterministic"] = True
    t0 = time.time()
    ctx = swapped(model) if dev == "cuda" and not a.model_attention else _null()
    with ctx:
        twin = VllmTwin(model, vllm_code.load(a.wheel), "default", inductor_options=options or None,
                        merged_gemms=a.merged)
        if a.warm:
            g = torch.Generator().manual_seed(7)
            twin(torch.randint(0, model.config.vocab_size, (1, a.warm), generator=g).to(dev))
        got = []
        for p in prompts:
            ids = torch.tensor(p, device=dev)[None]
            logits = twin(ids).logits[0, :-1]
            lp = torch.cat([logits[i:i + 4096].log_softmax(-1, dtype=torch.float32)
                            .gather(-1, ids[0, i + 1:i + 4097, None])[:, 0] for i in range(0, len(p) - 1, 4096)])
            got.append(lp.double().cpu().tolist())
    return {"side": a.label, "kind": "twin", "inductor_options": options, "merged_gemms": a.merged,
            "warm": a.warm, "prompts": prompts, "prompt_logprobs": got, "seconds": round(time.time() - t0, 1)}


class _null:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def load_runs(f: Path) -> list[dict]:
    """The run(s) a file holds: an engine run's solo logprobs are a run of their own."""
    d = json.loads(f.read_text())
    d.setdefault("side", f"{f.parent.name}/{f.stem}" if f.stem == "engine" else f.stem)
    out = [d]
    if d.get("solo_prompt_logprobs"):
        out.append({"side": d["side"] + "-solo", "prompts": d["prompts"], "prompt_logprobs": d["solo_prompt_logprobs"]})
    return out


def compare(files: list[Path]) -> list[dict]:
    """Every pair of runs over the prompts they share: bit-equal fraction, k3 (d = a - b) and
    max |d| of their prompt logprobs, per prompt length and overall."""
    runs = [r for f in files for r in load_runs(f)]
    rows = []
    for i, x in enumerate(runs):
        for y in runs[i + 1:]:
            eq = n = 0
            mx, k3, per = 0.0, 0.0, {}
            for p, lx in zip(x["prompts"], x["prompt_logprobs"]):
                for q, ly in zip(y["prompts"], y["prompt_logprobs"]):
                    if p != q:
                        continue
                    e = sum(u == v for u, v in zip(lx, ly))
                    eq, n = eq + e, n + len(lx)
                    mx = max(mx, max(abs(u - v) for u, v in zip(lx, ly)))
                    d = torch.tensor(lx, dtype=torch.float64) - torch.tensor(ly, dtype=torch.float64)
                    k3 += float((torch.exp(d) - 1 - d).sum())  # d = a - b
                    per[len(p)] = round(e / len(lx), 4)
            if n:
                rows.append({"a": x["side"], "b": y["side"], "logprobs": n, "equal": eq / n, "k3": k3 / n, "max_abs": mx,
                             "by_prompt_length": per})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("stage", choices=("engine", "twin", "compare"))
    ap.add_argument("--model", help="the HF checkpoint folder")
    ap.add_argument("--out", required=True, help="engine/twin: the run's JSON; compare: the table's JSON")
    ap.add_argument("--label", default=None)
    ap.add_argument("--compilation-config", default=None, help="engine: JSON for vllm.LLM(compilation_config=)")
    ap.add_argument("--vllm-opts", action="store_true", help="twin: vLLM's Inductor options (installed vllm)")
    ap.add_argument("--merged", action="store_true", help="twin: q/k/v and gate/up as one GEMM each")
    ap.add_argument("--deterministic", action="store_true", help="twin: torch._inductor.config.deterministic")
    ap.add_argument("--warm", type=int, default=0, help="twin: first call on this many random tokens")
    ap.add_argument("--wheel", default=None, help="twin: vLLM's code from this wheel (default: installed vllm)")
    ap.add_argument("--model-attention", action="store_true", help="twin: the model's own attention (CPU checks)")
    ap.add_argument("files", nargs="*", help="compare: run JSONs (engine.json of rla verify --live work too)")
    a = ap.parse_intermixed_args()
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    if a.stage == "compare":
        rows = compare([Path(f) for f in a.files])
        from vllm_live_h200 import stamp

        out.write_text(json.dumps({"environment": stamp(), "rows": rows}, indent=1))
        for r in rows:
            print(f"{r['a']:28s} vs {r['b']:28s} bit-equal {r['equal']:.4%} k3 {r['k3']:.2e} max {r['max_abs']:.2e} "
                  f"{r['by_prompt_length']}", flush=True)
        return
    a.label = a.label or out.stem
    res = run_engine(a) if a.stage == "engine" else run_twin(a)
    from vllm_live_h200 import stamp

    res["best_configs"] = best_configs(*_caches())
    res["environment"] = {**stamp(), "caches": _caches(),
                          "inductor_has_deterministic": hasattr(torch._inductor.config, "deterministic")}
    out.write_text(json.dumps(res))
    print(f"{a.label}: {res['seconds']}s; norm-like reductions autotuned:", flush=True)
    for b in res["best_configs"]:
        if b["rsqrt"] or b["r0_numel"] in (64, 128, 256):
            print(f"   {b['kernel'][:60]:60s} r0_numel {b['r0_numel']} persistent {b['persistent']} {b['config']}",
                  flush=True)


if __name__ == "__main__":
    main()
