"""``rla verify --model PATH --engine vllm``: the aligned model against the engine's twin; with
``--live``, against vLLM itself (``rla.commands.verify_live``)."""

from __future__ import annotations

from rla.commands._args import MODEL_HELP, model_path
from rla.commands._live import add_live_arguments

#: Flags of the twin path (dest -> (flag, value when not given)); refused with --live.
#: --engine-forward, --wheel and --library serve both paths (with --live: the engine-backed side).
TWIN_FLAGS = {"tokens": ("--tokens", None),
              "batch": ("--batch", None), "position_offset": ("--position-offset", 0), "json": ("--json", None),
              "expect_exact": ("--expect-exact", False), "device": ("--device", "cuda")}


def add_arguments(parser) -> None:
    parser.add_argument("--model", required=True, type=model_path,
                        help=f"HF checkpoint folder (the twin lays out Qwen2, Qwen3, Llama, Gemma 3, GLM-4 MoE and "
                        f"GPT-OSS; local files only), or {MODEL_HELP}")
    parser.add_argument("--engine", choices=["vllm"], default="vllm", help="the engine whose code the twin runs")
    parser.add_argument("--mode", choices=["default", "eager", "native"], default=None,
                        help="default (the default): native ops under Inductor in pieces split at attention (vLLM "
                        "V1); eager: vLLM's CUDA kernels (enforce_eager); native: native ops uncompiled. With "
                        "--live, the engine's mode (default or eager); with --engine-outputs, the saved run's")
    parser.add_argument("--profile", default=None,
                        help="profile to align to (a name, an alias, or a profile JSON file); default: the "
                        "engine's newest calibrated row for the mode; with --live, a side added to the rows "
                        "of the engine's version")
    parser.add_argument("--wheel", default=None, help="the engine's wheel file, if the engine is not installed "
                        "(with --live: the code of --engine-forward, which must be the live engine's version)")
    parser.add_argument("--library", default=None, help="vLLM's _C_stable_libtorch.abi3.so (or .xz) for --mode eager")
    parser.add_argument("--tokens", type=int, default=None, help="tokens per sequence (default 512)")
    parser.add_argument("--batch", type=int, default=None, help="sequences (default 2)")
    parser.add_argument("--position-offset", type=int, default=0, help="first position (long-context phases)")
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default=None, help="write the full result (per-layer rows too) to this file")
    parser.add_argument("--engine-forward", action="store_true",
                        help="add a side whose forward is the engine's own code (default mode: its compiled "
                        "pieces, rla.engines.vllm_forward; eager: its kernels per op, rla.engines.backed, on a "
                        "GPU); with --live, the side 'engine-forward' of the report, attending with "
                        "--train-attention's attention (docs/engines.md)")
    parser.add_argument("--expect-exact", action="store_true",
                        help="exit 1 unless the logits equal the twin's bit for bit: the engine-backed side's "
                        "with --engine-forward, else the aligned model's (the message names the side judged)")
    add_live_arguments(parser, "512,2048")
    parser.add_argument("--regions", default=None,
                        help="--live: the regions each row's side aligns, comma-separated (default rope,swiglu,rmsnorm; "
                        "'router' too for MoE models but GPT-OSS and GLM-4 MoE: docs/families.md)")
    parser.add_argument("--replay-routes", action="store_true",
                        help="--live, MoE models: the engine returns the experts it routed each token to (vLLM's "
                        "enable_return_routed_experts) and every side is scored a second time routed to them "
                        "(side <side>+routes): what is left is not expert-choice flips; with --engine-outputs, "
                        "data recorded so (docs/engines.md)")
    parser.add_argument("--out", default=None,
                        help="--live: report folder (report.json, report.md, the engine's logprobs and records); "
                        "default rla-verify-live/vllm-<mode>")
    parser.add_argument("--overwrite", action="store_true", help="--live: replace a non-empty --out folder rla wrote")


def _profile(args):
    from pathlib import Path

    from rla import profiles

    if args.profile and Path(args.profile).suffix == ".json":
        return profiles.load(args.profile)
    name = args.profile or (args.engine if args.mode in ("default", "native") else f"{args.engine}-{args.mode}")
    return profiles.get(name)


def _check(args) -> None:
    import torch

    args.tokens = 512 if args.tokens is None else args.tokens
    args.batch = 2 if args.batch is None else args.batch
    for flag in ("tokens", "batch"):
        if getattr(args, flag) < 1:
            raise ValueError(f"--{flag} must be at least 1, got {getattr(args, flag)}")
    if args.position_offset < 0:
        raise ValueError(f"--position-offset must be >= 0, got {args.position_offset}")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError("--device cuda: this torch sees no CUDA device; use --device cpu (default and native modes)")
    if args.mode == "eager" and not args.device.startswith("cuda"):
        raise ValueError("--mode eager runs vLLM's CUDA kernels: it needs --device cuda")
    if args.engine_forward and args.mode == "native":
        raise ValueError("--engine-forward: the engine-backed forward exists for --mode default and eager")
    if args.json is not None:
        from pathlib import Path

        parent = Path(args.json).resolve().parent
        if not parent.is_dir():
            raise FileNotFoundError(f"--json {args.json}: folder {parent} does not exist")


