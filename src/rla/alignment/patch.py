"""Per-instance, reversible patching: the only place that touches a module's attributes.

Rules (they are why aligning one model never changes another):

- Only instance attributes change. ``module.forward = MethodType(fn, module)`` shadows the class's
  ``forward`` for that instance; classes and transformers' module globals are never assigned.
- Each patched module carries one private attribute, ``_rla_patch``, that remembers what its
  instance ``__dict__`` held before and which buffers were replaced; :func:`uninstall` puts
  exactly that back. A module wrapped by an accelerate hook keeps the hook: its ``_old_forward``
  (what the hook calls) is replaced instead of ``forward``.
- A function that reads a module global (the attention forward calls ``apply_rotary_pos_emb``)
  is rebuilt by :func:`with_globals` around a *copy* of the globals, decorators included.
"""

from __future__ import annotations

import itertools
import sys
import types
import weakref
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = ["Patch", "install", "uninstall", "patch_of", "with_globals", "defined_in", "PATCH_ATTR"]

PATCH_ATTR = "_rla_patch"


class _Missing:
    """Marks "the instance had no such attribute"; survives deepcopy and pickle as itself."""

    def __repr__(self):
        return "<missing>"

    def __copy__(self):
        return self

    def __deepcopy__(self, memo):
        return self

    def __reduce__(self):
        return "_MISSING"


_MISSING = _Missing()


@dataclass
class Patch:
    """What :func:`install` changed on one module, enough to undo it."""

    role: str
    saved_attrs: dict[str, Any] = field(default_factory=dict)
    installed_attrs: dict[str, Any] = field(default_factory=dict)
    saved_buffers: dict[str, torch.Tensor | None] = field(default_factory=dict)


def patch_of(module: torch.nn.Module) -> Patch | None:
    return module.__dict__.get(PATCH_ATTR)


def install(
    module: torch.nn.Module,
    role: str,
    attrs: dict[str, Any],
    buffers: dict[str, torch.Tensor] | None = None,
    keep: tuple[str, ...] = (),
) -> Patch:
    """Set instance ``attrs`` and registered ``buffers`` on ``module``, remembering the old ones.

    ``keep`` names further instance attributes or buffers that the patched code may change while
    aligned (the dynamic-RoPE update re-registers ``inv_freq``); they are restored on uninstall.
    """
    if patch_of(module) is not None:
        raise RuntimeError(f"{type(module).__name__} is already aligned; unalign first")
    if "forward" in attrs and "_hf_hook" in module.__dict__ and "_old_forward" in module.__dict__:
        # accelerate's hook (device_map dispatch, offload) wraps ``_old_forward``: replace that,
        # so the hook keeps moving inputs and weights around the aligned forward.
        attrs = {("_old_forward" if k == "forward" else k): v for k, v in attrs.items()}
    patch = Patch(role)
    buffers = buffers or {}
    for name in (*attrs, *keep):
        if name in module._buffers:
            continue
        patch.saved_attrs[name] = module.__dict__.get(name, _MISSING)
    for name in (*buffers, *keep):
        if name in module._buffers:
            patch.saved_buffers[name] = module._buffers[name]
    for name, value in buffers.items():
        if name not in module._buffers:
            raise RuntimeError(f"{type(module).__name__} has no buffer {name!r}")
        module._buffers[name] = value
    for name, value in attrs.items():
        setattr(module, name, value)
        patch.installed_attrs[name] = value
    module.__dict__[PATCH_ATTR] = patch
    return patch


def foreign_wrapper(module: torch.nn.Module) -> str | None:
    """Name of an attribute someone re-wrapped after :func:`install` (it cannot be undone cleanly)."""
    patch = patch_of(module)
    if patch is None:
        return None
    for name, value in patch.installed_attrs.items():
        # only installed functions; state such as max_seq_len_cached may change while aligned
        if callable(value) and module.__dict__.get(name, _MISSING) is not value:
            return name
    return None


def uninstall(module: torch.nn.Module) -> Patch | None:
    """Undo :func:`install` on ``module``; returns the patch, or None if it was not patched."""
    patch = module.__dict__.pop(PATCH_ATTR, None)
    if patch is None:
        return None
    for name, value in patch.saved_attrs.items():
        if value is _MISSING:
            module.__dict__.pop(name, None)
        else:
            setattr(module, name, value)
    for name, value in patch.saved_buffers.items():
        live = module._buffers.get(name)
        if value is not None and value.is_meta and live is not None and not live.is_meta:
            # saved on the meta device (rla.align(allow_meta=True)) and filled in since: the saved
            # tensor has no data, so the live buffer is kept, in the saved dtype
            value = live.to(value.dtype)
        module._buffers[name] = value
    return patch


