"""vLLM 0.33's Qwen3.5 twin (``rla.engines.vllm_twin_qwen3_5``) on the tiny model, against the aligned model and
the oracle (``tests/qwen3_5_spec.py``): what tests/engines/test_vllm_twin_qwen3_5.py asserts.

:func:`run` takes the q/k path (``kernel``: vLLM's Triton kernel, run by Triton's interpreter on a CPU, so this runs
in a subprocess started with ``TRITON_INTERPRET=1`` whose script installs interpreter_compat's repairs first;
``modules``: the path without the kernel, in any process) and returns, per mode, plain numbers (``moe``: for the
tiny Qwen3.5 MoE model, ``rla.engines.vllm_twin_qwen3_5_moe``'s twin: HF, the eager row and, in default mode, the
default row and that row with ``shared + routed`` rounded, ``moe-out-round``; ``oracle``: the oracle under the row's
points, ``row``, and with that sum rounded, ``sum-round``):

- ``sides``: per profile (``None``: HF unaligned; ``native-row``: HF's points with the native add + norm's fp32
  sum; the vLLM rows), the fraction of bit-equal logits and of each layer's stream (``rla.align`` to the row);
- ``oracle``: the oracle under the ``vllm-0.33`` row's Qwen3.5 points (its ``qwen3_5`` variant's ``qk_norm_out``
  with the kernel, the base row's without; its ``attn_gate='fused'``: attn * sigmoid(gate) rounded once), as
  ``row``, with HF's output gate instead (``hf-gate``: ``attn_gate='per_op'``), and with each point flipped.

A helper module, not a test file.
"""

from __future__ import annotations

import torch

from rla import profiles

from align_spec import Row, tokens
from qwen3_5_spec import qwen3_5_points, spec_forward, tiny_qwen3_5, tiny_qwen3_5_moe
from twin_side import twin_side

IDS = tokens(2, 24)
POSITIONS = torch.arange(40, 64)[None].expand(2, 24)  # not from 0: the cache is indexed
#: The points a flip of which must break the default-mode equality (host == device on a CPU).
FLIPPED = ("rope_cos_sin", "rope_apply", "swiglu", "norm_weight", "norm_residual", "residual_stream", "qk_norm_out",
           "norm_reduction", "attn_gate")
CHOICES = {**profiles.POINTS, **profiles.VARIANT_POINTS}


def native_row():
    """vLLM's native ops run eagerly: HF's per-op rounding (its Qwen3.5 norm rounds once: the hf row's variant),
    except that the native add + norm normalises the fp32 sum (``vllm/ir/ops/layernorm.py``)."""
    return profiles.get("hf").replace(name="vllm-native-eager", norm_residual="fp32_sum")


def _fractions(out, logits, streams):
    return {"logits": (logits.reshape(out.logits.shape) == out.logits).float().mean().item(),
            "layers": [(a == b.reshape(a.shape)).float().mean().item() for a, b in zip(out.layers, streams)]}


def _oracle(model, out, pts, **kw):
    streams = []
    with torch.no_grad():
        logits = spec_forward(model, IDS, pts, positions=POSITIONS, streams=streams, **kw)
    return _fractions(out, logits.to(out.logits.dtype), streams)


def _flip(pts, point):
    a, b = CHOICES[point]
    attention = dict(pts.attention)
    if point in attention:
        attention[point] = b if attention[point] == a else a
        flipped = Row(dict(pts), pts.fused_head_sizes, pts.experts_swiglu)
    else:
        flipped = Row({**pts, point: b if pts[point] == a else a}, pts.fused_head_sizes, pts.experts_swiglu)
    flipped.attention = attention
    return flipped


def moe_out_round():
    """``vllm-0.33`` with ``shared + routed`` rounded before the residual add reads it (its moe_experts variant's
    ``moe_out='round'``, the row before it had the point)."""
    return profiles.get("vllm-0.33").replace_variant("moe_experts", name="vllm-0.33-moe-out-round", moe_out="round")


def run(wheel: str, qk: str, modes=("native", "default"), moe: bool = False) -> dict:
    from rla.engines import vllm
    from rla.engines.vllm_twin_families import build_twin

    engine = vllm.load(wheel)
    model = tiny_qwen3_5_moe() if moe else tiny_qwen3_5()
    result = {}
    for mode in modes:
        out = build_twin(model, engine, mode, qk=qk)(IDS, POSITIONS)
        sides = {}
        profs = [("hf", None), ("native-row", native_row()), ("vllm-0.33-eager", "vllm-0.33-eager"),
                 ("vllm-0.33", "vllm-0.33")]
        if moe:  # the rows the MoE test reads
            profs = [("hf", None), ("vllm-0.33-eager", "vllm-0.33-eager")]
            if mode == "default":
                profs += [("vllm-0.33", "vllm-0.33"), ("moe-out-round", moe_out_round())]
        for name, prof in profs:
            side = twin_side(model, prof, out, IDS, POSITIONS)
            sides[name] = {"logits": side.logits_equal, "layers": [r["equal"] for r in side.layers]}
        case = {"sides": sides}
        if mode == "default" and moe:  # the oracle's MoE block: shared + routed unrounded into the add, or rounded
            pts, rounded = qwen3_5_points("vllm-0.33"), qwen3_5_points("vllm-0.33")
            assert pts.moe_out == "fp32" and qk == "kernel"  # the row's (its q/k chain: the kernel's)
            rounded.moe_out = None
            case["oracle"] = {"row": _oracle(model, out, pts), "sum-round": _oracle(model, out, rounded)}
        if mode == "default" and not moe:
            pts = qwen3_5_points("vllm-0.33")
            if qk == "modules":  # no kernel: the base row's q/k chain (Qwen3's compiled q/k norm -> RoPE)
                pts.attention = {"attn_gate": pts.attention["attn_gate"]}
            assert pts.attention["attn_gate"] == "fused"  # the row's (tests/alignment/test_align_qwen3_5.py)
            case["oracle"] = {"row": _oracle(model, out, pts),
                              "hf-gate": _oracle(model, out, _flip(pts, "attn_gate")),
                              "flipped": {p: _oracle(model, out, _flip(pts, p))["logits"] for p in FLIPPED}}
        result[mode] = case
    return result
