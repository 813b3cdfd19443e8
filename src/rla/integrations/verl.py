"""verl: name this module in the config, ``actor_rollout_ref.model.external_lib=rla.integrations.verl``.

verl imports each ``external_lib`` in every worker process when it builds the model config
(``HFModelConfig.__post_init__`` -> ``import_external_libs``), before any model is built. Importing
this module therefore installs two patches (that is its whole purpose; :func:`uninstall` undoes
them), tested with verl 0.9.1:

- **Align after verl's dtype cast.** ``FSDPEngine._build_module``
  (``verl/workers/engine/fsdp/transformer_impl.py``) loads the HF model, applies verl's monkey
  patches, then ``module.to(torch_dtype)``: fp32 for the actor, bf16 for a forward-only reference.
  Aligning "right after ``from_pretrained``" would be undone in part by that cast, so the patch
  aligns the module ``_build_module`` returns: actor, reference and critic (a value model with a
  supported body) alike, before LoRA and FSDP wrapping.
- **``cast_forward_inputs=False`` under FSDP2.** verl 0.9.1 hard-codes
  ``MixedPrecisionPolicy(param_dtype, reduce_dtype, cast_forward_inputs=True)``; that cast rounds
  the fp32 cos/sin tables and residual sums aligned layers pass between FSDP units to bf16, and
  the aligned model refuses such inputs. The module-level name ``MixedPrecisionPolicy`` in verl's
  module is replaced by a function that builds the same policy with ``cast_forward_inputs=False``
  (the parameters are still cast to ``param_dtype`` by FSDP2 itself; only forward inputs stop
  being cast, which the aligned layers do at the points the profile says).

The older layout (verl before the engine workers, ``verl/workers/fsdp_workers.py``, where
``ActorRolloutRefWorker._build_model_optimizer`` and ``CriticWorker._build_critic_model_optimizer``
build, cast and wrap in one function) is covered the same way: the module is aligned when it is
handed to ``get_fsdp_wrap_policy(module=...)``, the first call after the cast, from those two
builders only (the ``RewardModelWorker`` calls it too; a reward model is left as it is), and that
module's ``MixedPrecisionPolicy`` name gets the same replacement. Tested against verl 0.7.1's
``fsdp_workers`` module (``tests/integrations/test_integration_verl_legacy.py``).
Megatron workers are not covered.

Profile: ``+actor_rollout_ref.model.override_config.rla_profile=vllm-eager`` (verl copies
``override_config`` onto the HF config, so each model carries its own choice; the same key works
for ``critic.model.override_config``), else the environment variable ``RLA_PROFILE`` (set it for
the Ray workers, e.g. ``ray_kwargs.ray_init.runtime_env.env_vars.RLA_PROFILE``), else ``vllm``.
An engine alias (``vllm``, ``vllm-eager``, ``sglang``) is the row calibrated for the engine version
the rollout runs: ``RLA_ENGINE_VERSION`` when set, else the engine installed in the worker (verl's
hybrid engine runs the rollout in the same worker environment); the alignment report in the
worker's log names the row and that version, and an uncalibrated version gets a warning naming the
nearest row and ``rla calibrate``. ``actor_rollout_ref.rollout.enforce_eager=True`` runs vLLM's
CUDA kernels: use ``rla_profile=vllm-eager`` with it (``vllm`` is the default -O2 mode's row).
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import logging
import os
import sys

from rla.alignment import align
from rla.profiles import engine_alias, resolve

__all__ = ["install", "uninstall", "installed", "profile_for", "ENV_VAR", "VERSION_ENV_VAR", "CONFIG_KEY"]

ENV_VAR = "RLA_PROFILE"
#: The engine version verl's rollout runs, when it is not the one installed in the worker.
VERSION_ENV_VAR = "RLA_ENGINE_VERSION"
CONFIG_KEY = "rla_profile"
_ENGINE = "verl.workers.engine.fsdp.transformer_impl"
_LEGACY = "verl.workers.fsdp_workers"
#: The fsdp_workers functions that build actor/reference (one function) and critic models.
_LEGACY_BUILDERS = ("_build_model_optimizer", "_build_critic_model_optimizer")
_log = logging.getLogger(__name__)
#: (module, attribute) -> the original object, for every patch in place.
_ORIGINALS: dict[tuple[object, str], object] = {}


def profile_for(module) -> str:
    """The profile for one model: its config's ``rla_profile``, else ``$RLA_PROFILE``, else vllm."""
    config = getattr(module, "config", None)
    name = getattr(config, CONFIG_KEY, None) or os.environ.get(ENV_VAR) or "vllm"
    resolve(name)  # an unknown name fails here, naming the known profiles
    return name


