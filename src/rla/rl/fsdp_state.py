"""AdamW state keyed by parameter name, so a checkpoint reads the same with or without FSDP.

A plain ``optimizer.state_dict()`` keys state by parameter *index*; FSDP2's full state dict
(``torch.distributed.checkpoint.state_dict``) keys it by the fully qualified name inside the
wrapped module, here ``PolicyForward`` whose model sits at ``lm.``. Checkpoints store neither:
they store ``{parameter name: state}`` (names as ``Policy.named_parameters`` gives them) and the
param groups without their ``params`` lists, and these two functions map to and from each form.
Under FSDP the full state is gathered to CPU on rank 0 only (other ranks get ``({}, [])``) and
set from the full state on every rank.
"""

from __future__ import annotations

__all__ = ["optimizer_state_by_name", "load_optimizer_state_by_name"]

_FSDP_PREFIX = "lm."  # PolicyForward.lm: the wrapped module's parameter names start with it


def optimizer_state_by_name(policy, optimizer, fsdp: bool) -> tuple[dict, list]:
    """``({parameter name: AdamW state}, param_groups)`` of ``optimizer`` over ``policy``'s parameters."""
    if fsdp:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

        sd = get_optimizer_state_dict(policy.forward, optimizer,
                                      options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if not sd:  # full state dicts with cpu_offload live on rank 0 only
            return {}, []
        state = {k[len(_FSDP_PREFIX):]: v for k, v in sd["state"].items()}
        return state, sd["param_groups"]
    sd = optimizer.state_dict()
    names = [n for n, _ in policy.named_parameters()]
    state = {names[i]: v for i, v in sd["state"].items()}
    return state, sd["param_groups"]


def load_optimizer_state_by_name(policy, optimizer, fsdp: bool, state: dict, groups: list, device) -> None:
    """Load ``state`` (``{parameter name: AdamW state}``) and ``groups`` (without ``params``) into ``optimizer``.

    Without FSDP the state tensors move to ``device`` (AdamW's ``step`` stays where it was saved);
    parameters missing from ``state`` start fresh.
    """
    names = [n for n, _ in policy.named_parameters()]
    if fsdp:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

        sd = {"state": {_FSDP_PREFIX + k: v for k, v in state.items()},
              "param_groups": [{**g, "params": [_FSDP_PREFIX + n for n in names]} for g in groups]}
        set_optimizer_state_dict(policy.forward, optimizer, sd, options=StateDictOptions(full_state_dict=True))
        return
    by_index = {i: {k: v.to(device) if k != "step" else v for k, v in state[n].items()}
                for i, n in enumerate(names) if n in state}
    optimizer.load_state_dict({"state": by_index,
                               "param_groups": [{**g, "params": list(range(len(names)))} for g in groups]})