# --------------------------------------------------------------------------------------------
# Rebuilding a function around other globals
# --------------------------------------------------------------------------------------------


def with_globals(
    fn: types.FunctionType, module_globals: dict, replacements: dict, code: types.CodeType | None = None
) -> types.FunctionType:
    """A copy of ``fn`` whose code from ``module_globals``' module sees ``replacements`` instead.

    ``fn`` may be a decorator's wrapper (``deprecate_kwarg``, ``functools.wraps``): the
    ``__wrapped__`` chain is followed down to the function defined in that module, which is
    rebuilt with ``types.FunctionType(code, new_globals, ...)``; every wrapper above it is rebuilt
    with the closure cell that held the old inner function pointing to the new one. Nothing is
    mutated: ``fn``, its class and the module keep their objects. ``code`` replaces the inner
    function's code object (a rewrite of its own source, see ``rla.alignment.qk_chain``).
    """
    new_globals = _module_globals(module_globals, replacements)
    rebuilt = _rebuild(fn, module_globals, new_globals, code)
    name = new_globals["__name__"]
    if rebuilt is fn:
        sys.modules.pop(name, None)
        raise RuntimeError(
            f"{getattr(fn, '__qualname__', fn)!r}: no function in its __wrapped__ chain is defined "
            "in the module whose globals rla.align replaces; transformers may have changed how "
            "this forward is decorated (see src/rla/alignment/compat.py)"
        )
    # the module stays in sys.modules while the function defined in it lives (every wrapper and
    # installed forward holds it); rla.unalign's uninstall drops the last of them, and so the entry
    weakref.finalize(defined_in(rebuilt, new_globals), sys.modules.pop, name, None)
    return rebuilt


def _module_globals(module_globals: dict, replacements: dict) -> dict:
    """A copy of ``module_globals`` with ``replacements``, as the ``__dict__`` of a module of its own
    (``rla._aligned.<module>.<n>`` in ``sys.modules``): torch.compile resolves an inlined function's
    globals through ``sys.modules[globals['__name__']]``, so with the original name its guards read the
    transformers module's ``apply_rotary_pos_emb`` while the trace used the replacement, and guard
    building failed (``regions=("rope",)`` under torch.compile, torch 2.11 and 2.13)."""
    name = f"rla._aligned.{module_globals.get('__name__', 'module')}.{next(_COUNTER)}"
    mod = types.ModuleType(name)
    mod.__dict__.update(module_globals)
    mod.__dict__.update(replacements)
    mod.__dict__["__name__"] = name
    sys.modules[name] = mod
    return mod.__dict__


_COUNTER = itertools.count()


def defined_in(fn, module_globals):
    """The function of ``fn``'s ``__wrapped__`` chain that is defined in ``module_globals``' module."""
    while isinstance(fn, types.FunctionType):
        if fn.__globals__ is module_globals:
            return fn
        fn = getattr(fn, "__wrapped__", None)
    return None


def _copy_function(fn, new_globals, closure, code=None):
    new = types.FunctionType(code or fn.__code__, new_globals, fn.__name__, fn.__defaults__, closure)
    new.__kwdefaults__ = fn.__kwdefaults__
    new.__dict__.update(fn.__dict__)
    new.__qualname__ = fn.__qualname__
    new.__doc__ = fn.__doc__
    new.__module__ = fn.__module__
    new.__annotations__ = dict(getattr(fn, "__annotations__", {}) or {})
    return new


def _rebuild(fn, old_globals, new_globals, code=None):
    if not isinstance(fn, types.FunctionType):
        return fn
    if fn.__globals__ is old_globals:
        return _copy_function(fn, new_globals, fn.__closure__, code)
    inner = getattr(fn, "__wrapped__", None)
    if inner is None or not fn.__closure__:
        return fn
    new_inner = _rebuild(inner, old_globals, new_globals, code)
    if new_inner is inner:
        return fn
    cells = []
    replaced = False
    for cell in fn.__closure__:
        try:
            held = cell.cell_contents
        except ValueError:  # an empty cell
            cells.append(cell)
            continue
        if held is inner:
            cells.append(types.CellType(new_inner))
            replaced = True
        else:
            cells.append(cell)
    if not replaced:
        return fn
    new = _copy_function(fn, fn.__globals__, tuple(cells))
    new.__wrapped__ = new_inner
    return new