def _align(module, where: str) -> None:
    name = profile_for(module)
    version = os.environ.get(VERSION_ENV_VAR) or None
    report = align(module, name, engine_version=version if engine_alias(name) else None)
    _log.warning("rla.integrations.verl: %s\n%s", where, report)


def _no_input_cast(policy_class):
    @functools.wraps(policy_class)
    def mixed_precision_policy(*args, **kwargs):
        kwargs["cast_forward_inputs"] = False
        return policy_class(*args, **kwargs)

    mixed_precision_policy.__rla_original__ = policy_class
    return mixed_precision_policy


def _set(module, name: str, value) -> None:
    _ORIGINALS.setdefault((module, name), getattr(module, name))
    setattr(module, name, value)


def _patch_engine(mod) -> None:
    engine = getattr(mod, "FSDPEngine", None)
    if engine is None or not callable(getattr(engine, "_build_module", None)) or not hasattr(mod, "MixedPrecisionPolicy"):
        raise RuntimeError(
            f"rla.integrations.verl: {_ENGINE} has no FSDPEngine._build_module or MixedPrecisionPolicy; "
            "this verl lays out its FSDP engine differently from 0.9.1 (the version tested)"
        )
    build = engine._build_module

    @functools.wraps(build)
    def _build_module(self, *args, **kwargs):
        module = build(self, *args, **kwargs)
        role = "forward-only (reference)" if self.engine_config.forward_only else "trainable"
        _align(module, f"aligned the {role} {self.model_config.model_type} after verl's dtype cast")
        return module

    _set(engine, "_build_module", _build_module)
    _set(mod, "MixedPrecisionPolicy", _no_input_cast(mod.MixedPrecisionPolicy))


def _patch_legacy(mod) -> None:
    wrap_policy = getattr(mod, "get_fsdp_wrap_policy", None)
    if wrap_policy is None or not hasattr(mod, "MixedPrecisionPolicy"):
        raise RuntimeError(
            f"rla.integrations.verl: {_LEGACY} has no get_fsdp_wrap_policy or MixedPrecisionPolicy; "
            "this verl builds its FSDP workers differently from the layout rla knows"
        )

    @functools.wraps(wrap_policy)
    def get_fsdp_wrap_policy(module, *args, **kwargs):
        builder = sys._getframe(1).f_code.co_name
        if builder in _LEGACY_BUILDERS:
            _align(module, f"aligned a model in {builder} (fsdp_workers layout) after verl's dtype cast")
        else:  # e.g. RewardModelWorker._build_model: a reward model is not compared with rollouts
            _log.warning("rla.integrations.verl: %s builds a model rla leaves as it is", builder)
        return wrap_policy(module, *args, **kwargs)

    _set(mod, "get_fsdp_wrap_policy", get_fsdp_wrap_policy)
    _set(mod, "MixedPrecisionPolicy", _no_input_cast(mod.MixedPrecisionPolicy))


def install() -> list[str]:
    """Install the patches on every verl layout present; returns the modules patched.

    Idempotent. Raises when verl is missing or neither layout is found.
    """
    if importlib.util.find_spec("verl") is None:
        raise ImportError("rla.integrations.verl: verl is not installed in this environment")
    patched = []
    for name, patch in ((_ENGINE, _patch_engine), (_LEGACY, _patch_legacy)):
        if importlib.util.find_spec(name) is None:
            continue
        mod = importlib.import_module(name)
        if any(m is mod or getattr(m, "__module__", None) == name for m, _ in _ORIGINALS):
            patched.append(name)
            continue
        patch(mod)
        patched.append(name)
    if not patched:
        raise RuntimeError(
            f"rla.integrations.verl: found neither {_ENGINE} (verl 0.9) nor {_LEGACY} (older verl); "
            "cannot hook this verl"
        )
    return patched


def installed() -> bool:
    return bool(_ORIGINALS)


def uninstall() -> None:
    """Restore every verl object this module replaced."""
    while _ORIGINALS:
        (owner, name), original = _ORIGINALS.popitem()
        setattr(owner, name, original)


# verl imports `external_lib` modules for their side effect; this is that side effect.
install()
