"""An FSDP-wrapped aligned model against the unsharded aligned model, bit for bit (a helper
module, not a test file; used by the verl tests on CPU and the GPU worker).

:func:`compare_with_unsharded`: logits (plain and under bf16 autocast, as verl's
``FSDPEngine.forward_step`` runs the model) and every parameter's gradient, each ``torch.equal``
against the same checkpoint loaded in bf16 and aligned by hand. :func:`untied_checkpoint`: the
tiny checkpoint with its own LM head, which verl builds on the meta device on ranks other than 0.
"""

from __future__ import annotations

import contextlib

import torch


def untied_checkpoint(path, model_path) -> str:
    """The tiny checkpoint with its own LM head (``tie_word_embeddings=False``): verl builds such a
    model on the meta device on every rank but 0 (``get_init_weight_context_manager``)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(model_path)
    config.tie_word_embeddings = False
    model = AutoModelForCausalLM.from_pretrained(model_path, config=config, dtype=torch.bfloat16)
    with torch.no_grad():
        model.lm_head.weight.copy_(0.05 * torch.randn(model.lm_head.weight.shape,
                                                      generator=torch.Generator().manual_seed(1)))
    model.save_pretrained(path)
    return str(path)


def _full_grads(module) -> dict[str, torch.Tensor]:
    """Every parameter's full gradient, named as in the unwrapped model. FSDP1
    (``use_orig_params=False``, verl's default): each unit's sharded flat gradient gathered and cut
    by the flat parameter's ``_fqns`` / ``_numels`` / ``_shapes``; FSDP2: each DTensor gradient's
    ``full_tensor()``."""
    import torch.distributed as dist
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    if not any(isinstance(m, FSDP) for m in module.modules()):
        return {n: p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
                for n, p in module.named_parameters() if p.grad is not None}
    world = dist.get_world_size()
    grads = {}
    for unit_name, unit in module.named_modules():
        if not isinstance(unit, FSDP) or unit._handle is None:
            continue
        flat = unit._handle.flat_param
        shard = flat.grad.contiguous()
        parts = [torch.empty_like(shard) for _ in range(world)]
        dist.all_gather(parts, shard)
        full = torch.cat(parts)
        prefix = unit_name.replace("_fsdp_wrapped_module", "").replace("..", ".").strip(".")
        offset = 0
        for fqn, numel, shape in zip(flat._fqns, flat._numels, flat._shapes):
            name = ".".join(x for x in (prefix, fqn.replace("_fsdp_wrapped_module.", "")) if x)
            grads[name] = full[offset:offset + numel].view(shape)
            offset += numel
    return grads


def compare_with_unsharded(module, model_path: str, profile, ids, backward: bool = True) -> dict:
    """The FSDP-wrapped aligned ``module`` against the bf16-loaded, hand-aligned checkpoint.

    FSDP1's ``MixedPrecision(param_dtype=bf16, reduce_dtype=fp32)`` (FSDP2's
    ``MixedPrecisionPolicy`` alike) computes with bf16 copies of the fp32 weights (the bf16
    checkpoint's own values: the fp32 load is exact) and casts each bf16 gradient to fp32 before
    reducing; every rank runs the same batch, so the mean over ranks
    (a division by the world size of equal fp32 values) is exact: each gradient must equal the
    unsharded model's bf16 gradient cast to fp32, bit for bit. ``backward=False``: the logits only
    (a forward-only reference engine)."""
    import rla
    from transformers import AutoModelForCausalLM

    device = ids.device
    reference = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.bfloat16,
                                                     attn_implementation="eager").to(device)
    rla.align(reference, profile)
    out = {}
    for name, ctx in (("plain", contextlib.nullcontext),
                      ("autocast", lambda: torch.autocast(device.type, torch.bfloat16))):
        with torch.no_grad(), ctx():
            out[f"logits_equal_{name}"] = bool(torch.equal(module(ids).logits, reference(ids).logits))
    if not backward:  # a forward-only (reference) engine
        return out
    for m in (module, reference):
        m.zero_grad(set_to_none=True)
        m(ids).logits.float().logsumexp(-1).mean().backward()
    got = _full_grads(module)
    want = {n: p.grad.float() for n, p in reference.named_parameters()}
    out["grads_compared"] = len(want)
    out["grads_unequal"] = sorted(n for n in want if n not in got or not torch.equal(got[n], want[n]))
    out["grads_max_abs_diff"] = max((float((got[n] - want[n]).abs().max()) for n in want if n in got), default=None)
    out["grads_missing"] = sorted(set(want) - set(got))
    return out
