"""OpenRLHF: ``rla.integrations.openrlhf.patch(profile="vllm")`` before the actors are built.

OpenRLHF (tested: 0.11.2) builds every trained or scored model through ``openrlhf.models.Actor``:
the policy (``PolicyModelActor``), the reference (``ReferenceModelActor``) and the EMA copy, each in
its own Ray worker. ``Actor.__init__`` loads the HF model (``from_pretrained(...,
torch_dtype=bf16)``), applies LoRA, and only afterwards does DeepSpeed wrap it; there is no hook
between. :func:`patch` wraps ``Actor.__init__`` so that the HF model inside (``actor.model``, PEFT
included) is aligned as the constructor returns, before ``strategy.prepare`` hands it to DeepSpeed.
A later cast of the module (by DeepSpeed or anyone) keeps the aligned rotary's fp32 frequencies.
The report is kept as ``actor.rla_alignment``.

Patching a class is global to the process, so it is explicit and reversible (:func:`unpatch`),
never done on import. The workers are separate processes: run :func:`setup_worker` in each, which
Ray does when it is named as the job's ``worker_process_setup_hook``; it reads the profile from
``RLA_PROFILE`` (an engine alias such as ``vllm`` is the row of the vLLM installed in the worker,
or of ``RLA_ENGINE_VERSION`` when set; see :func:`patch`)::

    ray job submit --runtime-env-json='{"worker_process_setup_hook":
        "rla.integrations.openrlhf.setup_worker", "env_vars": {"RLA_PROFILE": "vllm"}}' \\
        -- python3 -m openrlhf.cli.train_ppo_ray ...

**Metrics.** :func:`patch` also wraps ``ActorPPOTrainer.training_step``
(``openrlhf/trainer/ray/ppo_actor.py``, imported where it can be: the policy's Ray worker; it
needs Ray and vLLM) when the experience carries the engine's ``rollout_log_probs``: rla's
token-mean mismatch metrics (:data:`TOKEN_MEAN_KEYS`: k1, k2, k3, mean |delta|, chi2, ...) of
the micro-batch, training side = ``action_log_probs`` (pi_old, the actor's own forward before the
update), are added to the step's ``metrics`` with OpenRLHF's ``"token"`` weight. OpenRLHF's
``ppo_train`` then reduces them as it reduces its own token metrics (weighted by each
micro-batch's token count, summed over ranks), which gives exactly the token mean of the whole
batch, and its loggers write them as ``train/mismatch/...`` (they prefix every key with
``train/``). Maxima, percentiles and sequence metrics are left out: a weighted mean of them is
not the metric. ``mismatch/k1`` is left out when OpenRLHF logs ``vllm_kl`` itself (= -k1, with
``is_correction`` on); ``rla.metrics.names_as(m, "openrlhf")`` gives OpenRLHF's status keys
(``vllm_kl``, without the ``train/`` its loggers add).
"""

from __future__ import annotations

import functools
import importlib
import os

from rla.alignment import align
from rla.profiles import REGIONS, RoundingProfile, for_engine, resolve

__all__ = ["patch", "unpatch", "patched", "setup_worker", "token_metrics", "TOKEN_MEAN_KEYS", "ENV_VAR",
           "VERSION_ENV_VAR"]

ENV_VAR = "RLA_PROFILE"
#: The vLLM version the rollout engines run, when it is not the one installed in the worker.
VERSION_ENV_VAR = "RLA_ENGINE_VERSION"
_ACTOR_MODULE = "openrlhf.models.actor"
_TRAINER_MODULE = "openrlhf.trainer.ray.ppo_actor"
_state: dict = {}

#: rla metrics that are means over the masked tokens: OpenRLHF's token-weighted reduction of
#: per-micro-batch values gives the whole batch's value. (Plus every ``clip_leak/*`` and ``bitwise/*``.)
TOKEN_MEAN_KEYS = ("mismatch/k1", "mismatch/k2", "mismatch/k3", "mismatch/abs/mean", "mismatch/chi2_token",
                   "mismatch/prob_abs/mean")
_TOKEN_MEAN_PREFIXES = ("mismatch/clip_leak/", "mismatch/bitwise/")


def token_metrics(experience, *, skip_k1: bool = False) -> dict:
    """rla's token-mean mismatch metrics of one OpenRLHF ``Experience`` (0-d fp64 tensors), or {}
    when it carries no rollout logprobs. Training side: ``action_log_probs`` (pi_old)."""
    import torch

    from rla.metrics import mismatch

    roll = getattr(experience, "rollout_log_probs", None)
    train = getattr(experience, "action_log_probs", None)
    mask = getattr(experience, "action_mask", None)
    if roll is None or train is None or mask is None or not bool(mask.any()):
        return {}
    m = mismatch(train.detach().float().cpu(), roll.detach().float().cpu(), mask.bool().cpu(), nan_policy="mask")
    keep = {k: v for k, v in m.items() if k in TOKEN_MEAN_KEYS or k.startswith(_TOKEN_MEAN_PREFIXES)}
    if skip_k1:
        keep.pop("mismatch/k1", None)
    return {k: torch.tensor(v, dtype=torch.float64) for k, v in keep.items()}


