"""TRL: ``rla.integrations.trl.attach(trainer, profile="vllm")``, one line after building the trainer.

What the one call does to a ``trl.GRPOTrainer`` (tested with TRL 1.16):

- **Aligns the policy** (``trainer.model``, through accelerate/PEFT wrappers) and **the reference
  model** TRL builds for itself when ``beta > 0`` (``trainer.ref_model``, loaded from the same
  checkpoint in ``GRPOTrainer.__init__``). Aligning only the model passed in leaves the reference
  on HF's own rounding, so the KL term is nonzero at step 1 although both hold the same weights.
  With PEFT TRL has no reference model: the reference is the policy with its adapters disabled,
  which is aligned with it.
- **Logs rla's mismatch metrics** (:func:`rla.metrics.mismatch`) into TRL's own log, each step,
  whenever a generation batch carries rollout logprobs (``use_vllm=True``, or a ``rollout_func``
  that returns ``logprobs``). TRL keeps NaN for tokens vLLM could not score; those are masked
  (``nan_policy="mask"``) and counted in ``mismatch/n_nan_masked``. The keys are rla's own
  ``mismatch/...`` names; ``mismatch/abs/mean`` and ``mismatch/abs/max`` are left out whenever
  TRL logs the same numbers itself (``sampling/sampling_logp_difference/{mean,max}`` with
  vLLM importance-sampling correction on). The training-side logprobs are TRL's
  ``old_per_token_logps`` when it computed them (always with vLLM); otherwise one extra no-grad
  forward of the batch computes them, since the comparison needs the training stack's numbers
  before any update. Without rollout logprobs (TRL sampling with the training model itself)
  there is no second stack to compare and nothing is logged; :class:`Attachment` says so.

Casts TRL makes after ``attach`` (``use_transformers_continuous_batching=True`` with ``bf16=True``
calls ``model.to(torch.bfloat16)`` before each generation) keep the aligned rotary's fp32
frequencies (``rla.alignment.rope``). A checkpoint holds plain HF weights; after
``resume_from_checkpoint`` the trainer built by the same script is attached again by the same
line, and its report says so.
"""

from __future__ import annotations

import types
from dataclasses import dataclass, field

import torch

from rla.alignment import AlignmentReport, align
from rla.metrics import mismatch
from rla.profiles import REGIONS, RoundingProfile

__all__ = ["attach", "Attachment", "TRL_OWN_KEYS"]

#: rla keys whose numbers TRL 1.16 logs itself, under its own names, when vLLM IS correction is on.
TRL_OWN_KEYS = {
    "mismatch/abs/mean": "sampling/sampling_logp_difference/mean",
    "mismatch/abs/max": "sampling/sampling_logp_difference/max",
}
_HOOKS = ("model", "ref_model", "accelerator", "_metrics", "_generate_and_score_completions",
          "_get_per_token_logps_and_entropies", "args")


@dataclass
class Attachment:
    """What :func:`attach` did: the policy's and the reference's alignment, and the metrics hook."""

    policy: AlignmentReport
    reference: AlignmentReport | None
    reference_note: str
    metrics: str
    logged_keys: set[str] = field(default_factory=set)
    log_metrics: bool = True
    weights_column: str = "off (log_tokens=False)"
    """Whether ``log_tokens`` writes the weights fingerprint (``rla/policy``), or why not."""

    def __str__(self) -> str:
        return "\n".join([
            "rla.integrations.trl: attached",
            f"policy: {self.policy}",
            f"reference: {self.reference_note}",
            f"metrics: {self.metrics}",
            f"weights fingerprint: {self.weights_column}",
        ])


