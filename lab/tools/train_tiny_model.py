"""Train a small model on a synthetic task with the SFT warm start and save it with its record.

Makes the bundled model (``src/rla/assets/tiny-qwen2``) and the Qwen2 / Qwen3 / Llama warm-start
models of the GRPO experiments. The output folder holds what ``from_pretrained`` reads
(``config.json``, ``model.safetensors`` in bf16, the tokenizer files), ``task.json`` (the task and
difficulty, for ``get_task(**spec)``) and ``TRAINING.md`` (command, time, loss, accuracy, GPU,
versions, date, and the command that reproduces the run step for step).

The bundled model, as recorded in its TRAINING.md (751 steps of 256 problems, ~2 min on a shared
H200):

    python lab/tools/train_tiny_model.py --arch qwen2 --size tiny --task addition --difficulty 12 \\
        --lr 2e-3 --evals 3 --max-mb 10 --steps 751 --out src/rla/assets/tiny-qwen2

A Qwen3 / Llama warm start for the GRPO experiments (records only, no weights):

    python lab/tools/train_tiny_model.py --arch qwen3 --size 10m --task addition --difficulty 12 \\
        --lr 1.5e-3 --time-budget 55 --no-weights --out runs/qwen3-10m-add12

``--time-budget S`` without ``--steps`` times a few steps on a throw-away copy of the model and
picks the step count that fits in S seconds; the record then gives the explicit ``--steps``.
"""

from __future__ import annotations

import argparse
import copy
import datetime
import json
import platform
import random
import shlex
import sys
import time
from pathlib import Path

import torch

from rla.models import ARCHS, SIZES, build_model, param_count, tiny_config
from rla.rl.sft import encode_batch, evaluate, sft_train
from rla.rl.tasks import TASKS, get_task
from rla.rl.tokenizer import build_tokenizer


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--arch", choices=ARCHS, default="qwen2")
    p.add_argument("--size", choices=list(SIZES), default="tiny")
    p.add_argument("--task", choices=sorted(TASKS), default="addition")
    p.add_argument("--difficulty", type=int, default=15, help="the task's difficulty knob")
    p.add_argument("--task-kw", action="append", default=[], metavar="KEY=INT",
                   help="another task keyword, e.g. digits=3 for sorting (repeatable)")
    p.add_argument("--steps", type=int, help="optimizer steps (default: from --time-budget)")
    p.add_argument("--time-budget", type=float, help="seconds of training to size --steps by")
    p.add_argument("--time-limit", type=float, help="stop training after this many seconds")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--warmup", type=int, help="warm-up steps (default 5%% of steps)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--eval-size", type=int, default=256, help="held-out problems per evaluation")
    p.add_argument("--evals", type=int, default=4, help="evaluations during training (and one at the end)")
    p.add_argument("--log-every", type=int, default=100)
    p.add_argument("--device", default="auto", help="cuda, cpu or auto")
    p.add_argument("--no-weights", action="store_true", help="write the record only, not the model")
    p.add_argument("--max-mb", type=float, help="fail if model.safetensors is larger than this")
    p.add_argument("--out", required=True, type=Path, help="output folder")
    args = p.parse_args(argv)
    if args.steps is None and args.time_budget is None:
        p.error("give --steps or --time-budget")
    return args


def task_kwargs(args) -> dict:
    kw = {"difficulty": args.difficulty}
    for item in args.task_kw:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--task-kw wants KEY=INT, got {item!r}")
        kw[key] = int(value)
    return kw


