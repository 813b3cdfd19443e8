"""SGLang 0.5.23's Qwen3.5 attention kernel (fused q/k norm + partial RoPE + gate split) against rla's
aligned q/k norm and partial rotary, on one probe per head size; tests/engines/test_sglang_families.py
runs it under Triton's interpreter on a CPU and compiled on a GPU.

The rla side is what the aligned Qwen3.5 attention runs: ``rla.ops.rms_norm`` with the zero-centred
offset for ``q_norm`` / ``k_norm``, then the aligned ``apply_rotary_pos_emb``
(``rla.alignment.rope.make_apply_partial_rotary``) on HF's [B, H, S, D] layout with fp32 tables, once
under the row at the head size (its head-size rule applied) and once under that row's ``qwen3_5``
variant. Both sides read SGLang's own fp32 cos/sin cache (``RotaryEmbedding._compute_cos_sin_cache``,
the table the aligned rotary equals on the same device: tests/engines/test_engines_sglang.py).

The probe's q/k values are multiples of 1/8 in [-2, 2]: every sum of their squares is exact in fp32
in any order, so the kernel's ``tl.sum`` and PyTorch's mean give the same rstd (the row's
``norm_reduction`` is ``unpinned``: their orders differ); the values RoPE reads, the norms' outputs,
are arbitrary bf16 numbers. A helper module, not a test file.
"""

from __future__ import annotations

from pathlib import Path

import torch

import rla
from rla import profiles
from rla.alignment.rope import make_apply_partial_rotary
from rla.engines import sglang as S
from rla.engines import sglang_families as SF
from rla.engines.source import locate

BF = torch.bfloat16
#: (head size, rotated dims): 32 is outside SGLang's fused-RoPE head sizes, 64 is one of them.
CASES = ((32, 8), (64, 16))
#: tokens, query heads, key heads, the norms' eps of every probe
T, HQ, HK, EPS = 12, 2, 1, 1e-6


def points(p) -> list[str]:
    """The three points the kernel decides: rope_cos_sin, rope_apply, qk_norm_out."""
    return [p.rope_cos_sin, p.rope_apply, p.qk_norm_out]


def probe_inputs(D: int):
    """``(q_gate, k, wq, wk, positions)`` of head size ``D``: Qwen3.5's q projection [T, HQ * 2D] ([q_h, gate_h]
    per head) and k [T, HK * D], multiples of 1/8 in [-2, 2] (module docstring), random bf16 norm weights,
    positions from 1000."""
    g = torch.Generator().manual_seed(D)

    def probe(*shape):
        return (torch.randint(-16, 17, shape, generator=g).float() / 8).to(BF)

    q_gate, k = probe(T, HQ * 2 * D), probe(T, HK * D)
    wq, wk = ((0.3 * torch.randn(D, generator=g)).to(BF) for _ in range(2))
    return q_gate, k, wq, wk, torch.arange(T) + 1000


def run(wheel: str, extract_to: str, device: str) -> dict:
    """-> {"D/R": {"row"|"variant": {"points", "q", "k"} (fractions of q / k outputs equal), "gate": bool}}."""
    kernel, _ = SF.qwen3_5_qk_norm_rope_gate(locate("sglang", wheel), Path(extract_to))
    engine = S.load(wheel)
    row = profiles.get("sglang-0.5.23")
    dev = torch.device(device)
    out = {}
    for D, R in CASES:
        q_gate, k, wq, wk, positions = probe_inputs(D)
        cache = engine.cos_sin_cache(D, R, 2048, 1e7)
        qo, ko, go = (t.cpu() for t in kernel(q_gate.to(dev), k.to(dev), wq.to(dev), wk.to(dev), cache.to(dev),
                                              positions.to(dev), EPS, HQ, HK, D, R, has_gate=True))
        heads = q_gate.view(T, HQ, 2 * D)
        case = {"gate": torch.equal(go.reshape(T, -1), heads[..., D:].reshape(T, -1))}
        half_cos, half_sin = cache[positions, : R // 2], cache[positions, R // 2:]
        cos, sin = torch.cat([half_cos, half_cos], -1)[None], torch.cat([half_sin, half_sin], -1)[None]
        at = row.at_head_size(D)
        for name, p in (("row", at), ("variant", at.variant("qwen3_5"))):
            qn = rla.ops.rms_norm(heads[..., :D], wq, EPS, p, weight_offset=1.0)
            kn = rla.ops.rms_norm(k.view(T, HK, D), wk, EPS, p, weight_offset=1.0)
            apply = make_apply_partial_rotary(p, half_tables=False)
            qr, kr = apply(qn.transpose(0, 1)[None], kn.transpose(0, 1)[None], cos, sin)
            qr, kr = qr[0].transpose(0, 1).reshape(T, -1), kr[0].transpose(0, 1).reshape(T, -1)
            case[name] = {"points": points(p), "q": (qr == qo).float().mean().item(),
                          "k": (kr == ko).float().mean().item()}
        out[f"{D}/{R}"] = case
    return out
