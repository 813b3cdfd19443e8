"""Everything ``rla.align`` knows about differences between transformers releases, in one place.

Supported: transformers 5.5.3 (verl 0.9.1 needs <5.11) through 5.24; CI runs the align tests at
5.5.3 and at the newest release (5.24); 5.17 is the GPU machine's. What differs between them and
matters here ("5.17" below stands for every release before 5.24 unless a line says otherwise):

- Gradient checkpointing. 5.17's ``GradientCheckpointingLayer`` checkpoints in ``__call__``, so a
  per-instance ``forward`` is checkpointed for free. 5.24 wraps each subclass's ``forward`` at class
  creation (``__init_subclass__``), so an instance ``forward`` bypasses it: :func:`with_layer_checkpointing`
  puts the same wrapper around the aligned forward.
- The rotary embedding. 5.17 computes the angles as ``inv_freq @ position_ids`` (a matmul that
  TF32 can touch); 5.24 multiplies elementwise. The aligned rotary always multiplies elementwise;
  :data:`HF_ROTARY_USES_MATMUL` only decides whether the report lists the TF32 hazard as fixed.
- The KV-cache keyword (``past_key_values`` in 5.17, ``cache`` in 5.24) and the experts' routing
  mask (``one_hot(num_experts)`` vs ``num_experts + 1`` for expert-parallel sentinels) need no
  switch: the aligned decoder layer passes keywords through untouched, and the aligned experts
  loop uses the 5.24 mask, which is also right for 5.17's routing.
- Dynamic-NTK RoPE. 5.5-5.10 store the cached length under a wrong name, so scaled frequencies
  are never reset for short sequences; :func:`dynamic_rope_update` puts it back where HF reads it.
- Outside the regions, and left as each release has it: 5.5-5.10 hand Qwen3-MoE's experts fp32
  routing weights (5.24: bf16), so grouped/batched experts sum differently from the eager loop.
"""

from __future__ import annotations

import functools
import inspect
import math
from functools import partial

import torch
import transformers
from packaging.version import Version
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.modeling_rope_utils import dynamic_rope_update as _hf_dynamic_rope_update

__all__ = [
    "TRANSFORMERS_VERSION",
    "HF_ROTARY_USES_MATMUL",
    "with_layer_checkpointing",
    "rope_init",
    "dynamic_rope_update",
    "check_apply_rotary_signature",
    "check_apply_rotary_interleave_signature",
    "experts_function",
    "GATE_CALLING_EXPERTS",
]

TRANSFORMERS_VERSION = Version(transformers.__version__)

#: 5.17 computes RoPE angles with a matmul (``inv_freq @ position_ids``); 5.24 elementwise.
HF_ROTARY_USES_MATMUL = TRANSFORMERS_VERSION < Version("5.24")

# 5.17: ``GradientCheckpointingLayer.__call__`` checkpoints; 5.24: ``__init_subclass__`` wraps forward.
_CHECKPOINTS_IN_CALL = "__call__" in GradientCheckpointingLayer.__dict__

#: Experts implementations of ``transformers.integrations.moe`` that compute the activation product
#: through ``self._apply_gate`` (which ``rla.align`` overrides per instance). Others (``sonicmoe``)
#: fuse it into a kernel that cannot be aligned.
GATE_CALLING_EXPERTS = ("batched_mm", "grouped_mm", "deepgemm")

_CACHE_KWARGS = ("cache", "past_key_values", "layer_past")


def with_layer_checkpointing(inner):
    """Wrap an aligned decoder-layer ``forward`` so that gradient checkpointing still applies.

    On 5.24 this repeats ``GradientCheckpointingLayer``'s own ``forward_with_checkpointing`` (cache
    keywords dropped, ``use_cache`` off, ``self._gradient_checkpointing_func`` around the call); on
    5.17 ``__call__`` already does it and ``inner`` is returned as is (wrapping twice would
    checkpoint twice).
    """
    if _CHECKPOINTS_IN_CALL:
        return inner

    def forward(self, *args, **kwargs):
        if self.gradient_checkpointing and self.training and torch.is_grad_enabled():
            if kwargs.get("use_cache"):
                kwargs["use_cache"] = False
            if not self._can_checkpoint_with_cache:
                for name in _CACHE_KWARGS:
                    if kwargs.get(name) is not None:
                        kwargs[name] = None
            return self._gradient_checkpointing_func(partial(inner, self, **kwargs), *args)
        return inner(self, *args, **kwargs)

    forward.__wrapped__ = inner
    forward.__doc__ = inner.__doc__
    return forward


