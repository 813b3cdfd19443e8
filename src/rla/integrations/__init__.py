"""One call or one config line per RL framework: TRL, verl, OpenRLHF.

Each submodule imports its framework lazily (only when called or imported), so ``import rla``
never needs any of them:

- :mod:`rla.integrations.trl`: ``attach(trainer, profile="vllm")`` after building a
  ``GRPOTrainer``: aligns the policy and the reference model, logs rla's mismatch metrics into
  TRL's own log.
- :mod:`rla.integrations.verl`: ``actor_rollout_ref.model.external_lib=rla.integrations.verl``:
  aligns actor, reference and critic after verl's dtype cast, and keeps FSDP2 from casting the
  fp32 tensors aligned layers pass on.
- :mod:`rla.integrations.openrlhf`: ``patch(profile="vllm")`` before the actors are built (in
  every Ray worker, e.g. through ``RLA_OPENRLHF_PROFILE`` and ``sitecustomize``): aligns the HF
  model inside each ``openrlhf.models.Actor``.

Versions tested are in the README's integration section; each module checks the framework's
version and the hook points it relies on, and names what moved if they did.
"""
