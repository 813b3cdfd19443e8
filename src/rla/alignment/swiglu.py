"""SwiGLU region: ``silu(gate) * up`` through ``rla.ops.swiglu`` in dense MLPs and MoE experts.

- Dense MLP (``gate_proj``/``up_proj``/``down_proj``; also Qwen2-MoE's shared expert):
  ``down_proj(rla.ops.swiglu(gate_proj(x), up_proj(x), profile))``. The projections are called as
  modules, so PEFT LoRA layers and hooks on them still run.
- MoE experts (transformers 5.x: 3-D ``gate_up_proj`` [E, 2I, H] and ``down_proj`` [E, H, I],
  decorated by ``use_experts_implementation``). The activation product lives in
  ``self._apply_gate``, which the registered grouped/batched implementations call; it is
  overridden per instance. The eager loop computes the product inline, so the instance
  ``forward`` is HF's eager loop with that one line calling ``self._apply_gate``; for
  other implementations it dispatches as HF does and the override does the rest.
"""

from __future__ import annotations

import types

import torch
import torch.nn.functional as F

from rla import ops
from rla.alignment import compat
from rla.alignment.patch import install
from rla.profiles import RoundingProfile

__all__ = ["check_activation", "check_experts", "align_mlps", "align_experts", "check_clamped_experts",
           "align_clamped_experts", "family_notes"]

_SILU = ("silu", "swish")


def check_activation(config) -> None:
    act = getattr(config, "hidden_act", None)
    if act not in _SILU:
        raise ValueError(
            f"rla.align 'swiglu' region: config.hidden_act is {act!r}, but the region aligns "
            "silu(gate) * up (SwiGLU). Align without 'swiglu' (regions=('rope', 'rmsnorm'))."
        )


def _experts_implementation(experts) -> str:
    config = getattr(experts, "config", None)
    impl = getattr(config, "_experts_implementation", None)
    return "eager" if impl is None else impl


def check_experts(experts: torch.nn.Module) -> None:
    """Refuse expert layouts the aligned gate does not compute exactly."""
    problems = []
    for name in ("gate_up_proj", "down_proj"):
        w = getattr(experts, name, None)
        if not isinstance(w, torch.Tensor) or w.ndim != 3:
            problems.append(f"{name} is not a 3-D expert weight")
    if not getattr(experts, "has_gate", True):
        problems.append("has_gate=False")
    if getattr(experts, "has_bias", False):
        problems.append("has_bias=True")
    if not getattr(experts, "is_concatenated", True):
        problems.append("gate/up interleaved (is_concatenated=False)")
    if problems:
        raise NotImplementedError(
            f"rla.align: {type(experts).__name__} has a layout the aligned experts do not handle: "
            f"{'; '.join(problems)}"
        )
    impl = _experts_implementation(experts)
    if impl != "eager":
        compat.experts_function(impl)  # raises for kernels that fuse the activation


def _make_mlp_forward(profile: RoundingProfile, impl=None):
    # rla.ops (impl None) is looked up at call time, so a profiler or test can wrap rla.ops.swiglu
    swiglu = impl.swiglu if impl is not None else (lambda *a: ops.swiglu(*a))

    def forward(self, x):
        return self.down_proj(swiglu(self.gate_proj(x), self.up_proj(x), profile))

    return forward


def _make_apply_gate(profile: RoundingProfile, impl=None):
    swiglu = impl.swiglu if impl is not None else (lambda *a: ops.swiglu(*a))

    def _apply_gate(self, gate_up_out):
        gate, up = gate_up_out.chunk(2, dim=-1)
        return swiglu(gate, up, profile)

    return _apply_gate


