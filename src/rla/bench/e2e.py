"""End-to-end benchmark: one training step (forward + loss + backward) of a realistic model shape.

Random init from a config (no download), sdpa attention, next-token loss on random tokens. The
shapes (``MODELS``): Qwen2.5-1.5B / 7B, Qwen3-1.7B, and Gemma 3 4B's text model (``gemma3-4b``:
zero-centred sandwich norms, GeGLU, sliding and full layers with their own RoPE tables), each
the family's HF config with the checkpoint's numbers written out.
Variants, each timed in the same process:
  hf-bf16       HF transformers eager in bf16 (the baseline)
  rla-vllm      bf16, the three regions aligned to the ``vllm`` profile through ``rla``
  rla-sglang    same, ``sglang`` profile (fp32 cos/sin)
  naive-upcast  bf16, the three regions computed by eager fp32 upcasts (vllm numbers, unfused)
  fp16, fp32    the whole model in that dtype, no patch (fp32 at a batch that fits)
  liger         bf16, Liger Kernel's RoPE, RMSNorm and gated MLP (``apply_liger_kernel_to_<family>``,
                ``LIGER``; the loss left as HF's), on a model of its own: what a Liger user runs today,
                unaligned
  liger-flce    the same plus Liger's fused linear cross-entropy (the loss without materialised
                logits): Liger alone, as Liger's defaults apply it
  rla-vllm+liger-flce  ``liger-flce``, then ``rla.align(model, "vllm")`` over it: rla's regions replace
                Liger's RoPE, RMSNorm and SwiGLU, Liger's fused linear cross-entropy stays
                (``rla.alignment.liger``); beside ``liger-flce`` in the same run

How the regions are aligned: ``rla.alignment.align(model, profile)`` for the ``rla-*`` variants,
and ``align(model, "vllm", ops=rla.bench.ops.NAIVE_UPCAST)`` for ``naive-upcast``: the same
per-instance patch, with the four region ops replaced by plain eager fp32 upcasts that autograd
differentiates (every fp32 intermediate kept for backward). ``rla.alignment.unalign`` undoes
either after the variant.
"""

from __future__ import annotations

import gc
import statistics
from typing import Callable

import torch

from rla.bench.common import write_results
from rla.environment import env_markdown, environment

MODELS = {
    "qwen2.5-1.5b": dict(
        hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
        num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True,
    ),
    "qwen2.5-7b": dict(
        hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
        num_key_value_heads=4, vocab_size=152064, tie_word_embeddings=False,
    ),
    # Qwen3 (per-head q/k norms: under the vllm row, the qk_norm_out='fp32' chain runs)
    "qwen3-1.7b": dict(
        family="qwen3", hidden_size=2048, intermediate_size=6144, num_hidden_layers=28, num_attention_heads=16,
        num_key_value_heads=8, head_dim=128, vocab_size=151936, tie_word_embeddings=True,
    ),
    # Gemma 3 4B's text model (google/gemma-3-4b-it, config.json's text_config: hidden 2560,
    # intermediate 10240, 34 layers, sliding window 1024, full layers' RoPE linear x8; the rest
    # Gemma3TextConfig's defaults, which that file leaves in place: 8 heads, 4 KV heads, head_dim 256,
    # query_pre_attn_scalar 256, vocab 262208, every 6th layer full, theta 10k sliding / 1M full)
    "gemma3-4b": dict(
        family="gemma3_text", hidden_size=2560, intermediate_size=10240, num_hidden_layers=34, num_attention_heads=8,
        num_key_value_heads=4, head_dim=256, vocab_size=262208, tie_word_embeddings=True, sliding_window=1024,
        query_pre_attn_scalar=256, max_position_embeddings=131072,
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                         "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6}},
    ),
}

#: The config keys every shape shares unless it names its own (a Qwen-style single RoPE table).
CONFIG_DEFAULTS = dict(max_position_embeddings=32768, rms_norm_eps=1e-6,
                       rope_parameters={"rope_type": "default", "rope_theta": 1e6}, use_cache=False)

