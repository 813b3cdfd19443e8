"""Engine twins of GLM-4 MoE (``glm4_moe``) and GPT-OSS (``gpt_oss``), laid out as vLLM's model files.

Both are the Llama layout of :class:`rla.engines.vllm_twin.VllmTwin` (a fused add + norm at each
layer's start and after attention, the final fused add + norm) with an MoE block in the MLP's place.

**The MoE block is an opaque op in the piece**, as vLLM's is: ``MoERunner`` calls
``torch.ops.vllm.moe_forward`` / ``moe_forward_shared`` (``fused_moe/runner/moe_runner.py``), custom
ops Inductor cannot see into, in the graph between attentions (not a split point). So Inductor
fuses up to the block's input and from its output on, never through it. The twin registers two such
ops of its own (``rla_twin::moe_forward`` / ``moe_forward_shared``, on the first MoE twin made), whose
implementation runs, eagerly:

- **the router as HF computes it** (the HF model's own ``gate`` / ``router`` module: on both sides;
  vLLM's fused top-k kernels are another computation, the MoE issue's, not a rounding region here);
- **the routed experts as HF's GEMMs per expert** (HF's eager loop: the experts hit in ascending
  order, each expert's tokens gathered, gate/up GEMM, the activation, down GEMM, times the routing
  weight, ``index_add_`` in the model's dtype), since vLLM's fused MoE GEMMs are Triton kernels on a
  GPU. Only the activation between the GEMMs is vLLM's: its fused MoE calls the CUDA kernel
  ``torch.ops._C.silu_and_mul`` / ``swigluoai_and_mul`` directly (``fused_moe/activation.py``
  ``apply_moe_activation``) **in every mode**, so the twin calls it in eager *and* default mode on
  CUDA; in native mode, and in default mode without CUDA, the native op (``SiluAndMul`` /
  ``SwigluOAIAndMul.forward_native``) runs eagerly, a stand-in that is not what the engine runs
  (``_C.silu_and_mul`` rounds silu(gate) first, as the eager op does; ``swigluoai_and_mul`` rounds
  once, as one quotient ``(g * (u + 1)) / (1 + e)``: the rows' ``oai_glu``; the eager op after every step);
- **GLM-4's shared experts inside the op** (``SharedExperts`` runs in ``_forward_impl``): its
  ``Glm4MoeMLP``'s ``SiluAndMul`` is ``forward_native`` compiled on its own in default mode
  (``CustomOp.maybe_compile``, ``dynamic=True``: the op's code is hidden from the model's compile),
  the kernel in eager mode; the op returns ``(shared, routed)`` and the piece adds them
  (``MoERunner.forward``: ``shared_output + fused_output``), where Inductor can fuse that add into
  the next layer's fused add + norm.

Not followed, by construction: vLLM applies GLM-4's ``routed_scaling_factor`` to the routed sum
(``apply_routed_scale_to_output``), HF to the routing weights (HF's router is on both sides).

GLM-4 MoE (``models/glm4_moe.py``): ``Glm4MoeAttention.forward`` (QKV, optional per-head
``q_norm``/``k_norm`` with ``use_qk_norm``, partial rotary: ``get_rope`` with
``partial_rotary_factor`` (``setdefault`` 0.5), attention, ``o_proj``), ``Glm4MoeDecoderLayer.forward``
(the Llama layout), a dense ``Glm4MoeMLP`` in the first ``first_k_dense_replace`` layers (compiled in
the piece), ``Glm4MoE`` after.

GPT-OSS (``models/gpt_oss.py``): ``TransformerBlock.forward`` (the Llama layout; ``RMSNorm(..., eps=1e-5)``
everywhere, whatever the config says), ``OAIAttention.forward`` (QKV and ``o_proj`` with biases;
``get_rope(..., dtype=torch.float32)`` with YaRN: the cache stays fp32 and every forward casts it to
the query's dtype, ``_match_cos_sin_cache_dtype``, inside the compiled graph in default mode; the
attention sinks handed to the attention, here HF's ``s_aux``), sliding windows on even layers only
(``_build_attention``: ``layer_idx % 2 == 0``), ``MLPBlock`` (router, fused MoE with
``activation="swigluoai"``, ``has_bias=True``).
"""

