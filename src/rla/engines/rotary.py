"""The engines' rotary cache builders, instantiated the way their ``__init__`` would set them up.

vLLM and SGLang share the lineage of ``RotaryEmbedding._compute_inv_freq`` /
``_compute_cos_sin_cache`` and ``Llama3RotaryEmbedding._compute_inv_freq``: the adapters extract
those methods from the engine's own files into classes of their own, and :func:`builder` makes an
instance with the attributes the engine's ``__init__`` sets (``__init__`` itself is never run: it
builds the engine's op-dispatch machinery). What differs between engines (vLLM's ``use_aiter``,
SGLang's ``_force_native``, ...) comes in as ``engine_attrs``.
"""

from __future__ import annotations

__all__ = ["SUPPORTED_ROPE_TYPES", "rope_type", "builder"]

#: RoPE scaling types the adapters build caches for, as the engines' ``get_rope`` names them.
SUPPORTED_ROPE_TYPES = ("default", "llama3")


def rope_type(rope_scaling: dict | None, adapter: str) -> str:
    """``rope_scaling``'s type (``default`` without one); ``adapter`` names the engine in the error."""
    if not rope_scaling:
        return "default"
    kind = rope_scaling.get("rope_type", rope_scaling.get("type", "default"))
    if kind not in SUPPORTED_ROPE_TYPES:
        raise ValueError(
            f"RoPE scaling type {kind!r} is not supported by rla's {adapter} adapter yet "
            f"(supported: {', '.join(SUPPORTED_ROPE_TYPES)}); got rope_scaling={rope_scaling!r}"
        )
    return kind


def builder(plain_cls, llama3_cls, adapter: str, rotary_dim, max_position, base, rope_scaling,
            head_size=None, **engine_attrs):
    """An instance of ``plain_cls`` (or ``llama3_cls`` under llama3 scaling) holding what the
    engine's ``__init__`` sets, neox style, plus ``engine_attrs``."""
    if rope_type(rope_scaling, adapter) == "llama3":
        obj = object.__new__(llama3_cls)
        try:
            obj.scaling_factor = rope_scaling["factor"]
            obj.low_freq_factor = rope_scaling["low_freq_factor"]
            obj.high_freq_factor = rope_scaling["high_freq_factor"]
            obj.orig_max_position = rope_scaling["original_max_position_embeddings"]
        except KeyError as e:
            raise ValueError(f"llama3 rope_scaling is missing {e.args[0]!r}: {rope_scaling!r}") from None
    else:
        obj = object.__new__(plain_cls)
    obj.head_size = head_size or rotary_dim
    obj.rotary_dim = rotary_dim
    obj.max_position_embeddings = max_position
    obj.base = base
    obj.is_neox_style = True
    for name, value in engine_attrs.items():
        setattr(obj, name, value)
    return obj
