"""The four training arms: what the training forward rounds, and where the weights live.

Every arm keeps **fp32 master weights** in AdamW. What differs is the copy the forward runs on:

============  ==============================================================================
``bf16``      A bf16 *compute copy* ``RN(master)``, forward and backward in bf16 with HF's
              eager rounding (docs/rounding.md's ``hf`` profile): the usual training stack, and the
              baseline. Parameter gradients come out in bf16 and are added into fp32 master
              gradients after every micro-batch (what FSDP2 with ``reduce_dtype=fp32`` does).
``aligned``   The same bf16 copy with ``rla.align(copy, profile=rollout_profile,
              regions=align_regions)``: RoPE / SwiGLU / residual-add + RMSNorm round where the
              engine does. The copy's weights are ``RN(master)``, bit for bit the numbers the
              sampler loads, so the norm weights are the engine's ``RN(w)`` (no fp32-weight
              hazard), and the residual stream is bf16 as in the engine.
``fp32``      No copy: the fp32 master model runs the forward (fp32 activations and logprobs).
              The rollouts stay bf16 (``rollout_dtype=auto``), so the ratio compares an fp32
              policy with a bf16 engine.
``fp16``      An fp16 compute copy ``RN16(master)`` and an fp16 engine (``rollout_dtype=auto``):
              the FP16 recipe. The loss is multiplied by a dynamic loss scale S before backward;
              fp16 gradients (scaled) are added into fp32 master gradients, checked for inf/NaN
              over all ranks, divided by S in fp32, then clipped; an overflow skips the update
              and halves S, ``loss_scale_growth_interval`` clean updates double it.
============  ==============================================================================

``aligned`` with ``ops``: the aligned copy's regions call ``ops`` (``rla.align``'s ``ops=`` plug)
instead of ``rla.ops``; a study's knob enters the trainer this way (the dose-response study's
``lab.dose.knob.DoseOps`` rounds the region outputs further), never through ``TrainConfig``.

Why a compute copy rather than ``torch.autocast`` over fp32 parameters: under autocast the
embedding output and hence the residual stream stay fp32, and HF's RMSNorm multiplies an fp32
weight by the rounded normalised value (``RN(w32 * RN(x*rstd))``), neither of which any bf16
engine does. A bf16 copy of fp32 masters is also exactly what FSDP2's
``MixedPrecisionPolicy(param_dtype=bf16)`` all-gathers, so the single-process and FSDP paths
compute the same forward. Under FSDP (``shard=True``) FSDP2 itself is the compute copy.
"""

from __future__ import annotations

import copy

import torch

from rla.rl.distributed import Dist, full_state_dict, shard as fsdp_shard
from rla.rl.forward import PolicyForward

__all__ = ["LossScaler", "Policy", "LOW_PRECISION", "round_inv_freq"]

#: dtype of the compute copy per arm (None: the fp32 master itself runs the forward).
LOW_PRECISION = {"bf16": torch.bfloat16, "aligned": torch.bfloat16, "fp16": torch.float16, "fp32": None}


class LossScaler:
    """Dynamic loss scaling (as ``torch.amp.GradScaler``, in a few explicit lines).

    Disabled (scale 1, never skips) for every arm but fp16.
    """

    def __init__(self, enabled: bool, init_scale: float = 2.0**16, growth_interval: int = 200,
                 growth: float = 2.0, backoff: float = 0.5):
        self.enabled = enabled
        self.scale = float(init_scale) if enabled else 1.0
        self.growth_interval, self.growth, self.backoff = growth_interval, growth, backoff
        self.good_updates = 0
        self.skipped = 0

    def update(self, found_inf: bool) -> None:
        if not self.enabled:
            return
        if found_inf:
            self.scale *= self.backoff
            self.good_updates = 0
            self.skipped += 1
        else:
            self.good_updates += 1
            if self.good_updates >= self.growth_interval:
                self.scale *= self.growth
                self.good_updates = 0

    def state_dict(self) -> dict:
        return {"scale": self.scale, "good_updates": self.good_updates, "skipped": self.skipped}

    def load_state_dict(self, state: dict) -> None:
        self.scale, self.good_updates, self.skipped = float(state["scale"]), int(state["good_updates"]), int(state["skipped"])


def round_inv_freq(model: torch.nn.Module, dtype: torch.dtype) -> int:
    """Round every RoPE ``inv_freq`` buffer of ``model`` to ``dtype``, exactly as ``model.to(dtype)``
    does (transformers then computes the angles from the rounded values in fp32): the phase-drift
    hazard as a condition of study. Returns how many buffers were rounded; none is an error."""
    if dtype is None:
        raise ValueError("train_inv_freq=rounded needs a low-precision compute copy (bf16 or fp16)")
    n = 0
    for module in model.modules():
        for name in ("inv_freq", "original_inv_freq"):
            buf = module._buffers.get(name)
            if buf is not None:
                module._buffers[name] = buf.to(dtype)
                n += 1
    if not n:
        raise ValueError(f"train_inv_freq=rounded: {type(model).__name__} has no RoPE inv_freq buffer")
    return n


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


