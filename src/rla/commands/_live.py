"""What ``rla verify --live`` and ``rla calibrate --live`` share: their flags, the checks that run
before vLLM is imported, starting the engine and collecting its logprobs.

Every check is a one-line error before anything expensive: a flag of the other path, a mode vLLM
does not have, a model folder that is not an HF checkpoint of a family rla aligns (or whose
positions the prompts pass), then -- last, because it is what a CPU machine fails on -- vLLM
missing or in a version the live adapter has not run, and no GPU
(:func:`rla.engines.vllm_live.preflight`).
"""

from __future__ import annotations

import argparse

from rla.commands._args import positive_float, positive_int

__all__ = ["add_live_arguments", "LIVE_FLAGS", "token_list", "check_live", "check_model", "run_engine",
           "DECODE_PROMPT_TOKENS", "train_attention", "saved_engine", "engine_data", "ENGINE_RUN_FLAGS",
           "train_device", "check_saved_kernel", "weigh", "engine_code"]

DECODE_PROMPT_TOKENS = 256
"""Tokens of each decode prompt (random tokens; one sampled response per prompt)."""

#: The flags only the live path reads (dest -> flag), None unless given.
LIVE_FLAGS = {"prompt_tokens": "--prompt-tokens", "responses": "--responses", "max_new_tokens": "--max-new-tokens",
              "attention_backend": "--attention-backend", "gpu_memory_utilization": "--gpu-memory-utilization",
              "train_attention": "--train-attention", "engine_outputs": "--engine-outputs",
              "gdn_prefill_backend": "--gdn-prefill-backend"}

#: The flags that configure an engine run (dest -> flag): refused with --engine-outputs, whose run is over.
ENGINE_RUN_FLAGS = {dest: flag for dest, flag in LIVE_FLAGS.items()
                    if dest in ("prompt_tokens", "responses", "max_new_tokens", "attention_backend",
                                "gpu_memory_utilization", "gdn_prefill_backend")}


def token_list(text: str) -> list[int]:
    """``--prompt-tokens 512,2048``: prompt lengths, each >= 2 (a prompt logprob needs a token before it)."""
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of integers") from None
    if not values or any(v < 2 for v in values):
        raise argparse.ArgumentTypeError(f"prompt lengths must each be >= 2 tokens, got {text!r}")
    return values


def add_live_arguments(parser, default_prompts: str) -> None:
    from rla.engines.vllm_live import GDN_PREFILL_BACKENDS  # vLLM is not imported by it
    parser.add_argument("--live", action="store_true",
                        help="run vLLM itself (vllm.LLM on --model, on a GPU; vLLM 0.26 installed): its own prompt "
                        "logprobs and sampled tokens, in --mode default or eager (docs/engines.md)")
    parser.add_argument("--prompt-tokens", type=token_list, default=None,
                        help=f"--live: prompt lengths, comma-separated (default {default_prompts}); random tokens")
    parser.add_argument("--responses", type=positive_int, default=None,
                        help="--live: sampled responses, one per random prompt of "
                        f"{DECODE_PROMPT_TOKENS} tokens (default 8)")
    parser.add_argument("--max-new-tokens", type=positive_int, default=None,
                        help="--live: tokens per sampled response (default 128)")
    parser.add_argument("--attention-backend", default=None,
                        help="--live: vLLM's attention backend (default TRITON_ATTN; 'auto': vLLM's own choice)")
    parser.add_argument("--train-attention", choices=("model", "engine"), default=None,
                        help="--live: the attention the training side scores with: 'model' (the model's own, "
                        "e.g. SDPA: what a trainer runs) or 'engine' (vLLM's own Triton kernel, so only the "
                        "rounding points differ; needs --attention-backend TRITON_ATTN). Default: model for "
                        "verify, engine for calibrate (docs/engines.md)")
    parser.add_argument("--engine-outputs", default=None, metavar="DIR",
                        help="--live: score the engine's outputs an earlier `rla verify --live` wrote to DIR "
                        "(engine.json, rollouts.jsonl) instead of starting vLLM: the engine runs once, the training "
                        "side as often as needed, on any device (vLLM is then needed only for --train-attention "
                        "engine); --model must be the checkpoint the engine ran (checked by its weights)")
    parser.add_argument("--gdn-prefill-backend", default=None, choices=GDN_PREFILL_BACKENDS,
                        help="--live: vLLM's kernels for a Gated DeltaNet layer's prefill (Qwen3.5's linear "
                        "attention; default: vLLM's choice, FlashInfer's on Hopper, which compiles at start)")
    parser.add_argument("--gpu-memory-utilization", type=positive_float, default=None,
                        help="--live: the share of GPU memory vLLM may take (default 0.5; the training side "
                        "loads after the engine is closed)")