def memory_needed(config, tokens: int, batch: int, dtype) -> int:
    """Estimated bytes of a verify run: both sides' logits and per-layer streams (held whole, they are
    compared element by element) and one side's forward activations (see rla.rollout.prefill)."""
    import torch

    from rla.engines.twin_compare import COMPARE_BYTES
    from rla.rollout.prefill import layer_bytes_per_token

    n = tokens * batch
    size = torch.tensor([], dtype=dtype).element_size()
    held = 2 * n * (config.vocab_size + config.num_hidden_layers * config.hidden_size) * size
    return held + layer_bytes_per_token(config, tokens) * n + COMPARE_BYTES


def run(args) -> int:
    from rla.commands._live import check_live

    check_live(args, TWIN_FLAGS, "the twin")
    if not (args.live and args.engine_outputs):
        args.mode = args.mode or "default"
    if args.live:
        from rla.commands.verify_live import run as run_live

        return run_live(args)
    for dest, flag in (("out", "--out"), ("overwrite", "--overwrite"), ("regions", "--regions"),
                       ("replay_routes", "--replay-routes")):
        if getattr(args, dest):
            raise ValueError(f"{flag}: only used with --live (the twin's report goes to --json); add --live or drop it")
    return _run_twin(args)


def _run_twin(args) -> int:
    import json

    import torch
    from rla.console import console as make_console
    from rich.table import Table

    from rla.engines.twin_compare import aligned_side, compare, hf_side
    from rla.engines import vllm
    from rla.engines import vllm_twin_families
    from rla.hf import load_model

    _check(args)
    profile = _profile(args)
    engine = vllm.load(args.wheel)
    model = load_model(args.model, dtype=torch.bfloat16, device=args.device)
    limit = model.config.max_position_embeddings
    if args.position_offset + args.tokens > limit:
        raise ValueError(
            f"positions {args.position_offset}..{args.position_offset + args.tokens - 1} pass the model's "
            f"max_position_embeddings ({limit})"
        )
    from rla.rollout.prefill import available_bytes, gib

    need = memory_needed(model.config, args.tokens, args.batch, torch.bfloat16)
    avail = available_bytes(torch.device(args.device))
    if avail is not None and need > avail:
        raise ValueError(
            f"--tokens {args.tokens} x --batch {args.batch} needs about {gib(need)} (both sides' logits and per-layer "
            f"streams, held whole to compare them element by element, and one forward's activations); "
            f"{gib(avail)} available on {args.device}: lower --tokens or --batch"
        )
    console = make_console()
    console.print(f"twin: vLLM {engine.version} ({engine.package.origin}), mode {args.mode}; "
                  f"aligned profile: {profile.name}", highlight=False)
    twin = vllm_twin_families.build_twin(model, engine, args.mode, args.library)
    g = torch.Generator().manual_seed(args.seed)
    ids = torch.randint(0, model.config.vocab_size, (args.batch, args.tokens), generator=g).to(args.device)
    positions = (torch.arange(args.tokens) + args.position_offset)[None].expand(args.batch, -1).to(args.device)
    with console.status(f"twin forward: {args.batch} x {args.tokens} tokens"):
        out = twin(ids, positions)
    aligned_name = f"aligned {profile.name}"
    sides = {"hf eager (unaligned)": hf_side(model), aligned_name: aligned_side(model, profile)}
    if args.engine_forward:  # aligned to the row the engine's code realises (its calibrated row)
        ops = _engine_side(engine, args)
        sides[f"aligned {ops.profile.name}, engine's code"] = aligned_side(model, ops.profile, ops=ops)
    meta = {"engine": "vllm", "engine_version": engine.version, "mode": args.mode, "profile": profile.name,
            "model": args.model, "tokens": args.tokens, "batch": args.batch,
            "position_offset": args.position_offset, "device": args.device, "torch": torch.__version__,
            "provenance": engine.provenance}
    from rla.progress import Progress

    bar = Progress(True, transient=True)
    try:
        result = compare((out.logits, out.layers), sides, ids, positions, seed=args.seed, meta=meta,
                         progress=bar.callback(f"training sides: {args.batch} x {args.tokens} tokens each"))
    finally:
        bar.close()

    table = Table(title=f"against the vLLM {engine.version} twin ({args.mode}), {result.tokens} tokens")
    for col in ("training side", "logits bit-equal", "max |dlogit|", "k3", "max |dlogprob|", "KL", "first layer off"):
        table.add_column(col)
    for s in result.sides:
        first = s.first_diverging_layer()
        table.add_row(s.name, f"{s.logits_equal:.4%}", f"{s.logits_max_abs:.3g}", f"{s.k3:.3g}",
                      f"{s.max_abs_delta:.3g}", f"{s.kl:.3g}", "none" if first is None else str(first))
    console.print(table)
    layers = Table(title="residual stream after each layer: fraction bit-equal to the twin")
    layers.add_column("layer")
    for s in result.sides:
        layers.add_column(s.name)
    for i in range(len(result.sides[0].layers)):
        layers.add_row(str(i), *(f"{s.layers[i]['equal']:.4%}" for s in result.sides))
    console.print(layers)
    aligned = next(s for s in result.sides if s.name == aligned_name)
    if aligned.logits_equal < 1.0:
        console.print(_rest_note(profile, args.mode, model.config.model_type), highlight=False)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result.as_dict(), f, indent=2)
    if args.expect_exact:  # the side asked about: the engine's code when --engine-forward, else rla's ops
        judged = result.sides[-1] if args.engine_forward else aligned
        if judged.logits_equal < 1.0:
            first = judged.first_diverging_layer()
            where = f"from layer {first}" if first is not None else "in the logits (every layer bit-equal)"
            console.print(f"[bold red]not exact[/]: '{judged.name}' differs from the twin {where} "
                          f"({judged.logits_equal:.4%} of logits bit-equal)", highlight=False)
            return 1
        console.print(f"exact: '{judged.name}' equals the twin bit for bit", highlight=False)
    return 0