def calibrate_steps(model, tokenizer, task, args, device) -> tuple[int, float]:
    """Steps that fit in ``args.time_budget``, from timing a throw-away copy of the model."""
    trial = copy.deepcopy(model).to(device).train()
    opt = torch.optim.AdamW(trial.parameters(), lr=1e-4, fused=device.type == "cuda")
    rng = random.Random(12345)  # not the training stream: the real run starts from its seed
    amp = torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")

    def one():  # a training step as sft_train takes it, data included
        ids, labels = encode_batch(tokenizer, task.sample(rng, args.batch_size), device)
        with amp:
            logits = trial(input_ids=ids).logits
        loss = torch.nn.functional.cross_entropy(logits[:, :-1].float().flatten(0, 1), labels[:, 1:].flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()

    for _ in range(5):
        one()
    if device.type == "cuda":
        torch.cuda.synchronize()
    t = time.perf_counter()
    n = 20
    for _ in range(n):
        one()
    if device.type == "cuda":
        torch.cuda.synchronize()
    per_step = (time.perf_counter() - t) / n
    del trial, opt
    return max(1, int(args.time_budget / per_step)), per_step


def file_mb(path: Path) -> float:
    return path.stat().st_size / 1e6


def write_record(out: Path, args, info: dict, hist, saved_eval: dict | None) -> None:
    ev = hist.final_eval
    lines = [
        f"# {info['name']}: {info['arch']} {info['size']} trained on {info['task_repr']}",
        "",
        "Made by `lab/tools/train_tiny_model.py` (SFT warm start, `rla.rl.sft.sft_train`).",
        "",
        "| | |",
        "|---|---|",
        f"| command | `{info['command']}` |",
        f"| reproduce step for step | `{info['reproduce']}` |",
        f"| date (UTC) | {info['date']} |",
        f"| device | {info['device_name']} |",
        f"| versions | python {platform.python_version()}, torch {torch.__version__}, "
        f"transformers {info['transformers']}, tokenizers {info['tokenizers']} |",
        f"| parameters | {info['params']:,} |",
        f"| model.safetensors | {info.get('file_mb', float('nan')):.2f} MB (bf16) |",
        f"| task | `{json.dumps(info['task_spec'])}`; mean correct response {info['expected_len']:.0f} tokens "
        f"(max {info['max_len']}) |",
        f"| training | {hist.steps_done} steps x {args.batch_size} problems, lr {args.lr:g} (warm-up, cosine "
        f"to 10%), AdamW, fp32 master weights, {info['precision']} compute, seed {args.seed}"
        f"{f' (stopped by --time-limit after step {hist.steps_done})' if hist.stopped_early else ''} |",
        f"| calibration | {info.get('calibration', 'none (--steps given)')} |",
        f"| wall time | {hist.wall_time_s:.1f} s in sft_train (evaluations included); {info['total_s']:.1f} s in all |",
        f"| final training loss | {hist.final_loss:.4f} (mean over the last {args.log_every} steps, "
        "response tokens only, nats/token) |",
        f"| held-out exact match, fp32 master | greedy {ev.get('greedy_acc', float('nan')):.3f}, sampled at "
        f"T=1 {ev.get('sample_acc', float('nan')):.3f} ({args.eval_size} problems) |",
    ]
    if saved_eval:
        lines.append(
            f"| held-out exact match, saved bf16 weights | greedy {saved_eval['greedy_acc']:.3f}, sampled at "
            f"T=1 {saved_eval['sample_acc']:.3f}; mean greedy response {saved_eval['mean_len']:.0f} chars |"
        )
    lines += ["", "## Training log", "", "| step | loss | lr | elapsed s |", "|---|---|---|---|"]
    lines += [f"| {r['step']} | {r['loss']:.4f} | {r['lr']:.2e} | {r['elapsed_s']:.1f} |" for r in hist.train]
    lines += ["", "## Evaluations (fp32 master, held-out)", "", "| step | greedy | sampled T=1 | mean len |",
              "|---|---|---|---|"]
    lines += [f"| {r['step']} | {r['greedy_acc']:.3f} | {r['sample_acc']:.3f} | {r['mean_len']:.0f} |" for r in hist.evals]
    if hist.evals:
        lines += ["", f"Example greedy response: `{hist.evals[-1]['example']}`"]
    (out / "TRAINING.md").write_text("\n".join(lines) + "\n")


def main(argv=None) -> int:
    t_start = time.perf_counter()
    args = parse_args(argv)
    import tokenizers
    import transformers

    device = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device)
    task = get_task(args.task, **task_kwargs(args))
    tokenizer = build_tokenizer()
    config = tiny_config(args.arch, args.size)
    model = build_model(config, seed=args.seed)
    info = {
        "name": args.out.name,
        "arch": args.arch,
        "size": args.size,
        "task_repr": repr(task),
        "task_spec": task.spec(),
        "expected_len": task.expected_length(),
        "max_len": task.max_length(),
        "params": param_count(config),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
        "transformers": transformers.__version__,
        "tokenizers": tokenizers.__version__,
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M"),
        "precision": "bf16 autocast" if device.type == "cuda" else "fp32",
    }
    print(f"{args.arch} {args.size}: {info['params']:,} params; {task!r}: mean response "
          f"{info['expected_len']:.0f} tokens; device {info['device_name']}", flush=True)

    steps = args.steps
    if steps is None:
        steps, per_step = calibrate_steps(model, tokenizer, task, args, device)
        info["calibration"] = f"{per_step * 1e3:.1f} ms/step timed on a copy -> {steps} steps for {args.time_budget:g} s"
        print(info["calibration"], flush=True)
    argv_list = sys.argv[1:] if argv is None else list(argv)
    info["command"] = "python lab/tools/train_tiny_model.py " + shlex.join(argv_list)
    repro = list(argv_list)
    for flag in ("--time-budget", "--time-limit"):  # the step count alone fixes the run
        if flag in repro:
            i = repro.index(flag)
            del repro[i : i + 2]
    if "--steps" not in repro:
        repro += ["--steps", str(steps)]

    hist = sft_train(
        model, tokenizer, task, steps, args.batch_size, args.lr,
        warmup_steps=args.warmup, seed=args.seed, device=device, log_every=args.log_every,
        eval_every=max(1, steps // (args.evals + 1)) if args.evals else None, eval_size=args.eval_size,
        time_limit_s=args.time_limit, log=lambda s: print(s, flush=True),
    )

    args.out.mkdir(parents=True, exist_ok=True)
    saved_eval = None
    if not args.no_weights:
        # save bf16 weights; save_pretrained skips RoPE's inv_freq (a non-persistent buffer), so
        # from_pretrained recomputes it in fp32 however the saved model was cast
        model.to(torch.bfloat16).save_pretrained(args.out)
        tokenizer.save_pretrained(args.out)
        (args.out / "generation_config.json").unlink(missing_ok=True)  # defaults only; keeps $OUT small
        info["file_mb"] = file_mb(args.out / "model.safetensors")
        from transformers import AutoModelForCausalLM

        reloaded = AutoModelForCausalLM.from_pretrained(args.out, dtype=torch.bfloat16, local_files_only=True).to(device)
        held_out = task.sample(random.Random(args.seed + 1), args.eval_size)
        saved_eval = evaluate(reloaded, tokenizer, task, held_out, seed=args.seed)
        print(f"saved bf16 model: {info['file_mb']:.2f} MB; greedy {saved_eval['greedy_acc']:.3f} "
              f"sampled {saved_eval['sample_acc']:.3f} mean_len {saved_eval['mean_len']:.0f}", flush=True)
    # a run cut by --time-limit is reproduced by the same command up to the step it stopped at
    info["reproduce"] = "python lab/tools/train_tiny_model.py " + shlex.join(repro)
    (args.out / "task.json").write_text(json.dumps({"task": task.spec(), "seed": args.seed}, indent=1) + "\n")
    info["total_s"] = time.perf_counter() - t_start
    write_record(args.out, args, info, hist, saved_eval)
    print(f"wrote {args.out} in {info['total_s']:.1f} s; final loss {hist.final_loss:.4f}", flush=True)
    if args.max_mb is not None and info.get("file_mb", 0) > args.max_mb:
        print(f"model.safetensors is {info['file_mb']:.2f} MB > --max-mb {args.max_mb}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