#: Where transformers < 5.11 stores the dynamic-NTK cached length by mistake (``layer_type`` None).
_MISPLACED_CACHED_LEN = "None_max_seq_len_cached"


def _sync_cached_len(rotary: torch.nn.Module) -> None:
    misplaced = rotary.__dict__.pop(_MISPLACED_CACHED_LEN, None)
    if misplaced is not None:
        rotary.max_seq_len_cached = misplaced


def dynamic_rope_update(rope_forward):
    """HF's ``dynamic_rope_update`` decorator, with the cached length kept where HF reads it.

    transformers 5.5-5.10 write the dynamic-NTK cached length to ``None_max_seq_len_cached``
    (``f"{layer_type}_max_seq_len_cached"`` with ``layer_type=None``) while reading
    ``max_seq_len_cached``: after one sequence longer than ``original_max_seq_len`` the scaled
    frequencies are never reset for short sequences again. 5.24 writes ``max_seq_len_cached``.
    Moving the value to its place before and after HF's update gives every release 5.24's
    behaviour (grow past the original length, reset below it); HF's own update code does the rest.
    """
    inner = _hf_dynamic_rope_update(rope_forward)

    @functools.wraps(inner)
    def wrapper(self, x, position_ids, *args, **kwargs):
        if "dynamic" not in self.rope_type:  # HF's update touches the cached length for dynamic NTK only;
            return inner(self, x, position_ids, *args, **kwargs)  # and Dynamo (torch 2.11) cannot trace __dict__.pop
        _sync_cached_len(self)
        try:
            return inner(self, x, position_ids, *args, **kwargs)
        finally:
            _sync_cached_len(self)

    return wrapper


def rope_init(rotary: torch.nn.Module, device=None, seq_len=None) -> tuple[torch.Tensor, float]:
    """fp32 ``(inv_freq, attention_scaling)`` from the config, with the module's own init function.

    Same choice as the rotary module's ``__init__``: ``compute_default_rope_parameters`` for the
    default type, ``ROPE_INIT_FUNCTIONS[rope_type]`` (llama3, linear, dynamic, ...) otherwise.
    Every init function takes ``(config, device, seq_len)``: ``device`` is where the frequencies
    are evaluated (None: the CPU, as HF's ``__init__`` does); ``seq_len`` only matters to dynamic
    types that have grown past their original length. YaRN off the CPU: the attention factor is the
    module's ``attention_scaling``, which HF's init gave its ``__init__`` from the same config.
    """
    rope_type = rotary.rope_type
    fn = rotary.compute_default_rope_parameters if rope_type == "default" else ROPE_INIT_FUNCTIONS[rope_type]
    device = torch.device(device if device is not None else "cpu")
    kwargs = {} if seq_len is None else {"seq_len": seq_len}
    if rope_type == "default" and device.type != "cpu":
        # The models' own default init evaluates on the CPU whatever device it is told (5.17:
        # ``arange`` on the default device, moved afterwards; 5.24: no device argument), and a
        # default-device context cannot be traced by torch.compile: the same formula, on ``device``.
        inv_freq, scaling = _default_rope_on(rotary.config, device), 1.0
    elif rope_type == "yarn" and device.type != "cpu" and "rope_theta" in rotary.config.rope_parameters:
        # YaRN's init evaluates its ramp on the CPU whatever device it is told: the same formula, every op on
        # ``device``; its attention factor (plain Python arithmetic) is the one that init gave the module's
        # __init__ from this config, so HF's init is not run again for it
        inv_freq, scaling = _yarn_rope_on(rotary.config, device), rotary.attention_scaling
    elif "device" in inspect.signature(fn).parameters:
        inv_freq, scaling = fn(rotary.config, device=device, **kwargs)
    else:
        inv_freq, scaling = fn(rotary.config, **kwargs)
    return inv_freq.to(torch.float32), scaling


def default_inv_freq_on(theta: float, dim: int, device) -> torch.Tensor:
    """``1/(theta**(arange(0, dim, 2)/dim))`` evaluated on ``device``, op for op the expression of
    :func:`_default_rope_on` (for the families whose rope parameters are per layer type)."""
    exponent = torch.arange(0, dim, 2, dtype=torch.int64).to(device=device, dtype=torch.float) / dim
    return 1.0 / (theta ** exponent)


