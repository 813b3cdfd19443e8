"""The ``families`` stage of engine_twin_h200.py: vLLM 0.33's twin of Gemma 3, Gemma 4, GLM-4 MoE, GPT-OSS,
Qwen3.5 dense and Qwen3.5 MoE at a realistic width, in default and eager mode, against HF eager, the aligned model
and the oracles of the chains the CPU twin found (tests/engines/test_vllm_twin_families.py,
tests/engines/test_vllm_twin_qwen3_5.py).

Models (random init, 4 layers, vocab 32000, eager attention on every side, so the oracles attend
as the twin does): ``gemma3-h2560`` (Gemma 3 4B's layer: ``vllm_live_h200.gemma3_config``, three
sliding layers and a full one; its positions capped at 32768 to keep the linear cache small),
``gemma4-h2560`` (E4B's text layer, ``live_family_configs.gemma4``: heads of 256 on both layer types,
per-layer inputs of 256, three sliding layers then a full one with proportional RoPE, no K/V sharing,
no MoE; positions capped at 32768), ``glm4moe-h2048``, ``gptoss-h2880`` and ``qwen35-h2048`` (``live_family_configs``;
Qwen3.5's text model: three Gated DeltaNet layers then a full-attention one, 16 gated query heads of 256, partial
mRoPE; its twin runs vLLM's q/k norm + RoPE Triton kernel compiled, as the engine does on CUDA in both modes),
``qwen35moe-h2048`` (``live_family_configs.qwen3_5_moe``'s text model: those layers with every MLP a block of 16
experts of 512, top 4, and a shared expert of 512 with its sigmoid gate; ``rla.engines.vllm_twin_qwen3_5_moe``).
Norm weights 1 + 0.2 N(0, 1), Gemma's and Qwen3.5's zero-centred ones 0.2 N(0, 1) (as the live checkpoints;
Qwen3.5's gated DeltaNet norm ``w * x`` is not zero-centred: 1 + 0.2 N(0, 1)); Gemma 4's layer scalars 0.5 + U(0, 1)
(HF initialises them to 1, where the multiply is exact) and its HF per-layer-input scales set to the engine's bf16
numbers on every side (``bf16_scales``: a constant's dtype is no rounding point, docs/families.md "Gemma 4 scale
constants"). Shapes: 1 x 512 and 1 x 2048 from position 0, 2 x 512 from 20000 (``--quick``: the first only).

Sides, per family and mode (profile ``vllm-0.33`` / ``vllm-0.33-eager``):

- ``hf``: HF eager, unaligned; ``rla``: ``rla.align`` with rla's ops (its kernels on CUDA where it
  has them; ``rla.align`` takes no other ops on these families);
- Gemma 3: ``oracle`` (tests/gemma_spec.py under the row's Gemma points, its zero_centred_norm
  variant's ``post_norm_out`` included: what ``rla.align`` computes), ``oracle+post-norm-round`` and
  ``oracle+post-norm-fp32`` (the post-attention / post-feed-forward norms' outputs rounded, or
  unrounded into the adds: the CPU twin's default-mode chain, which ``vllm-0.33`` now says),
  ``oracle+post-norm+embed-fp32`` (also the scaled embedding unrounded into the first norm, which the
  CPU cannot tell: sqrt(64) = 8);
- Gemma 4: ``oracle`` (tests/gemma4_spec.py under the row's Gemma 4 points: what ``rla.align``
  computes), ``oracle+cpu-chains`` (with the four chains the CPU twin's default mode adds,
  ``gemma4_spec.CHAINS`` less ``embed_fp32``: the per-layer inputs one fp32 chain, the per-layer-input
  add reading the rounded sum, the norms after a layer and after the embedding taking their mean
  square from the unrounded value), ``oracle+cpu-chains-wide`` (the same with the first norm reading
  the scaled embedding unrounded, ``embed_fp32``: what another compilation of the CPU twin's first piece
  does at hidden 2560) and
  ``oracle+<chain>`` with each alone: which of them Triton's fusion keeps on the GPU (in eager mode the
  row should win);
- GLM-4 MoE: ``oracle`` with the routed experts' activation ``per_op`` (the twin runs vLLM's CUDA
  ``silu_and_mul`` for them in both modes, as its fused MoE does) and ``oracle+experts-sum-fp32``
  (the shared + routed sum unrounded into the residual add: the CPU twin's chain, which ``vllm-0.33``'s
  moe_experts variant now says, ``moe_out='fp32'``, so the ``rla`` side has it too);
- Qwen3.5: ``oracle`` (tests/qwen3_5_spec.py under the row's Qwen3.5 points: what ``rla.align`` computes, the
  output gate as the row's ``attn_gate`` says: ``fused`` in default mode, the CPU twin's finding, Inductor's fused
  sigmoid * mul; ``per_op`` in eager mode, two PyTorch ops), ``oracle+gate-once`` (``attn * sigmoid(gate)``
  rounded once whatever the row says) and ``oracle+gate-per-op`` (HF's two roundings whatever the row says);
- Qwen3.5 MoE: ``oracle`` (the same oracle with its MoE block, HF's router, the routed experts' activation as the
  row's moe_experts variant says: vLLM's CUDA ``silu_and_mul`` in both modes, ``per_op``; ``shared + routed`` as
  its ``moe_out`` says: unrounded into the residual add in default mode, the CPU twin's finding, as on GLM-4 MoE)
  and ``oracle+experts-sum-round`` (that sum rounded whatever the row says);
- GPT-OSS: ``rla-rope-fp32`` / ``rla-rope-round``: aligned with ``rope_cos_sin='fp32'`` / ``'round'``
  for GPT-OSS (the fp32 YaRN cache cast inside the compiled graph: the CPU twin's default-mode
  finding, which ``vllm-0.33``'s gpt_oss variant now says; in eager mode the cast happens before the
  kernel, so the row should win there).

Per row: fraction of bit-equal logits, k3 of tokens sampled from the twin, KL(twin || side), the
fraction bit-equal of each layer's residual stream, seconds.
"""

