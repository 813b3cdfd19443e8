"""One description per fused op, and the two doors generated from it.

A fused op is written once, as data: :class:`Kernel` names a launcher, its parameters with their
types (the flags are named fields, not positions in a tuple) and its fake (the outputs' shapes,
dtypes and strides, for FakeTensor tracing); :class:`OpSpec` adds what autograd needs: how many
outputs the caller sees (the rest, e.g. a norm's rstd, exist only for backward), the ``save`` rule
(what is kept for backward, as tensors and named ``ctx`` fields), the ``grad`` rule (the gradients
of the inputs from the saved state and the output gradients) and the backward :class:`Kernel` that
``grad`` launches. :class:`Op` generates both doors from that one description:

- the **custom op**: ``torch.library.custom_op("rla::<name>")`` with a schema written from the
  parameters, ``register_fake`` and ``register_autograd``, whose backward is the backward kernel's
  own custom op. This is what ``torch.compile`` (an opaque node with symbolic shapes), export and
  ``torch.library.opcheck`` see.
- the **autograd.Function**: the eager door. A call through the custom-op dispatcher costs tens of
  microseconds of host time more than a plain ``autograd.Function``, longer than the RoPE kernel
  itself (the benchmark results' summary, session 2; ``lab/bench/host_time.py`` times the layers
  of one call), so eager calls skip the dispatcher.

Identical by construction: both doors run the same launcher, then the same ``save`` rule, and in
backward the same ``grad`` rule. The one difference is what ``grad`` is handed as ``backward``: the
backward kernel's custom op in the first door, its launcher in the second, and that custom op does
nothing but call that launcher. A launcher therefore returns what a custom op may return: a
d_weight nobody needs is an empty tensor, not ``None`` (``grad`` turns it into ``None``), which
costs the eager door one small allocation per backward when a weight is frozen. The parameter
names of every launcher, fake and ``save`` rule are checked against the description when it is
built, so a flag added in one place and not the others fails at import, not in a backward pass.

What the generation costs the eager door: binding the named flags to their positions (one list of
dict lookups) and one more Python call each way, small against the dispatcher's cost; the saved
tensors and the ``grad_fn`` class name are what a hand-written Function would have.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from functools import cached_property
from typing import Callable, Optional

import torch
from torch import Tensor

#: Parameter types a description may use, and their names in a ``torch.library`` schema.
SCHEMA_TYPES = {
    Tensor: "Tensor",
    Optional[Tensor]: "Tensor?",
    bool: "bool",
    int: "SymInt",
    float: "float",
    str: "str",
    torch.dtype: "ScalarType",
}


def _check_params(fn: Callable, names: tuple[str, ...], lead: tuple[str, ...], what: str) -> None:
    """``fn``'s parameters must be ``lead`` then ``names``, in order: the description's names."""
    got = tuple(inspect.signature(fn).parameters)
    if got != lead + names:
        raise TypeError(f"{what} {fn.__qualname__} takes {got}; the description says {lead + names}")


@dataclass(frozen=True)
class Kernel:
    """A launcher as data.

    ``params``: name -> type (a key of :data:`SCHEMA_TYPES`) in call order, the order of the
    schema and of every positional call; ``outputs``: the number of tensors it returns (one is
    returned bare, several as a tuple); ``launch`` runs it; ``fake`` returns empty tensors with the
    outputs' shapes, dtypes and strides. Both take exactly ``params``. :attr:`op` registers it as
    the custom op ``rla::<name>`` on first access (once, however many ops share the kernel).
    """

    name: str
    params: dict
    outputs: int
    launch: Callable
    fake: Callable

    def __post_init__(self):
        for n, t in self.params.items():
            if t not in SCHEMA_TYPES:
                raise TypeError(f"rla::{self.name}: parameter {n} has type {t}, not one of {list(SCHEMA_TYPES)}")
        names = tuple(self.params)
        _check_params(self.launch, names, (), f"rla::{self.name} launcher")
        _check_params(self.fake, names, (), f"rla::{self.name} fake")

    @cached_property
    def op(self):
        """The custom op ``rla::<name>``: this launcher behind the dispatcher, with its fake."""
        op = torch.library.custom_op(f"rla::{self.name}", self.launch, mutates_args=(), schema=self.schema())
        op.register_fake(self.fake)
        return op

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self.params)

    def schema(self) -> str:
        """The ``torch.library`` schema: ``(Tensor q, bool per_op, ...) -> (Tensor, Tensor)``."""
        args = ", ".join(f"{SCHEMA_TYPES[t]} {n}" for n, t in self.params.items())
        out = "Tensor" if self.outputs == 1 else "(" + ", ".join(["Tensor"] * self.outputs) + ")"
        return f"({args}) -> {out}"


@dataclass(frozen=True)
class OpSpec:
    """A differentiable fused op: its forward kernel and its autograd rules.

    ``returns``: the leading outputs the caller gets; ``save(ctx, outputs, *params)`` keeps what
    backward needs (``ctx.save_for_backward`` and named ``ctx`` fields), ``outputs`` being all of
    the forward kernel's; ``grad(ctx, backward, *grads)`` gets the gradients of the returned
    outputs and ``backward`` (the backward kernel, through one door or the other, or ``None``
    when there is none) and returns the gradients of the leading parameters (``None`` where an
    input needs none; the flags after them get ``None`` without saying so). ``function_name``
    names the generated ``autograd.Function`` (what ``grad_fn``'s type shows in a profile).
    """

    forward: Kernel
    returns: int
    save: Callable
    grad: Callable
    backward: Optional[Kernel]
    function_name: str

    def __post_init__(self):
        if not 1 <= self.returns <= self.forward.outputs:
            raise ValueError(f"rla::{self.forward.name}: returns {self.returns} of {self.forward.outputs} outputs")
        _check_params(self.save, self.forward.names, ("ctx", "outputs"), f"rla::{self.forward.name} save rule")


class Op:
    """Both doors of one :class:`OpSpec`: ``op(*tensors, **flags)`` runs the custom op under
    ``torch.compile`` and the ``autograd.Function`` otherwise, and returns the returned outputs
    (one bare, several as a tuple). Leading parameters may be passed by position, the rest by
    name; ``custom_op`` and ``function`` are the two doors themselves, called with all of
    ``names`` by position."""

    def __init__(self, spec: OpSpec):
        self.spec = spec
        fwd = spec.forward
        self.name, self.names = fwd.name, fwd.names
        self.custom_op = fwd.op
        self.function = _function(spec)
        n_params, returns, single, grad = len(fwd.params), spec.returns, fwd.outputs == 1, spec.grad
        self._single, self._returns = single, returns
        backward_op = spec.backward.op if spec.backward is not None else None

        def setup_context(ctx, inputs, output):
            spec.save(ctx, (output,) if single else output, *inputs)

        def backward(ctx, *grads):
            g = grad(ctx, backward_op, *grads[:returns])
            return (*g, *(None,) * (n_params - len(g)))

        fwd.op.register_autograd(backward, setup_context=setup_context)

    def __call__(self, *tensors, **flags):
        names = self.names
        if len(tensors) + len(flags) != len(names):
            raise TypeError(f"rla::{self.name} takes {names}; got {len(tensors)} positional and {sorted(flags)}")
        args = (*tensors, *[flags[n] for n in names[len(tensors):]])
        if torch.compiler.is_compiling():
            out = self.custom_op(*args)
            return out if self._single else out[0] if self._returns == 1 else out[: self._returns]
        return self.function.apply(*args)


def _function(spec: OpSpec) -> type:
    """The eager door: an ``autograd.Function`` that launches, saves and differentiates through
    the description's own launcher and rules."""
    launch, save, grad = spec.forward.launch, spec.save, spec.grad
    single, returns, n_params = spec.forward.outputs == 1, spec.returns, len(spec.forward.params)
    backward_launch = spec.backward.launch if spec.backward is not None else None

    def forward(ctx, *args):
        out = launch(*args)
        outs = (out,) if single else out
        save(ctx, outs, *args)
        return outs[0] if returns == 1 else outs[:returns]

    def backward(ctx, *grads):
        g = grad(ctx, backward_launch, *grads)
        return (*g, *(None,) * (n_params - len(g)))

    body = {"forward": staticmethod(forward), "backward": staticmethod(backward), "__module__": launch.__module__,
            "__doc__": f"The eager door of rla::{spec.forward.name} (generated by rla.ops._op_spec)."}
    return type(spec.function_name, (torch.autograd.Function,), body)
