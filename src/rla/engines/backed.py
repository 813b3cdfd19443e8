"""Engine-backed region ops: the forward is the engine's own compiled kernel, the backward rla's.

Rounding *locations* are what a profile captures; the arithmetic *order* inside a kernel is not:
a norm's sum of squares is rounded into fp32 in the order the kernel adds, so a 1-ulp rstd flips
bf16 outputs and layers amplify it (``docs/rounding.md``, "Model level"). Where the engine is
installed next to the trainer -- the usual RL box -- the exact answer is to run the engine's own
kernel in the training forward. :func:`engine_ops` gives an object with ``rla.ops``' four
functions for ``rla.align(model, profile, ops=...)``:

- forward: vLLM's ``torch.ops._C`` kernels (``rms_norm``, ``fused_add_rms_norm``,
  ``silu_and_mul``, ``rotary_embedding``), loaded from the engine's package by
  :mod:`rla.engines.vllm`; RoPE reads a cos/sin cache built from the aligned rotary's fp32
  tables rounded to the stack dtype, indexed by token (the kernel's own cache is built from the
  same ``inv_freq`` on the device: ``rope_inv_freq='device'``);
- backward: ``rla.ops``' exact straight-through gradient of the same profile, recomputed from the
  saved inputs (the forward runs twice per op in training; inputs are what is saved, as in HF).

Only vLLM's eager mode (``enforce_eager``) runs region kernels; its default mode compiles the
native ops with Inductor across op boundaries, which has no per-op kernel to call: for that mode
:func:`rla.engines.vllm_forward.engine_forward` runs the compiled pieces themselves in the forward.
"""

from __future__ import annotations

import torch

from rla import ops as rla_ops
from rla import profiles

__all__ = ["EngineOps", "engine_ops", "engine_backed", "calibrated_profile"]


class _Backed(torch.autograd.Function):
    """``forward`` = ``engine(*tensors)``; ``backward`` = the gradient of ``reference(*tensors)``."""

    @staticmethod
    def forward(ctx, engine, reference, *tensors):
        ctx.reference = reference
        ctx.save_for_backward(*tensors)
        with torch.no_grad():
            out = engine(*tensors)
        return out

    @staticmethod
    def backward(ctx, *grads):
        saved = ctx.saved_tensors
        inputs = [t.detach().requires_grad_(ctx.needs_input_grad[i + 2]) for i, t in enumerate(saved)]
        with torch.enable_grad():
            outs = ctx.reference(*inputs)
        outs = outs if isinstance(outs, tuple) else (outs,)
        pairs = [(o, g) for o, g in zip(outs, grads) if g is not None and o.requires_grad]
        wanted = [t for t in inputs if t.requires_grad]
        got = iter(torch.autograd.grad([o for o, _ in pairs], wanted, [g for _, g in pairs], allow_unused=True)
                   if pairs and wanted else [None] * len(wanted))
        return (None, None, *[next(got) if t.requires_grad else None for t in inputs])


def engine_backed(engine, reference, *tensors):
    """``engine(*tensors)`` in the forward (no graph), the gradient of ``reference(*tensors)`` in the
    backward, recomputed from the saved inputs; ``engine`` may return a tensor or a tuple."""
    return _Backed.apply(engine, reference, *tensors)