#: (batch, seq) per model and variant; fp32 (and, for 7B, everything) at what fits in 141 GB.
BATCH = {
    "qwen2.5-1.5b": {"default": (4, 4096), "fp32": (2, 4096)},
    "qwen2.5-7b": {"default": (1, 4096), "fp32": (1, 2048)},
    "qwen3-1.7b": {"default": (2, 4096), "fp32": (1, 4096)},
    "gemma3-4b": {"default": (2, 4096), "fp32": (1, 2048)},
}

#: Liger Kernel's patch per family (``config.model_type``): its function, the HF modeling module
#: whose globals the patch replaces for the whole process (restored after the variant: RoPE, the
#: norm and MLP classes) and the name of its gated-MLP flag.
LIGER = {
    "qwen2": dict(patch="apply_liger_kernel_to_qwen2", module="qwen2", names=("Qwen2RMSNorm", "Qwen2MLP"),
                  mlp="swiglu"),
    "qwen3": dict(patch="apply_liger_kernel_to_qwen3", module="qwen3", names=("Qwen3RMSNorm", "Qwen3MLP"),
                  mlp="swiglu"),
    "gemma3_text": dict(patch="apply_liger_kernel_to_gemma3_text", module="gemma3",
                        names=("Gemma3RMSNorm", "Gemma3MLP"), mlp="geglu"),
}

VARIANTS = ("hf-bf16", "rla-vllm", "rla-vllm-eager", "rla-sglang", "naive-upcast", "fp16", "fp32")
#: Also accepted: ``rla-vllm-eager-kernels``, the engine-backed mode (vLLM's own CUDA norm, SwiGLU
#: and RoPE kernels in the forward, rla's backward); it needs the engine, named by
#: ``RLA_ENGINE_WHEEL`` (default: the installed vllm) and ``RLA_ENGINE_LIBRARY`` (its kernel library).
#: And ``rla-vllm-pieces``, the engine-backed default mode (``rla.engines.vllm_forward``: the decoder
#: forward is vLLM's native ops compiled in pieces by Inductor, rla's gradient recomputed per piece).
#: Variants that patch their model for good: each runs on a model built for it alone.
OWN_MODEL = {"fp16": torch.float16, "fp32": torch.float32, "liger": torch.bfloat16, "liger-flce": torch.bfloat16,
             "rla-vllm+liger-flce": torch.bfloat16}


def build_model(name: str, dtype: torch.dtype, device="cuda"):
    from transformers import AutoConfig, AutoModelForCausalLM

    shape = dict(MODELS[name])
    family = shape.pop("family", "qwen2")
    cfg = AutoConfig.for_model(family, **{**CONFIG_DEFAULTS, **shape})
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa", dtype=dtype)
    model.train()
    return model


def _liger(model, flce: bool = False) -> tuple[Callable[[], None], str]:
    """Liger's patch for the model's family (``LIGER``) on ``model`` (its modules stay patched:
    the model is not reused); the undo restores the module globals the patch also replaces."""
    import importlib

    family = model.config.model_type
    if family not in LIGER:
        raise ValueError(f"the liger variants: no Liger patch is listed for {family!r} (rla.bench.e2e.LIGER has "
                         f"{', '.join(LIGER)})")
    import liger_kernel.transformers as lk

    spec = LIGER[family]
    mq = importlib.import_module(f"transformers.models.{spec['module']}.modeling_{spec['module']}")
    saved = {n: getattr(mq, n) for n in ("apply_rotary_pos_emb", *spec["names"])}
    getattr(lk, spec["patch"])(rope=True, rms_norm=True, cross_entropy=False, fused_linear_cross_entropy=flce,
                               model=model, **{spec["mlp"]: True})

    def undo():
        for name, value in saved.items():
            setattr(mq, name, value)

    return undo, f"Liger Kernel (rope, rms_norm, {spec['mlp']}" + (", fused_linear_cross_entropy)" if flce else ")")