def _default_rope_on(config, device) -> torch.Tensor:
    """The default RoPE frequencies, ``1/(theta**(arange(0, d, 2)/d))``, evaluated on ``device``:
    the expression every transformers release's default init (and vLLM's cache builder) uses,
    op for op; equal to the model's own init on the CPU (tests/alignment/test_align_rope.py)."""
    rp = config.rope_parameters
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    dim = int(head_dim * rp.get("partial_rotary_factor", 1.0))
    exponent = torch.arange(0, dim, 2, dtype=torch.int64).to(device=device, dtype=torch.float) / dim
    return 1.0 / (rp["rope_theta"] ** exponent)


def _yarn_rope_on(config, device) -> torch.Tensor:
    """YaRN's frequencies as transformers' ``_compute_yarn_parameters`` writes them (the extrapolated and
    interpolated frequencies blended by a linear ramp over the correction range), every tensor op on
    ``device``. HF's own function builds the ramp on the CPU whatever device it is told; the engines build
    theirs on the device, where PyTorch's CUDA division by a Python scalar multiplies by its reciprocal
    (GPT-OSS: 2 of 32 frequencies one fp32 ulp apart on an H200, results/benchmarks/gptoss_quotient_h200_2026-12-04/).
    Equal to HF's on the CPU (tests/alignment/test_align_rope_yarn.py)."""
    rp = config.rope_parameters
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    dim = int(head_dim * rp.get("partial_rotary_factor", 1.0))
    base, original = rp["rope_theta"], rp["original_max_position_embeddings"]
    factor = rp["factor"] if rp.get("factor") is not None else config.max_position_embeddings / original

    def correction_dim(rotations):
        return (dim * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(rp.get("beta_fast") or 32), correction_dim(rp.get("beta_slow") or 1)
    if rp.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    high = high + 0.001 if low == high else high
    pos_freqs = base ** (torch.arange(0, dim, 2).to(device=device, dtype=torch.float) / dim)
    extrapolation, interpolation = 1.0 / pos_freqs, 1.0 / (factor * pos_freqs)
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32, device=device) - low) / (high - low), 0, 1)
    keep = 1 - ramp
    return interpolation * (1 - keep) + extrapolation * keep


def check_apply_rotary_signature(fn) -> None:
    """The aligned ``apply_rotary_pos_emb`` assumes HF's 5.x signature; fail loudly if it moved."""
    params = list(inspect.signature(fn).parameters)
    if params != ["q", "k", "cos", "sin", "unsqueeze_dim"]:
        raise RuntimeError(
            f"transformers {TRANSFORMERS_VERSION}: apply_rotary_pos_emb{tuple(params)} no longer has "
            "the signature (q, k, cos, sin, unsqueeze_dim) that rla.align replaces; update "
            "src/rla/alignment/compat.py"
        )


def check_apply_rotary_interleave_signature(fn) -> None:
    """DeepSeek-V3's ``apply_rotary_pos_emb_interleave`` as transformers 5.24 has it; fail loudly if it moved."""
    params = list(inspect.signature(fn).parameters)
    if params != ["q", "k", "cos", "sin", "position_ids", "unsqueeze_dim"]:
        raise RuntimeError(
            f"transformers {TRANSFORMERS_VERSION}: apply_rotary_pos_emb_interleave{tuple(params)} no longer has "
            "the signature (q, k, cos, sin, position_ids, unsqueeze_dim) that rla.align replaces; update "
            "src/rla/alignment/compat.py"
        )


def experts_function(implementation: str):
    """The registered experts forward for ``implementation``, if it calls ``self._apply_gate``."""
    from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

    if implementation not in GATE_CALLING_EXPERTS or implementation not in ALL_EXPERTS_FUNCTIONS:
        raise NotImplementedError(
            f"experts_implementation={implementation!r} computes the SwiGLU product inside its own "
            "kernel, where rla.align cannot change the rounding. Use 'eager' or one of "
            f"{GATE_CALLING_EXPERTS} (model.set_experts_implementation('eager')), or align "
            "without the 'swiglu' region."
        )
    return ALL_EXPERTS_FUNCTIONS[implementation]