def check_live(args, other_flags: dict[str, object], other: str) -> None:
    """Flags of one path given to the other are refused (nothing is silently ignored); ``other``
    names the path ``other_flags`` configure."""
    if args.live:
        given = [flag for dest, (flag, unset) in other_flags.items() if getattr(args, dest) != unset]
        if given:
            raise ValueError(f"{', '.join(given)}: set{'s' if len(given) == 1 else ''} up {other}, not the live "
                             f"engine; drop {'it' if len(given) == 1 else 'them'} with --live")
        if args.mode is not None and args.mode not in ("default", "eager"):
            raise ValueError(f"--live --mode {args.mode}: the live engine runs vLLM's own modes, default "
                             "(-O2 compile, CUDA graphs) or eager (enforce_eager)")
    else:
        given = [flag for dest, flag in LIVE_FLAGS.items() if getattr(args, dest) is not None]
        if given:
            raise ValueError(f"{', '.join(given)}: only used with --live; add --live or drop "
                             f"{'it' if len(given) == 1 else 'them'}")


def check_model(path: str, longest: int) -> dict:
    """The model folder's config, checked: an HF checkpoint, readable weights of its shapes, a
    family rla aligns, and room for ``longest`` positions. Returns its family and shape."""
    from pathlib import Path

    from rla.alignment.families import get_family
    from rla.engines.live_verify import model_info
    from rla.hf import causal_lm_config, check_safetensors, read_config

    p = Path(path)
    if not (p / "config.json").is_file():
        raise FileNotFoundError(f"--model {path}: not an HF checkpoint folder (no config.json)")
    config = read_config(p)
    cap = getattr(config, "final_logit_softcapping", None)
    if cap:
        raise ValueError(f"--model {path}: final_logit_softcapping={cap}: the training side's logprobs are "
                         "log_softmax of the LM head's logits (rla.engines.live_calibration.train_logprobs), without "
                         "the cap the engine applies; not scored live")
    if not any(p.glob("*.safetensors")):
        raise FileNotFoundError(f"--model {path}: no *.safetensors weights (vLLM and rla both read safetensors)")
    check_safetensors(p, config)
    checkpoint, config = config, causal_lm_config(config)  # a multimodal checkpoint's text model, as a trainer loads it
    get_family(getattr(config, "model_type", None), f"--model {path}")
    limit = getattr(config, "max_position_embeddings", None)
    if limit is not None and longest > limit:
        raise ValueError(f"--model {path}: sequences of {longest} tokens pass its max_position_embeddings ({limit}); "
                         "lower --prompt-tokens or --max-new-tokens")
    info = model_info(config)
    if config is not checkpoint:  # the engine runs the checkpoint's language model alone (vLLM's language_model_only)
        info["checkpoint"] = {"model_type": checkpoint.model_type, "architectures": getattr(checkpoint, "architectures", None)}
        info["language_model_only"] = True
    return info


def settings_of(args, longest: int, info: dict | None = None):
    from rla.engines.vllm_live import LiveSettings

    backend = args.attention_backend or "TRITON_ATTN"
    return LiveSettings(mode=args.mode, attention_backend=None if backend == "auto" else backend,
                        max_model_len=max(longest + 64, 1024), seed=args.seed,
                        gpu_memory_utilization=args.gpu_memory_utilization or 0.5,
                        language_model_only=bool((info or {}).get("language_model_only")),
                        gdn_prefill_backend=gdn_backend(args, info),
                        return_routed_experts=bool(getattr(args, "replay_routes", False)))


#: families with Gated DeltaNet layers (the only layers --gdn-prefill-backend reaches)
GDN_FAMILIES = ("qwen3_5_text", "qwen3_5_moe_text", "qwen3_next")


def gdn_backend(args, info: dict | None) -> str | None:
    """``--gdn-prefill-backend``, refused for a model without Gated DeltaNet layers (vLLM would ignore it)."""
    backend = getattr(args, "gdn_prefill_backend", None)
    family = (info or {}).get("family")
    if backend is not None and info is not None and family not in GDN_FAMILIES:
        raise ValueError(f"--gdn-prefill-backend {backend}: the model ({family}) has no Gated DeltaNet layers; "
                         f"the flag reaches only {', '.join(GDN_FAMILIES)}")
    return backend


