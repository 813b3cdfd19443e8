"""``rla.align(model, profile="vllm")``: make an HF model's training forward round like an engine.

One line per model instance::

    report = rla.align(model, profile="vllm")       # regions=("rope", "swiglu", "rmsnorm")
    print(report)                                    # what was aligned, hazards fixed
    rla.unalign(model)                               # back to HF's own code, bit for bit
    with rla.aligned(model, "sglang"): ...           # aligned inside the block only

What changes, per region (everything else in the model runs HF's own code):

- ``rope``: the rotary module returns fp32 cos/sin half tables [B, S, D/2] from an fp32
  ``inv_freq`` (recomputed from the config if ``model.to(bf16)`` rounded it); attention applies
  them with ``rla.ops.rope``.
- ``swiglu``: dense MLPs, shared experts and MoE experts compute silu(gate) * up with
  ``rla.ops.swiglu``.
- ``rmsnorm``: every RMSNorm (input, post-attention, final, Qwen3's q/k norms) runs
  ``rla.ops.rms_norm``; under ``norm_residual='fp32_sum'`` decoder layers hand the fp32 residual
  sum to the next norm, as fused add+norm kernels do (see ``rla.alignment.rmsnorm``).
- ``router`` (opt-in, MoE models: ``regions=("rope", "swiglu", "rmsnorm", "router")``): each MoE
  block's routing and weighted sum of experts through ``rla.ops.routing`` with the profile's
  router points (``rla.alignment.router``); ``rla.replay_routes`` routes the training forward to
  recorded experts (``rla.alignment.replay``).
- the LM head (every alignment, whatever ``regions``): the row's ``lm_head`` point
  (``rla.alignment.lm_head``): fp32 logits under ``fp32``; under ``lp`` HF's bf16 head is left as
  it is and a head a trainer cast to fp32 (TRL) computes the engine's bf16 GEMM again.
- ``qk_norm_out='fp32'`` (rope and rmsnorm regions): Qwen3's q/k norms and RoPE run as one op,
  ``rla.ops.qk_norm_rope``, in an attention forward rebuilt from HF's own source
  (``rla.alignment.qk_chain``; the two-op chain, with a note in the report, where the source
  has another shape).

Supported families: Llama, Mistral, Qwen2, Qwen3, Qwen2-MoE, Qwen3-MoE, Mixtral, GLM-4 MoE (partial rotary), GPT-OSS
(its experts' clamped SwiGLU through ``rla.ops.swiglu_oai``), Gemma 3 (``rla.alignment.gemma``), Gemma 4's text model (``rla.alignment.gemma4``; its MoE router and experts left as they are) and Qwen3.5 dense and MoE (``rla.alignment.qwen3_5``; its linear-attention mixers and the MoE's shared-expert gate left as they are) and
DeepSeek-V3 (its MLA's latent norms and rope half: ``rla.alignment.mla``); transformers 5.17 and 5.24 (``rla.alignment.compat``). Where a
family's modules run other engine code, the row's variant for them holds (docs/families.md).

Alignment is per instance: only instance attributes change, classes and transformers' module
globals never do, and ``state_dict()`` is untouched. Works under ``model.generate``, gradient
checkpointing, ``torch.compile``, PEFT, accelerate hooks, ``copy.deepcopy``, autocast with fp32
master weights and FSDP2 (with ``MixedPrecisionPolicy(cast_forward_inputs=False)`` under the
``fp32_sum`` profiles).

Things that behave differently from HF on purpose:

- Under ``fp32_sum`` (vllm, sglang, rla) decoder layers return the fp32 residual sum, so
  ``output_hidden_states`` shows fp32 tensors between layers (the values the next norm reads).
- fp32 master weights under bf16 autocast compute what the bf16 engine computes (layer 0 rounds
  the embeddings, norms multiply by RN(w)), bit for bit the aligned bf16 copy of the weights.
  HF's own autocast forward keeps an fp32 residual stream instead, so even under ``hf`` an
  autocast model's aligned and unaligned outputs differ.
- A rounded ``inv_freq`` is fixed under every profile (engines compute it in fp32), so a model
  cast with ``model.to(torch.bfloat16)`` changes under ``hf`` too; the report says so.
- ``model.to(dtype)`` after aligning is an error at the next forward (it re-rounds ``inv_freq``):
  align again after casting. Pickling the aligned module object (``torch.save(model)``) is not
  supported; ``state_dict()`` / ``save_pretrained`` are unchanged and round-trip.
"""

from __future__ import annotations

from rla.alignment.core import ALIGN_REGIONS, align, aligned, alignment_of, unalign
from rla.alignment.alignment_report import AlignmentReport, FixedHazard
from rla.alignment.replay import capture_routes, moe_layers, replay_routes, routes_from_records

__all__ = ["ALIGN_REGIONS", "align", "unalign", "aligned", "alignment_of", "AlignmentReport", "FixedHazard", "replay_routes",
           "capture_routes", "routes_from_records", "moe_layers"]
