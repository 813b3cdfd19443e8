"""The test oracle for ``rla.align``: a whole decoder forward written from docs/rounding.md.

Nothing here calls ``rla.ops`` or ``rla.align``. The forward reuses the model's weights and its
(unpatched) MoE routers, and mirrors HF's eager attention op for op, so that under the ``hf``
points it equals the unaligned HF model bit for bit (``tests/alignment/test_align_spec.py``: that
is what makes it a trustworthy oracle for the other profiles). Every rounding is an explicit
``.to(lp)``.

A helper module, not a test file: the alignment, profile and engine tests import the helpers (tiny
models, ``spec_forward``, the ``single_thread`` fixture) by name, ``from align_spec import ...``
(``tests/`` is on ``sys.path``, see ``pyproject.toml``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import pytest
import torch
import torch.nn.functional as F
import transformers
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from spec import vllm_mean_square

BF16 = torch.bfloat16


@pytest.fixture(autouse=True, scope="module")
def single_thread():
    """One intra-op thread while these tests run. The CPU test machine has 2 shared cores; with
    more busy processes than cores, OpenMP workers spin and tiny bf16 ops (index_add_ in the MoE
    loop) get ~10x slower. Results do not depend on it: aligned model and oracle share the setting.
    Other test files import this fixture by name."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)

# ---------------------------------------------------------------------------------------------
# docs/rounding.md, "Built-in profiles", copied as data (checked against rla.profiles by tests/alignment/test_align_spec.py).
# ---------------------------------------------------------------------------------------------
POINTS = ("rope_cos_sin", "rope_apply", "rope_inv_freq", "swiglu", "norm_weight", "norm_residual",
          "residual_stream", "qk_norm_out", "norm_reduction", "lm_head")
SPEC = {
    "hf": ("round", "per_op", "host", "per_op", "per_op", "rounded_sum", "rounded", "round", "unpinned", "lp"),
    "sglang-0.5.23": ("fp32", "fused", "device", "fused", "fused", "fp32_sum", "rounded", "round", "unpinned", "lp"),
    "vllm-0.26": ("round", "fused", "device", "fused", "fused", "fp32_sum", "fp32_carry", "fp32", "unpinned", "lp"),
    "vllm-0.26-eager": ("round", "fused", "device", "per_op", "fused", "rounded_sum", "rounded", "round", "vllm_block", "lp"),
    "vllm-0.33": ("round", "fused", "device", "fused", "fused", "fp32_sum", "fp32_carry", "fp32", "unpinned", "lp"),
    "vllm-0.33-eager": ("round", "fused", "device", "per_op", "fused", "rounded_sum", "rounded", "round", "vllm_block", "lp"),
    "rla": ("fp32", "fused", "device", "fused", "fused", "fp32_sum", "rounded", "round", "unpinned", "lp"),
}


class Row(dict):
    """A row's points; ``fused_head_sizes``: the head sizes at which its RoPE points hold, where the
    row has such a rule (None: at every head size). At any other head size RoPE reads bf16 cos/sin
    with bf16 products (``HEAD_SIZE_POINTS``); :func:`at_head_size` applies it. ``experts_swiglu``:
    the routed experts' swiglu where it is not the row's (:data:`EXPERTS_SWIGLU`; None: the row's);
    :func:`experts_points` applies it. ``moe_out``: ``fp32`` where the residual add after an MoE block with
    shared experts reads their fp32 sum (:data:`MOE_OUT`; None: RN(shared + routed)); :func:`moe_sum_fp32`
    reads it. Equal to a plain dict of the same points (no rule is a point)."""

    def __init__(self, pts, fused_head_sizes=None, experts_swiglu=None, moe_out=None):
        super().__init__(pts)
        self.fused_head_sizes = fused_head_sizes
        self.experts_swiglu = experts_swiglu
        self.moe_out = moe_out


#: docs/families.md, "Routed experts", copied as data: vLLM runs an MoE block's routed experts inside its
#: fused-MoE op, whose activation is the CUDA silu_and_mul in both modes (RN(RN(silu(g)) * u)), so the
#: default rows' routed experts round per_op while their dense MLPs and shared experts are fused.
EXPERTS_SWIGLU = {"vllm-0.33": "per_op", "vllm-0.26": "per_op"}


#: docs/families.md, "The engine twin of GLM-4 MoE", copied as data: vLLM's compiled graph adds an MoE
#: block's shared and routed outputs (two bf16 tensors from its opaque op) outside the op, and Inductor fuses
#: that add into the next residual add, which reads the fp32 sum; the eager rows and SGLang round it.
MOE_OUT = {"vllm-0.33": "fp32", "vllm-0.26": "fp32"}


