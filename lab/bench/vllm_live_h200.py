"""The live vLLM engine against HF eager and rla's profiles: prefill and decode, per family and mode.

Stages (each writes JSON into ``--out``):

- ``engine``: one process per (model, mode): builds the random-init checkpoint (the twin's shapes:
  Qwen2 h1536 with QKV bias, Qwen3 h2048 with q/k norms, Llama-3.1 h2048 with llama3 scaling),
  starts ``rla.engines.vllm_live.LiveVllm`` on it, and saves the engine's prompt logprobs for
  prompts of 512 / 2048 / 4096 tokens and one of ``--long`` tokens, and sampled responses
  (decode: KV cache, CUDA graphs in default mode, vLLM's sampler) with their logprobs.
- ``compare``: loads the same checkpoint with HF (sdpa, bf16) and scores the engine's tokens with
  HF eager and rla under each candidate row (``rla.engines.live_verify.compare``, the function
  ``rla verify --live`` runs: the rows of the engine's version in both modes, plus any
  ``oprow-*.json`` in the folder), and with ``--search`` the model-level search
  (``rla.engines.live_calibration.search``, what ``rla calibrate --live`` runs); writes per side
  the fraction of bit-equal logprobs, k3, mean / max |dlogp|, for prefill and decode, per
  position bucket.
- ``checkpoint``: only builds the random-init checkpoints (for ``rla verify --live`` /
  ``rla calibrate --live`` on the device). Besides the twin's three families it builds
  ``gemma3-h2560`` (:func:`gemma3_config`: Gemma 3 4B's width, sliding and full layers) and the MoE
  families of ``live_family_configs`` (GPT-OSS, GLM-4 MoE, DeepSeek-V3, and Qwen3.5 saved as its
  multimodal class, ``MODEL_CLASS``).

Needs CUDA and the real vLLM (0.26 on torch 2.11). Random-init weights: norm weights are drawn
around 1 (as the twin runs do) so per_op and fused norms differ.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import live_family_configs  # noqa: E402
from rla.engines.live_calibration import search  # noqa: E402
from rla.engines.live_verify import EngineData, candidates, compare, random_prompts  # noqa: E402

BF16 = torch.bfloat16
DEV = "cuda" if torch.cuda.is_available() else "cpu"
PROMPT_LENGTHS = (512, 2048, 4096)


def stamp() -> dict:
    import transformers
    try:
        import triton
        tv = triton.__version__
    except ImportError:
        tv = None
    try:
        import importlib.metadata as md
        vv = md.version("vllm")
    except Exception:
        vv = None
    return {"gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
            "torch": torch.__version__, "triton": tv, "transformers": transformers.__version__, "vllm": vv,
            "python": platform.python_version(), "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "command": " ".join(sys.argv), "env": {k: v for k, v in os.environ.items() if k.startswith("VLLM_")}}


def gemma3_config(layers: int):
    """Gemma 3 at Gemma 3 4B's width: hidden 2560, 8 query heads of 256 and 4 KV heads, GeGLU
    (gelu tanh) 10240 wide, query_pre_attn_scalar 256, a 1024-token sliding window on every layer
    but the last, which attends fully (Gemma 3 interleaves five sliding layers to one full);
    RoPE theta 10k on the sliding layers, 1M with linear x8 on the full ones; vocab 32000 like the
    twin's models, untied head."""
    import transformers

    if layers < 2:
        raise ValueError(f"gemma3-h2560 needs >= 2 layers (sliding and full), got {layers}")
    return transformers.Gemma3TextConfig(
        vocab_size=32000, hidden_size=2560, intermediate_size=10240, num_hidden_layers=layers,
        num_attention_heads=8, num_key_value_heads=4, head_dim=256, query_pre_attn_scalar=256,
        sliding_window=1024, layer_types=["sliding_attention"] * (layers - 1) + ["full_attention"],
        hidden_activation="gelu_pytorch_tanh", max_position_embeddings=131072, rms_norm_eps=1e-6,
        final_logit_softcapping=None, tie_word_embeddings=False,
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                         "full_attention": {"rope_type": "linear", "rope_theta": 1e6, "factor": 8.0}})


