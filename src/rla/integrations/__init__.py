"""One call or one config line per RL framework: TRL, verl, OpenRLHF.

Each submodule imports its framework lazily (only when called or imported), so ``import rla``
never needs any of them:

- :mod:`rla.integrations.trl`: ``attach(trainer, profile="vllm")`` after building a
  ``GRPOTrainer``: aligns the policy and the reference model, logs rla's mismatch metrics into
  TRL's own log.
- :mod:`rla.integrations.verl`: ``actor_rollout_ref.model.external_lib=rla.integrations.verl``:
  aligns actor, reference and critic after verl's dtype cast (FSDP1 and FSDP2), keeps FSDP2 from
  casting the fp32 tensors aligned layers pass on, and adds ``mismatch/*`` to the step metrics
  verl's trainer logs.
- :mod:`rla.integrations.openrlhf`: ``patch(profile="vllm")`` before the actors are built (in
  every Ray worker, through ``setup_worker`` and ``RLA_PROFILE``): aligns the HF model inside each
  ``openrlhf.models.Actor`` and adds rla's token-mean ``mismatch/*`` to the PPO actor's metrics.

A model Liger Kernel has patched is aligned over Liger (``rla.alignment.liger``); TRL's
``use_liger_kernel`` is refused by ``attach``.

Versions tested are in the README's integration section; each module checks the framework's
version and the hook points it relies on, and names what moved if they did.
"""