from __future__ import annotations

import json
import time

import torch

FAMILIES = ("gemma3-h2560", "gemma4-h2560", "glm4moe-h2048", "gptoss-h2880", "qwen35-h2048", "qwen35moe-h2048")
#: The default-mode chains the CPU twin of Gemma 4 found (tests/engines/test_vllm_twin_families.py); the first norm
#: normalises the rounded scaled embedding (``embed_variance_fp32``) in the twin's forward, and the fp32 one
#: (``embed_fp32``) where the same first piece, compiled again on a plain [T] input, was called directly at hidden
#: 2560: Inductor's choice there is not stable across compilations (docs/families.md, Gemma 4), so both are sides.
GEMMA4_CHAINS = ("ple_fp32", "ple_add_rounded", "stream_variance_fp32", "embed_variance_fp32")
GEMMA4_WIDE_CHAINS = ("ple_fp32", "ple_add_rounded", "stream_variance_fp32", "embed_fp32")
SHAPES = [(1, 512, 0), (1, 2048, 0), (2, 512, 20000)]


def configs(layers: int, scale: float = 1.0) -> dict:
    """The configs of :data:`FAMILIES`; ``scale`` < 1 shrinks widths and heads for a CPU smoke run."""
    import live_family_configs as fam
    from vllm_live_h200 import gemma3_config

    cfgs = {"gemma3-h2560": gemma3_config(layers), "glm4moe-h2048": fam.glm4_moe(layers),
            "gptoss-h2880": fam.gpt_oss(layers), "qwen35-h2048": fam.qwen3_5(layers).text_config,
            "qwen35moe-h2048": fam.qwen3_5_moe(layers).text_config}
    cfgs["gemma3-h2560"].max_position_embeddings = 32768
    small = {} if scale == 1.0 else {  # Gemma 4's config derives its per-layer attributes when built
        "hidden_size": max(64, int(2560 * scale) // 64 * 64),
        "intermediate_size": max(64, int(10240 * scale) // 64 * 64),
        "num_attention_heads": max(2, int(8 * scale) // 2 * 2), "num_key_value_heads": 1,
        "head_dim": max(16, int(256 * scale) // 16 * 16), "hidden_size_per_layer_input": max(16, int(256 * scale))}
    cfgs["gemma4-h2560"] = fam.gemma4(layers, max_position_embeddings=32768, **small)
    if scale != 1.0:
        for name, cfg in cfgs.items():
            if name.startswith("gemma4-"):
                continue
            heads = max(2, int(cfg.num_attention_heads * scale) // 2 * 2)
            cfg.num_attention_heads, cfg.num_key_value_heads = heads, max(1, heads // 2)
            cfg.head_dim = max(16, int(cfg.head_dim * scale) // 16 * 16)
            cfg.hidden_size = max(64, int(cfg.hidden_size * scale) // 64 * 64)
            for width, step in (("intermediate_size", 64), ("moe_intermediate_size", 32),
                                ("shared_expert_intermediate_size", 32)):
                if getattr(cfg, width, None):  # Qwen3.5 MoE has no dense intermediate_size
                    setattr(cfg, width, max(step, int(getattr(cfg, width) * scale) // step * step))
            if hasattr(cfg, "query_pre_attn_scalar"):
                cfg.query_pre_attn_scalar = cfg.head_dim
            if hasattr(cfg, "linear_num_key_heads"):  # Qwen3.5: its linear heads, mRoPE's sections of the rotary half
                cfg.linear_num_key_heads = cfg.linear_num_value_heads = max(2, int(cfg.linear_num_key_heads * scale))
                width = max(16, int(cfg.linear_key_head_dim * scale) // 16 * 16)
                cfg.linear_key_head_dim = cfg.linear_value_head_dim = width
                half = int(cfg.head_dim * cfg.rope_parameters["partial_rotary_factor"]) // 2
                cfg.rope_parameters["mrope_section"] = [half - 2 * (half // 3), half // 3, half // 3]
    return cfgs


def build(name: str, cfg, device: str, seed: int = 0):
    """A random-init bf16 model (eager attention and experts) with the live checkpoints' norm init."""
    import transformers

    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(
        cfg, dtype=torch.bfloat16, attn_implementation="eager", experts_implementation="eager").to(device).eval()
    g = torch.Generator(device=device).manual_seed(seed + 1)
    zero_centred = name.startswith(("gemma3-", "qwen35-", "qwen35moe-"))
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if pname.endswith("norm.weight"):
                noise = 0.2 * torch.randn(p.shape, generator=g, device=device)
                gated = pname.endswith("linear_attn.norm.weight")  # Qwen3.5's gated DeltaNet norm: w * x
                p.copy_(noise if zero_centred and not gated else 1 + noise)
        if name.startswith("gemma4-"):
            for layer in model.model.layers:
                layer.layer_scalar.copy_(0.5 + torch.rand(1, generator=g, device=device))
    if name.startswith("gemma4-"):
        bf16_scales(model)
    return model


def bf16_scales(model):
    """HF's Gemma 4 per-layer-input scales (Python floats) set to the bf16 numbers vLLM multiplies by."""
    body = model.model
    body.per_layer_input_scale = float(torch.tensor(2 ** -0.5).to(torch.bfloat16))
    body.per_layer_model_projection_scale = float(torch.tensor(model.config.hidden_size ** -0.5).to(torch.bfloat16))


def _oracle_side(forward, model, **kwargs):
    def run(ids, positions):
        streams = []
        with torch.no_grad():
            logits = forward(model, ids, positions=positions, streams=streams, **kwargs)
        return logits.to(model.model.embed_tokens.weight.dtype), streams

    return run


def sides(name: str, model, prof) -> dict:
    from rla.engines.twin_compare import aligned_side, hf_side

    out = {"hf": hf_side(model), "rla": aligned_side(model, prof)}  # (rla.align takes no other ops on these)
    if name.startswith("gemma3-"):
        from gemma_spec import gemma_points, spec_forward

        pts = gemma_points(prof.name)
        out["oracle"] = _oracle_side(spec_forward, model, pts=pts)
        out["oracle+post-norm-round"] = _oracle_side(spec_forward, model, pts=pts, post_norm_fp32=False)
        out["oracle+post-norm-fp32"] = _oracle_side(spec_forward, model, pts=pts, post_norm_fp32=True)
        out["oracle+post-norm+embed-fp32"] = _oracle_side(spec_forward, model, pts=pts, post_norm_fp32=True,
                                                          embed_fp32=True)
    elif name.startswith("gemma4-"):
        from gemma4_spec import gemma4_points, spec_forward

        pts = gemma4_points(prof.name)
        out["oracle"] = _oracle_side(spec_forward, model, pts=pts)
        out["oracle+cpu-chains"] = _oracle_side(spec_forward, model, pts=pts, chains=GEMMA4_CHAINS)
        out["oracle+cpu-chains-wide"] = _oracle_side(spec_forward, model, pts=pts, chains=GEMMA4_WIDE_CHAINS)
        for chain in dict.fromkeys(GEMMA4_CHAINS + GEMMA4_WIDE_CHAINS):
            out[f"oracle+{chain}"] = _oracle_side(spec_forward, model, pts=pts, chains=(chain,))
    elif name.startswith("glm4moe-"):
        from align_spec import SPEC, Row, at_head_size
        from glm4_moe_spec import spec_forward

        pts = at_head_size(Row(dict(SPEC[prof.name]), SPEC[prof.name].fused_head_sizes), model.config.head_dim)
        experts = {**pts, "swiglu": "per_op"}  # vLLM's CUDA silu_and_mul, in both modes
        out["oracle"] = _oracle_side(spec_forward, model, pts=pts, expert_pts=experts, moe_sum_fp32=False)
        out["oracle+experts-sum-fp32"] = _oracle_side(spec_forward, model, pts=pts, expert_pts=experts,
                                                      moe_sum_fp32=True)
    elif name.startswith("qwen35-"):
        from qwen3_5_spec import qwen3_5_points, spec_forward

        pts = qwen3_5_points(prof.name)
        out["oracle"] = _oracle_side(spec_forward, model, pts=pts)
        out["oracle+gate-once"] = _oracle_side(spec_forward, model, pts=pts, gate_once=True)
        pts.attention = {**pts.attention, "attn_gate": "per_op"}
        out["oracle+gate-per-op"] = _oracle_side(spec_forward, model, pts=pts)
    elif name.startswith("qwen35moe-"):
        from qwen3_5_spec import qwen3_5_points, spec_forward

        pts = qwen3_5_points(prof.name)
        out["oracle"] = _oracle_side(spec_forward, model, pts=pts)
        rounded = qwen3_5_points(prof.name)
        rounded.moe_out = None  # align_spec.Row: RN(shared + routed) before the residual add
        out["oracle+experts-sum-round"] = _oracle_side(spec_forward, model, pts=rounded)
    elif name.startswith("gptoss-"):
        out["rla-rope-fp32"] = aligned_side(model, prof.replace(name=f"{prof.name}+rope_cos_sin=fp32",
                                                                rope_cos_sin="fp32"))
        rounded = prof.replace_variant("gpt_oss", name=f"{prof.name}+rope_cos_sin=round", rope_cos_sin="round")
        out["rla-rope-round"] = aligned_side(model, rounded)
    return out


def run(engine, modes, library, out_path, quick=False, only=(), layers=4, scale=1.0, device="cuda", stamp=None):
    """Every family in ``only`` (default all) and mode: the twin, the sides, one JSON of rows."""
    from engine_twin_h200 import twin_rows  # beside this file: the stage that runs this one

    from rla import profiles
    from rla.engines.vllm_twin_families import build_twin

    names = [n for n in FAMILIES if not only or n in only]
    shapes = SHAPES[:1] if quick else SHAPES
    cfgs = configs(layers, scale)
    rows = []
    for name in names:
        model = build(name, cfgs[name], device)
        for mode in modes:
            prof = profiles.get("vllm-0.33" if mode == "default" else "vllm-0.33-eager")
            t0 = time.time()
            twin = build_twin(model, engine, mode, library)
            side_fns = sides(name, model, prof)
            rows += twin_rows(twin, side_fns, shapes, model, name, mode, prof, device, width=28)
            print(f"  ({name} {mode} since its twin: {time.time() - t0:.1f}s)", flush=True)
            del twin
        del model
        if device == "cuda":
            torch.cuda.empty_cache()
    out_path.write_text(json.dumps({"environment": stamp, "provenance": {**engine.provenance,
                                                                          **engine.family_ops().provenance},
                                    "rows": rows}, indent=2))
    return rows


def summarize(path) -> str:
    """Markdown tables of a ``twin_families.json``: per family and mode, each side's bit-equal logits,
    k3 and KL per shape."""
    rows = json.loads(path.read_text())["rows"]
    out = []
    for name, mode in dict.fromkeys((r["model"], r["mode"]) for r in rows):
        mine = [r for r in rows if (r["model"], r["mode"]) == (name, mode)]
        names = list(dict.fromkeys(r["side"] for r in mine))
        out.append(f"\n### {name}, {mode} mode (profile {mine[0]['profile']}): logits bit-equal / k3 / KL\n")
        out.append("| batch x tokens @ first position | " + " | ".join(names) + " |")
        out.append("|---|" + "---|" * len(names))
        for b, s, off in dict.fromkeys((r["batch"], r["tokens"], r["position_offset"]) for r in mine):
            cells = []
            for side in names:
                r = next(x for x in mine if (x["batch"], x["tokens"], x["position_offset"], x["side"]) == (b, s, off, side))
                cells.append(f"{r['logits_equal']:.2%} / {r['k3']:.2g} / {r['kl']:.2g}")
            out.append(f"| {b}x{s} @ {off} | " + " | ".join(cells) + " |")
    return "\n".join(out)
