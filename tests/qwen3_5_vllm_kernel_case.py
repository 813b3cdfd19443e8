"""vLLM's Qwen3.5 attention kernel (``fused_qk_rmsnorm_rope_gate``: gated split + zero-centred q/k norm
+ partial RoPE) against rla's aligned q/k norm and partial rotary, on one probe per head size;
tests/engines/test_vllm_families.py runs it under Triton's interpreter on a CPU and compiled on a GPU.

The kernel is vLLM's own file from the wheel (``rla.engines.vllm_families``), handed the norms' bf16
weights as that version's ``Qwen3NextAttention._project_qkv_gate`` hands them, and the bf16 cos/sin
cache vLLM stores (``RotaryEmbeddingBase.__init__``: ``cache.to(dtype)``), built by vLLM's own
``_compute_cos_sin_cache`` (``rla.engines.vllm``). The rla side is what the aligned Qwen3.5 attention
runs: ``rla.ops.rms_norm`` with the zero-centred offset, its output fp32 under ``qk_norm_out='fp32'``
(the aligned rotary then hands RoPE the rounded tables, as ``rla.alignment.qwen3_5`` does under the
chain), then ``rla.alignment.rope.make_apply_partial_rotary`` on HF's [B, H, S, D] layout: once under
the row at the head size and once under that row's ``qwen3_5`` variant.

The probe's q/k values are multiples of 1/8 in [-2, 2]: every sum of their squares is exact in fp32
in any order, so the kernel's ``tl.sum`` and PyTorch's mean give the same rstd (``norm_reduction`` is
``unpinned``). A helper module, not a test file.
"""

from __future__ import annotations

from pathlib import Path

import torch

import rla
from rla import profiles
from rla.alignment.rope import make_apply_partial_rotary
from rla.engines import vllm as V
from rla.engines import vllm_families as VF
from rla.engines.source import locate

from qwen3_5_kernel_case import EPS, HK, HQ, T, points, probe_inputs  # the same probes as SGLang's case

BF = torch.bfloat16
#: (head size, rotated dims): the tiny model's (32, partial 0.25) and a larger one.
CASES = ((32, 8), (64, 16))
#: vLLM version -> its rows (default mode, eager mode).
ROWS = {"0.26.0": ("vllm-0.26", "vllm-0.26-eager"), "0.33.0": ("vllm-0.33", "vllm-0.33-eager")}


def _rla(p, q, k, wq, wk, eps, table, positions):
    """rla's aligned q/k norm and partial rotary under ``p`` on [T, H, D] q/k -> [T, H * D] each."""
    T, R = q.shape[0], table.shape[-1]
    chain = p.qk_norm_out == "fp32"
    out = torch.float32 if chain else None
    qn = rla.ops.rms_norm(q, wq, eps, p, dtype=BF, out_dtype=out, weight_offset=1.0)
    kn = rla.ops.rms_norm(k, wk, eps, p, dtype=BF, out_dtype=out, weight_offset=1.0)
    half_cos, half_sin = table[positions, : R // 2], table[positions, R // 2:]
    cos, sin = torch.cat([half_cos, half_cos], -1)[None], torch.cat([half_sin, half_sin], -1)[None]
    if chain:  # the aligned rotary's tables under the q/k chain are rounded (round_tables)
        cos, sin = cos.to(BF), sin.to(BF)
    qr, kr = make_apply_partial_rotary(p, half_tables=False)(qn.transpose(0, 1)[None], kn.transpose(0, 1)[None],
                                                              cos, sin)
    return qr[0].transpose(0, 1).reshape(T, -1), kr[0].transpose(0, 1).reshape(T, -1)


def run(wheel: str, extract_to: str, device: str) -> dict:
    """-> {"version", "D/R": {row name: {"points", "q", "k"} (fractions of q / k outputs equal), each row's
    "<name>/qwen3_5" too where its variant differs, "gate": bool, "mrope_text": bool}}: ``mrope_text``, the
    kernel's q/k for a text prompt's [3, T] mRoPE positions equal its q/k for the [T] ones."""
    pkg = locate("vllm", wheel)
    kernel, _ = VF.qwen3_5_qk_norm_rope_gate(pkg, Path(extract_to))
    engine = V.load(wheel)
    dev = torch.device(device)
    out = {"version": pkg.version}
    for D, R in CASES:
        q_gate, k, wq, wk, positions = probe_inputs(D)
        table = engine.cos_sin_cache(D, R, 2048, 1e7, dtype=torch.float32)  # vLLM's fp32 table ...
        cache = table.to(BF)  # ... stored in the model dtype (RotaryEmbeddingBase.__init__)
        args = (q_gate.to(dev), k.to(dev), wq.to(dev), wk.to(dev), cache.to(dev))
        qo, ko, go = (t.cpu() for t in kernel(*args, positions.to(dev), EPS, HQ, HK, D, R))
        # a text prompt's mRoPE positions (Qwen3.5's interleaved sections, three equal rows): the same q/k
        sections = [R // 4, R // 8, R // 2 - R // 4 - R // 8]
        mq, mk, _ = (t.cpu() for t in kernel(*args, positions.expand(3, T).contiguous().to(dev), EPS, HQ, HK, D, R,
                                             mrope_section=sections))
        heads = q_gate.view(T, HQ, 2 * D)
        case = {"gate": torch.equal(go.reshape(T, -1), heads[..., D:].reshape(T, -1)),
                "mrope_text": torch.equal(mq, qo) and torch.equal(mk, ko)}
        for name in ROWS[pkg.version]:
            at = profiles.get(name).at_head_size(D)
            for p in {at.name: at, at.variant("qwen3_5").name: at.variant("qwen3_5")}.values():
                qr, kr = _rla(p, heads[..., :D], k.view(T, HK, D), wq, wk, EPS, table, positions)
                case[p.name] = {"points": points(p), "q": (qr == qo).float().mean().item(),
                                "k": (kr == ko).float().mean().item()}
        out[f"{D}/{R}"] = case
    return out