#: TRL trainers ``attach`` refuses by name, and why (what to do instead).
_NOT_SUPPORTED = {
    "RLOOTrainer": (
        "its generation batch keeps no rollout logprobs (no sampling_per_token_logps), so the mismatch "
        "metrics attach promises would never be logged. Align its models by hand: "
        "rla.align(trainer.model, profile) and, with beta > 0, rla.align(trainer.ref_model, profile)"
    ),
    "DPOTrainer": (
        "DPO, KTO and the other offline trainers have no rollout engine to align to; aligning only the "
        "policy makes the implicit reward beta * (log pi - log pi_ref) nonzero at step 0 with identical "
        "weights. Align both models or neither (docs/integrations/trl.md)"
    ),
}
_NOT_SUPPORTED["KTOTrainer"] = _NOT_SUPPORTED["DPOTrainer"]


def _check_trainer(trainer) -> None:
    import trl

    name = type(trainer).__name__
    if not isinstance(trainer, trl.GRPOTrainer):
        why = next((w for n, w in _NOT_SUPPORTED.items() if any(k.__name__ == n for k in type(trainer).__mro__)),
                   "attach is written and tested for GRPOTrainer's generation and logging code only")
        raise TypeError(f"rla.integrations.trl.attach supports trl.GRPOTrainer (TRL 1.16), not {name}: {why}")
    missing = [hook for hook in _HOOKS if not hasattr(trainer, hook)]
    if missing:
        raise TypeError(
            f"rla.integrations.trl.attach needs a trl.GRPOTrainer as TRL 1.16 builds it; {name} lacks {missing} "
            "(TRL's layout changed)"
        )
    if getattr(trainer.args, "use_liger_kernel", False):
        raise ValueError(
            "rla.integrations.trl.attach: use_liger_kernel=True. TRL applies Liger Kernel when train() starts, "
            "after attach, and only to the policy: Liger's RMSNorm and SwiGLU forwards then replace the aligned "
            "ones and the policy stops rounding like the engine while the reference still does. In GRPOTrainer "
            "TRL turns Liger's fused linear cross-entropy off, so everything Liger would do lies in rla's three "
            "regions, which rla replaces anyway: set GRPOConfig(use_liger_kernel=False); nothing of Liger's is lost"
        )


def _unfingerprinted(trainer) -> str | None:
    """Why the completions table cannot say which weights sampled its rows, or None when it can.

    The rows' weights are the ones TRL synced to vLLM for that generation
    (``vllm_generation.sync_weights`` in ``GRPOTrainer._generate``, at each new global step): the
    policy's own tensors as they are at generation, the optimizer not having stepped since, except
    where vLLM gets other tensors than the module holds, or the module does not hold them whole."""
    from accelerate.utils import is_peft_model

    if not getattr(trainer.args, "use_vllm", False):
        return ("not written: without use_vllm TRL syncs no engine, so which weights the rollout_func's engine "
                "held is not known here (record the fingerprint in the rollout_func: docs/rollouts.md)")
    model = trainer.accelerator.unwrap_model(trainer.model)
    if is_peft_model(model):
        return ("not written: with PEFT TRL syncs the merged weights to vLLM, which the model's own tensors "
                "(base and adapters) do not fingerprint")
    if any(hasattr(p, "ds_id") for p in model.parameters()):
        return "not written: DeepSpeed ZeRO-3 partitions the parameters, so no rank holds the tensors synced"
    if "FSDP" in str(getattr(trainer.accelerator, "distributed_type", "")):
        return "not written: under FSDP no rank holds the whole tensors synced (not supported by this hook)"
    return None


def _autocast_note(trainer, report: AlignmentReport) -> None:
    """TRL's defaults load fp32 weights and train under accelerate's bf16 autocast: rla's generic note
    ('nothing to round, autocast is off') holds at attach time only; say what training does."""
    precision = getattr(trainer.accelerator, "mixed_precision", "no")
    if precision not in ("bf16", "fp16"):
        return
    stale = [n for n in report.notes if n.startswith("nothing to round")]
    if not stale:
        return
    for note in stale:
        report.notes.remove(note)
    dtype = "bfloat16" if precision == "bf16" else "float16"
    report.notes.append(
        f"the weights are float32 and TRL runs every forward under accelerate's {dtype} autocast "
        f"(mixed_precision={precision!r}): the aligned layers take {dtype} as the stack dtype (the residual "
        "stream is held in it, as the engine holds it) and round where the profile says, so training runs "
        "aligned although the weights are float32 at attach time (on CPU the logits equal those of the "
        f"{dtype}-loaded aligned model bit for bit, tests/integrations/test_integration_trl.py)"
    )


