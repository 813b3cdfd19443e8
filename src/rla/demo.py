"""``rla demo``: the whole story on the bundled tiny model, on a laptop CPU, in a few minutes.

1. Load the bundled Qwen2-architecture model (trained on a synthetic task, so its
   distributions look like a real LM's, not like random weights').
2. Sample rollouts from it with the rollout stack aligned to the ``vllm`` profile: the stand-in
   for a vLLM engine.
3. Diagnose the training forward as a trainer runs it (HF eager), with every subset of the
   three regions aligned: the table, the Shapley attribution, and the profile detection.
4. Write the report folder (JSON, Markdown, plots) and the rollouts, and say what it means.

The folder is written whole at the end (:func:`rla.diagnosis.output.staged`): a non-empty ``out``
is refused unless ``overwrite``, and a kill leaves the old folder or the new one, never new
rollouts beside an old report. ``report.json`` records the model, the rollouts file and their
hashes. The default folder (``rla-demo``) is not ``rla diagnose``'s (``rla-report``).
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = ["DemoConfig", "run_demo"]


@dataclass(frozen=True)
class DemoConfig:
    out: str = "rla-demo"
    """Report folder (created; refused if it is not empty, unless ``overwrite``)."""
    overwrite: bool = False
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


def _machine(device: str) -> str:
    """What the numbers were computed on, as report.json's stamp names it (:func:`rla.environment.cpu_model`)."""
    import torch

    from rla.environment import cpu_model

    if device.startswith("cuda"):
        return torch.cuda.get_device_name(torch.device(device))
    return f"{cpu_model()}, {torch.get_num_threads()} threads"


def run_demo(cfg: DemoConfig, console=None):
    import torch
    from rla.console import console as make_console

    from rla.rollout import rollouts
    from rla.diagnosis.core import diagnose, group_label
    from rla.diagnosis.output import check_out_dir, staged
    from rla.diagnosis.provenance import InputChangedError, inputs_record, weights_sha256
    from rla.diagnosis.report import explain, rich_tables, write_report_files
    from rla.models import bundled_path
    from rla.rl.bundled import bundled_task, load_bundled
    from rla.rl.tasks import get_task
    from rla.rollout.sampler import Sampler, SamplingParams

    console = console or make_console()
    if cfg.n < 2:
        raise ValueError(f"n must be at least 2, got {cfg.n}")
    if cfg.max_new_tokens is not None and cfg.max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be positive (or None for the task's), got {cfg.max_new_tokens}")
    check_out_dir(cfg.out, overwrite=cfg.overwrite, inputs=[bundled_path()])
    weights = weights_sha256(bundled_path())  # before the work; checked again before the report names it
    t0 = time.perf_counter()
    torch.manual_seed(cfg.seed)
    model, tok = load_bundled(dtype=torch.bfloat16, device=cfg.device)
    task = bundled_task()
    if cfg.difficulty is not None:
        task = get_task(**{**task.spec(), "difficulty": cfg.difficulty})
    n_params = sum(p.numel() for p in model.parameters())
    console.print(
        f"[bold]rla demo[/]: bundled {model.config.model_type} model ({n_params / 1e6:.1f}M parameters), "
        f"task {task!r}; sampling {cfg.n} rollouts under the [bold]{cfg.profile}[/] profile on {_machine(cfg.device)} "
        "(the numbers' last digits move with the CPU: its kernels round in their own order)..."
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
            + ", ".join(f"{group_label(g)} {k3:.2e}" for g, k3 in d.detection.ranking)
        )
    with staged(out, overwrite=cfg.overwrite, inputs=[bundled_path()]) as tmp:
        rollouts.save(tmp / "rollouts.jsonl", records)
        inputs = inputs_record(model_path=bundled_path(), rollouts_path=tmp / "rollouts.jsonl", profile=d.profile)
        if inputs["model"]["weights_sha256"] != weights:
            raise InputChangedError(f"the bundled weights in {bundled_path()} changed while rla read them; "
                                    "no report was written")
        inputs["rollouts"]["path"] = str(out / "rollouts.jsonl")
        written = [out / p.name for p in write_report_files(d, tmp, inputs)]
    console.print()
    console.print(explain(d))
    if d.verdict is not None:
        console.print(f"Verdict: {d.verdict.message}" if d.verdict.ok else
                      f"[bold yellow]Verdict ({d.verdict.kind}):[/] {d.verdict.message}" if d.verdict.attributed else
                      f"[bold red]Not attributed:[/] {d.verdict.message}")
    console.print(
        f"\nReport: {', '.join(str(p) for p in written)}; rollouts: {out / 'rollouts.jsonl'} "
        f"({time.perf_counter() - t0:.0f} s)."
    )
    return d
