"""Tiny models built so that a one-ulp change of one region op's fp32 arithmetic flips the logits.

A helper module, not a test file: the aligned-model tests (``tests/alignment/test_align_one_ulp.py``)
and the CPU twin tests (``tests/engines/test_vllm_twin_one_ulp.py``) import it by name.

Why random weights do not do: each region op rounds its fp32 result to bf16, and a one-ulp change
of an fp32 value moves a bf16 result only when that value lies within about one fp32 ulp of a bf16
rounding tie, about 1 in 65,000 elements. A tiny model's forward has a few thousand such elements,
so a planted one-ulp change passes every test that uses one. Each builder below puts the op's
inputs where the change shows, by construction or by a search at run time over inputs the model
can be given (embedding rows, MLP units, positions), measured with the planted expression on this
machine's kernels (``1/sqrt`` and ``rsqrt``, ``silu`` and ``x * sigmoid(x)``, PyTorch's ``cos``
and the correctly rounded one agree on most inputs, in a proportion that depends on the CPU):

- :func:`norm_rows_model`: embedding rows whose first norm's output differs under ``1/sqrt``
  (integer-valued rows: their mean square is exact, so it is chosen, not sampled);
- :func:`cancelling_model`: an attention output that cancels the residual stream to 2^-8, and an
  MLP output 2^-20 of it, so the two orders of the fp32_carry add differ by many bf16 ulps of the
  sum the next norm reads;
- :func:`swiglu_units_model`: MLP units that select (gate, up) pairs of the MLP's input at which
  ``silu`` and ``x * sigmoid(x)`` round to different bf16 outputs;
- :func:`sensitive_positions`: positions whose rounded cos/sin table (or whose RoPE of the fp32
  q/k-norm output) differs under the planted expression; the tokens sit at those positions.

The tests assert the sensitivity they rely on (the oracle with the planted expression gives other
logits), so a builder that stopped planting would fail, never pass vacuously.
"""

from __future__ import annotations

import math

import pytest
import torch

from align_spec import tiny_config, tiny_model

BF16 = torch.bfloat16


def one_over_sqrt(m: torch.Tensor) -> torch.Tensor:
    """The planted rstd: ``1 / sqrt(m)``, one fp32 ulp from ``rsqrt(m)`` for some ``m``."""
    return 1 / torch.sqrt(m)


def _bf16_round(v: torch.Tensor) -> torch.Tensor:
    return v.to(BF16).float()


def _sum_of_squares(total: int, slots: int, top: int = 255) -> list[int]:
    """``slots`` integers in [0, top] whose squares sum to ``total`` (greedy, then a search of
    the last four), or ValueError."""
    out = []
    while len(out) < slots - 4 and total > 4 * top * top:
        out.append(top)
        total -= top * top
    rest = slots - len(out)
    for a in range(min(top, math.isqrt(total)), -1, -1):
        ra = total - a * a
        for b in range(min(a, math.isqrt(ra)), -1, -1):
            rb = ra - b * b
            if rest >= 4:
                for c in range(min(b, math.isqrt(rb)), -1, -1):
                    d2 = rb - c * c
                    d = math.isqrt(d2)
                    if d * d == d2 and d <= c:
                        return out + [a, b, c, d] + [0] * (rest - 4)
    raise ValueError(f"{total} is not a sum of {slots} squares of integers <= {top}")


# ---------------------------------------------------------------------------------------------
# RMSNorm: rows whose rstd is one ulp apart under 1/sqrt, and whose output shows it
# ---------------------------------------------------------------------------------------------


