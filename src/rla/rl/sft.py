"""Supervised warm start: train a small model on a task's worked solutions before RL.

RL on a random model learns nothing (every reward is 0), and rounding mismatch measured on a
random model is unrealistic (flat distributions). ``sft_train`` takes a model to a *moderate*
accuracy on a task: high enough that GRPO sees rewards, low enough (20-70% sampled at
temperature 1) that it has room to improve.

Recipe: teacher forcing on ``<bos> prompt solution <eos>`` with the loss on the solution and
``<eos>`` only (the prompt is given, not learned); AdamW (betas 0.9/0.95, weight decay on
matrices), linear warm-up then cosine decay to ``min_lr_ratio * lr``, gradient clipping; fresh
problems every step from a seeded stream, with the held-out evaluation prompts excluded.

Precision: the model keeps **fp32 master weights** and, on CUDA, runs forward and backward under
``torch.autocast(bfloat16)`` (``precision="bf16"``); on CPU the default is plain fp32. This is
how RL trainers hold a policy (fp32 master, bf16 compute), and a bf16 copy saved from it is
RN(master), the same weights an inference engine would load. Padding is on the right, so real
tokens never attend to it and attention runs in its plain causal form with no mask.

Evaluation (``evaluate``) is greedy and sampled (temperature 1, no top-k/top-p) exact match on a
held-out set, through HF ``generate`` with a KV cache: a plain evaluation helper, not the
profile-following rollout sampler of ``rla.rollout.sampler``.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field

import numpy as np
import torch
import torch.nn.functional as F

from rla.rl.lr_schedule import lr_factor
from rla.rl.tasks import Problem, Task
from rla.rl.tokenizer import char_table

__all__ = ["SFTHistory", "sft_train", "encode_batch", "generate_responses", "evaluate"]


@dataclass
class SFTHistory:
    """What ``sft_train`` measured: per-log training rows, evaluation rows, and totals."""

    train: list[dict] = field(default_factory=list)  # step, loss (mean since last row), lr, elapsed_s
    evals: list[dict] = field(default_factory=list)  # step, greedy_acc, sample_acc, mean_len, ...
    steps_done: int = 0
    wall_time_s: float = 0.0
    stopped_early: bool = False  # time_limit or stop_at_sampled reached before ``steps``

    @property
    def final_loss(self) -> float:
        return self.train[-1]["loss"] if self.train else float("nan")

    @property
    def final_eval(self) -> dict:
        return self.evals[-1] if self.evals else {}

    def to_dict(self) -> dict:
        d = asdict(self)
        d["final_loss"] = self.final_loss
        return d


def encode_batch(tokenizer, problems: Sequence[Problem], device=None):
    """Token ids and labels for teacher forcing: ``<bos> prompt solution <eos>``, right-padded.

    Returns ``(input_ids, labels)``, both ``[B, T]`` long; labels are -100 on the prompt (and
    ``<bos>``) and on padding, the token ids on the solution and ``<eos>``.
    """
    table = char_table(tokenizer)
    if table is not None:  # the character tokenizer: a table lookup gives the same ids, fast
        bos = tokenizer("", add_special_tokens=True)["input_ids"]  # what the tokenizer prepends

        def enc(text):
            return table[np.frombuffer(text.encode("ascii", errors="replace"), np.uint8)].tolist()

        prompts = [bos + enc(p.prompt) for p in problems]
        answers = [enc(p.solution) for p in problems]
    else:
        prompts = tokenizer([p.prompt for p in problems], add_special_tokens=True)["input_ids"]
        answers = tokenizer([p.solution for p in problems], add_special_tokens=False)["input_ids"]
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    width = max(len(p) + len(a) for p, a in zip(prompts, answers)) + 1
    ids = np.full((len(problems), width), pad, dtype=np.int64)
    labels = np.full((len(problems), width), -100, dtype=np.int64)
    for i, (p, a) in enumerate(zip(prompts, answers)):
        row = p + a + [eos]
        ids[i, : len(row)] = row
        labels[i, len(p) : len(row)] = row[len(p) :]
    ids, labels = torch.from_numpy(ids), torch.from_numpy(labels)
    if device is not None and torch.device(device).type == "cuda":
        # pinned + non_blocking: the copy does not wait for the GPU, so the next batch is built
        # on the CPU while the current step runs
        ids, labels = ids.pin_memory().to(device, non_blocking=True), labels.pin_memory().to(device, non_blocking=True)
    elif device is not None:
        ids, labels = ids.to(device), labels.to(device)
    return ids, labels


def _autocast(device: torch.device, precision: str):
    if precision == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return nullcontext()


@torch.no_grad()
def generate_responses(
    model,
    tokenizer,
    prompts: Sequence[str],
    max_new_tokens: int,
    temperature: float = 0.0,
    batch_size: int = 256,
    seed: int | None = None,
    precision: str = "fp32",
) -> list[str]:
    """Responses to ``prompts`` (decoded, special tokens dropped): greedy at temperature 0,
    else sampled from the full softmax at ``temperature`` (no top-k, no top-p)."""
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    if seed is not None:
        torch.manual_seed(seed)
    sample = temperature > 0
    kw = dict(do_sample=True, temperature=temperature, top_k=0, top_p=1.0) if sample else dict(do_sample=False)
    out = []
    try:
        for i in range(0, len(prompts), batch_size):
            enc = tokenizer(list(prompts[i : i + batch_size]), return_tensors="pt", padding=True, padding_side="left")
            enc = {k: v.to(device) for k, v in enc.items()}
            with _autocast(device, precision):
                gen = model.generate(
                    **enc,
                    max_new_tokens=max_new_tokens,
                    eos_token_id=tokenizer.eos_token_id,
                    pad_token_id=tokenizer.pad_token_id,
                    use_cache=True,
                    **kw,
                )
            out += tokenizer.batch_decode(gen[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
    finally:
        model.train(was_training)
    return out


def evaluate(
    model,
    tokenizer,
    task: Task,
    problems: Sequence[Problem],
    temperatures: Sequence[float] = (0.0, 1.0),
    seed: int = 0,
    precision: str = "fp32",
    batch_size: int = 256,
) -> dict:
    """Exact-match accuracy on ``problems`` at each temperature: ``{"greedy_acc": .., "sample_acc": ..,
    "mean_len": ..}`` (``acc_t{T}`` for temperatures other than 0 and 1; ``mean_len`` in
    characters of the greedy, or first, responses)."""
    result = {}
    prompts = [p.prompt for p in problems]
    for j, t in enumerate(temperatures):
        resp = generate_responses(
            model, tokenizer, prompts, task.max_length() + 8, t, batch_size, seed + j, precision
        )
        acc = sum(task.reward(p, r) for p, r in zip(problems, resp)) / max(len(problems), 1)
        key = {0.0: "greedy_acc", 1.0: "sample_acc"}.get(float(t), f"acc_t{t:g}")
        result[key] = acc
        if j == 0:
            result["mean_len"] = sum(map(len, resp)) / max(len(resp), 1)
            result["example"] = resp[0] if resp else ""
    return result


def sft_train(
    model,
    tokenizer,
    task: Task,
    steps: int,
    batch_size: int = 64,
    lr: float = 1e-3,
    *,
    warmup_steps: int | None = None,
    min_lr_ratio: float = 0.1,
    weight_decay: float = 0.1,
    grad_clip: float = 1.0,
    seed: int = 0,
    device: str | torch.device = "cpu",
    precision: str = "auto",
    log_every: int = 50,
    eval_every: int | None = None,
    eval_size: int = 128,
    time_limit_s: float | None = None,
    stop_at_sampled: float | None = None,
    log: Callable[[str], None] | None = print,
) -> SFTHistory:
    """Train ``model`` in place on ``task`` for ``steps`` steps of ``batch_size`` fresh problems.

    ``precision``: ``"bf16"`` (fp32 master weights, bf16 autocast), ``"fp32"``, or ``"auto"``
    (bf16 on CUDA, fp32 elsewhere). ``warmup_steps`` defaults to 5% of ``steps``. Evaluates
    ``eval_size`` held-out problems every ``eval_every`` steps (None: at the end only; 0: never).
    ``time_limit_s`` stops early (``history.stopped_early``) after that many seconds of training.
    ``stop_at_sampled`` stops early at the first evaluation whose sampled (T=1) accuracy reaches it:
    exact match arrives in a jump, and RL needs a warm start inside it, not past it.
    Reproducible: the problems come from ``random.Random(seed)``, the held-out set from
    ``random.Random(seed + 1)``, sampling in evaluation from ``torch.manual_seed(seed)``; the
    initial weights are the caller's (``rla.models.build_model(config, seed=...)``).
    """
    if steps < 1 or batch_size < 1:
        raise ValueError(f"steps and batch_size must be >= 1, got {steps} and {batch_size}")
    device = torch.device(device)
    if precision == "auto":
        precision = "bf16" if device.type == "cuda" else "fp32"
    if precision not in ("bf16", "fp32"):
        raise ValueError(f"precision must be 'bf16', 'fp32' or 'auto', got {precision!r}")
    if stop_at_sampled is not None and not (0 < stop_at_sampled <= 1 and eval_every and eval_size):
        raise ValueError(
            f"stop_at_sampled={stop_at_sampled} needs a value in (0, 1] and periodic evaluation "
            f"(eval_every={eval_every}, eval_size={eval_size})"
        )
    if any(p.dtype != torch.float32 for p in model.parameters()):
        raise ValueError("sft_train keeps fp32 master weights: build the model in float32")
    log = log or (lambda s: None)
    warmup = max(1, round(0.05 * steps) if warmup_steps is None else warmup_steps)

    model.to(device).train()
    torch.manual_seed(seed)
    rng = random.Random(seed)
    held_out = task.sample(random.Random(seed + 1), eval_size) if eval_size else []
    held_prompts = {p.prompt for p in held_out}

    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=lr,
        betas=(0.9, 0.95),
        fused=device.type == "cuda",
    )
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, steps=steps, warmup=warmup, min_ratio=min_lr_ratio))

    hist = SFTHistory()
    loss_sum = torch.zeros((), device=device)
    n_sum = 0
    t0 = time.perf_counter()

    def run_eval(step):
        row = {"step": step, **evaluate(model, tokenizer, task, held_out, seed=seed, precision=precision)}
        hist.evals.append(row)
        log(
            f"eval step {step}: greedy {row['greedy_acc']:.3f} sampled(T=1) {row['sample_acc']:.3f} "
            f"mean_len {row['mean_len']:.0f}  e.g. {row['example'][:80]!r}"
        )

    step = 0
    reached = False  # stop_at_sampled met at the last evaluation
    for step in range(1, steps + 1):
        problems = [p for p in task.sample(rng, batch_size) if p.prompt not in held_prompts]
        if not problems:
            raise ValueError(f"SFT step {step}: all {batch_size} sampled problems are held out for evaluation "
                             f"({len(held_prompts)} held-out prompts): the task has too few distinct problems "
                             "(raise its difficulty or digits)")
        ids, labels = encode_batch(tokenizer, problems, device)
        with _autocast(device, precision):
            logits = model(input_ids=ids).logits
        loss = F.cross_entropy(
            logits[:, :-1].float().reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1), ignore_index=-100
        )
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if grad_clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        opt.step()
        sched.step()
        loss_sum += loss.detach()
        n_sum += 1

        elapsed = time.perf_counter() - t0
        out_of_time = time_limit_s is not None and elapsed > time_limit_s
        if step % log_every == 0 or step == steps or out_of_time:
            row = {"step": step, "loss": (loss_sum / n_sum).item(), "lr": sched.get_last_lr()[0], "elapsed_s": elapsed}
            hist.train.append(row)
            log(f"step {step}/{steps} loss {row['loss']:.4f} lr {row['lr']:.2e} {elapsed:.1f}s")
            loss_sum.zero_()
            n_sum = 0
        if eval_every and step % eval_every == 0 and steps - step > eval_every // 2 and held_out:
            run_eval(step)
            reached = stop_at_sampled is not None and hist.evals[-1]["sample_acc"] >= stop_at_sampled
        if reached:
            hist.stopped_early = True
            log(f"sampled accuracy reached {stop_at_sampled}: stopping at step {step}")
            break
        if out_of_time:
            hist.stopped_early = step < steps
            break

    hist.steps_done = step
    if held_out and eval_every != 0 and not reached:  # a stop on accuracy has just evaluated this step
        run_eval(step)
    hist.wall_time_s = time.perf_counter() - t0
    model.eval()
    return hist
