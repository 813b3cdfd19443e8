"""verl's FSDP engine on a CPU, for the verl integration tests (a helper module, not a test file).

verl picks its device through a platform plugin and ships none for CPU; :class:`CPUPlatform`
(registered with ``verl.plugin.platform.set_platform``, verl's documented extension point) makes
the CPU the device and gloo the collective backend. Everything else is verl's own code.

FSDP1 (``strategy: fsdp``, verl's default) then runs on the CPU with two shims, neither of which
touches a number (:func:`fsdp1_on_cpu`):

- torch's ``_check_module_states_for_sync_module_states`` raises for CPU tensors when
  ``sync_module_states=True`` (verl hard-codes it, ``transformer_impl.py``
  ``_build_fsdp_module``): a device check only; the broadcast itself
  (``_sync_params_and_buffers``) runs through gloo on CPU tensors. The check is lifted.
- verl's ``init_fn`` (``verl/utils/fsdp_utils.py``), FSDP1's ``param_init_fn`` on ranks other
  than 0, calls ``get_torch_device().empty_cache()``; ``torch.cpu`` has no ``empty_cache``. A
  no-op is supplied.

:func:`compare_with_unsharded` is the check: an FSDP1-wrapped aligned model against the same
checkpoint loaded in bf16 and aligned by hand, logits (plain and under verl's bf16 autocast,
``FSDPEngine.forward_step``) and every parameter's gradient, each ``torch.equal``.
"""

from __future__ import annotations

import contextlib

import torch
from verl.plugin.platform.platform_base import PlatformBase
from verl.plugin.platform.platform_manager import set_platform


class CPUPlatform(PlatformBase):
    """The CPU as a verl platform: device "cpu", gloo collectives, no-op device management."""

    device_name = "cpu"
    vendor_name = "cpu"
    device_module = torch.cpu

    def is_available(self): return True
    def current_device(self): return torch.device("cpu")
    def device_count(self): return 1
    def set_device(self, device_index): pass
    def synchronize(self, device_index=None): pass
    def manual_seed(self, seed): torch.manual_seed(seed)
    def manual_seed_all(self, seed): torch.manual_seed(seed)
    def set_allocator_settings(self, settings): pass
    def empty_cache(self): pass
    def get_device_capability(self, device_index=0): return (None, None)
    def communication_backend_name(self): return "gloo"
    def visible_devices_envvar(self): return "CPU_VISIBLE_DEVICES"
    def nvtx_range(self, msg): return contextlib.nullcontext()
    def profiler_start(self): pass
    def profiler_stop(self): pass
    def ray_resource_name(self): return "CPU"
    def ray_noset_envvars(self): return []
    def is_ipc_supported(self): return False
    def cudart(self): return None


set_platform(CPUPlatform())  # before verl's engine modules read the device name at import


@contextlib.contextmanager
def fsdp1_on_cpu():
    """The two shims of the module docstring, undone on exit."""
    from torch.distributed.fsdp import _init_utils

    check = _init_utils._check_module_states_for_sync_module_states
    had = hasattr(torch.cpu, "empty_cache")
    _init_utils._check_module_states_for_sync_module_states = lambda states: None
    if not had:
        torch.cpu.empty_cache = lambda: None
    try:
        yield
    finally:
        _init_utils._check_module_states_for_sync_module_states = check
        if not had:
            del torch.cpu.empty_cache


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


def compare_with_unsharded(module, model_path: str, profile, ids) -> dict:
    """The FSDP-wrapped aligned ``module`` against the bf16-loaded, hand-aligned checkpoint.

    FSDP1's ``MixedPrecision(param_dtype=bf16, reduce_dtype=fp32)`` (FSDP2's
    ``MixedPrecisionPolicy`` alike) computes with bf16 copies of the fp32 weights (the bf16
    checkpoint's own values: the fp32 load is exact) and casts each bf16 gradient to fp32 before
    reducing; every rank runs the same batch, so the mean over ranks
    (a division by the world size of equal fp32 values) is exact: each gradient must equal the
    unsharded model's bf16 gradient cast to fp32, bit for bit."""
    import rla
    from transformers import AutoModelForCausalLM

    reference = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.bfloat16, attn_implementation="eager")
    rla.align(reference, profile)
    out = {}
    for name, ctx in (("plain", contextlib.nullcontext), ("autocast", lambda: torch.autocast("cpu", torch.bfloat16))):
        with torch.no_grad(), ctx():
            out[f"logits_equal_{name}"] = bool(torch.equal(module(ids).logits, reference(ids).logits))
    for m in (module, reference):
        m.zero_grad(set_to_none=True)
        m(ids).logits.float().logsumexp(-1).mean().backward()
    got = _full_grads(module)
    want = {n: p.grad.float() for n, p in reference.named_parameters()}
    out["grads_compared"] = len(want)
    out["grads_unequal"] = sorted(n for n in want if n not in got or not torch.equal(got[n], want[n]))
    out["grads_missing"] = sorted(set(want) - set(got))
    return out
