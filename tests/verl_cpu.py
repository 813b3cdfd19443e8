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

The check itself, the same on CPU and CUDA, is ``fsdp_compare.compare_with_unsharded``.
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