#: Families whose norms are zero-centred, ``x * (1 + w)``: their random norm weights are drawn
#: around 0 (HF initialises them to 0, where ``1 + w`` is exact), the others' around 1.
ZERO_CENTRED = ("gemma3-", "qwen35-", "qwen35moe-")
#: ... except these norms of theirs, which are plain (Qwen3.5's gated norm in its linear attention: weight * x)
PLAIN_NORMS = ("linear_attn.norm.weight",)
#: Families whose layers end with a layer scalar (Gemma 4's bf16 buffer, HF's init 1: exact): drawn in [0.5, 1.5)
RANDOM_LAYER_SCALAR = ("gemma4-",)


def model_configs(layers: int) -> dict:
    import engine_twin_h200 as twin

    twin.LAYERS = layers
    cfgs = twin.configs()
    cfgs["gemma3-h2560"] = gemma3_config(layers)
    cfgs.update({name: make(layers) for name, make in live_family_configs.CONFIGS.items()})
    for cfg in cfgs.values():  # room for the long prompt on every family (a multimodal config's text model's)
        text = cfg.get_text_config()
        text.max_position_embeddings = max(text.max_position_embeddings, 40960)
    return cfgs


def build_checkpoint(name: str, layers: int, root: Path) -> Path:
    import engine_twin_h200 as twin

    path = root / f"{name}-L{layers}"
    if (path / "config.json").is_file():
        return path
    cfgs = model_configs(layers)
    if name not in cfgs:
        raise ValueError(f"no checkpoint {name!r}; the families are {', '.join(cfgs)}")
    twin.DEV = "cuda"
    model = twin.random_model(cfgs[name], attention=live_family_configs.ATTENTION.get(name, "sdpa"),
                              model_class=live_family_configs.MODEL_CLASS.get(name))
    if name.startswith(ZERO_CENTRED):
        g = torch.Generator(device=twin.DEV).manual_seed(2)
        with torch.no_grad():
            for pname, p in model.named_parameters():
                if pname.endswith("norm.weight") and not pname.endswith(PLAIN_NORMS):
                    p.copy_(0.2 * torch.randn(p.shape, generator=g, device=twin.DEV))
    if name.startswith(RANDOM_LAYER_SCALAR):
        g = torch.Generator(device=twin.DEV).manual_seed(3)
        with torch.no_grad():
            for layer in model.model.layers:
                layer.layer_scalar.copy_(0.5 + torch.rand(1, generator=g, device=twin.DEV))
    model.save_pretrained(str(path), safe_serialization=True)
    del model
    torch.cuda.empty_cache()
    return path


def prompts_for(vocab: int, long_tokens: int, seed: int = 0) -> list[list[int]]:
    return random_prompts(vocab, list(PROMPT_LENGTHS) + ([long_tokens] if long_tokens else []), seed)


# -- stage engine (one process per model and mode) ------------------------------------------------

def run_engine(path: Path, mode: str, out: Path, long_tokens: int, decode_tokens: int, samples: int) -> None:
    from rla.engines.vllm_live import LiveSettings, LiveVllm
    from rla.rollout import rollouts

    cfg = json.loads((path / "config.json").read_text())
    prompts = prompts_for(cfg["vocab_size"], long_tokens)
    settings = LiveSettings(mode=mode, max_model_len=max(8192, long_tokens + 64), gpu_memory_utilization=0.45)
    t0 = time.time()
    engine = LiveVllm(str(path), settings)
    started = time.time() - t0
    t0 = time.time()
    pre = engine.prompt_logprobs(prompts)
    t_pre = time.time() - t0
    t0 = time.time()
    dec_prompts = [p[:256] for p in prompts[:3]] * samples
    recs = engine.sample(dec_prompts, max_tokens=decode_tokens, seed=1)
    t_dec = time.time() - t0
    rollouts.save(out.with_suffix(".rollouts.jsonl"), recs)
    out.write_text(json.dumps({"environment": stamp(), "engine": engine.metadata, "model": path.name,
                               "prompts": prompts, "prompt_logprobs": pre,
                               "seconds": {"start": started, "prefill": t_pre, "decode": t_dec}}))
    print(f"{path.name} {mode}: start {started:.0f}s prefill {t_pre:.1f}s decode {t_dec:.1f}s", flush=True)
    engine.close()


# -- stage compare ----------------------------------------------------------------------------------

