"""Small models: a config factory for Qwen2, Qwen3, Llama and Qwen3-MoE, and the bundled tiny Qwen2 model.

The configs are real transformers config classes (``Qwen2Config``, ``Qwen3Config``,
``LlamaConfig``) with the numerics that matter for rounding kept as in the released families:
head_dim 64, RoPE theta of the family (1e6 for Qwen, 5e5 for Llama 3), the family's RMSNorm eps,
Qwen2's q/k/v bias, Qwen3's q/k norms, SwiGLU MLPs, grouped-query attention, tied embeddings.
Only the width and depth are small, except ``1.5b``: Qwen2.5-1.5B's width and depth.
``qwen3_moe`` is Qwen3's attention with every MLP an MoE block (``Qwen3MoeConfig``): 8 experts,
top-2, renormalised top-k (``norm_topk_prob``, as Qwen3-30B-A3B), each expert
``intermediate // 2`` wide, no auxiliary load-balancing loss (``output_router_logits`` off; the SFT
warm start trains on the task's loss only). Its size names count the parameters *active* per
token (:func:`active_param_count`, as Qwen3-30B-A3B's "A3B" does): ``10m`` is 36M parameters of
which 11M are active, the MoE experiment's model (``lab/grpo/configs/experiment_moe_h200.yaml``). The
vocabulary is the character tokenizer's (``rla.rl.tokenizer``, 52 tokens) padded to 64.

The bundled model (``rla/assets/tiny-qwen2``) is the ``tiny`` Qwen2 trained by
``lab/tools/train_tiny_model.py`` on a synthetic task; its ``TRAINING.md`` records how. Trained
weights matter: a random model's next-token distributions are nearly flat, and the rounding
mismatch between two stacks is then unrealistically small and uniform.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

__all__ = [
    "ARCHS",
    "SIZES",
    "VOCAB_SIZE",
    "tiny_config",
    "param_count",
    "active_param_count",
    "build_model",
    "bundled_path",
    "check_bundled",
    "load_bundled_model",
    "check_safetensors",
]

VOCAB_SIZE = 64  # the character tokenizer's 52 tokens, padded to a multiple of 64
ARCHS = ("qwen2", "qwen3", "llama", "qwen3_moe")

#: ``qwen3_moe``: experts, experts per token, expert width as a divisor of the dense intermediate size.
MOE_EXPERTS, MOE_TOP_K, MOE_WIDTH_DIVISOR = 8, 2, 2

# size -> (hidden, layers, heads, kv_heads, intermediate); head_dim (hidden / heads) is 64 except
# for "micro" (32) and "1.5b" (128)
SIZES: dict[str, tuple[int, int, int, int, int]] = {
    "micro": (64, 2, 2, 1, 192),  # ~0.1M, for tests on CPU (head_dim 32)
    "tiny": (256, 6, 4, 2, 640),  # ~4.1M: the bundled model, 8 MB in bf16
    "10m": (384, 7, 6, 2, 1024),  # ~11M
    "50m": (640, 12, 10, 2, 1728),  # ~52M
    "150m": (1024, 12, 16, 4, 2816),  # ~135M
    # Qwen2.5-1.5B's shapes: 1.31B here; with its vocabulary (vocab_size=151936) exactly its
    # 1,543,714,304 parameters. For FSDP2 runs (lab/bench/fsdp2_check.py); random init only.
    "1.5b": (1536, 28, 12, 2, 8960),
}

_FAMILY = {
    # arch: (config class name, rope theta, rms_norm eps, extra config keywords)
    "qwen2": ("Qwen2Config", 1e6, 1e-6, {}),
    "qwen3": ("Qwen3Config", 1e6, 1e-6, {"attention_bias": False}),
    "llama": ("LlamaConfig", 5e5, 1e-5, {"attention_bias": False, "mlp_bias": False}),
    "qwen3_moe": ("Qwen3MoeConfig", 1e6, 1e-6, {"attention_bias": False, "num_experts": MOE_EXPERTS,
                                                "num_experts_per_tok": MOE_TOP_K, "norm_topk_prob": True,
                                                "decoder_sparse_step": 1, "mlp_only_layers": [],
                                                "output_router_logits": False}),
}


def tiny_config(arch: str, size: str = "tiny", *, attn_implementation: str = "sdpa", **overrides):
    """A transformers config for a small ``arch`` model of ``size`` (see ``SIZES``).

    ``overrides`` go to the config class last (e.g. ``max_position_embeddings=8192``).
    Token ids match ``rla.rl.tokenizer``: pad 0, bos 1, eos 2.
    """
    import transformers

    if arch not in _FAMILY:
        raise ValueError(f"unknown arch {arch!r}; known: {', '.join(ARCHS)}")
    if size not in SIZES:
        raise ValueError(f"unknown size {size!r}; known: {', '.join(SIZES)}")
    hidden, layers, heads, kv_heads, inter = SIZES[size]
    cls_name, theta, eps, extra = _FAMILY[arch]
    kwargs = dict(
        vocab_size=VOCAB_SIZE,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=hidden // heads,
        intermediate_size=inter,
        hidden_act="silu",
        max_position_embeddings=32768,
        rms_norm_eps=eps,
        rope_parameters={"rope_type": "default", "rope_theta": theta},
        tie_word_embeddings=True,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        attn_implementation=attn_implementation,
        **extra,
    )
    if arch == "qwen2":
        kwargs.pop("head_dim")  # Qwen2 derives head_dim = hidden / heads
    if arch == "qwen3_moe":
        kwargs["moe_intermediate_size"] = inter // MOE_WIDTH_DIVISOR
    kwargs.update(overrides)
    return getattr(transformers, cls_name)(**kwargs)


def build_model(config, dtype: torch.dtype = torch.float32, seed: int | None = None):
    """A randomly initialised causal LM for ``config`` (HF's own init), on CPU in ``dtype``."""
    from transformers import AutoModelForCausalLM

    if seed is not None:
        torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    return model


def param_count(config) -> int:
    """Parameters of a model built from ``config`` (tied weights once), built on the meta device."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters())


def active_param_count(config) -> int:
    """Parameters one token passes through: :func:`param_count` less the experts it is not routed
    to (``num_experts - num_experts_per_tok`` per MoE layer); a dense config's is its count."""
    total = param_count(config)
    experts = getattr(config, "num_experts", None)
    if not experts:
        return total
    sparse = [i for i in range(config.num_hidden_layers) if i not in (config.mlp_only_layers or [])
              and (i + 1) % config.decoder_sparse_step == 0]
    per_expert = 3 * config.hidden_size * config.moe_intermediate_size  # gate, up, down
    return total - len(sparse) * (experts - config.num_experts_per_tok) * per_expert


# --------------------------------------------------------------------------------------------
# The bundled model
# --------------------------------------------------------------------------------------------

_BUNDLED = "tiny-qwen2"
_REQUIRED = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "task.json")
_HOW_TO_MAKE = "lab/tools/train_tiny_model.py makes it (see rla/assets/tiny-qwen2/TRAINING.md)"