def norm_rows(weight: torch.Tensor, eps: float, n_rows: int, rstd=one_over_sqrt, seed: int = 0):
    """``n_rows`` bf16 rows [n_rows, H] such that the fused norm ``RN((v * rsqrt(ms + eps)) * w)``
    and the same with ``rstd`` for ``rsqrt`` differ in at least one element of each row.

    Built, not sampled: the row holds integers times 2^-7 (exact in bf16; their squares and every
    partial sum are exact in fp32, so the mean square is the same in any summation order). Three
    quarters of the columns hold a fixed multiset of planted values (rotated per row), the last
    quarter fills the sum of squares up to a chosen total. The search runs over that total: the
    totals whose two reciprocal square roots differ on this machine, then the rotations at which
    some planted element's product lies across a bf16 tie between the two.
    """
    h = weight.shape[-1]
    planted, fill = 3 * h // 4, h - 3 * h // 4
    g = torch.Generator().manual_seed(seed)
    values = (128 + torch.randperm(128, generator=g)[:planted]).tolist()
    base = sum(v * v for v in values)
    totals = torch.arange(base, base + fill * 255 * 255 - 4 * 255 * 255, dtype=torch.float64)
    ms = (totals * 2.0**-14 / h).float() + eps  # exact: integers below 2^24 times a power of two
    r1, r2 = torch.rsqrt(ms), rstd(ms)
    differ = torch.nonzero(r1 != r2).squeeze(-1)
    if differ.numel() == 0:
        pytest.skip("on this CPU the planted rstd equals rsqrt on every mean square searched")
    w = _bf16_round(weight.float())[:planted]
    vals = torch.tensor(values, dtype=torch.float32) * 2.0**-7
    shifts = torch.stack([vals.roll(-s) for s in range(planted)])  # [shift, column]
    found = []
    for chunk in differ.split(512):
        a = _bf16_round((shifts[None] * r1[chunk, None, None]) * w)
        b = _bf16_round((shifts[None] * r2[chunk, None, None]) * w)
        flips = (a != b).sum(-1)  # [total, shift]
        for t, s in torch.nonzero(flips).tolist():
            found.append((int(flips[t, s]), int(chunk[t]), s))
        if len(found) >= 4 * n_rows:
            break
    if len(found) < n_rows:
        pytest.skip(f"only {len(found)} planted norm rows found on this CPU (needed {n_rows})")
    found.sort(key=lambda f: -f[0])
    rows, used = [], set()
    signs = torch.where(torch.rand(n_rows, h, generator=g) < 0.5, -1.0, 1.0)
    for _, t, s in found:
        if (t, s) in used:
            continue
        used.add((t, s))
        try:
            filler = _sum_of_squares(int(totals[t]) - base, fill)
        except ValueError:
            continue
        row = torch.tensor(values, dtype=torch.float32).roll(-s).tolist() + filler
        rows.append(torch.tensor(row) * 2.0**-7 * signs[len(rows)])
        if len(rows) == n_rows:
            break
    return torch.stack(rows).to(BF16)