class EngineOps:
    """``rla.ops``' four region functions on an engine's compiled kernels (see the module doc).

    ``profile`` is the calibrated row those kernels realise; ``rla.align`` refuses another, and
    a profile whose norms read an fp32 residual sum across layers (``norm_residual='fp32_sum'``):
    the engine forms that sum inside the next layer's fused add, which HF's layers do not have."""

    def __init__(self, kernels, profile: profiles.RoundingProfile, name: str):
        self.kernels, self.profile, self.name = kernels, profile, name

    def __repr__(self) -> str:
        return f"EngineOps({self.name}, profile {self.profile.name})"

    def __deepcopy__(self, memo):  # stateless: a copied aligned model shares the engine's kernels
        return self

    def _check(self, profile, *tensors):
        # rla.align hands the row these ops realise (checked once there): no per-call comparison
        if profile is not self.profile and not profile.same_rounding(self.profile):
            raise ValueError(f"{self.name} realise profile {self.profile.name!r}, not {profile.name!r}")
        for t in tensors:
            if t.dtype not in (torch.bfloat16, torch.float16):
                raise ValueError(f"{self.name} run on bf16/fp16 tensors; got {t.dtype} (use rla.ops, the default)")

    def rms_norm(self, x, weight, eps, profile, dtype=None, out_dtype=None):
        lp = dtype or x.dtype
        if x.dtype != lp or (out_dtype is not None and out_dtype != lp):
            raise ValueError(
                f"{self.name}: the kernel reads and writes {lp}; got x {x.dtype}, out {out_dtype}. An fp32 "
                "input is a residual sum formed in the previous layer (norm_residual='fp32_sum'); the engine "
                "forms it inside its next fused add, which HF's layer structure does not have"
            )
        self._check(profile, x)
        return engine_backed(
            lambda x_, w_: self.kernels.rms_norm(x_, w_.to(x_.dtype), float(eps)),
            lambda x_, w_: rla_ops.rms_norm(x_, w_, eps, profile, lp),
            x, weight,
        )

    def rms_norm_of_sum(self, x, weight, eps, profile, dtype=None, out_dtype=None):
        """RMSNorm of a residual sum ``x`` that the engine normalises inside its fused add + norm
        kernel (every layer's input norm but the first, the final norm): that kernel on (0, x).
        Adding zero is exact, and the kernel's reduction (its block size differs from the plain
        norm kernel's) is the engine's."""
        lp = dtype or x.dtype
        if x.dtype != lp or (out_dtype is not None and out_dtype != lp):
            return self.rms_norm(x, weight, eps, profile, dtype, out_dtype)  # raises with the reason
        self._check(profile, x)
        return engine_backed(
            lambda x_, w_: self.kernels.fused_add_rms_norm(torch.zeros_like(x_), x_, w_.to(x_.dtype), float(eps))[0],
            lambda x_, w_: rla_ops.rms_norm(x_, w_, eps, profile, lp),
            x, weight,
        )

    def add_rms_norm(self, x, residual, weight, eps, profile):
        self._check(profile, x, residual)
        return engine_backed(
            lambda x_, r_, w_: self.kernels.fused_add_rms_norm(x_, r_, w_.to(x_.dtype), float(eps)),
            lambda x_, r_, w_: rla_ops.add_rms_norm(x_, r_, w_, eps, profile),
            x, residual, weight,
        )

    def swiglu(self, gate, up, profile):
        self._check(profile, gate, up)
        return engine_backed(
            lambda g_, u_: self.kernels.silu_and_mul(torch.cat((g_, u_), dim=-1)),
            lambda g_, u_: rla_ops.swiglu(g_, u_, profile),
            gate, up,
        )

    def rope(self, q, k, cos, sin, profile, unsqueeze_dim=1, dtype=None):
        if dtype is not None and dtype != q.dtype:
            raise ValueError(f"{self.name}: the rotary kernel rounds to the input dtype; got q {q.dtype}, dtype {dtype}")
        self._check(profile, q, k)
        if unsqueeze_dim not in (1, 2) or q.ndim != 4 or cos.ndim != 3:
            raise ValueError(f"{self.name}: rotary needs q/k [B, H, S, D] (or [B, S, H, D]) and cos/sin [B, S, *]")
        return engine_backed(
            lambda q_, k_, c_, s_: self._rope_forward(q_, k_, c_, s_, unsqueeze_dim),
            lambda q_, k_, c_, s_: rla_ops.rope(q_, k_, c_, s_, profile, unsqueeze_dim),
            q, k, cos, sin,
        )

    def _rope_forward(self, q, k, cos, sin, unsqueeze_dim):
        d = q.shape[-1]
        tokens_first = unsqueeze_dim == 1  # [B, H, S, D]: the kernel wants [tokens, heads*D]
        qt = q.transpose(1, 2) if tokens_first else q
        kt = k.transpose(1, 2) if tokens_first else k
        b, s = qt.shape[0], qt.shape[1]
        half = d // 2
        c = cos[..., :half].expand(b, s, half)
        sn = sin[..., :half].expand(b, s, half)
        cache = torch.cat((c, sn), dim=-1).reshape(b * s, d).to(q.dtype)  # rope_cos_sin='round'
        positions = torch.arange(b * s, device=q.device)
        qo, ko = self.kernels.rotary_embedding(
            positions, qt.reshape(b * s, -1), kt.reshape(b * s, -1), d, cache, True
        )
        qo, ko = qo.view(b, s, -1, d), ko.view(b, s, -1, d)
        return (qo.transpose(1, 2), ko.transpose(1, 2)) if tokens_first else (qo, ko)


def calibrated_profile(engine: str, version: str, mode: str) -> profiles.RoundingProfile:
    """The shipped row calibrated from ``engine`` ``version`` in ``mode`` (KeyError naming how to make one)."""
    for p in profiles.all_profiles().values():
        c = p.calibration
        if c is not None and (c.engine, c.version, c.mode) == (engine, version, mode):
            return p
    raise KeyError(
        f"no calibrated profile of {engine} {version} ({mode} mode) ships with rla: calibrate it with "
        f"`rla calibrate --engine {engine} --mode {mode} --out profile.json` and pass "
        "profile=rla.profiles.load('profile.json')"
    )


def engine_ops(engine, mode: str = "eager", library: str | None = None, profile=None) -> EngineOps:
    """Region ops whose forward is ``engine``'s compiled kernels (vLLM's ``enforce_eager`` mode).

    ``engine`` is :func:`rla.engines.vllm.load`'s result; ``profile`` the row the kernels realise
    (default: the calibrated row of this engine version and mode)."""
    if mode != "eager":
        raise NotImplementedError(
            f"engine-backed ops exist for vLLM's eager mode (its region kernels); mode {mode!r} compiles "
            "native ops across op boundaries with Inductor, which has no per-op kernel to call: use "
            "rla.engines.vllm_forward.engine_forward(engine, 'default'), which runs the compiled pieces"
        )
    p = profiles.resolve(profile) if profile is not None else calibrated_profile("vllm", engine.version, mode)
    return EngineOps(engine.c_ops(library), p, f"vLLM {engine.version} kernels")
