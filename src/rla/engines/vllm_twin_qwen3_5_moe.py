"""The engine twin of Qwen3.5 MoE's text model (``qwen3_5_moe_text``), laid out as vLLM 0.33's ``models/qwen3_5.py``.

vLLM's ``Qwen3_5DecoderLayer`` builds, for ``qwen3_5_moe_text``, the dense model's layer (both token mixers, the
fused add + norms, :mod:`rla.engines.vllm_twin_qwen3_5`) with ``Qwen3NextSparseMoeBlock`` (``models/qwen3_next.py``)
in the MLP's place. So this twin is :class:`rla.engines.vllm_twin_qwen3_5.Qwen3_5Twin` (its pieces, mixers, q/k
paths and modes) with the MoE block of :mod:`rla.engines.vllm_twin_moe`: an opaque op in the piece, as vLLM's
``MoERunner`` calls ``torch.ops.vllm.moe_forward_shared`` (``fused_moe/runner/moe_runner.py``), a custom op Inductor
does not trace into. What runs inside the op, eagerly:

- **the router as HF computes it** (the model's own ``Qwen3_5MoeTopKRouter``: bf16 logits, fp32 softmax, top-k,
  renormalised, the weights rounded to bf16), on both sides. vLLM's router is ``GateLinear`` (bf16 logits, inside
  the op: ``router_logits=hidden_states``, the runner holds the gate) and its fused top-k softmax kernel, another
  computation (the MoE issue's, not a rounding region here), with ``renormalize=getattr(config, "norm_topk_prob",
  True)``: HF renormalises whatever the config says, so a config with ``norm_topk_prob: false`` is refused;
- **the routed experts as HF's GEMMs per expert** (HF's eager loop over the 3-D ``gate_up_proj`` / ``down_proj``,
  :func:`rla.engines.vllm_twin_moe.hf_routed`), since vLLM's fused MoE GEMMs are Triton kernels on a GPU; only the
  activation between them is vLLM's: the CUDA ``silu_and_mul`` its fused MoE calls in every mode (eager, and
  default on CUDA), in native mode and on a CPU's default mode the native op run eagerly (a stand-in, rounding per
  op as the kernel does);
- **the shared expert and its gate, inside the op**: ``Qwen3NextMLP`` is ``Qwen2MoeMLP`` (``models/qwen2_moe.py``)
  built with ``expert_gate=shared_expert_gate`` and handed to the runner as its shared experts
  (``runner/shared_experts.py`` ``SharedExperts`` runs it in ``_forward_impl``, inside the op): one gate/up GEMM,
  ``SiluAndMul`` (the CUDA kernel in eager mode; in default mode ``forward_native`` compiled on its own,
  ``CustomOp.maybe_compile``), down, then ``F.sigmoid(expert_gate(x)[0]) * out``: the gate's GEMM (hidden -> 1),
  the sigmoid and the product as plain PyTorch ops on bf16 tensors, in both modes, hidden from the model's
  compile: RN(RN(sigmoid(RN(x w))) * s), HF's own ops in HF's order;
- **``shared + routed`` in the piece**: the op returns ``(shared_output, fused_output)``, two bf16 tensors, and
  ``MoERunner.forward`` adds them (``shared_output + fused_output``) in the model's graph, outside the op, in the
  model's dtype; in default mode Inductor fuses that add into the next layer's fused add + norm (or the final
  norm), which then reads the unrounded sum (the rows' ``moe_out``), as on GLM-4 MoE.

Not laid out: expert parallelism, sequence-parallel MoE and tensor parallelism (``replicate_shared_expert``, the
all-reduces), ROCm AITER's shared expert fused into the routed kernel (``resolve_layer_fused_shared_expert``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from rla.engines.vllm_twin_moe import MoeBlock, expert_kernels, hf_routed, moe_ops, moe_output, shared_activation
from rla.engines.vllm_twin_qwen3_5 import Qwen3_5Twin

__all__ = ["Qwen3_5MoeTwin"]


class Qwen3_5MoeTwin(Qwen3_5Twin):
    """vLLM 0.33's Qwen3.5 MoE forward of an HF ``Qwen3_5MoeForCausalLM`` (see the module doc); arguments as
    :class:`rla.engines.vllm_twin_qwen3_5.Qwen3_5Twin`."""

    FAMILIES = ("qwen3_5_moe_text",)

    def __init__(self, model, engine, mode: str = "default", library: str | None = None, **options):
        cfg = model.config
        if cfg.model_type in self.FAMILIES:
            _check_moe_config(cfg)
        self.blocks = []
        super().__init__(model, engine, mode, library, **options)

    def _bind_ops(self, engine, mode, library):
        super()._bind_ops(engine, mode, library)
        moe_ops()
        kernels = expert_kernels(self.device, engine, mode, library)
        self.expert_act = kernels.silu_and_mul if kernels is not None else engine.silu_and_mul_native
        self.shared_act = shared_activation(engine, mode, kernels)

    def layer_weights(self, layer, merged_gemms: bool = False):
        mlp = layer.mlp
        w = self.mixer_weights(layer, merged_gemms)
        block = MoeBlock(hf_routed(mlp.gate, mlp.experts, lambda t: self.expert_act(t)),
                         self._shared(mlp, merged_gemms))
        self.blocks.append(block)
        w["moe"], w["shared"] = block.key, True
        return w

    def _shared(self, mlp, merged_gemms):
        """``Qwen2MoeMLP.forward`` with its ``expert_gate``, as ``SharedExperts`` runs it inside the op."""
        sh, gate = mlp.shared_expert, mlp.shared_expert_gate

        def shared(x):
            if merged_gemms:
                gate_up = F.linear(x, torch.cat((sh.gate_proj.weight, sh.up_proj.weight)))
            else:
                gate_up = torch.cat((F.linear(x, sh.gate_proj.weight), F.linear(x, sh.up_proj.weight)), dim=-1)
            out = F.linear(self.shared_act(gate_up), sh.down_proj.weight)
            return F.sigmoid(F.linear(x, gate.weight)) * out

        return shared

    def _mlp(self, hidden, residual, w):
        hidden, residual = self.add_norm(hidden, residual, w["post"], self.eps)
        return moe_output(hidden, w), residual


def _check_moe_config(cfg):
    """What vLLM's Qwen3.5 MoE block computes that the twin lays out, else a clear error."""
    if getattr(cfg, "norm_topk_prob", True) is False:
        raise NotImplementedError(
            "norm_topk_prob=False: vLLM's Qwen3NextSparseMoeBlock then does not renormalise the top-k weights, "
            "HF's Qwen3_5MoeTopKRouter always does, and the twin routes as HF")
    if int(getattr(cfg, "shared_expert_intermediate_size", 0) or 0) <= 0:
        raise NotImplementedError("shared_expert_intermediate_size <= 0: vLLM's Qwen3NextSparseMoeBlock then builds "
                                  "no shared expert, HF's block always does")
