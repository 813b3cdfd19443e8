"""Where a run's weights and task come from: the task by name, the warm start, the initial model.

RL on a random model learns nothing on an exact-match task (every reward is 0), and mismatch
measured on one is unrealistically small (flat distributions). ``init=sft`` therefore trains the
randomly initialised model on the task's worked solutions first (``rla.rl.sft``) and caches the
result as an HF model folder; ``rla experiment`` makes one per model so that all its arms and seeds
start from the same weights.
"""

from __future__ import annotations

import importlib
from pathlib import Path

import torch

from rla.rl.config import TrainConfig
from rla.rl.distributed import Dist

__all__ = ["build_task", "warm_start", "initial_model"]


def build_task(cfg: TrainConfig):
    """The task of ``cfg``: a name in ``rla.rl.tasks.TASKS`` or ``"package.module:factory"``.

    A factory is called with ``difficulty=`` and ``task_args`` and must return an object with the
    ``rla.rl.tasks.Task`` interface (``sample``, ``reward``, ``max_length``).
    """
    if ":" in cfg.task:
        module, attr = cfg.task.split(":", 1)
        try:
            factory = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as e:
            raise ValueError(f"task={cfg.task!r}: cannot import it ({e})") from None
        return factory(difficulty=cfg.difficulty, **cfg.task_args)
    from rla.rl.tasks import get_task

    return get_task(cfg.task, difficulty=cfg.difficulty, **cfg.task_args)


def _atomic_save_pretrained(model, folder: Path, extra: dict[str, str]) -> None:
    import os
    import shutil

    from rla.atomic import publish_dir

    tmp = folder.with_name(f".tmp_{folder.name}_{os.getpid()}")
    if tmp.exists():
        shutil.rmtree(tmp)
    model.save_pretrained(str(tmp), safe_serialization=True)
    for name, text in extra.items():
        (tmp / name).write_text(text)
    publish_dir(tmp, folder)


def warm_start(cfg: TrainConfig, folder: str | Path, device: torch.device | str = "cpu", log=print) -> Path:
    """Random init + SFT warm start for ``cfg`` saved as an HF model folder (reused if present).

    The experiment runner calls this once per model so that every arm and seed starts from the
    same weights (``init=<folder>``).
    """
    import json

    from rla import models
    from rla.rl.sft import sft_train
    from rla.rl.tokenizer import build_tokenizer

    folder = Path(folder)
    if (folder / "model.safetensors").is_file():
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    task = build_task(cfg)
    model = models.build_model(models.tiny_config(cfg.arch, cfg.size), dtype=torch.float32, seed=cfg.init_seed)
    tokenizer = build_tokenizer()
    stop = cfg.sft_stop_sampled or None
    hist = sft_train(model, tokenizer, task, steps=cfg.sft_steps, batch_size=cfg.sft_batch_size, lr=cfg.sft_lr,
                     seed=cfg.init_seed, device=device, log=log, stop_at_sampled=stop,
                     eval_every=cfg.sft_eval_every if stop else None)
    model.to("cpu")
    meta = {"arch": cfg.arch, "size": cfg.size, "task": cfg.task, "difficulty": cfg.difficulty,
            "task_args": cfg.task_args, "init_seed": cfg.init_seed, "sft_steps": cfg.sft_steps,
            "sft_lr": cfg.sft_lr, "sft_batch_size": cfg.sft_batch_size, "sft_stop_sampled": cfg.sft_stop_sampled,
            "history": hist.to_dict()}
    _atomic_save_pretrained(model, folder, {"sft.json": json.dumps(meta, indent=1, default=str)})
    return folder


def initial_model(cfg: TrainConfig, dist: Dist, device: torch.device, log) -> torch.nn.Module:
    """The fp32 model ``cfg.init`` names (on CPU); rank 0 makes the SFT warm start, the others wait."""
    from transformers import AutoModelForCausalLM

    from rla import models

    if cfg.init == "bundled":
        model = models.load_bundled_model(dtype=torch.float32)
        return model.train()
    if cfg.init == "random":
        return models.build_model(models.tiny_config(cfg.arch, cfg.size), dtype=torch.float32, seed=cfg.init_seed)
    path = Path(cfg.init)
    if cfg.init == "sft":
        path = Path(cfg.out_dir) / "init"
        if dist.main:
            warm_start(cfg, path, device, log)
        dist.barrier()
    return AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32, local_files_only=True)