def run_engine(args, settings, vocab: int, say, route_layers=None):
    """Start the engine, collect prefill and decode (:func:`rla.engines.live_verify.collect`; with
    ``route_layers``, the engine's routes at those MoE decoder layers too), close it."""
    from rla.engines.live_verify import collect, random_prompts
    from rla.engines.vllm_live import LiveVllm

    prompts = random_prompts(vocab, args.prompt_tokens, args.seed)
    decode = random_prompts(vocab, [DECODE_PROMPT_TOKENS] * args.responses, args.seed + 1)
    say(f"starting vLLM on {args.model} ({settings.mode} mode, attention {settings.attention_backend or 'auto'})")
    engine = LiveVllm(args.model, settings)
    try:
        say(f"vLLM {engine.version}: prompt logprobs of {len(prompts)} prompts, {len(decode)} sampled responses")
        data = collect(engine, prompts, decode, max_new_tokens=args.max_new_tokens, seed=args.seed + 1,
                       route_layers=route_layers)
    finally:
        engine.close()
    return data


def saved_engine(args):
    """The engine data of ``--engine-outputs`` (:func:`rla.engines.live_verify.load`), or None
    without it; the flags of an engine run and a ``--mode`` other than the data's are refused, and
    ``args.mode`` is set to the data's mode when not given."""
    if args.engine_outputs is None:
        return None
    given = [flag for dest, flag in ENGINE_RUN_FLAGS.items() if getattr(args, dest) is not None]
    if given:
        raise ValueError(f"{', '.join(given)}: set{'s' if len(given) == 1 else ''} up an engine run; --engine-outputs "
                         f"scores one that is over: drop {'it' if len(given) == 1 else 'them'}")
    from rla.engines.live_verify import load

    data = load(args.engine_outputs)
    if args.mode is not None and args.mode != data.engine["mode"]:
        raise ValueError(f"--mode {args.mode}: the engine outputs in {args.engine_outputs} are from {data.engine['name']} "
                         f"{data.engine['version']} in {data.engine['mode']} mode; drop --mode or give that one")
    args.mode = data.engine["mode"]
    return data


def run_length(args, saved) -> int:
    """The longest sequence the training side will score: the saved run's, else the run's to come
    (its longest prompt, or a decode prompt and its response)."""
    from rla.engines.live_verify import longest

    if saved is not None:
        return longest(saved)
    return max(max(args.prompt_tokens), DECODE_PROMPT_TOKENS + args.max_new_tokens)


def engine_side(args, saved, longest: int, default_attention: str, info: dict | None = None):
    """``(settings, attention, attending, version, device)`` of a live run (``saved`` None) or of a
    saved one, each refusal before the engine starts: the engine's settings, the training side's
    attention (:func:`train_attention`), the engine's version (:func:`rla.engines.vllm_live.preflight`
    for a run to come; the saved run's, with :func:`check_saved_kernel`), and the training device."""
    from rla.engines.vllm_live import preflight

    settings = saved.engine.get("settings", {}) if saved is not None else settings_of(args, longest, info)
    attention, attending = train_attention(args, settings, default_attention)
    if saved is None:
        version = preflight(args.model)  # vLLM installed, a version the adapter ran, a GPU: still not imported
    else:
        version = saved.engine["version"]
        check_saved_kernel(saved, attention, args.model)
    return settings, attention, attending, version, train_device(saved, attention)


def engine_data(args, saved, settings, vocab: int, say, route_layers=None):
    """The saved data, or a fresh engine run (:func:`run_engine`)."""
    if saved is not None:
        say(f"the engine outputs of {args.engine_outputs}: {saved.engine['name']} {saved.engine['version']}, "
            f"{saved.engine['mode']} mode, {len(saved.prompts)} prompts, {len(saved.records)} responses (no engine started)")
        return saved
    return run_engine(args, settings, vocab, say, route_layers)


def train_device(saved, attention: str) -> str:
    """Where the training side scores: CUDA for a live run or the engine's attention; a saved run
    with the model's own attention also on a machine without a GPU."""
    import torch

    if saved is None or attention != "model" or torch.cuda.is_available():
        return "cuda"
    return "cpu"