#: rla.align applies moe_out from transformers 5.24's block layout on; below it the blocks stay HF's (the report says
#: so: rla.alignment.moe_out.MIN_TRANSFORMERS), so what the aligned model computes there rounds the sum.
_MOE_OUT_FROM = tuple(int(x) for x in "5.24".split("."))


def moe_sum_fp32(pts: dict) -> bool:
    """Whether the residual add after an MoE block with shared experts reads their unrounded sum."""
    release = tuple(int(x) for x in transformers.__version__.split(".")[:2])
    return getattr(pts, "moe_out", None) == "fp32" and release >= _MOE_OUT_FROM


def experts_points(pts: dict) -> dict:
    """The points the routed experts' gated product takes under ``pts``: the row's, with its
    ``experts_swiglu`` where it has one."""
    own = getattr(pts, "experts_swiglu", None)
    return pts if own is None else {**pts, "swiglu": own}


#: docs/rounding.md, "SGLang's head sizes", copied as data: SGLang 0.5.23 on CUDA keeps the fp32
#: cos/sin cache and its fused RoPE kernel for these head sizes only (srt/layers/rotary_embedding/
#: base.py); at the others its fallback kernel reads a bf16 cache and rounds each product.
SGLANG_FUSED_HEAD_SIZES = (64, 128, 256, 512)
HEAD_SIZE_POINTS = {"rope_cos_sin": "round", "rope_apply": "per_op"}
SPEC = {name: Row(dict(zip(POINTS, row)), SGLANG_FUSED_HEAD_SIZES if name == "sglang-0.5.23" else None,
                 EXPERTS_SWIGLU.get(name), MOE_OUT.get(name))
        for name, row in SPEC.items()}
SPEC["vllm"], SPEC["vllm-eager"], SPEC["sglang"] = SPEC["vllm-0.33"], SPEC["vllm-0.33-eager"], SPEC["sglang-0.5.23"]


def at_head_size(pts: dict, head_size: int) -> dict:
    """The points ``pts`` hold for a model with attention head size ``head_size``."""
    sizes = getattr(pts, "fused_head_sizes", None)
    keep = getattr(pts, "experts_swiglu", None)  # the experts' rule survives the head-size rule
    moe_out = getattr(pts, "moe_out", None)  # and so does the MoE sum's
    if sizes is None or head_size in sizes:
        return Row(pts, None, keep, moe_out)
    return Row({**pts, **HEAD_SIZE_POINTS}, None, keep, moe_out)


def head_size_of(cfg) -> int:
    """The attention head size of a config: head_dim where set, else hidden / heads."""
    return getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
PROFILES = ("hf", "sglang-0.5.23", "vllm-0.26", "vllm-0.26-eager", "vllm-0.33", "vllm-0.33-eager", "rla")
REGION_POINTS = {
    "rope": ("rope_cos_sin", "rope_apply", "rope_inv_freq", "qk_norm_out"),
    "swiglu": ("swiglu",),
    "rmsnorm": ("norm_weight", "norm_residual", "residual_stream", "norm_reduction"),
}


def points(profile: str, regions=("rope", "swiglu", "rmsnorm")) -> dict:
    """The profile's points in ``regions``; HF's own (``hf``) points elsewhere."""
    out = Row(SPEC["hf"], SPEC[profile].fused_head_sizes if "rope" in regions else None,
              SPEC[profile].experts_swiglu if "swiglu" in regions else None,
              SPEC[profile].moe_out if "rmsnorm" in regions else None)  # the residual add's (rmsnorm region)
    for region in regions:
        for point in REGION_POINTS[region]:
            out[point] = SPEC[profile][point]
    if not {"rope", "rmsnorm"} <= set(regions):  # the q/k-norm -> RoPE chain needs both regions
        out["qk_norm_out"] = "round"
    out["lm_head"] = SPEC[profile]["lm_head"]  # no region's: every alignment applies it
    return out


# ---------------------------------------------------------------------------------------------
# Tiny models
# ---------------------------------------------------------------------------------------------
FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "qwen2_moe", "qwen3_moe", "mixtral")
_COMMON = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=128,
    max_position_embeddings=64,
    rms_norm_eps=1e-6,
    initializer_range=0.1,
    tie_word_embeddings=False,
)
_MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32)