class Policy:
    """fp32 master model + the module the training forward runs (``forward``), for one arm.

    ``master`` is an fp32 HF causal LM already on ``device``. After ``backward`` on the forward
    module's loss call ``accumulate_grads()``; after ``optimizer.step()`` call ``sync()``.
    """

    def __init__(self, master: torch.nn.Module, *, precision: str, rollout_profile: str,
                 align_regions, temperature: float, top_k: int, top_p: float, chunk: int, dist: Dist,
                 loss_scale_init: float = 2.0**16, loss_scale_growth_interval: int = 200, inv_freq: str = "fp32",
                 ops=None):
        from rla.alignment import align

        if any(p.dtype != torch.float32 for p in master.parameters()):
            raise ValueError("the master model must be fp32 (AdamW keeps fp32 master weights)")
        self.precision, self.dist = precision, dist
        self.lp_dtype = LOW_PRECISION[precision]
        self.master = master
        self.alignment = None
        if ops is not None and precision != "aligned":
            raise ValueError(f"ops= replaces the aligned regions' ops and needs precision='aligned', got {precision!r}")
        region_ops = ops
        fwd_kw = dict(temperature=temperature, top_k=top_k, top_p=top_p, chunk=chunk)
        if dist.fsdp:
            if precision == "aligned":
                self.alignment = align(master, profile=rollout_profile, regions=tuple(align_regions), ops=region_ops)
            self.forward = PolicyForward(master, **fwd_kw)
            fsdp_shard(self.forward, master.get_decoder().layers, self.lp_dtype)
            self.compute = master
        else:
            if self.lp_dtype is None:
                self.compute = master
            else:
                from transformers import AutoModelForCausalLM

                # built from the config, never by casting: .to(bf16) would round RoPE's inv_freq
                self.compute = AutoModelForCausalLM.from_config(copy.deepcopy(master.config), dtype=self.lp_dtype)
                self.compute.to(next(master.parameters()).device)
            if precision == "aligned":
                self.alignment = align(self.compute, profile=rollout_profile, regions=tuple(align_regions),
                                       ops=region_ops)
            self.forward = PolicyForward(self.compute, **fwd_kw)
        if inv_freq == "rounded":
            round_inv_freq(self.compute, self.lp_dtype)
        self.master.train()
        self.compute.train()
        self._pairs = []
        if self.compute is not master:
            c = dict(self.compute.named_parameters())
            self._pairs = [(p, c[n]) for n, p in master.named_parameters()]
            for _, cp in self._pairs:
                cp.requires_grad_(True)
            self.sync()
        self.scaler = LossScaler(precision == "fp16", loss_scale_init, loss_scale_growth_interval)

    # ------------------------------------------------------------------ weights and gradients
    def parameters(self) -> list[torch.nn.Parameter]:
        """The fp32 master parameters (sharded DTensors under FSDP): what AdamW updates."""
        return list(self.master.parameters())

    def named_parameters(self):
        return list(self.master.named_parameters())

    @torch.no_grad()
    def sync(self) -> None:
        """Master -> compute copy (round to nearest); a no-op when the master runs the forward."""
        for m, c in self._pairs:
            c.copy_(m)

    @torch.no_grad()
    def accumulate_grads(self) -> None:
        """Compute-copy gradients (lp) -> fp32 master gradients, summed over micro-batches."""
        for m, c in self._pairs:
            if c.grad is None:
                continue
            g = c.grad.float()
            m.grad = g if m.grad is None else m.grad.add_(g)
            c.grad = None

    @torch.no_grad()
    def unscale_and_check(self) -> bool:
        """Divide master gradients by the loss scale; True when any is inf/NaN on any rank."""
        grads = [p.grad for p in self.parameters() if p.grad is not None]
        if not self.scaler.enabled:
            return False
        bad = torch.zeros((), device=grads[0].device if grads else "cpu")
        for g in grads:
            bad = torch.maximum(bad, (~torch.isfinite(_local(g))).any().float())
        found = bool(self.dist.all_reduce(bad, "max").item())
        if not found:
            inv = 1.0 / self.scaler.scale
            for g in grads:
                g.mul_(inv)
        return found

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """Unsharded master weights by state_dict name (collective under FSDP)."""
        if self.dist.fsdp:
            return full_state_dict(self.forward, prefix="lm.")
        return {k: v.detach() for k, v in self.master.state_dict().items()}

    @torch.no_grad()
    def load_full_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Copy full fp32 weights (by parameter name) into the master, then sync the copy."""
        params = dict(self.master.named_parameters())
        missing = sorted(set(params) - set(state))
        if missing:
            raise ValueError(f"checkpoint lacks parameters {missing[:5]} (a different architecture?)")
        for name, p in params.items():
            src = state[name]
            if tuple(src.shape) != tuple(p.shape):
                raise ValueError(f"checkpoint {name} has shape {tuple(src.shape)}, the model {tuple(p.shape)}")
            if hasattr(p, "device_mesh"):  # a DTensor shard: take this rank's slice
                from torch.distributed.tensor import distribute_tensor

                p.copy_(distribute_tensor(src.to(_local(p).device, p.dtype), p.device_mesh, p.placements))
            else:
                p.copy_(src.to(p.device, p.dtype))
        self.sync()
