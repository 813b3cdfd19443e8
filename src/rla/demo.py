"""``rla demo``: the whole story on the bundled tiny model, on a laptop CPU, in a few minutes.

1. Load the bundled Qwen2-architecture model (trained on a synthetic task, so its
   distributions look like a real LM's, not like random weights').
2. Sample rollouts from it with the rollout stack aligned to the ``vllm`` profile: the stand-in
   for a vLLM engine.
3. Diagnose the training forward as a trainer runs it (HF eager), with every subset of the
   three regions aligned: the table, the Shapley attribution, and the profile detection.
4. Write the report folder (JSON, Markdown, plots) and the rollouts, and say what it means.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = ["DemoConfig", "run_demo"]


@dataclass(frozen=True)
class DemoConfig:
    out: str = "rla-report"
    """Report folder (created)."""
    n: int = 128
    """Rollouts to sample."""
    max_new_tokens: int | None = None
    """Response cap; default: the task's longest correct response."""
    profile: str = "vllm"
    """The engine profile the rollouts are sampled under."""
    temperature: float = 1.0
    seed: int = 0
    detect: bool = True
    device: str = "cpu"
    difficulty: int | None = None
    """Task difficulty (longer responses); default: what the model was trained on."""
    ignore_eos: bool = False
    """Sample past eos up to max_new_tokens (vLLM's ignore_eos): long positions from a model
    that answers briefly."""


def run_demo(cfg: DemoConfig, console=None):
    import torch
    from rich.console import Console

    from rla import rollouts
    from rla.diagnosis.core import diagnose
    from rla.diagnosis.report import explain, rich_tables, write_report
    from rla.models import bundled_task, load_bundled
    from rla.rl.tasks import get_task
    from rla.sampler import Sampler, SamplingParams

    console = console or Console()
    t0 = time.perf_counter()
    torch.manual_seed(cfg.seed)
    model, tok = load_bundled(dtype=torch.bfloat16, device=cfg.device)
    task = bundled_task()
    if cfg.difficulty is not None:
        task = get_task(**{**task.spec(), "difficulty": cfg.difficulty})
    n_params = sum(p.numel() for p in model.parameters())
    console.print(
        f"[bold]rla demo[/]: bundled {model.config.model_type} model ({n_params / 1e6:.1f}M parameters), "
        f"task {task!r}; sampling {cfg.n} rollouts under the [bold]{cfg.profile}[/] profile..."
    )
    problems = task.sample(random.Random(cfg.seed), cfg.n)
    prompts = [tok(p.prompt, add_special_tokens=False)["input_ids"] for p in problems]
    bos = tok.bos_token_id
    if bos is not None:
        prompts = [[bos] + p for p in prompts]
    sampler = Sampler(model, cfg.profile, device=cfg.device)
    params = SamplingParams(
        temperature=cfg.temperature, max_new_tokens=cfg.max_new_tokens or task.max_length(), seed=cfg.seed,
        ignore_eos=cfg.ignore_eos,
    )
    with console.status("sampling"):
        records = sampler.generate(prompts, params)
    del sampler
    for rec, prob in zip(records, problems):
        text = tok.decode(rec.response_ids, skip_special_tokens=True)
        rec.reward = task.reward(prob, text)
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    rollouts.save(out / "rollouts.jsonl", records)
    lengths = [len(r.response_ids) for r in records]
    reward = sum(r.reward for r in records) / len(records)
    console.print(
        f"{len(records)} rollouts, {sum(lengths)} response tokens (mean {sum(lengths) / len(lengths):.0f}), "
        f"reward {reward:.2f}; diagnosing the HF-eager training forward against them..."
    )
    d = diagnose(model, records, cfg.profile, detect=cfg.detect, progress=True)
    table, attribution = rich_tables(d)
    console.print(table)
    console.print(attribution)
    if d.detection is not None:
        console.print(
            "profile detection (k3 with all regions aligned to each): "
            + ", ".join(f"{n} {k3:.2e}" for n, k3 in d.detection.ranking)
        )
    written = write_report(d, out)
    console.print()
    console.print(explain(d))
    console.print(
        f"\nReport: {', '.join(str(p) for p in written)}; rollouts: {out / 'rollouts.jsonl'} "
        f"({time.perf_counter() - t0:.0f} s)."
    )
    return d
