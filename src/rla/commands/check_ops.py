"""``rla check-ops``: every region under every profile on random Qwen-shaped data."""

from __future__ import annotations

DTYPES = {"bf16": "bfloat16", "fp16": "float16"}


def add_arguments(parser) -> None:
    parser.add_argument("--tokens", type=int, default=512, help="tokens per region (default 512)")
    parser.add_argument("--dtype", choices=list(DTYPES), default="bf16")
    parser.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")


def run(args) -> int:
    import json
    from dataclasses import asdict

    import torch
    from rla.console import console as make_console
    from rich.table import Table

    from rla.ops.compare import QWEN_SHAPES, compare_profiles

    if args.tokens < 1:
        raise ValueError(f"--tokens must be positive, got {args.tokens}")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError("--device cuda asked for, but torch sees no CUDA device")
    results = compare_profiles(
        tokens=args.tokens, dtype=getattr(torch, DTYPES[args.dtype]), device=args.device, seed=args.seed
    )
    if args.json:
        print(json.dumps([asdict(r) for r in results], indent=2))
        return 0
    s = QWEN_SHAPES
    table = Table(
        title=f"Same inputs, five rounding profiles ({args.dtype}, {args.tokens} tokens, Qwen2.5-1.5B "
        f"shapes: hidden {s['hidden']}, MLP {s['intermediate']}, {s['heads']}/{s['kv_heads']} heads x {s['head_dim']})"
    )
    for col in ("region", "profile", "differs from hf", "max |err| vs fp64", "mean |err| vs fp64"):
        table.add_column(col, justify="right" if col != "region" and col != "profile" else "left")
    last = None
    for r in results:
        table.add_row(
            r.region if r.region != last else "",
            r.profile,
            f"{r.differs_from_hf:.1%}",
            f"{r.max_abs_error:.3e}",
            f"{r.mean_abs_error:.3e}",
            end_section=False,
        )
        last = r.region
    console = make_console()
    console.print(table)
    console.print(
        "Each row is one region's output under one profile. 'differs from hf' counts bf16 elements "
        "that are not bit-identical to HF eager's: that is the train/inference mismatch a rollout "
        "engine with that profile injects into every importance ratio before training starts. "
        "Profiles that keep fp32 until the store (vllm, sglang, rla) sit closer to the fp64 oracle."
    )
    return 0