def tiny_config(family: str, **overrides):
    """A tiny config of ``family``; ``overrides`` go to the config constructor."""
    kw = dict(_COMMON)
    if family in ("mistral", "qwen3", "qwen3_moe"):
        kw["head_dim"] = 16
    if family in ("qwen2_moe", "qwen3_moe"):
        kw.update(_MOE)
    if family == "qwen2_moe":
        # layer 1 is a dense MLP (mlp_only_layers): both kinds in one model
        kw.update(shared_expert_intermediate_size=64, decoder_sparse_step=1, mlp_only_layers=[1])
    if family == "qwen3_moe":
        kw.update(norm_topk_prob=True)
    if family == "mixtral":
        kw.update(num_local_experts=4, num_experts_per_tok=2)
    kw.update(overrides)
    classes = {
        "llama": transformers.LlamaConfig,
        "mistral": transformers.MistralConfig,
        "qwen2": transformers.Qwen2Config,
        "qwen3": transformers.Qwen3Config,
        "qwen2_moe": transformers.Qwen2MoeConfig,
        "qwen3_moe": transformers.Qwen3MoeConfig,
        "mixtral": transformers.MixtralConfig,
    }
    return classes[family](**kw)


def tiny_model(family: str, seed: int = 0, dtype=BF16, experts="eager", config=None, **overrides):
    """A random tiny model in ``dtype`` with an fp32 ``inv_freq`` (as from_pretrained(dtype=) gives).

    RMSNorm weights are randomised (HF initialises them to 1, where per_op and fused weight
    products coincide and a test would prove nothing).
    """
    cfg = config if config is not None else tiny_config(family, **overrides)
    torch.manual_seed(seed)
    kwargs = dict(attn_implementation="eager")
    if "moe" in family or family == "mixtral":
        kwargs["experts_implementation"] = experts
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=dtype, **kwargs)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.2 * torch.randn(p.shape, generator=g))
    assert model.model.rotary_emb.inv_freq.dtype == torch.float32
    return model.eval()


def tokens(batch=2, seq=12, seed=0, vocab=128):
    return torch.randint(0, vocab, (batch, seq), generator=torch.Generator().manual_seed(seed))


# ---------------------------------------------------------------------------------------------
# The spec: one region at a time (v, w are fp32 values; RN is .to(lp))
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Arith:
    """The fp32 expressions the oracle writes where a one-ulp change is possible. The spec's
    own are the defaults; a one-ulp test replaces one (``Arith(rstd=lambda m: 1 / torch.sqrt(m))``)
    to show, on its inputs, that the planted change flips the logits the aligned model must match
    (``tests/alignment/test_align_one_ulp.py``)."""

    rstd: Callable = torch.rsqrt  # of mean square + eps
    silu: Callable = F.silu  # of the fp32 gate
    carry: Callable = lambda a, r, m: (a + r) + m  # fp32_carry: attention out, residual, MLP out
    cos_sin: Callable = lambda freqs: (freqs.cos(), freqs.sin())  # of the fp32 angles
    scale_normed: Callable = lambda v, rstd, w: (v * rstd) * w  # a fused norm's fp32 product


ARITH = Arith()


def rn(v, lp):
    return v.to(lp).float()


def spec_inv_freq(cfg, seq_len=None):
    """fp32 inv_freq as engines compute it (rope types without an attention factor)."""
    inv_freq, scale = spec_rope_params(cfg, seq_len)
    assert scale == 1.0
    return inv_freq


def spec_rope_params(cfg, seq_len=None):
    """fp32 inv_freq as engines compute it, and the attention factor that scales cos/sin (YaRN,
    longrope; 1.0 for the rest). Default RoPE written out; scaled types use the rope-type formula
    transformers defines (the model's own definition of its frequencies). ``dynamic`` grows past
    max_position_embeddings, ``longrope`` takes its long factors past the original length."""
    rp = cfg.rope_parameters
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    if rp["rope_type"] == "default":
        return 1.0 / (rp["rope_theta"] ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim)), 1.0
    fn = ROPE_INIT_FUNCTIONS[rp["rope_type"]]
    if rp["rope_type"] == "dynamic" and seq_len is not None and seq_len > cfg.max_position_embeddings:
        inv_freq, scale = fn(cfg, None, seq_len=torch.tensor(seq_len))
    elif rp["rope_type"] == "longrope" and seq_len is not None:
        inv_freq, scale = fn(cfg, None, seq_len=seq_len)
    else:
        inv_freq, scale = fn(cfg)
    return inv_freq.float(), float(scale)