def _engine_side(engine, args):
    from rla.engines.live_verify import engine_backed_forward

    return engine_backed_forward(engine, args.mode, args.library)


#: Families whose default-mode twin computes a chain a row may lack (docs/families.md, each family's section):
#: what it is, and the (variant kind, point, value) triples that say it.
_CHAINS = {"gemma3_text": ("the post-attention / post-feed-forward norms' outputs unrounded into the adds "
                           "(post_norm_out='fp32')", (("zero_centred_norm", "post_norm_out", "fp32"),)),
           "gemma4_text": ("the post-sub-block norms' outputs unrounded into the adds, the per-layer inputs as one "
                           "fp32 chain, the per-layer-input add reading the rounded sum, and the norms after a layer "
                           "and after the embedding taking their mean square from the unrounded value "
                           "(post_norm_out='fp32', ple_inputs='fused', ple_add='rounded', stream_variance='fp32', "
                           "embed_variance='fp32')",
                           tuple(("gemma4", p, v) for p, v in (("post_norm_out", "fp32"), ("ple_inputs", "fused"),
                                                               ("ple_add", "rounded"), ("stream_variance", "fp32"),
                                                               ("embed_variance", "fp32")))),
           "glm4_moe": ("the shared + routed experts' sum unrounded into the residual add (moe_out='fp32')",
                        (("moe_experts", "moe_out", "fp32"),)),
           "gpt_oss": ("the fp32 YaRN cache read unrounded by RoPE (rope_cos_sin='fp32')",
                       (("gpt_oss", "rope_cos_sin", "fp32"),))}


def _rest_note(profile, mode: str, model_type: str | None = None) -> str:
    """What the aligned side's difference from the twin can be, said without guessing which."""
    chain = ""
    said = _CHAINS[model_type][1] if model_type in _CHAINS else ()
    missing = any(getattr(profile.variant(kind), point) != value for kind, point, value in said)
    if mode == "default" and missing:
        chain = (f" On {model_type} the default-mode twin also computes what this row does not say, so the aligned "
                 f"model does not either: {_CHAINS[model_type][0]} (docs/families.md).")
    return _rest_kind(profile, mode) + chain


def _rest_kind(profile, mode: str) -> str:
    if profile.norm_reduction == "unpinned" and mode == "default":
        known = ("the norms' reduction order: this row leaves it unpinned (norm_reduction='unpinned'), and "
                 "Inductor picks a reduction tree per compiled kernel, so rla's kernels add the squares "
                 "in another order. That is the expected rest; a profile that rounds elsewhere than the "
                 "engine would show up here too. Bit-exact: --engine-forward (the engine's compiled pieces "
                 "in the training forward, rla.engines.vllm_forward).")
    else:
        known = (f"not a rest this row expects (norm_reduction={profile.norm_reduction!r}, mode {mode}): a "
                 "rounding location or an arithmetic order the profile gets wrong, e.g. another engine "
                 "version; calibrate it (rla calibrate) or compare with --engine-forward.")
    return f"the aligned side is not bit-equal to the twin. {known}"
