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

OpenRLHF logs the rollout mismatch as ``train/vllm_kl`` (= -k1, with ``is_correction`` on);
``rla.metrics.names_as(m, "openrlhf")`` maps rla's metrics onto that key.
"""

from __future__ import annotations

import functools
import importlib
import os

from rla.alignment import align
from rla.profiles import REGIONS, RoundingProfile, for_engine, resolve

__all__ = ["patch", "unpatch", "patched", "setup_worker", "ENV_VAR", "VERSION_ENV_VAR"]

ENV_VAR = "RLA_PROFILE"
#: The vLLM version the rollout engines run, when it is not the one installed in the worker.
VERSION_ENV_VAR = "RLA_ENGINE_VERSION"
_ACTOR_MODULE = "openrlhf.models.actor"
_state: dict = {}


def _actor_class():
    try:
        module = importlib.import_module(_ACTOR_MODULE)
    except ImportError as e:
        raise ImportError(f"rla.integrations.openrlhf: cannot import {_ACTOR_MODULE} ({e})") from e
    actor = getattr(module, "Actor", None)
    if actor is None or not callable(getattr(actor, "__init__", None)):
        raise RuntimeError(f"rla.integrations.openrlhf: {_ACTOR_MODULE} has no Actor class (OpenRLHF layout changed)")
    return actor


def patch(profile: str | RoundingProfile = "vllm", regions=REGIONS, *, engine_version: str | None = None) -> None:
    """Align the HF model of every ``openrlhf.models.Actor`` built from now on in this process.

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


def unpatch() -> None:
    """Restore OpenRLHF's own ``Actor.__init__``."""
    original = _state.pop("original", None)
    _state.clear()
    if original is not None:
        _actor_class().__init__ = original


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