def _align(model, variant: str) -> tuple[Callable[[], None], str]:
    """Apply a variant's region implementation; -> (undo, how)."""
    if variant == "liger":
        return _liger(model)
    if variant == "liger-flce":
        return _liger(model, flce=True)
    from rla.alignment import align, unalign

    if variant == "rla-vllm+liger-flce":
        undo_liger, how = _liger(model, flce=True)
        report = align(model, "vllm")
        if not any("fused linear cross-entropy" in n for n in report.notes):
            raise RuntimeError(f"{variant}: Liger's fused linear cross-entropy forward is not in place\n{report}")

        def undo():
            unalign(model)
            undo_liger()

        return undo, f"{how}, then rla.align(model, 'vllm') over it (Liger's fused linear cross-entropy kept)"

    if variant == "naive-upcast":
        from rla.bench.ops import NAIVE_UPCAST

        align(model, "vllm", ops=NAIVE_UPCAST)
        return (lambda: unalign(model)), "rla.align(model, 'vllm', ops=NAIVE_UPCAST) (naive fp32 upcasts)"
    if variant.endswith("-kernels"):  # engine-backed: the engine's forward kernels
        import os

        from rla.engines import vllm
        from rla.engines.backed import engine_ops

        profile = variant[len("rla-"):-len("-kernels")]
        impl = engine_ops(vllm.load(os.environ.get("RLA_ENGINE_WHEEL")), "eager", os.environ.get("RLA_ENGINE_LIBRARY"))
        align(model, profile, ops=impl)
        return (lambda: unalign(model)), f"rla.align(model, {profile!r}, ops=engine_ops(vllm, 'eager'))"
    if variant.endswith("-pieces"):  # engine-backed default mode: the engine's compiled pieces
        import os

        from rla.engines import vllm
        from rla.engines.vllm_forward import engine_forward

        profile = variant[len("rla-"):-len("-pieces")]
        align(model, profile, ops=engine_forward(vllm.load(os.environ.get("RLA_ENGINE_WHEEL")), "default"))
        return (lambda: unalign(model)), f"rla.align(model, {profile!r}, ops=engine_forward(vllm, 'default'))"
    profile = variant.split("-", 1)[1]
    align(model, profile)
    return (lambda: unalign(model)), f"rla.align(model, {profile!r})"


def training_step(model, ids: torch.Tensor) -> Callable[[], torch.Tensor]:
    """One step on ``ids`` (next-token loss, labels = ids): forward, loss, backward, gradients
    dropped; the step returns the loss."""

    def step():
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        model.zero_grad(set_to_none=True)
        return loss

    return step


def _time_steps(model, batch: int, seq: int, warmup: int, reps: int) -> dict:
    device = next(model.parameters()).device
    step = training_step(model, torch.randint(0, model.config.vocab_size, (batch, seq), device=device))
    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    gc.collect()
    torch.cuda.reset_peak_memory_stats()
    times, losses = [], []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        loss = step()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e))
        losses.append(loss.item())
    ms = statistics.median(times)
    return {
        "batch": batch, "seq": seq, "step_ms": ms, "step_ms_all": times, "tok_s": batch * seq / (ms * 1e-3),
        "peak_gib": torch.cuda.max_memory_allocated() / 2**30, "loss": losses[-1],
    }