def _check_still_aligned(trainer) -> None:
    """Something (Liger, another patch) replaced aligned forwards after attach: refuse to go on silently."""
    from rla.alignment.patch import foreign_wrapper

    model = trainer.accelerator.unwrap_model(trainer.model)
    replaced = [name for name, m in model.named_modules() if foreign_wrapper(m)]
    if replaced:
        raise RuntimeError(
            f"rla.integrations.trl: {', '.join(replaced[:3])} had their aligned forward replaced after attach "
            "(Liger Kernel's use_liger_kernel does this when train() starts); the policy no longer rounds like "
            "the engine. Turn that patch off, or apply it before attach"
        )


def _head_note(trainer, report: AlignmentReport) -> None:
    """A note when TRL's fused GRPO head, which reads ``lm_head.weight`` itself and so is beyond
    ``rla.align``'s head (``rla.alignment.lm_head``), computes another logits dtype than the row's
    ``lm_head``: TRL's ``cast_lm_head_to_fp32`` decides it (docs/integrations/trl.md)."""
    cast = bool(getattr(trainer.args, "cast_lm_head_to_fp32", False))
    row = report.ran().lm_head
    if cast and row == "lp":
        report.notes.append(
            "TRL's cast_lm_head_to_fp32=True: GRPO's training logprobs come from TRL's fused head on the fp32 weight "
            f"(fp32 logits), while {report.profile.name!r} has a bf16 head (lm_head='lp', the engine's default); "
            "model(...).logits follow the row, TRL's loss does not. Drop the cast, or start vLLM with "
            "hf_overrides={'head_dtype': 'float32'} and align to row.replace(lm_head='fp32')")
    elif cast:
        report.notes.append(
            "TRL's cast_lm_head_to_fp32=True with an fp32-head row: TRL's fused head reads the fp32 master weight, "
            "the engine RN(w) (what the weight sync loads): equal until the first update")
    elif row == "fp32":
        report.notes.append(
            f"{report.profile.name!r} has an fp32 head (lm_head='fp32') but TRL's fused GRPO head computes bf16 "
            "logits without cast_lm_head_to_fp32=True: model(...).logits follow the row, TRL's loss does not")


