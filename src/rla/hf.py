"""Loading a user's HF checkpoint for diagnosis: local files only, errors that say what is wrong."""

from __future__ import annotations

from pathlib import Path

import torch

__all__ = ["load_model", "meta_model", "read_config", "check_safetensors", "causal_lm_config", "ModelFilesError"]


class ModelFilesError(ValueError):
    """A checkpoint folder's weight files are damaged or do not fit its config (the message names the file)."""


def causal_lm_config(config):
    """The config of the model ``AutoModelForCausalLM`` builds from ``config``: for a multimodal
    checkpoint that transformers maps to its text model (its "VLM compatibility" entries: Qwen3.5's
    ``qwen3_5`` -> ``Qwen3_5ForCausalLM``, whose config is the ``qwen3_5_text`` one), the text config;
    for every other config, ``config`` itself. What a text RL trainer loads from a released
    multimodal checkpoint is that text model, so it is what rla aligns and scores."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    try:
        cls = MODEL_FOR_CAUSAL_LM_MAPPING[type(config)]
    except KeyError:
        return config
    want = getattr(cls, "config_class", None)
    if want is None or isinstance(config, want):
        return config
    text = config.get_text_config()
    return text if isinstance(text, want) else config


def read_config(folder):
    """The HF config of a checkpoint folder, as transformers' own class for its ``model_type``.

    ``AutoConfig`` returns whatever class was registered last for a model type, and an engine imported
    in the same process registers its own: vLLM 0.26 registers its ``Qwen3_5Config`` for ``qwen3_5``
    (``vllm/transformers_utils/config.py``), which transformers' model mapping does not know, so after
    a live engine run the text model was built from the multimodal config and failed (on the H200,
    2026-12-03: ``'Qwen3_5Config' object has no attribute 'vocab_size'``). The folder is then read again
    with transformers' class. A model type transformers does not have keeps the registered class.
    Errors name the file."""
    import transformers
    from transformers import AutoConfig
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    path = Path(folder) / "config.json"
    try:
        config = AutoConfig.from_pretrained(str(folder), local_files_only=True)
        own = getattr(transformers, CONFIG_MAPPING_NAMES.get(config.model_type, ""), None)
        if own is not None and type(config) is not own:
            config = own.from_pretrained(str(folder), local_files_only=True)
    except Exception as e:  # transformers raises several types for a bad config; name the file
        raise ValueError(f"{path} could not be read as an HF config: {e}") from e
    return config


def check_safetensors(folder, config=None) -> None:
    """Read every ``*.safetensors`` header of ``folder`` (a truncated file fails here) and, with an HF
    ``config``, compare each tensor's shape to the model that config builds (on the meta device,
    no memory): a :class:`ModelFilesError` names the file and tensor, before any weights are read."""
    from safetensors import SafetensorError, safe_open

    shapes: dict[str, tuple[tuple[int, ...], str]] = {}
    for f in sorted(Path(folder).glob("*.safetensors")):
        try:
            with safe_open(str(f), framework="pt") as st:
                for k in st.keys():
                    shapes[k] = (tuple(st.get_slice(k).get_shape()), f.name)
        except (SafetensorError, OSError, ValueError) as e:
            raise ModelFilesError(f"{f}: not a readable safetensors file ({e}); truncated or damaged? Copy the "
                                  "checkpoint again") from None
    if config is None or not shapes:
        return
    from transformers import AutoModelForCausalLM

    try:
        with torch.device("meta"):
            skeleton = AutoModelForCausalLM.from_config(config)
    except Exception:  # a config transformers builds no model from fails in from_pretrained with its own error
        return
    want = {k: tuple(v.shape) for k, v in (*skeleton.named_parameters(), *skeleton.named_buffers())}
    for k, (shape, fname) in shapes.items():
        if k in want and want[k] != shape:
            raise ModelFilesError(
                f"{Path(folder) / fname}: tensor {k} has shape {list(shape)}, but config.json builds {list(want[k])}; "
                "the weights and config.json are from different models"
            )


def meta_model(path: str):
    """The causal LM ``load_model(path)`` would build, on the meta device (no weights read, no memory):
    for what a model's structure says (which decoder layers are MoE blocks) before anything is loaded."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(causal_lm_config(read_config(Path(path))))


def load_model(path: str, dtype: torch.dtype = torch.bfloat16, device: str = "cpu"):
    """``AutoModelForCausalLM.from_pretrained(path, dtype=...)`` from a local folder, in eval mode.

    ``dtype=`` (not a later ``.to()``) keeps RoPE's inv_freq in fp32, as the engine has it.
    """
    from transformers import AutoModelForCausalLM

    p = Path(path)
    if not p.is_dir():
        raise FileNotFoundError(f"model folder {path!r} does not exist (rla never downloads from a hub)")
    if not (p / "config.json").is_file():
        raise FileNotFoundError(f"{path!r} has no config.json; expected an HF checkpoint folder")
    config = read_config(p)
    check_safetensors(p, config)
    try:
        # a multimodal checkpoint's text model gets its text config: what AutoModelForCausalLM builds (on the H200,
        # transformers 5.24 built Qwen3_5ForCausalLM from the multimodal Qwen3_5Config as given, and failed)
        model = AutoModelForCausalLM.from_pretrained(str(p), config=causal_lm_config(config), dtype=dtype,
                                                     local_files_only=True)
    except OSError as e:
        raise FileNotFoundError(f"{path!r}: no loadable weights ({e})") from e
    return model.to(device).eval()