def _trainer_class():
    try:
        module = importlib.import_module(_TRAINER_MODULE)
    except ImportError:  # no Ray / vLLM in this process: no PPO actor trains here
        return None
    trainer = getattr(module, "ActorPPOTrainer", None)
    if trainer is None or not callable(getattr(trainer, "training_step", None)):
        raise RuntimeError(
            f"rla.integrations.openrlhf: {_TRAINER_MODULE} has no ActorPPOTrainer.training_step (OpenRLHF layout "
            "changed from 0.11.2); pass metrics=False to patch() to align without the metrics hook"
        )
    return trainer


def _patch_metrics() -> str:
    trainer = _trainer_class()
    if trainer is None:
        return f"off in this process ({_TRAINER_MODULE} cannot be imported here: no Ray or vLLM)"
    original = _state.get("training_step", trainer.training_step)

    @functools.wraps(original)
    def training_step(self, experience, *args, **kwargs):
        status = original(self, experience, *args, **kwargs)
        metrics, weights = status["metrics"], status["weights"]
        extra = token_metrics(experience, skip_k1="vllm_kl" in metrics)
        clash = [k for k in extra if k in metrics]
        if clash:
            raise RuntimeError(f"rla.integrations.openrlhf: OpenRLHF's step metrics already hold {clash}; "
                               "refusing to write two numbers under one key")
        metrics.update(extra)
        weights.update({k: "token" for k in extra})
        return status

    _state["training_step"] = original
    trainer.training_step = training_step
    return "mismatch/* token means added to ActorPPOTrainer.training_step's metrics"


def _actor_class():
    try:
        module = importlib.import_module(_ACTOR_MODULE)
    except ImportError as e:
        raise ImportError(f"rla.integrations.openrlhf: cannot import {_ACTOR_MODULE} ({e})") from e
    actor = getattr(module, "Actor", None)
    if actor is None or not callable(getattr(actor, "__init__", None)):
        raise RuntimeError(f"rla.integrations.openrlhf: {_ACTOR_MODULE} has no Actor class (OpenRLHF layout changed)")
    return actor


def patch(profile: str | RoundingProfile = "vllm", regions=REGIONS, metrics: bool = True, *,
          engine_version: str | None = None) -> str:
    """Align the HF model of every ``openrlhf.models.Actor`` built from now on in this process, and
    (``metrics``) add rla's token-mean mismatch metrics to the PPO actor's step metrics where that
    trainer can be imported. Returns what the metrics hook does in this process.

    An engine alias (``"vllm"``) is the row of the vLLM the rollout engines run: ``engine_version``
    (``setup_worker`` reads ``RLA_ENGINE_VERSION``), else the vLLM installed in this worker's
    environment, which is the one OpenRLHF's vLLM actors import (:func:`rla.profiles.for_engine`;
    a warning when that version has no calibrated row). Patching again replaces the profile (one
    wrapper, never two).
    """
    match = for_engine(profile, engine_version) if isinstance(profile, str) else None
    if engine_version is not None and match is None:
        raise ValueError(f"engine_version={engine_version!r} needs an engine alias as profile (e.g. 'vllm'), "
                         f"got {getattr(profile, 'name', profile)!r}")
    p = match.profile if match is not None else resolve(profile)
    actor = _actor_class()
    original = _state.get("original", actor.__init__)

    @functools.wraps(original)
    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        model = getattr(self, "model", None)
        if model is None:
            raise RuntimeError("rla.integrations.openrlhf: Actor.__init__ set no .model to align")
        self.rla_alignment = align(model, _state["profile"], _state["regions"])
        self.rla_alignment.profile_choice = _state["choice"]

    _state.update(original=original, profile=p, regions=regions, choice=match.message() if match else "")
    actor.__init__ = __init__
    _state["metrics"] = _patch_metrics() if metrics else "off (metrics=False)"
    return _state["metrics"]


def unpatch() -> None:
    """Restore OpenRLHF's own ``Actor.__init__``."""
    original = _state.pop("original", None)
    training_step = _state.pop("training_step", None)
    _state.clear()
    if original is not None:
        _actor_class().__init__ = original
    if training_step is not None:
        _trainer_class().training_step = training_step


def patched() -> RoundingProfile | None:
    """The profile new Actors are aligned to, or None when not patched."""
    return _state.get("profile")


def setup_worker() -> None:
    """Ray ``worker_process_setup_hook``: ``patch(os.environ["RLA_PROFILE"])`` in this worker
    (with ``engine_version=os.environ["RLA_ENGINE_VERSION"]`` when set)."""
    name = os.environ.get(ENV_VAR)
    if not name:
        raise RuntimeError(
            f"rla.integrations.openrlhf.setup_worker: set {ENV_VAR} (e.g. vllm) in the job's runtime_env env_vars"
        )
    patch(name, engine_version=os.environ.get(VERSION_ENV_VAR) or None)