def run(out_dir="results/benchmarks", models=("qwen2.5-1.5b", "qwen2.5-7b"), variants=VARIANTS,
        warmup: int = 2, reps: int = 5, stem=None, shape: tuple[int, int] | None = None,
        compile_mode: str | None = None) -> dict:
    """``shape`` (batch, seq) replaces the per-model, per-variant ``BATCH`` for every variant;
    ``compile_mode`` (a ``torch.compile`` mode: ``default``, ``reduce-overhead``, ...) times
    ``torch.compile(model, mode=compile_mode)``, compiled during the warm-up steps."""
    env = environment()
    results = []
    for name in models:
        groups = [(torch.bfloat16, [v for v in variants if v not in OWN_MODEL])]
        groups += [(OWN_MODEL[v], [v]) for v in variants if v in OWN_MODEL]
        for dtype, group in groups:
            if not group:
                continue
            model = build_model(name, dtype)
            for variant in group:
                batch, seq = shape or BATCH[name].get(variant, BATCH[name]["default"])
                undo, how = (lambda: None), "none"
                try:
                    if variant.startswith("rla-") or variant in ("naive-upcast", "liger", "liger-flce"):
                        undo, how = _align(model, variant)
                    if compile_mode:
                        torch._dynamo.reset()
                        how += f" + torch.compile(mode={compile_mode!r})"
                    stepper = torch.compile(model, mode=compile_mode) if compile_mode else model
                    r = _time_steps(stepper, batch, seq, warmup, reps)
                except torch.cuda.OutOfMemoryError as e:
                    r = {"batch": batch, "seq": seq, "error": f"OOM: {str(e)[:160]}"}
                except Exception as e:
                    r = {"batch": batch, "seq": seq, "error": f"{type(e).__name__}: {str(e)[:300]}"}
                finally:
                    undo()
                    model.zero_grad(set_to_none=True)
                    gc.collect()
                    torch.cuda.empty_cache()
                r.update(model=name, variant=variant, aligned_by=how)
                results.append(r)
                print(f"{name:13s} {variant:13s} " + (
                    f"B{batch}xS{seq}  {r['tok_s']:9.0f} tok/s  step {r['step_ms']:.1f} ms  "
                    f"peak {r['peak_gib']:.1f} GiB  loss {r['loss']:.3f}  [{how}]"
                    if "error" not in r else r["error"]), flush=True)
            del model
            gc.collect()
            torch.cuda.empty_cache()
    payload = {"env": env, "warmup": warmup, "reps": reps, "compile": compile_mode, "results": results}
    md = markdown(payload)
    print(md, flush=True)
    write_results(out_dir, stem or f"e2e_{env.get('gpu', 'gpu').replace(' ', '_')}_{env['date'][:10]}", payload, md)
    return payload


def markdown(payload: dict) -> str:
    lines = [f"# rla end-to-end training step ({payload['env'].get('gpu')})\n", env_markdown(payload["env"]),
             "Random-init models of the named shapes (rla.bench.e2e.MODELS), sdpa, forward + loss + backward "
             "(no optimizer), "
             f"median of {payload['reps']} steps after {payload['warmup']} warm-up; peak = max allocated.\n",
             "| model | variant | batch x seq | tok/s | vs hf-bf16 | peak GiB | vs hf-bf16 | aligned by |",
             "|---|---|---|---|---|---|---|---|"]
    base = {r["model"]: r for r in payload["results"] if r["variant"] == "hf-bf16" and "error" not in r}
    for r in payload["results"]:
        if "error" in r:
            lines.append(f"| {r['model']} | {r['variant']} | {r['batch']}x{r['seq']} | {r['error'][:60]} | | | | |")
            continue
        b = base.get(r["model"])
        lines.append(
            f"| {r['model']} | {r['variant']} | {r['batch']}x{r['seq']} | {r['tok_s']:.0f} | "
            f"{r['tok_s'] / b['tok_s']:.3f} | {r['peak_gib']:.1f} | "
            f"{(r['peak_gib'] / b['peak_gib']) if (b and (r['batch'], r['seq']) == (b['batch'], b['seq'])) else float('nan'):.3f} | "
            f"{r['aligned_by']} |" if b else
            f"| {r['model']} | {r['variant']} | {r['batch']}x{r['seq']} | {r['tok_s']:.0f} | | {r['peak_gib']:.1f} | | {r['aligned_by']} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":  # pragma: no cover
    run()