def attach(
    trainer,
    profile: str | RoundingProfile = "vllm",
    *,
    regions=REGIONS,
    log_metrics: bool = True,
    log_tokens: bool = False,
    ops=None,
) -> Attachment:
    """Align ``trainer``'s policy and reference model to ``profile`` and log mismatch metrics.

    Call once after ``GRPOTrainer(...)`` and before ``trainer.train()``. Calling it again
    re-aligns both models (e.g. another profile) and keeps one metrics hook. ``ops`` goes to
    :func:`rla.align` for both models, e.g. ``rla.engines.vllm_forward.engine_forward(vllm.load())``
    (the engine's own compiled pieces in the forward); a forward that keeps no KV cache needs the
    rollouts from vLLM (``use_vllm``) or a ``rollout_func``, and is refused otherwise.

    ``log_tokens=True`` (with ``log_completions=True`` in TRL's config) adds four columns to TRL's
    own completions table, which TRL's ``log`` writes to ``completions/completions_*.parquet``:
    ``rla/prompt_ids`` and ``rla/completion_ids`` (unpadded), ``rla/sampling_logprobs`` (TRL's
    ``sampling_per_token_logps``, the engine's) and ``rla/old_logprobs`` (the training side's,
    see :func:`_training_logprobs`). ``rla triage --from trl FILE`` reads them
    (:func:`rla.rollout.framework_dumps.read_trl`); TRL's table alone holds only text. With
    ``use_vllm=True`` two more say which weights sampled each row, read into the records'
    ``policy``: ``rla/policy`` (:func:`rla.rollout.fingerprint.weights_fingerprint` of the weights
    TRL synced to vLLM for that generation) and ``rla/policy_step`` (the global step); not under
    PEFT, DeepSpeed ZeRO-3 or FSDP, and not for a ``rollout_func`` without vLLM
    (:func:`_unfingerprinted` says why; ``Attachment.weights_column``).
    """
    _check_trainer(trainer)
    samples_itself = not getattr(trainer.args, "use_vllm", False) and getattr(trainer, "rollout_func", None) is None
    if ops is not None and callable(getattr(ops, "make_forward", None)) and samples_itself:
        raise ValueError(
            f"rla.integrations.trl.attach: {ops!r} replaces the forward with one that keeps no KV cache, "
            "but this trainer samples with the training model itself (no use_vllm, no rollout_func); "
            "generate with vLLM (use_vllm=True) or pass a rollout_func"
        )
    policy_model = trainer.accelerator.unwrap_model(trainer.model)
    policy = align(policy_model, profile, regions, ops)
    _autocast_note(trainer, policy)
    _head_note(trainer, policy)
    reference = None
    if trainer.ref_model is not None:
        reference = align(trainer.accelerator.unwrap_model(trainer.ref_model), policy.profile, regions, ops)
        _autocast_note(trainer, reference)
        reference_note = f"TRL's reference model aligned ({reference.profile.name})"
    elif getattr(trainer, "beta", None) == 0.0:
        reference_note = "none (beta = 0: TRL builds no reference model)"
    else:
        reference_note = "the policy with its adapters disabled (PEFT), aligned with it"

    previous = trainer.__dict__.get("_rla_attachment")
    if log_tokens and not getattr(trainer, "log_completions", False):
        raise ValueError("rla.integrations.trl.attach: log_tokens=True writes into TRL's completions table, "
                         "which TRL keeps only with log_completions=True in its GRPOConfig")
    trainer.__dict__["_rla_log_tokens"] = log_tokens
    if not log_metrics and not log_tokens:
        metrics = "off (log_metrics=False)"
        if previous is not None and "_generate_and_score_completions" in trainer.__dict__:
            del trainer.__dict__["_generate_and_score_completions"]
    else:
        if not samples_itself:
            metrics = "mismatch/* each step, from the rollout logprobs (NaN tokens masked)"
        else:
            metrics = ("nothing to log: TRL samples with the training model itself (no use_vllm, no "
                       "rollout_func), so there are no rollout logprobs to compare")
        if "_generate_and_score_completions" not in trainer.__dict__:
            original = trainer._generate_and_score_completions

            def _generate_and_score_completions(self, inputs):
                _check_still_aligned(self)
                output = original(inputs)
                if output.get("sampling_per_token_logps") is not None:
                    if self.__dict__["_rla_attachment"].log_metrics:
                        _log_mismatch(self, output)
                    if self.__dict__.get("_rla_log_tokens"):
                        _log_tokens(self, output)
                return output

            trainer._generate_and_score_completions = types.MethodType(_generate_and_score_completions, trainer)
    if not log_metrics and log_tokens:
        metrics = "off (log_metrics=False); token columns in TRL's completions table"
    unfingerprinted = _unfingerprinted(trainer) if log_tokens else "off (log_tokens=False)"
    trainer.__dict__["_rla_fingerprint"] = log_tokens and unfingerprinted is None
    weights_column = unfingerprinted or ("rla/policy and rla/policy_step in TRL's completions table: the fingerprint "
                                         "of the weights synced to vLLM for each generation, and the global step")
    attachment = Attachment(policy, reference, reference_note, metrics,
                            previous.logged_keys if previous is not None else set(), log_metrics, weights_column)
    trainer.__dict__["_rla_attachment"] = attachment
    return attachment


