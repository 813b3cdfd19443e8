"""The bundled tiny model with what it was trained on: its character tokenizer and its task.

:func:`rla.models.load_bundled_model` loads the weights; the tokenizer (:mod:`rla.rl.tokenizer`)
and the synthetic task (:mod:`rla.rl.tasks`, recorded in the folder's ``task.json``) belong to the
RL room, so the pairing lives here and ``rla.models`` imports nothing from ``rla.rl``.
"""

from __future__ import annotations

import json

import torch

from rla import models
from rla.rl.tasks import get_task
from rla.rl.tokenizer import load_tokenizer

__all__ = ["bundled_task", "load_bundled"]


def bundled_task():
    """The task (``rla.rl.tasks``) and difficulty the bundled model was trained on."""
    path = models.bundled_path()
    models.check_bundled(path)
    return get_task(**json.loads((path / "task.json").read_text())["task"])


def load_bundled(dtype: torch.dtype = torch.bfloat16, device: str | torch.device = "cpu"):
    """The bundled model and its tokenizer: ``(model, tokenizer)``, the model in eval mode."""
    model = models.load_bundled_model(dtype=dtype, device=device)
    return model, load_tokenizer(models.bundled_path())
