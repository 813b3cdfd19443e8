"""verl: name this module in the config, ``actor_rollout_ref.model.external_lib=rla.integrations.verl``.

verl imports each ``external_lib`` in every worker process when it builds the model config
(``HFModelConfig.__post_init__`` -> ``import_external_libs``), before any model is built. Importing
this module therefore installs its patches (that is its whole purpose; :func:`uninstall` undoes
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

- **Metrics on verl's dashboard.** verl's trainer (``RayPPOTrainer.fit``, in the driver) calls
  ``verl.utils.debug.metrics.calculate_debug_metrics(batch)`` on the whole batch whenever it
  carries the engine's ``rollout_log_probs`` and the actor has recomputed ``old_log_probs``, and
  merges the result into the step's ``metrics`` dict, which its ``Tracking`` logger writes to
  every backend (console, wandb, tensorboard, ...). The patch adds rla's ``mismatch/*`` metrics
  (:func:`rla.metrics.mismatch`, ``response_mask`` as the mask) to that dict, in verl's
  ``section/name`` key style, leaving out the three that verl's function already returns under its
  own names (``training/rollout_probs_diff_{mean,max}`` = ``mismatch/prob_abs/{mean,max}``,
  ``training/rollout_actor_probs_pearson_corr`` = ``mismatch/prob_pearson``). The driver imports
  ``external_lib`` only for a critic; name this module for it as verl's own plugin variable does:
  ``VERL_USE_EXTERNAL_MODULES=rla.integrations.verl`` in the Ray runtime environment
  (``+ray_kwargs.ray_init.runtime_env.env_vars.VERL_USE_EXTERNAL_MODULES=rla.integrations.verl``),
  which every process imports with ``import verl``.
- **FSDP1** (``strategy: fsdp``, verl's default): verl builds ``MixedPrecision(param_dtype,
  reduce_dtype, buffer_dtype)`` (bf16, fp32, fp32), whose ``cast_forward_inputs`` is False by
  default: FSDP1 casts the floating inputs of the root module only (``cast_root_forward_inputs``;
  the root receives token ids), never the fp32 cos/sin and sums that aligned layers pass between
  wrapped units, so nothing needs patching; the build checks that default. ``buffer_dtype=fp32``
  keeps RoPE's fp32 ``inv_freq`` as it is (the aligned rotary computes its frequencies from the
  config anyway), and the flat parameters leave the patched forwards in place (they are instance
  attributes of the wrapped modules; FSDP1 calls them with bf16 views of its flat parameters).
  Tested with verl's own ``FSDPEngine.initialize()`` on CPU with gloo, 1 and 2 processes, tied
  and untied LM head: logits and every gradient equal the unsharded aligned model's bit for bit
  (``tests/integrations/test_integration_verl.py``, ``test_integration_verl_fsdp1.py``).
- **Meta-device ranks** (both strategies): verl builds a model with an untied LM head on the meta
  device on every rank but 0 and fills it in from rank 0 when it wraps it; those copies are
  aligned with ``rla.align(..., allow_meta=True)``, exactly as rank 0's (a broadcast pairs the
  buffers by name and size, so the copies must agree).

The alignment report of a trainable actor (fp32 weights at build time, bf16 compute under FSDP's
mixed precision) says so instead of rla's generic "nothing to round" note.

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

__all__ = ["install", "uninstall", "installed", "profile_for", "mismatch_metrics", "VERL_OWN_KEYS", "ENV_VAR",
           "VERSION_ENV_VAR", "CONFIG_KEY"]

ENV_VAR = "RLA_PROFILE"
#: The engine version verl's rollout runs, when it is not the one installed in the worker.
VERSION_ENV_VAR = "RLA_ENGINE_VERSION"
CONFIG_KEY = "rla_profile"
_ENGINE = "verl.workers.engine.fsdp.transformer_impl"
_LEGACY = "verl.workers.fsdp_workers"
_DEBUG_METRICS = "verl.utils.debug.metrics"
#: rla keys that verl's calculate_debug_metrics returns itself, under its names (not written twice).
VERL_OWN_KEYS = {
    "mismatch/prob_abs/mean": "training/rollout_probs_diff_mean",
    "mismatch/prob_abs/max": "training/rollout_probs_diff_max",
    "mismatch/prob_pearson": "training/rollout_actor_probs_pearson_corr",
}
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


def _built_on_meta(module) -> bool:
    """verl builds an untied model on the meta device on every rank but 0
    (``get_init_weight_context_manager(use_meta_tensor=not tie_word_embeddings)``, then
    ``init_empty_weights``); FSDP1's ``sync_module_states`` / FSDP2's ``fsdp2_load_full_state_dict``
    fill it in from rank 0. Only there is a meta model expected: on rank 0 it is an error."""
    import torch.distributed as dist

    on_meta = any(t.is_meta for t in (*module.parameters(), *module.buffers()))
    return on_meta and dist.is_available() and dist.is_initialized() and dist.get_rank() != 0


def _align(module, where: str, mixed_precision: bool = False) -> None:
    name = profile_for(module)
    version = os.environ.get(VERSION_ENV_VAR) or None
    meta = _built_on_meta(module)
    report = align(module, name, engine_version=version if engine_alias(name) else None, allow_meta=meta)
    if meta:
        report.notes.append(
            "built on the meta device by verl (this rank is not 0): aligned as rank 0's copy is, so the two hold the "
            "same buffers; FSDP fills in rank 0's weights and buffers when it wraps the model"
        )
    if mixed_precision:
        stale = [n for n in report.notes if n.startswith("nothing to round")]
        for note in stale:
            report.notes.remove(note)
            report.notes.append(
                "the weights are float32 here (verl's trainable model); verl's FSDP mixed precision computes "
                "the forward with bf16 parameters (param_dtype), where the aligned points round as the profile says"
            )
    _log.warning("rla.integrations.verl: %s\n%s", where, report)


def mismatch_metrics(batch) -> dict[str, float]:
    """rla's mismatch metrics of one verl batch (``DataProto``): ``old_log_probs`` against
    ``rollout_log_probs`` over ``response_mask``; {} when a key is missing. The keys verl's
    ``calculate_debug_metrics`` returns under its own names are left out (:data:`VERL_OWN_KEYS`)."""
    from rla.metrics import mismatch

    tensors = batch.batch
    if not all(k in tensors.keys() for k in ("old_log_probs", "rollout_log_probs", "response_mask")):
        return {}
    mask = tensors["response_mask"].bool()
    if not bool(mask.any()):
        return {}
    m = mismatch(tensors["old_log_probs"].detach().float().cpu(), tensors["rollout_log_probs"].detach().float().cpu(),
                 mask.cpu(), nan_policy="mask")
    return {k: v for k, v in m.items() if k not in VERL_OWN_KEYS}


def _patch_debug_metrics(mod) -> None:
    original = getattr(mod, "calculate_debug_metrics", None)
    if not callable(original):
        raise RuntimeError(f"rla.integrations.verl: {_DEBUG_METRICS} has no calculate_debug_metrics (verl changed)")

    @functools.wraps(original)
    def calculate_debug_metrics(data):
        metrics = original(data)
        ours = mismatch_metrics(data)
        clash = [k for k in ours if k in metrics]
        if clash:
            raise RuntimeError(f"rla.integrations.verl: verl's debug metrics already hold {clash}; "
                               "refusing to write two numbers under one key")
        metrics.update(ours)
        return metrics

    _set(mod, "calculate_debug_metrics", calculate_debug_metrics)


def _check_fsdp1_default() -> None:
    """verl's FSDP1 path relies on ``MixedPrecision(...).cast_forward_inputs`` being False."""
    from torch.distributed.fsdp import MixedPrecision

    if MixedPrecision(param_dtype=None).cast_forward_inputs:
        raise RuntimeError(
            "rla.integrations.verl: this torch's FSDP1 MixedPrecision casts forward inputs by default, which rounds "
            "the fp32 tensors aligned layers pass between FSDP units; set actor_rollout_ref.actor.strategy=fsdp2 (and "
            "critic.strategy=fsdp2 with a critic): rla patches FSDP2's policy"
        )


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
        strategy = getattr(self.engine_config, "strategy", None)
        if strategy == "fsdp":
            _check_fsdp1_default()
        _align(module, f"aligned the {role} {self.model_config.model_type} after verl's dtype cast ({strategy})",
               mixed_precision=strategy in ("fsdp", "fsdp2"))
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
    for name, patch in ((_ENGINE, _patch_engine), (_LEGACY, _patch_legacy), (_DEBUG_METRICS, _patch_debug_metrics)):
        if importlib.util.find_spec(name) is None:
            continue
        mod = importlib.import_module(name)
        if any(m is mod or getattr(m, "__module__", None) == name for m, _ in _ORIGINALS):
            patched.append(name)
            continue
        patch(mod)
        patched.append(name)
    if not set(patched) - {_DEBUG_METRICS}:
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