def bundled_path() -> Path:
    """The folder of the bundled tiny Qwen2 model inside the installed package."""
    from importlib.resources import files

    root = files("rla").joinpath("assets", _BUNDLED)
    if not isinstance(root, Path):
        raise FileNotFoundError(
            f"rla's package data is not on the file system ({root!r}); install rla unzipped"
        )
    return root


def check_safetensors(path: str | Path) -> dict:
    """Check that ``path`` is a whole safetensors file and return its header.

    Catches what a broken checkout leaves: a Git LFS pointer in place of the weights, a truncated
    download, a file that is not safetensors at all. The header length, the JSON header and the
    byte range of every tensor are checked against the file size; the data are not read.
    """
    path = Path(path)
    size = path.stat().st_size
    with path.open("rb") as f:
        head = f.read(8)
        if head.startswith(b"version "):
            raise ValueError(f"{path} is a Git LFS pointer, not the weights: run `git lfs pull`")
        if len(head) < 8:
            raise ValueError(f"{path} is not a safetensors file: {size} bytes")
        n = int.from_bytes(head, "little")
        if n > min(size - 8, 100 << 20):
            raise ValueError(f"{path} is not a safetensors file (header length {n}, file {size} bytes)")
        try:
            header = json.loads(f.read(n))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ValueError(f"{path} has a corrupt safetensors header: {e}") from None
    ends = [v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"]
    if not ends or 8 + n + max(ends) != size:
        raise ValueError(
            f"{path} is truncated or corrupt: the header describes {8 + n + max(ends, default=0)} "
            f"bytes, the file has {size}"
        )
    return header


def check_bundled(path: Path) -> None:
    """The bundled model folder has every file and real (not Git LFS pointer) weights."""
    missing = [name for name in _REQUIRED if not (path / name).is_file()]
    if missing:
        raise FileNotFoundError(
            f"the bundled model at {path} lacks {', '.join(missing)}; {_HOW_TO_MAKE}"
        )
    check_safetensors(path / "model.safetensors")


def load_bundled_model(dtype: torch.dtype = torch.bfloat16, device: str | torch.device = "cpu"):
    """Load the bundled tiny Qwen2 model in eval mode (its tokenizer and task: :mod:`rla.rl.bundled`).

    Loaded with ``from_pretrained(dtype=...)``, which keeps RoPE's ``inv_freq`` in fp32 (a later
    ``model.to(torch.bfloat16)`` would round it; see docs/rounding.md's hazards). Local files only.
    """
    from transformers import AutoModelForCausalLM

    path = bundled_path()
    check_bundled(path)
    model = AutoModelForCausalLM.from_pretrained(
        str(path), dtype=dtype, local_files_only=True, attn_implementation="sdpa"
    )
    return model.to(device).eval()
