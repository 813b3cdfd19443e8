"""Loading a user's HF checkpoint for diagnosis: local files only, errors that say what is wrong."""

from __future__ import annotations

from pathlib import Path

import torch

__all__ = ["load_model"]


def load_model(path: str, dtype: torch.dtype = torch.bfloat16, device: str = "cpu"):
    """``AutoModelForCausalLM.from_pretrained(path, dtype=...)`` from a local folder, in eval mode.

    ``dtype=`` (not a later ``.to()``) keeps RoPE's inv_freq in fp32, as the engine has it.
    """
    from transformers import AutoConfig, AutoModelForCausalLM

    p = Path(path)
    if not p.is_dir():
        raise FileNotFoundError(f"model folder {path!r} does not exist (rla never downloads from a hub)")
    if not (p / "config.json").is_file():
        raise FileNotFoundError(f"{path!r} has no config.json; expected an HF checkpoint folder")
    try:
        config = AutoConfig.from_pretrained(str(p), local_files_only=True)
    except Exception as e:  # transformers raises several types for a bad config; name the file
        raise ValueError(f"{p / 'config.json'} could not be read as an HF config: {e}") from e
    try:
        model = AutoModelForCausalLM.from_pretrained(str(p), config=config, dtype=dtype, local_files_only=True)
    except OSError as e:
        raise FileNotFoundError(f"{path!r}: no loadable weights ({e})") from e
    return model.to(device).eval()