from __future__ import annotations

import itertools
import weakref

import torch
import torch.nn.functional as F

from rla.engines.vllm_twin import VllmTwin, layer_attention_inputs

__all__ = ["Glm4MoeTwin", "GptOssTwin", "MoeBlock", "expert_loop", "expert_kernels", "hf_routed", "moe_ops",
           "moe_output", "shared_activation"]

_BLOCKS: "weakref.WeakValueDictionary[int, MoeBlock]" = weakref.WeakValueDictionary()
_KEYS = itertools.count()
_OPS: dict = {}

#: vLLM's fused MoE calls ``swigluoai_and_mul(output, input)`` with the kernel's defaults.
_OAI_ALPHA, _OAI_LIMIT = 1.702, 7.0


def moe_ops():
    """The twin's opaque MoE ops, registered once per process (at the first MoE twin, not at import)."""
    if not _OPS:
        @torch.library.custom_op("rla_twin::moe_forward", mutates_args=())
        def moe_forward(hidden_states: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
            return _BLOCKS[int(key)].routed(hidden_states)

        @moe_forward.register_fake
        def _(hidden_states, key):
            return torch.empty_like(hidden_states)

        @torch.library.custom_op("rla_twin::moe_forward_shared", mutates_args=())
        def moe_forward_shared(hidden_states: torch.Tensor, key: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            block = _BLOCKS[int(key)]
            return block.shared(hidden_states), block.routed(hidden_states)

        @moe_forward_shared.register_fake
        def _(hidden_states, key):
            return torch.empty_like(hidden_states), torch.empty_like(hidden_states)

        _OPS.update(moe_forward=moe_forward, moe_forward_shared=moe_forward_shared)
    return _OPS


class MoeBlock:
    """One MoE layer as the opaque op runs it: ``routed(x)`` and, with a shared expert, ``shared(x)``;
    ``key`` names it to the op (``w["moe"]`` of the layer's weights)."""

    def __init__(self, routed, shared=None):
        self.routed, self.shared = routed, shared
        key = next(_KEYS)
        _BLOCKS[key] = self
        self.key = torch.tensor(key)  # on the CPU: the op reads it on the host


def expert_loop(x, index, weights, num_experts, up, act, down):
    """HF's eager experts loop (``Glm4MoeExperts.forward``, ``GptOssExperts.forward``): for each expert
    hit, in ascending order, its tokens ``x[token]`` through ``down(e, act(up(e, x)))``, times their
    routing weight, ``index_add_`` into a zero tensor of ``x``'s dtype."""
    final = torch.zeros_like(x)
    with torch.no_grad():
        mask = F.one_hot(index, num_classes=num_experts + 1).permute(2, 1, 0)
        hit = torch.greater(mask.sum(dim=(-1, -2)), 0).nonzero()
    for e in hit:
        e = e[0]
        if e == num_experts:
            continue
        pos, token = torch.where(mask[e])
        out = down(e, act(up(e, x[token]))) * weights[token, pos, None]
        final.index_add_(0, token, out.to(final.dtype))
    return final


def hf_routed(gate, experts, act):
    """``x -> routed experts' sum`` with HF's router ``gate`` (``_, weights, index = gate(x)``) and HF's
    per-expert GEMMs over 3-D ``gate_up_proj`` / ``down_proj`` (``Glm4MoeExperts``, ``Qwen3_5MoeExperts``),
    ``act`` (read at each call) between them: :func:`expert_loop`."""
    def routed(x):
        _, weights, index = gate(x)
        return expert_loop(x, index, weights, experts.num_experts, lambda e, t: F.linear(t, experts.gate_up_proj[e]),
                           act, lambda e, t: F.linear(t, experts.down_proj[e]))

    return routed


def expert_kernels(device, engine, mode, library):
    """vLLM's CUDA ops for the routed experts' activation, which its fused MoE calls in every mode
    (eager; default mode on CUDA), else None (the native op runs eagerly: the CPU's stand-in)."""
    return engine.c_ops(library) if mode == "eager" or (mode == "default" and device.type == "cuda") else None


def shared_activation(engine, mode, kernels):
    """The shared experts' ``SiluAndMul`` as it runs inside the opaque op: the CUDA kernel in eager
    mode (``kernels``: :func:`expert_kernels`'s); in default mode ``forward_native`` compiled on its
    own (``CustomOp.maybe_compile``, ``dynamic=True``: the op's code is hidden from the model's
    compile); natively, the native op."""
    native = engine.silu_and_mul_native
    if mode == "eager":
        return kernels.silu_and_mul
    if mode == "default":
        return torch.compile(native, dynamic=True, backend="inductor")
    return native


def moe_output(hidden, w):
    """The MoE block in the piece: the opaque op, then ``shared + routed`` outside it
    (``MoERunner.forward``: ``shared_output + fused_output``, where Inductor may fuse the add into the
    next residual add), or the op's routed output alone."""
    if w["shared"]:
        shared, routed = torch.ops.rla_twin.moe_forward_shared(hidden, w["moe"])
        return shared + routed
    return torch.ops.rla_twin.moe_forward(hidden, w["moe"])


class _MoeTwin(VllmTwin):
    """What both MoE twins share: the activation functions by mode, the MoE piece of the MLP."""

    def _bind_ops(self, engine, mode, library):
        super()._bind_ops(engine, mode, library)
        moe_ops()
        self.kernels = expert_kernels(self.device, engine, mode, library)
        self.expert_act_is_kernel = self.kernels is not None

    def _mlp(self, attn, residual, w):
        if "moe" not in w:
            return super()._mlp(attn, residual, w)
        hidden = F.linear(attn, w["wo"], w.get("bo"))
        hidden, residual = self.add_norm(hidden, residual, w["post"], self.eps)
        return moe_output(hidden, w), residual

    def _attention_weights(self, layer, merged_gemms):
        a = layer.self_attn
        w = {"in": layer.input_layernorm.weight, "post": layer.post_attention_layernorm.weight,
             "wq": a.q_proj.weight, "bq": a.q_proj.bias, "wk": a.k_proj.weight, "bk": a.k_proj.bias,
             "wv": a.v_proj.weight, "bv": a.v_proj.bias, "wo": a.o_proj.weight, "bo": a.o_proj.bias}
        if getattr(a, "q_norm", None) is not None:
            w["qn"], w["kn"] = a.q_norm.weight, a.k_norm.weight
        if merged_gemms:
            w["wqkv"] = torch.cat((w["wq"], w["wk"], w["wv"]))
            w["bqkv"] = None if w["bq"] is None else torch.cat((w["bq"], w["bk"], w["bv"]))
        return w

    def release_model(self):
        raise NotImplementedError("the MoE twins keep their model (the engine-backed forward covers the Llama layout)")


class Glm4MoeTwin(_MoeTwin):
    """vLLM 0.33's GLM-4 MoE forward of an HF ``Glm4MoeForCausalLM`` (see the module doc)."""

    FAMILIES = ("glm4_moe",)

    def __init__(self, model, engine, mode: str = "default", library: str | None = None, **options):
        if model.config.model_type in self.FAMILIES and model.config.hidden_act != "silu":
            raise NotImplementedError(f"vLLM's Glm4MoeMLP supports hidden_act='silu' only; got {model.config.hidden_act!r}")
        self.blocks = []
        super().__init__(model, engine, mode, library, **options)

    def _rope_cache(self, cfg, engine):
        return super()._rope_cache(cfg, engine, partial_rotary_default=0.5)  # Glm4MoeAttention's setdefault

    def _bind_ops(self, engine, mode, library):
        super()._bind_ops(engine, mode, library)
        k = self.kernels
        self.expert_act = k.silu_and_mul if k is not None else engine.silu_and_mul_native
        self.shared_act = shared_activation(engine, mode, k)

    def layer_weights(self, layer, merged_gemms: bool = False):
        mlp = layer.mlp
        if hasattr(mlp, "gate_proj"):  # a dense layer (first_k_dense_replace)
            return VllmTwin.layer_weights(layer, merged_gemms)
        w = self._attention_weights(layer, merged_gemms)
        shared = getattr(mlp, "shared_experts", None)
        block = MoeBlock(hf_routed(mlp.gate, mlp.experts, lambda t: self.expert_act(t)),  # HF's router
                         None if shared is None else self._shared(shared, merged_gemms))
        self.blocks.append(block)
        w["moe"], w["shared"] = block.key, shared is not None
        return w

    def _shared(self, mlp, merged_gemms):
        def shared(x):
            if merged_gemms:
                gate_up = F.linear(x, torch.cat((mlp.gate_proj.weight, mlp.up_proj.weight)))
            else:
                gate_up = torch.cat((F.linear(x, mlp.gate_proj.weight), F.linear(x, mlp.up_proj.weight)), dim=-1)
            return F.linear(self.shared_act(gate_up), mlp.down_proj.weight)

        return shared


class GptOssTwin(_MoeTwin):
    """vLLM 0.33's GPT-OSS forward of an HF ``GptOssForCausalLM`` (see the module doc)."""

    FAMILIES = ("gpt_oss",)

    def __init__(self, model, engine, mode: str = "default", library: str | None = None, **options):
        cfg = model.config
        if cfg.model_type in self.FAMILIES:
            for i, kind in enumerate(cfg.layer_types):
                if (kind == "sliding_attention") != (i % 2 == 0):
                    raise NotImplementedError(
                        f"GPT-OSS layer {i} is {kind!r} in the config, but vLLM's OAIAttention._build_attention gives "
                        "even layers the sliding window and odd layers none: the engine attends otherwise than HF, "
                        "and the twin attends as HF")
            ex = model.model.layers[0].mlp.experts
            if (ex.alpha, ex.limit) != (_OAI_ALPHA, _OAI_LIMIT):
                raise NotImplementedError(
                    f"vLLM's fused MoE calls swigluoai_and_mul with alpha={_OAI_ALPHA}, limit={_OAI_LIMIT} "
                    f"(fused_moe/activation.py); this model's experts use alpha={ex.alpha}, limit={ex.limit}")
        self.blocks = []
        super().__init__(model, engine, mode, library, **options)
        self.eps = 1e-5  # TransformerBlock / GptOssModel: RMSNorm(hidden_size, eps=1e-5)

    def _rope_cache(self, cfg, engine):
        """The fp32 YaRN cache object of ``get_rope(..., dtype=torch.float32)``; ``cos_sin_cache`` is
        its fp32 table (:meth:`cache_for` casts it, as each forward does)."""
        rp = cfg.rope_parameters
        self.family = engine.family_ops()
        self.rope_module = self.family.yarn_cache_module(
            self.head_dim, rp["original_max_position_embeddings"], rp["rope_theta"], rp["factor"],
            rp["beta_fast"], rp["beta_slow"], rp.get("truncate", True), dtype=torch.float32, device=self.device)
        return self.rope_module.cos_sin_cache

    def cache_for(self, w, query):
        return self.family.match_cache(self.rope_module, query)

    def _bind_ops(self, engine, mode, library):
        super()._bind_ops(engine, mode, library)
        k, fam = self.kernels, self.family
        if k is not None:
            self.expert_act = lambda x: k.swigluoai_and_mul(x, _OAI_ALPHA, _OAI_LIMIT)
        else:
            self.expert_act = lambda x: fam.swigluoai_and_mul(x, _OAI_ALPHA, _OAI_LIMIT)

    def layer_weights(self, layer, merged_gemms: bool = False):
        w = self._attention_weights(layer, merged_gemms)
        mlp = layer.mlp
        block = MoeBlock(self._routed(mlp))
        self.blocks.append(block)
        w["moe"], w["shared"] = block.key, False
        return w

    def _routed(self, mlp):
        router, ex = mlp.router, mlp.experts

        def routed(x):
            _, scores, index = router(x)  # HF's router (GptOssTopKRouter.forward)
            return expert_loop(x, index, scores, ex.num_experts,
                               lambda e, t: t @ ex.gate_up_proj[e] + ex.gate_up_proj_bias[e], self.expert_act,
                               lambda e, t: t @ ex.down_proj[e] + ex.down_proj_bias[e])

        return routed

    def layer_masks(self, input_ids, position_ids) -> list:
        return [mask for mask, _ in layer_attention_inputs(self.model.model, input_ids, None, position_ids)]

    def attention_kwargs(self, module) -> dict:
        return {**super().attention_kwargs(module), "s_aux": module.sinks}