def check_saved_kernel(saved, attention: str, model_path: str) -> None:
    """Saved outputs scored with the engine's attention need that kernel from the same vLLM
    version, on a GPU: the installed vLLM's version must be the data's."""
    if saved is None or attention == "model":
        return
    from rla.engines.source import EngineUnavailable
    from rla.engines.vllm_live import preflight

    installed = preflight(model_path)
    if installed != saved.engine["version"]:
        raise EngineUnavailable(f"--train-attention engine runs the installed vLLM's kernel ({installed}); the engine "
                                f"outputs are from vLLM {saved.engine['version']}: install that or use "
                                "--train-attention model")


def train_attention(args, settings, default: str):
    """``(name, context factory)`` of the attention the training side scores with: ``model`` (a
    no-op) or ``engine`` (:func:`rla.engines.vllm_attention.engine_attention` for the engine's
    backend), checked before the engine starts. ``settings`` is the run's
    :class:`rla.engines.vllm_live.LiveSettings`, or the saved run's settings dict."""
    import contextlib

    from rla.engines.vllm_attention import BACKENDS, engine_attention

    choice = args.train_attention or default
    if choice == "model":
        return "model", lambda model: contextlib.nullcontext()
    backend = settings.get("attention_backend") if isinstance(settings, dict) else settings.attention_backend
    if backend not in BACKENDS:
        raise ValueError(f"--train-attention engine runs the kernel of the engine's {' / '.join(BACKENDS)} backend; "
                         f"this engine {'ran' if isinstance(settings, dict) else 'starts'} with --attention-backend "
                         f"{backend or 'auto'}: use "
                         f"--attention-backend TRITON_ATTN or --train-attention model")
    return f"engine ({backend}: vLLM's unified_attention)", lambda model: engine_attention(model, backend)


def weigh(data, saved, model, where: str):
    """The engine data with the weights that made it (:func:`rla.engines.live_verify.with_weights`):
    a fresh run is stamped with the model's fingerprint (the checkpoint the engine ran); saved
    outputs must name the same weights, or none."""
    from rla.engines.live_verify import check_weights, with_weights
    from rla.rollout.fingerprint import weights_fingerprint

    fingerprint = weights_fingerprint(model)
    if saved is not None:
        check_weights(data, fingerprint, where)
        return data
    return with_weights(data, fingerprint)


def engine_code(args, info: dict, version: str, device: str):
    """``--engine-forward`` with ``--live``: the engine's code for the engine-backed side
    (:func:`rla.engines.vllm.load`: the installed vLLM, or ``--wheel``), checked before the engine
    starts; None without the flag (and then ``--wheel`` / ``--library`` are refused). The code must
    be the version the engine ran (``version``: the installed one, or the saved run's), the
    model a family the engine-backed forward covers, and eager mode's kernels need CUDA."""
    if not args.engine_forward:
        given = [flag for dest, flag in (("wheel", "--wheel"), ("library", "--library")) if getattr(args, dest)]
        if given:
            raise ValueError(f"{', '.join(given)}: with --live, only used by --engine-forward (the engine-backed "
                             f"side); add it or drop {'it' if len(given) == 1 else 'them'}")
        return None
    from rla.engines import vllm
    from rla.engines.source import EngineUnavailable
    from rla.engines.vllm_twin import SUPPORTED_FAMILIES

    if info["family"] not in SUPPORTED_FAMILIES:
        raise NotImplementedError(f"--engine-forward: the engine-backed forward covers {', '.join(SUPPORTED_FAMILIES)}; "
                                  f"--model is {info['family']!r}: drop --engine-forward")
    if args.mode == "eager" and device != "cuda":
        raise EngineUnavailable("--engine-forward in eager mode runs vLLM's CUDA kernels per op (rla.engines.backed): "
                                "it needs a GPU; score on a GPU machine, or drop --engine-forward (default mode's "
                                "pieces also run on CPU)")
    if args.library is not None and args.mode != "eager":
        raise ValueError("--library: vLLM's CUDA kernels serve --engine-forward in eager mode only; drop it")
    engine = vllm.load(args.wheel)
    if engine.version != version:
        raise EngineUnavailable(f"--engine-forward runs vLLM {engine.version}'s code ({engine.package.origin}); the "
                                f"engine {'outputs are' if args.engine_outputs else 'is'} vLLM {version}: "
                                f"{'pass --wheel of' if args.wheel is None else 'give --wheel'} vLLM {version}")
    return engine