def spec_cos_sin(inv_freq, positions, arith=ARITH):
    freqs = positions[..., None].float() * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    return arith.cos_sin(emb)


def _rot(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def spec_rope(x, cos, sin, pts, lp=None):
    lp = lp or x.dtype
    c, s = cos[:, None], sin[:, None]  # [B, 1, S, D] against x [B, H, S, D]
    if pts["rope_cos_sin"] == "round":
        c, s = rn(c, lp), rn(s, lp)
    xf = x.float()
    if pts["rope_apply"] == "per_op":
        return (rn(xf * c, lp) + rn(_rot(xf) * s, lp)).to(lp)
    return (xf * c + _rot(xf) * s).to(lp)


def spec_swiglu(g, u, pts, arith=ARITH):
    lp = g.dtype
    a = arith.silu(g.float())
    if pts["swiglu"] == "per_op":
        a = rn(a, lp)
    return (a * u.float()).to(lp)


def spec_norm(v, weight, eps, pts, lp, out=None, after_add=False, arith=ARITH):
    """v: the fp32 value the norm reads; weight: the engine's copy is RN(weight); ``out``: the
    output dtype (fp32 = unrounded, the q/k norm of the qk_norm_out='fp32' chain); ``after_add``:
    the norm reads a residual sum (the engine's add + norm kernel, for ``norm_reduction``)."""
    if pts.get("norm_reduction", "unpinned") == "vllm_block":
        mean_square = vllm_mean_square(v, v.numel() // v.shape[-1], after_add)
    else:
        mean_square = (v * v).mean(-1, keepdim=True)
    rstd = arith.rstd(mean_square + eps)
    w = rn(weight.float(), lp)
    if pts["norm_weight"] == "per_op":
        return (w * rn(v * rstd, lp)).to(out or lp)
    return arith.scale_normed(v, rstd, w).to(out or lp)


# ---------------------------------------------------------------------------------------------
# The decoder, HF eager attention op for op
# ---------------------------------------------------------------------------------------------


class SpecCache:
    """Per-layer K (after RoPE) and V, like HF's DynamicCache."""

    def __init__(self):
        self.k, self.v = {}, {}

    def length(self):
        return 0 if not self.k else self.k[0].shape[2]


def _linear(mod, x):
    return F.linear(x, mod.weight, mod.bias)


def _repeat_kv(x, n_rep):
    b, kv, s, d = x.shape
    if n_rep == 1:
        return x
    return x[:, :, None, :, :].expand(b, kv, n_rep, s, d).reshape(b, kv * n_rep, s, d)


def _attention(attn, h, cos, sin, mask, pts, lp, eps, cache, idx, arith=ARITH):
    b, s, _ = h.shape
    d = attn.head_dim
    q = _linear(attn.q_proj, h).view(b, s, -1, d)
    k = _linear(attn.k_proj, h).view(b, s, -1, d)
    v = _linear(attn.v_proj, h).view(b, s, -1, d).transpose(1, 2)
    if hasattr(attn, "q_norm"):  # Qwen3: per-head norms, no residual, follow norm.weight
        out = torch.float32 if pts["qk_norm_out"] == "fp32" else lp  # fp32: RoPE reads it unrounded
        q = spec_norm(q.float(), attn.q_norm.weight, eps, pts, lp, out, arith=arith)
        k = spec_norm(k.float(), attn.k_norm.weight, eps, pts, lp, out, arith=arith)
    q, k = spec_rope(q.transpose(1, 2), cos, sin, pts, lp), spec_rope(k.transpose(1, 2), cos, sin, pts, lp)
    if cache is not None:
        if idx in cache.k:
            k = torch.cat([cache.k[idx], k], dim=2)
            v = torch.cat([cache.v[idx], v], dim=2)
        cache.k[idx], cache.v[idx] = k, v
    n_rep = q.shape[1] // k.shape[1]
    k, v = _repeat_kv(k, n_rep), _repeat_kv(v, n_rep)
    w = torch.matmul(q, k.transpose(2, 3)) * attn.scaling
    if mask is not None:
        w = w + mask
    w = F.softmax(w, dim=-1, dtype=torch.float32).to(lp)
    o = torch.matmul(w, v).transpose(1, 2).contiguous().reshape(b, s, -1)
    return _linear(attn.o_proj, o)


def _dense_mlp(mlp, h, pts, arith=ARITH):
    return _linear(mlp.down_proj, spec_swiglu(_linear(mlp.gate_proj, h), _linear(mlp.up_proj, h), pts, arith))


def _experts(ex, h2, idx, weights, pts, arith=ARITH):
    pts = experts_points(pts)  # the routed experts' own swiglu where the row has one
    out = torch.zeros_like(h2)
    mask = F.one_hot(idx, num_classes=ex.num_experts).permute(2, 1, 0)
    for e in range(ex.num_experts):
        pos, tok = torch.where(mask[e])
        if tok.numel() == 0:
            continue
        g, u = F.linear(h2[tok], ex.gate_up_proj[e]).chunk(2, dim=-1)
        cur = F.linear(spec_swiglu(g, u, pts, arith), ex.down_proj[e])
        cur = cur * weights[tok, pos, None]
        out.index_add_(0, tok, cur.to(out.dtype))
    return out


def _mlp(mlp, h, pts, arith=ARITH):
    if hasattr(mlp, "gate_proj"):
        return _dense_mlp(mlp, h, pts, arith)
    b, s, hid = h.shape
    h2 = h.view(-1, hid)
    _, weights, idx = mlp.gate(h2)  # the model's own router (not a rounding region)
    out = _experts(mlp.experts, h2, idx, weights, pts, arith)
    if hasattr(mlp, "shared_expert"):
        shared = _dense_mlp(mlp.shared_expert, h2, pts, arith)
        gated = torch.sigmoid(_linear(mlp.shared_expert_gate, h2)) * shared
        out = out.float() + gated.float() if moe_sum_fp32(pts) else out + gated  # the add's fp32 read, or RN
    return out.reshape(b, s, hid)


def spec_forward(model, input_ids, pts, cache: SpecCache | None = None, last_only=False, positions=None,
                 arith=ARITH, streams=None):
    """Logits of ``model`` under the rounding points ``pts``, from docs/rounding.md.

    ``positions`` [B, S]: the tokens' positions (default: consecutive after the cache);
    ``arith``: the oracle's fp32 expressions (:class:`Arith`); ``streams``: a list that receives
    each layer's output as the next layer reads it (fp32 under ``fp32_sum``, else lp).
    """
    body, cfg = model.model, model.config
    pts = at_head_size(pts, head_size_of(cfg))
    lp = body.embed_tokens.weight.dtype
    eps = cfg.rms_norm_eps
    b, s = input_ids.shape
    past = cache.length() if cache is not None else 0
    if positions is None:
        positions = torch.arange(past, past + s)[None].expand(b, s)
    inv_freq, scale = spec_rope_params(cfg, seq_len=past + s)
    cos, sin = spec_cos_sin(inv_freq, positions, arith)
    if scale != 1.0:  # YaRN / longrope: HF and engines scale the fp32 tables, then round them
        cos, sin = cos * scale, sin * scale
    mask = None
    if s > 1:
        future = torch.arange(past + s)[None, :] > (torch.arange(s)[:, None] + past)
        mask = torch.zeros(s, past + s, dtype=lp).masked_fill(future, torch.finfo(lp).min)[None, None]
    fp32_sum = pts["norm_residual"] == "fp32_sum"
    carry = pts["residual_stream"] == "fp32_carry"

    residual = F.embedding(input_ids, body.embed_tokens.weight)
    read = residual.float()  # what the next norm reads
    for i, layer in enumerate(body.layers):
        h = spec_norm(read, layer.input_layernorm.weight, eps, pts, lp, after_add=i > 0, arith=arith)
        a = _attention(layer.self_attn, h, cos, sin, mask, pts, lp, eps, cache, i, arith)
        r = residual
        total = a.float() + r.float()
        residual = total.to(lp)
        read = total if fp32_sum else residual.float()
        h = spec_norm(read, layer.post_attention_layernorm.weight, eps, pts, lp, after_add=True, arith=arith)
        x = _mlp(layer.mlp, h, pts, arith)
        if carry:  # fp32_carry: the MLP's add reads the unrounded a + r
            total = arith.carry(a.float(), r.float(), x.float())
        else:
            total = x.float() + residual.float()
        residual = total.to(lp)
        read = total if fp32_sum else residual.float()
        if streams is not None:
            streams.append(read if fp32_sum else residual)
    h = spec_norm(read, body.norm.weight, eps, pts, lp, after_add=True, arith=arith)
    if last_only:
        h = h[:, -1:]
    if pts.get("lm_head", "lp") == "fp32":  # docs/rounding.md, "LM head": the fp32 GEMM of h and RN(W)
        return F.linear(h.float(), model.lm_head.weight.to(lp).float())
    return F.linear(h, model.lm_head.weight)