def _experts_forward(self, hidden_states, top_k_index, top_k_weights):
    """HF's eager experts loop, with the activation product going through ``self._apply_gate``."""
    impl = _experts_implementation(self)
    if impl != "eager":
        return compat.experts_function(impl)(self, hidden_states, top_k_index, top_k_weights)
    final_hidden_states = torch.zeros_like(hidden_states)
    with torch.no_grad():
        # num_experts + 1 classes: expert-parallel sentinels (index == num_experts) are skipped.
        expert_mask = F.one_hot(top_k_index, num_classes=self.num_experts + 1).permute(2, 1, 0)
        expert_hit = torch.greater(expert_mask.sum(dim=(-1, -2)), 0).nonzero()
    for expert_idx in expert_hit:
        expert_idx = expert_idx[0]
        if expert_idx == self.num_experts:
            continue
        top_k_pos, token_idx = torch.where(expert_mask[expert_idx])
        current = hidden_states[token_idx]
        current = self._apply_gate(F.linear(current, self.gate_up_proj[expert_idx]))
        current = F.linear(current, self.down_proj[expert_idx])
        current = current * top_k_weights[token_idx, top_k_pos, None]
        final_hidden_states.index_add_(0, token_idx, current.to(final_hidden_states.dtype))
    return final_hidden_states


def align_mlps(mlps: list[torch.nn.Module], profile: RoundingProfile, impl=None) -> None:
    forward = _make_mlp_forward(profile, impl)
    for mlp in mlps:
        install(mlp, "mlp", {"forward": types.MethodType(forward, mlp)})


def align_experts(experts_list: list[torch.nn.Module], profile: RoundingProfile, impl=None) -> None:
    apply_gate = _make_apply_gate(profile, impl)
    for experts in experts_list:
        install(
            experts,
            "experts",
            {
                "forward": types.MethodType(_experts_forward, experts),
                "_apply_gate": types.MethodType(apply_gate, experts),
            },
        )


# ---------------------------------------------------------------------------------------------
# GPT-OSS: interleaved gate/up with biases, the clamped SwiGLU
# ---------------------------------------------------------------------------------------------


def check_clamped_experts(experts: torch.nn.Module) -> None:
    """GPT-OSS's experts: the aligned ``_apply_gate`` needs ``alpha`` and ``limit`` and an experts
    implementation that calls ``_apply_gate`` (HF's eager loop does, after its bias add)."""
    problems = [f"no float {name}" for name in ("alpha", "limit") if not isinstance(getattr(experts, name, None), float)]
    if not callable(getattr(type(experts), "_apply_gate", None)):
        problems.append("no _apply_gate method")
    if problems:
        raise NotImplementedError(f"rla.align: {type(experts).__name__} has a layout the aligned clamped SwiGLU "
                                  f"does not handle: {'; '.join(problems)}")
    impl = _experts_implementation(experts)
    if impl != "eager":
        compat.experts_function(impl)  # raises for kernels that fuse the activation


def _make_clamped_gate(profile: RoundingProfile):
    def _apply_gate(self, gate_up):
        return ops.swiglu_oai(gate_up[..., ::2], gate_up[..., 1::2], self.alpha, self.limit, profile)

    return _apply_gate


def align_clamped_experts(experts_list: list[torch.nn.Module], profile: RoundingProfile) -> None:
    """Replace each GPT-OSS experts instance's ``_apply_gate`` (HF's forward, its bias adds and its
    implementation dispatch stay)."""
    apply_gate = _make_clamped_gate(profile)
    for experts in experts_list:
        install(experts, "experts", {"_apply_gate": types.MethodType(apply_gate, experts)})


def family_notes(family) -> list[str]:
    """What the alignment of ``family`` leaves as it is, and why (for the report)."""
    if family.model_type == "gpt_oss":
        return [
            "left as is: attention sinks (HF's eager_attention_forward concatenates them to the logits; "
            "attention is outside the regions), the router (top-k and its softmax belong to the MoE issue)",
            "YaRN's inv_freq: HF's formula evaluated where rope_inv_freq says, its ramp included (HF's init builds "
            "the ramp on the CPU; vLLM on the device, where 2 of GPT-OSS's 32 frequencies come out one ulp apart)",
            "the clamped SwiGLU runs rla's fused kernel on CUDA (rla.ops._triton_swiglu_oai), the PyTorch reference elsewhere",
        ]
    if family.model_type == "glm4_moe":
        return [
            "left as is: the router (sigmoid scores, the correction bias, group top-k: they belong to the MoE issue)",
            "partial RoPE: the first head_dim * partial_rotary_factor dims rotated by rla.ops.rope, the rest passed",
        ]
    return []