def run_compare(folder: Path, ckpt_root: Path, out: Path, do_search: bool, families: list[str], layers: list[str]) -> None:
    import transformers
    from rla import profiles
    from rla.engines.vllm_live import MODES
    from rla.rollout import rollouts

    rows, searched = [], []
    def log(msg):
        print(msg, flush=True)
    for eng in sorted(folder.glob("engine-*.json")):
        data = json.loads(eng.read_text())
        mode, name = data["engine"]["mode"], data["model"]
        if not any(name.startswith(f) for f in families) or name.rsplit("-L", 1)[1] not in layers:
            continue
        records = rollouts.load(eng.with_suffix(".rollouts.jsonl"))
        model = transformers.AutoModelForCausalLM.from_pretrained(str(ckpt_root / name), dtype=BF16,
                                                                   attn_implementation="sdpa").to(DEV).eval()
        extra = {}
        for path in sorted(folder.glob("oprow-*.json")):
            prof = profiles.load(str(path))
            extra[f"op:{prof.name}"] = prof
        engine = EngineData(data["prompts"], data["prompt_logprobs"], records, data["engine"])
        sides = candidates(data["engine"]["name"], data["engine"]["version"], mode, MODES, extra)
        for r in compare(model, sides, engine, log=lambda m: log(f"{name:22s} {mode:7s} {m}")):
            rows.append({"model": name, "mode": mode, **r})
        if do_search and name.endswith("-L4"):
            for start in (profiles.get("vllm-0.33-eager" if mode == "eager" else "vllm-0.33"),):
                best, s, tried, flips = search(model, start, data["prompts"], data["prompt_logprobs"], records, log)
                searched.append({"model": name, "mode": mode, "start": start.name, "best": best.points(), "score": s,
                                 "flips": flips, "tried": tried})
                log(f"{name:22s} {mode:7s} SEARCH from {start.name} best {best.points()} "
                    f"prefill eq {s['prefill']['equal']:.4%} k3 {s['prefill']['k3']:.3e}")
        del model
        torch.cuda.empty_cache()
        out.write_text(json.dumps({"environment": stamp(), "rows": rows, "search": searched}, indent=1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("stage", choices=("engine", "engine-one", "compare", "checkpoint"))
    ap.add_argument("--out", required=True)
    ap.add_argument("--models", default="/tmp/rla-live-models")
    ap.add_argument("--families", default="qwen2-h1536,qwen3-h2048,llama31-h2048")
    ap.add_argument("--layers", default="4")
    ap.add_argument("--modes", default="eager,default")
    ap.add_argument("--long", type=int, default=33000)
    ap.add_argument("--decode-tokens", type=int, default=256)
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--search", action="store_true")
    ap.add_argument("--model-path")
    ap.add_argument("--mode")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    if a.stage == "engine-one":
        run_engine(Path(a.model_path), a.mode, out / f"engine-{Path(a.model_path).name}-{a.mode}.json",
                   a.long, a.decode_tokens, a.samples)
        return
    if a.stage == "checkpoint":
        for layers in [int(x) for x in a.layers.split(",")]:
            for fam in a.families.split(","):
                print(build_checkpoint(fam, layers, Path(a.models)), flush=True)
        return
    if a.stage == "engine":
        root = Path(a.models)
        for layers in [int(x) for x in a.layers.split(",")]:
            for fam in a.families.split(","):
                path = build_checkpoint(fam, layers, root)
                for mode in a.modes.split(","):
                    cmd = [sys.executable, __file__, "engine-one", "--out", str(out), "--model-path", str(path),
                           "--mode", mode, "--long", str(a.long), "--decode-tokens", str(a.decode_tokens),
                           "--samples", str(a.samples)]
                    with open(out / f"log-{path.name}-{mode}.txt", "w") as logf:
                        rc = subprocess.run(cmd, stdout=logf, stderr=subprocess.STDOUT).returncode
                    print(f"{path.name} {mode}: rc={rc}", flush=True)
                    if rc:
                        print((out / f"log-{path.name}-{mode}.txt").read_text()[-3000:], flush=True)
        return
    tag = f"{a.layers.replace(',', '_')}-{a.families.replace(',', '_')}"
    run_compare(out, Path(a.models), out / f"compare-{tag}.json", a.search, a.families.split(","), a.layers.split(","))


if __name__ == "__main__":
    main()
