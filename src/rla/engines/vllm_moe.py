"""vLLM's fused-MoE path, read from its wheel (never copied): the evidence of the rows' ``moe_experts``
variant (docs/families.md, "Routed experts"), and of its variant point ``moe_out``.

The default rows' ``swiglu=fused`` was measured on dense MLPs, where Inductor fuses ``silu(g) * u``. An
MoE block's routed experts run elsewhere: inside ``torch.ops.vllm.moe_forward`` (a custom op Inductor
does not trace into), whose Triton experts (the backend vLLM picks first on SM90) call the CUDA
``silu_and_mul`` between their two GEMMs in both modes -- the kernel the eager rows measured
``per_op``. The shared experts run inside the same op as their MLP module, whose ``SiluAndMul``
vLLM compiles alone with Inductor (``CustomOp.maybe_compile``): fused, the row's value.
The op returns the shared and routed outputs apart; ``MoERunner.forward`` adds them in the model's
graph, outside the op, and the decoder layer's next fused add + norm (compiled in the same piece)
reads that sum: Inductor fuses the two adds, so the residual add reads it unrounded (``moe_out``,
facts of the family ``moe_out``). :data:`FACTS` holds each link, :func:`check_facts` checks them
against the package in hand (0.33.0 and 0.26.0 say the same), so a vLLM that changed them fails
loudly instead of leaving the variant standing on nothing.
"""

from __future__ import annotations

from rla.engines.facts import Fact, check
from rla.engines.source import EnginePackage

__all__ = ["FACTS", "check_facts"]

_FM = "vllm/model_executor/layers/fused_moe/"
_M = "vllm/model_executor/models/"

FACTS = (
    Fact("moe_experts", _FM + "runner/moe_runner.py", "",
         'direct_register_custom_op( op_name="moe_forward", op_func=_moe_forward,',
         "the fused MoE is a registered custom op: Inductor does not compile inside it"),
    Fact("moe_experts", _FM + "runner/moe_runner.py", "MoERunner._select_forward",
         "torch.ops.vllm.moe_forward if self._shared_experts is None else torch.ops.vllm.moe_forward_shared",
         "on CUDA the layer calls that op (with its shared experts inside it where the model has them)"),
    Fact("moe_experts", _FM + "oracle/unquantized.py", "_get_priority_backends",
         "if current_platform.is_device_capability_family(90): "
         "_move_to_back(_AVAILABLE_BACKENDS, UnquantizedMoeBackend.FLASHINFER_TRTLLM)",
         "on SM90 (H100/H200) the bf16 unquantized experts take the Triton backend first"),
    Fact("moe_experts", _FM + "experts/triton_moe.py", "TritonExperts.apply",
         "self.activation( activation, intermediate_cache2, intermediate_cache1.view(-1, N) )",
         "between the gate_up and the down GEMMs the Triton experts call their activation on the lp cache"),
    Fact("moe_experts", _FM + "modular_kernel.py", "FusedMoEExpertsModular.activation", "apply_moe_activation(",
         "which is apply_moe_activation"),
    Fact("moe_experts", _FM + "activation.py", "apply_moe_activation", "torch.ops._C.silu_and_mul(output, input)",
         "SiLU without a clamp is the CUDA silu_and_mul kernel, measured per_op on the eager rows"),
    Fact("moe_experts", _M + "qwen2_moe.py", "Qwen2MoeSparseMoeBlock.__init__",
         "shared_experts=self.shared_expert, num_experts=config.num_experts,",
         "Qwen2-MoE's routed experts are the fused MoE (FusedMoEFactory in 0.33, FusedMoE in 0.26: both build "
         "the MoERunner), its shared expert passed into it"),
    Fact("moe_experts", _M + "qwen2_moe.py", "Qwen2MoeMLP.__init__", "self.act_fn = SiluAndMul()",
         "the shared expert is an MLP module with SiluAndMul"),
    Fact("moe_experts", "vllm/model_executor/layers/activation.py", "SiluAndMul.__init__",
         "def __init__(self, *, compile_native: bool = True):",
         "SiluAndMul asks for its native forward compiled where it is disabled (under Inductor)"),
    Fact("moe_experts", "vllm/model_executor/custom_op.py", "CustomOp.dispatch_forward",
         "return self.maybe_compile(self.forward_native, enable=compile_native)",
         "a disabled CustomOp inside an opaque op runs its native forward compiled alone: the shared "
         "experts' silu * up fused, the row's value"),
    Fact("moe_out", _FM + "runner/moe_runner.py", "_moe_forward_shared_fake", "return shared_out, fused_out",
         "with shared experts the op (moe_forward_shared) returns the shared and routed outputs apart"),
    Fact("moe_out", _FM + "runner/moe_runner.py", "MoERunner.forward",
         "if shared_output is not None: result = shared_output + fused_output",
         "the runner adds the two lp outputs after the op, in the model's compiled graph"),
    Fact("moe_out", _M + "glm4_moe.py", "Glm4MoE.__init__", "shared_experts=self.shared_experts,",
         "GLM-4 MoE hands the runner its shared experts"),
    Fact("moe_out", _M + "glm4_moe.py", "Glm4MoeDecoderLayer.forward",
         "hidden_states, residual = self.input_layernorm(hidden_states, residual)",
         "the next layer's fused add + norm reads the block's output (in the same compiled piece)"),
    Fact("moe_out", _M + "deepseek_v2.py", "DeepseekV2MoE.__init__", "shared_experts=self.shared_experts,",
         "DeepSeek-V2/V3 hand the runner their shared experts"),
    Fact("moe_out", _M + "qwen3_next.py", "Qwen3NextSparseMoeBlock.__init__",
         "reduce_results=False, expert_gate=self.shared_expert_gate,",
         "Qwen3-Next's and Qwen3.5 MoE's shared expert is Qwen2-MoE's gated MLP, its output left for the runner's sum"),
)


def check_facts(pkg: EnginePackage, family: str | None = None) -> dict[str, dict]:
    """Check every :data:`FACTS` entry (of ``family``, or all) in ``pkg``; -> provenance per fact
    (``"<file>:<function>"``). Raises :class:`rla.engines.EngineCodeError` naming each one that no
    longer holds."""
    return check(pkg, FACTS, family, "vLLM fused-MoE", "vLLM's fused-MoE code", "the vllm rows' moe_experts evidence")