def _training_logprobs(trainer, output) -> torch.Tensor:
    """TRL's ``old_per_token_logps`` if it computed them, else one no-grad forward of the batch."""
    old = output.get("old_per_token_logps")
    if old is not None:
        return old
    input_ids = torch.cat([output["prompt_ids"], output["completion_ids"]], dim=1)
    attention_mask = torch.cat([output["prompt_mask"], output["completion_mask"]], dim=1)
    mode = "train" if trainer.model.training else "eval"
    batch_size = trainer.args.per_device_train_batch_size if mode == "train" else trainer.args.per_device_eval_batch_size
    with torch.no_grad():
        logps, _, _ = trainer._get_per_token_logps_and_entropies(
            trainer.model, input_ids, attention_mask, output["completion_ids"].size(1), batch_size=batch_size
        )
    return logps


def _log_tokens(trainer, output) -> None:
    """Add the batch's token ids and both sides' logprobs to TRL's completions table, gathered over
    processes in the order TRL gathers its own prompt and completion columns."""
    from accelerate.utils import gather_object

    mask = output["completion_mask"].bool()
    pmask = output["prompt_mask"].bool()
    train = _training_logprobs(trainer, output)
    cols = {"rla/prompt_ids": [], "rla/completion_ids": [], "rla/sampling_logprobs": [], "rla/old_logprobs": []}
    for i in range(mask.size(0)):
        m = mask[i]
        cols["rla/prompt_ids"].append(output["prompt_ids"][i][pmask[i]].tolist())
        cols["rla/completion_ids"].append(output["completion_ids"][i][m].tolist())
        cols["rla/sampling_logprobs"].append(output["sampling_per_token_logps"][i][m].double().tolist())
        cols["rla/old_logprobs"].append(train[i][m].double().tolist())
    if trainer.__dict__.get("_rla_fingerprint"):  # the weights synced to vLLM for this generation (_unfingerprinted)
        from rla.rollout.fingerprint import weights_fingerprint

        fp = weights_fingerprint(trainer.accelerator.unwrap_model(trainer.model))
        cols["rla/policy"] = [fp] * mask.size(0)
        cols["rla/policy_step"] = [int(trainer.state.global_step)] * mask.size(0)
    for key, values in cols.items():
        trainer._logs["extra"][key].extend(gather_object(values))


def _log_mismatch(trainer, output) -> None:
    """Append rla's mismatch metrics of one generation batch to ``trainer._metrics[mode]``."""
    attachment: Attachment = trainer.__dict__["_rla_attachment"]
    mode = "train" if trainer.model.training else "eval"
    mask = output["completion_mask"]
    if output.get("tool_mask") is not None:
        mask = mask * output["tool_mask"]
    train = _training_logprobs(trainer, output)
    roll = output["sampling_per_token_logps"]
    acc = trainer.accelerator
    # Every rank computes the metrics of the whole global batch, as TRL gathers its own.
    train, roll, mask = (acc.gather(acc.pad_across_processes(t, dim=1, pad_index=0)) for t in (train, roll, mask))
    metrics = mismatch(train.detach().float(), roll.detach().float(), mask.bool(), nan_policy="mask")
    if getattr(trainer.args, "use_vllm", False) and getattr(trainer, "vllm_importance_sampling_correction", False):
        for key in TRL_OWN_KEYS:
            metrics.pop(key, None)
    log = trainer._metrics[mode]
    for key, value in metrics.items():
        if key in log and key not in attachment.logged_keys:
            raise RuntimeError(
                f"rla.integrations.trl: TRL's log already holds {key!r}, which rla did not write; "
                "refusing to mix two different numbers under one key"
            )
        attachment.logged_keys.add(key)
        log[key].append(value)