def norm_rows_model(family: str = "qwen2", n_rows: int = 24, seed: int = 0, **overrides):
    """A tiny model whose first ``n_rows`` embedding rows are :func:`norm_rows` for layer 0's
    input norm (its weight: 64 distinct bf16 values in [0.75, 1.25)); the tokens to feed are
    those row ids."""
    model = tiny_model(family, seed=seed, config=tiny_config(family, **overrides))
    norm = model.model.layers[0].input_layernorm
    h = norm.weight.shape[-1]
    with torch.no_grad():
        norm.weight.copy_(1 + (torch.arange(h) - h // 2) / 128)
        rows = norm_rows(norm.weight, model.config.rms_norm_eps, n_rows, seed=seed)
        model.model.embed_tokens.weight[:n_rows] = rows
    return model


# ---------------------------------------------------------------------------------------------
# fp32_carry: a sum that cancels, so the order of the three fp32 adds shows
# ---------------------------------------------------------------------------------------------


def cancelling_model(family: str = "qwen2", seed: int = 0, scale: float = 1024.0, **overrides):
    """A tiny model (no GQA) whose layer 0 cancels the residual stream.

    The embedding rows share one large vector C (|C| ~ ``scale``, a massive activation) plus a few
    bf16 ulps of it per token. Layer 0's attention reads them through v = I and o_proj =
    -rms(C) / w (w the input norm's weight), so its output a is -r to within bf16 rounding: a + r
    is exact and small (~ulps of C). The MLP's output m is ~2^-20 of C (down_proj scaled down). In
    fp32, (a + r) + m is then the exact sum, while a + (r + m) first rounds r + m at C's ulp, an
    error of up to 2^-14 relative to C: about 2^-7 bf16 ulps of the small sum that layer 1's input
    norm reads. Each token shows it in some of its 64 elements.
    """
    cfg = tiny_config(family, num_key_value_heads=4, **overrides)
    model = tiny_model(family, seed=seed, config=cfg)
    layer = model.model.layers[0]
    h = cfg.hidden_size
    g = torch.Generator().manual_seed(seed + 7)
    with torch.no_grad():
        big = torch.randn(h, generator=g).sign() * scale * (1 + torch.rand(h, generator=g))
        rows = _bf16_round(big + torch.randn(cfg.vocab_size, h, generator=g) * scale / 64)
        model.model.embed_tokens.weight.copy_(rows)
        w = _bf16_round(layer.input_layernorm.weight.float())
        rms = float(big.pow(2).mean().sqrt())
        layer.self_attn.v_proj.weight.copy_(torch.eye(h))
        if layer.self_attn.v_proj.bias is not None:
            layer.self_attn.v_proj.bias.zero_()
        layer.self_attn.o_proj.weight.copy_(torch.diag(-rms / w))
        layer.mlp.down_proj.weight.mul_(2.0**-10)
    return model


# ---------------------------------------------------------------------------------------------
# SwiGLU: units that select (gate, up) pairs at which silu's last bit shows
# ---------------------------------------------------------------------------------------------


def swiglu_units_model(family: str = "qwen2", seed: int = 0, silu=None, min_units: int = 6, **overrides):
    """A tiny model whose layer 0 MLP has units reading single elements of its input.

    Layer 0's o_proj is zero, so the MLP reads h = norm(embedding) (exact under every profile). A
    unit j with one-hot gate/up rows (a power-of-two gain) sees gate = h[t, c] * 2^e and up =
    h[t, d] exactly. The search, over tokens t, columns c, d and gains e, finds the units at which
    ``RN(silu(gate) * up)`` and ``RN(silu_planted(gate) * up)`` differ (``silu`` the planted
    expression, default ``x * sigmoid(x)``) and installs up to the MLP's width of them.
    """
    from align_spec import SPEC, spec_norm

    model = tiny_model(family, seed=seed, config=tiny_config(family, **overrides))
    layer = model.model.layers[0]
    planted = silu or (lambda x: x * torch.sigmoid(x))
    with torch.no_grad():
        layer.self_attn.o_proj.weight.zero_()
        emb = model.model.embed_tokens.weight.float()
        hn = spec_norm(emb, layer.post_attention_layernorm.weight, model.config.rms_norm_eps, SPEC["vllm-0.33"],
                       BF16).float()  # [vocab, H]; every built-in profile's norm of a bf16 row
        gains = [2.0**e for e in range(-3, 7)]
        units = []
        for e, gain in enumerate(gains):
            gate = hn * gain  # [t, c]
            s1, s2 = torch.nn.functional.silu(gate), planted(gate)
            a = _bf16_round(s1[:, :, None] * hn[:, None, :])  # [t, c, d]
            b = _bf16_round(s2[:, :, None] * hn[:, None, :])
            for t, c, d in torch.nonzero(a != b).tolist():
                units.append((c, e, d))
        units = list(dict.fromkeys(units))[: layer.mlp.gate_proj.weight.shape[0]]
        if len(units) < min_units:
            pytest.skip(f"only {len(units)} planted SwiGLU units found on this CPU (needed {min_units})")
        for j, (c, e, d) in enumerate(units):
            layer.mlp.gate_proj.weight[j] = 0
            layer.mlp.gate_proj.weight[j, c] = gains[e]
            layer.mlp.up_proj.weight[j] = 0
            layer.mlp.up_proj.weight[j, d] = 1
    return model


# ---------------------------------------------------------------------------------------------
# RoPE: positions at which the planted expression moves a rounded value
# ---------------------------------------------------------------------------------------------


def sensitive_positions(inv_freq: torch.Tensor, limit: int, cos_sin, seq: int = 4, least: int = 4) -> torch.Tensor:
    """Positions below ``limit`` whose cos/sin table, rounded to bf16, differs between PyTorch's
    fp32 ``cos``/``sin`` and ``cos_sin`` (the planted expression) of the same angles, as a
    [batch, ``seq``] tensor (at least ``least`` of them).

    A one-ulp change of cos moves its bf16 rounding in about 1 of 30,000 table entries (and
    PyTorch's fp32 cos is one ulp off the correctly rounded one in ~5% of angles on x86), so the
    search needs millions of entries: many positions times a wide head (cheap: one table)."""
    freqs = torch.arange(limit)[:, None].float() * inv_freq
    c1, s1 = freqs.cos(), freqs.sin()
    c2, s2 = cos_sin(freqs)
    moved = ((_bf16_round(c1) != _bf16_round(c2)) | (_bf16_round(s1) != _bf16_round(s2))).any(-1)
    where = torch.nonzero(moved).squeeze(-1)
    if where.numel() < least:
        pytest.skip(f"only {where.numel()} of {limit} positions move under the planted cos/sin on this CPU")
    return where[: where.numel() // seq * seq].view(-1, seq)


def qk_chain_inputs(model, arith, n: int, limit: int = 1024, seq: int = 4):
    """(ids [n/seq, seq], positions) for a Qwen3-like model under ``qk_norm_out='fp32'``: each
    token sits at a position where RoPE of layer 0's fp32 q/k-norm output, rounded to bf16,
    differs between the spec's norm arithmetic and ``arith``'s (both computed here from the
    model's weights: layer 0's q/k depend on the token alone). The q/k norm output is fp32 there,
    so its last bit reaches RoPE; a position picks the angles at which it crosses a bf16 tie."""
    from align_spec import ARITH, SPEC, spec_norm

    pts, cfg = SPEC["vllm-0.33"], model.config
    attn, layer0 = model.model.layers[0].self_attn, model.model.layers[0]
    eps = cfg.rms_norm_eps
    d = attn.head_dim
    ids_all = torch.arange(cfg.vocab_size)
    with torch.no_grad():
        h = spec_norm(model.model.embed_tokens.weight.float(), layer0.input_layernorm.weight, eps, pts, BF16)
        inv = 1.0 / (cfg.rope_parameters["rope_theta"] ** (torch.arange(0, d, 2).float() / d))
        freqs = torch.arange(limit)[:, None].float() * inv
        emb = torch.cat((freqs, freqs), -1)
        c, s = _bf16_round(emb.cos()), _bf16_round(emb.sin())  # [P, D], rope_cos_sin='round'
        moved = torch.zeros(cfg.vocab_size, limit, dtype=torch.bool)
        for proj, norm in ((attn.q_proj, attn.q_norm), (attn.k_proj, attn.k_norm)):
            x = torch.nn.functional.linear(h, proj.weight, proj.bias).view(cfg.vocab_size, -1, d).float()
            outs = []
            for a in (ARITH, arith):
                xn = spec_norm(x, norm.weight, eps, pts, BF16, torch.float32, arith=a)  # [V, H, D]
                half = xn.shape[-1] // 2
                rot = torch.cat((-xn[..., half:], xn[..., :half]), -1)
                outs.append(_bf16_round(xn[:, None] * c[None, :, None] + rot[:, None] * s[None, :, None]))
            moved |= (outs[0] != outs[1]).flatten(2).any(-1)
    pairs = torch.nonzero(moved)
    if pairs.shape[0] < n:
        pytest.skip(f"only {pairs.shape[0]} (token, position) pairs move under the planted q/k norm on this CPU")
    g = torch.Generator().manual_seed(0)
    pick = pairs[torch.randperm(pairs.shape[0], generator=g)[:n]]
    return ids_all[pick[:, 0]].view(-1, seq), pick[:, 1].view(-1, seq)


# ---------------------------------------------------------------------------------------------
# The cases: (model, ids, positions or None, the planted expression), one per op
# ---------------------------------------------------------------------------------------------


def _cos_sin_fp64(freqs):
    return freqs.double().cos().float(), freqs.double().sin().float()


#: name -> (what the planted change is, the oracle's planted arithmetic)
PLANTED = {
    "norm_rstd": ("the norm's rstd as 1/sqrt(ms + eps) instead of rsqrt", dict(rstd=one_over_sqrt)),
    "carry_order": ("fp32_carry's add as a + (r + m) instead of (a + r) + m",
                    dict(carry=lambda a, r, m: a + (r + m))),
    "silu": ("SwiGLU's silu as x * sigmoid(x)", dict(silu=lambda x: x * torch.sigmoid(x))),
    "cos_sin": ("RoPE's cos/sin tables correctly rounded (through fp64) instead of PyTorch's fp32 cos/sin",
                dict(cos_sin=_cos_sin_fp64)),
    "qk_norm_product": ("the fp32 q/k-norm output (RoPE's input under qk_norm_out='fp32') as v * (rstd * w)",
                        dict(scale_normed=lambda v, rstd, w: v * (rstd * w))),
}


def one_ulp_case(name: str):
    """(model, ids, positions or None, Arith) of the planted case ``name`` (:data:`PLANTED`)."""
    from align_spec import Arith, spec_inv_freq, tokens

    arith = Arith(**PLANTED[name][1])
    if name == "norm_rstd":
        return norm_rows_model("qwen2"), torch.arange(24).view(2, 12), None, arith
    if name == "carry_order":
        return cancelling_model("qwen2"), tokens(4, 16), None, arith
    if name == "silu":  # seed 4: 21 planted units here, and (seed 0 has one) no norm row whose
        # sum of squares PyTorch's and Inductor's orders round apart (norm_reduction='unpinned':
        # the twin's compiled norm may round such a row otherwise; tests/ops/test_reduction.py)
        return swiglu_units_model("qwen2", seed=4), torch.arange(128).view(4, 32), None, arith
    if name == "cos_sin":  # a wide head and many positions: millions of table entries, one table
        limit = 1 << 16
        model = tiny_model("llama", config=tiny_config("llama", max_position_embeddings=limit, head_dim=128))
        positions = sensitive_positions(spec_inv_freq(model.config), limit, _cos_sin_fp64, seq=2)
        return model, tokens(positions.shape[0], 2), positions, arith
    if name == "qk_norm_product":
        model = tiny_model("qwen3", config=tiny_config("qwen3", max_position_embeddings=1024))
        ids, positions = qk_chain_inputs(model, arith, 32, limit=1024)
        return model, ids, positions, arith
    raise KeyError(name)
