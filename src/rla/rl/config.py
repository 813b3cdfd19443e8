"""``TrainConfig``: every knob of an ``rla train`` run, with help, validation and YAML I/O.

One flat dataclass (TRL's style, without its knob explosion): each field carries
``metadata={"help": ...}``, which ``rla train --help-config`` prints, and ``__post_init__`` checks
the invariants between fields and says which one is broken and why. A run is a YAML file plus
``key=value`` overrides on the command line::

    rla train configs/grpo_tiny.yaml train_precision=aligned align_regions=[rope] seed=3

Override values are parsed as YAML (``true``, ``3``, ``[rope, swiglu]``) and then coerced to the
field's type, so ``lr=1e-4`` is a float although YAML 1.1 reads it as a string.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rla.rl.lr_schedule import SCHEDULES

__all__ = ["TrainConfig", "load_config", "apply_overrides", "config_help", "RESUME_SAFE_FIELDS", "RETIRED_FIELDS",
           "without_retired"]

PRECISIONS = ("bf16", "aligned", "fp32", "fp16")
ALGORITHMS = ("grpo", "reinforce")

#: Fields that may change between a run and its resume (they do not change the numbers of the steps
#: a run and its resume have in common). ``steps`` only under ``lr_schedule: constant``: a cosine
#: decays over ``steps``, so the trainer refuses a changed ``steps`` under it.
RESUME_SAFE_FIELDS = frozenset(
    {"steps", "progress", "tensorboard", "checkpoint_every", "keep_checkpoints", "out_dir", "device",
     "time_limit_s"}
)


#: Fields that left ``TrainConfig``, with the value that meant "off" and where the knob went. A run
#: config written before (every ``config.yaml`` lists every field) still reads when the field is at
#: that value; any other value is refused, naming the field and its plug: a study's knob enters the
#: trainer through ``Trainer(..., ops=...)`` (``rla.align``'s ``ops=``), not through the config.
RETIRED_FIELDS = {
    "train_dose_bits": (None, "the dose study's knob now enters the trainer through the ops= plug "
                              "(rla.rl.trainer.Trainer(cfg, ops=lab.dose.knob.DoseOps(bits, scale))); a dose grid "
                              "runs with `python -m lab.dose.experiment GRID --out DIR` (lab/README.md)"),
    "train_dose_scale": (1.0, "see train_dose_bits: the dose study's knob is the lab's ops= plug "
                              "(lab.dose.knob.DoseOps(bits, scale)), run by `python -m lab.dose.experiment`"),
}


def without_retired(values: dict[str, Any], where: str) -> dict[str, Any]:
    """``values`` without the ``RETIRED_FIELDS`` that hold their "off" value; a ValueError naming the
    field and its plug for one that holds any other value."""
    out = {}
    for key, value in values.items():
        if key in RETIRED_FIELDS:
            off, why = RETIRED_FIELDS[key]
            if value != off:
                raise ValueError(f"{where}: {key}={value!r} is no longer a TrainConfig field: {why}")
            continue
        out[key] = value
    return out


def _f(default, help: str, **kw):
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda d=default: type(d)(d), metadata={"help": help}, **kw)
    return field(default=default, metadata={"help": help}, **kw)


@dataclass
class TrainConfig:
    """One GRPO / REINFORCE run with decoupled rollout (``rla.rollout.sampler``) and training stacks."""

    # ---------------------------------------------------------------- model and task
    arch: str = _f("qwen2", "model family for rla.models.tiny_config: qwen2, qwen3, llama or qwen3_moe (8 experts, top-2)")
    size: str = _f("tiny", "model size for rla.models.tiny_config: micro, tiny, 10m, 50m, 150m, 1.5b")
    init: str = _f(
        "sft",
        "where the weights come from: 'sft' (random init + supervised warm start on the task, "
        "cached in out_dir/init), 'bundled' (rla's bundled tiny Qwen2; arch/size are ignored), "
        "'random' (no warm start: every reward is 0 on the real tasks), or a path to an HF model "
        "folder (e.g. a warm start shared by the arms of an experiment)",
    )
    init_seed: int = _f(0, "seed of the random initialisation and of the SFT warm start (shared by all RL seeds)")
    sft_steps: int = _f(300, "SFT warm-start steps when init='sft'")
    sft_batch_size: int = _f(64, "problems per SFT step when init='sft'")
    sft_lr: float = _f(1e-3, "peak learning rate of the SFT warm start")
    sft_stop_sampled: float = _f(
        0.0,
        "stop the SFT warm start once its held-out sampled (T=1) accuracy reaches this (evaluated every "
        "sft_eval_every steps); 0 trains all sft_steps. RL needs a warm start inside the accuracy jump",
    )
    sft_eval_every: int = _f(10, "SFT steps between held-out evaluations when sft_stop_sampled > 0")
    task: str = _f("addition", "task of rla.rl.tasks: addition, sorting or counting")
    difficulty: int = _f(3, "the task's difficulty knob (digits for addition, list size for sorting, counts for counting); sets response length")
    task_args: dict = _f({}, "extra keyword arguments of the task (e.g. {digits: 2} for sorting)")

    # ---------------------------------------------------------------- rollouts
    rollout_profile: str = _f("vllm", "engine rounding profile of the rollout sampler (rla profiles lists them)")
    rollout_dtype: str = _f(
        "auto",
        "dtype of the rollout engine copy: bf16, fp16, fp32 or auto (fp16 when train_precision=fp16, "
        "else bf16: the engine runs in low precision whatever the trainer does)",
    )
    rollout_cache: str = _f(
        "auto",
        "KV cache of the rollout sampler: auto (static with a CUDA-graph decode step on GPU, dynamic on CPU), "
        "static or dynamic",
    )
    rollout_decode_attention: str = _f(
        "grouped",
        "attention of the static-cache decode step: grouped (grouped K/V heads as they are, filled cache columns "
        "only) or model (the model's own attention over the whole cache)",
    )
    temperature: float = _f(1.0, "sampling temperature (engines divide logits by it before log_softmax; so does the trainer)")
    top_p: float = _f(1.0, "nucleus sampling; 1 disables")
    top_k: int = _f(-1, "top-k sampling; -1 disables")
    max_new_tokens: int = _f(0, "response length limit; 0 means the task's max_length() + 8")

    routing_replay: str = _f(
        "none",
        "MoE models: 'experts' replays the sampler's recorded experts in the training forward (R3: the routing "
        "weights are the router's own probabilities at those ids, so the gradient reaches the gate), 'weights' "
        "also the recorded routing weights (straight through, the gradient still through the router's), or 'none'. "
        "An MoE model's rollouts always record routes (routing/* metrics each step) and use the dynamic KV cache",
    )

    # ---------------------------------------------------------------- batch and schedule
    steps: int = _f(100, "RL steps (one rollout batch, then the policy updates, then a weight sync, per step)")
    prompts_per_step: int = _f(16, "prompts per step over all ranks (each rank samples its share)")
    group_size: int = _f(8, "responses sampled per prompt (the GRPO group)")
    ppo_epochs: int = _f(1, "passes over each rollout batch; >1 lets the ratio drift from its step-0 value")
    mini_batches: int = _f(1, "optimizer updates per epoch; the rollout batch is split into this many mini-batches")
    max_tokens: int = _f(16384, "token budget (rows x longest row) of one training micro-batch; bounds activation memory")
    logprob_chunk: int = _f(1024, "response positions sent through the LM head at once (bounds fp32 logits memory)")

    # ---------------------------------------------------------------- algorithm
    algorithm: str = _f("grpo", "grpo (PPO-clip surrogate) or reinforce (plain -A * log pi, no ratio, no clip)")
    pi_old: str = _f(
        "rollout",
        "the pi_old of the PPO ratio: 'rollout' (the sampler's recorded logprobs, so the ratio at step 0 "
        "is the mismatch itself) or 'train' (a recomputation by the training stack before the first update, "
        "verl's decoupled three-policy setting; the mismatch then only enters through is_correction)",
    )
    clip_eps: float = _f(0.2, "PPO clip range below 1: ratio is clipped to [1 - clip_eps, 1 + clip_eps_high]")
    clip_eps_high: float | None = _f(None, "PPO clip range above 1 (DAPO's clip-higher); None means clip_eps")
    clip_ratio_c: float | None = _f(
        None,
        "dual-clip PPO as verl (clip_ratio_c, 3 there): for negative advantages the loss is capped at -A*c, "
        "so tokens with ratio above c stop pushing; None is plain PPO-clip (TRL's GRPO)",
    )
    scale_rewards: str = _f("group", "advantage = (r - group mean) / (group std + 1e-6) for 'group'; r - group mean for 'none'")
    loss_agg: str = _f("token-mean", "token-mean (every response token weighs the same) or seq-mean-token-mean (GRPO paper)")
    is_correction: str = _f(
        "none",
        "rollout importance-sampling correction with w from pi_old_train / mu: 'tis' (token, truncated "
        "at is_cap, verl rollout_is=token / TRL token_truncate), 'mis' (sequence, masked: w = rho_seq "
        "if rho_seq <= is_cap else 0, TRL sequence_mask), or 'none'",
    )
    is_cap: float = _f(2.0, "upper threshold C of the TIS / MIS weights")

    # ---------------------------------------------------------------- precision
    train_precision: str = _f(
        "bf16",
        "training forward: 'bf16' (bf16 compute copy of fp32 master weights, HF eager rounding: the "
        "baseline), 'aligned' (the same copy with rla.align(profile=rollout_profile, regions=align_regions)), "
        "'fp32' (fp32 weights and activations), 'fp16' (fp16 compute copy, fp32 master, dynamic loss scaling)",
    )
    align_regions: list = _f(["rope", "swiglu", "rmsnorm"], "regions aligned when train_precision=aligned")
    train_inv_freq: str = _f(
        "fp32",
        "RoPE inv_freq of the training forward: fp32 (what from_pretrained(dtype=bf16) keeps and engines use) or "
        "rounded (to the compute dtype, what model.to(torch.bfloat16) does: docs/rounding.md's phase-drift hazard, "
        "as a condition to study; bf16/fp16 arms only)",
    )
    loss_scale_init: float = _f(2.0**16, "initial dynamic loss scale (fp16 only)")
    loss_scale_growth_interval: int = _f(200, "updates without overflow before the loss scale doubles (fp16 only)")

    # ---------------------------------------------------------------- optimizer
    lr: float = _f(1e-5, "peak learning rate of AdamW (on the fp32 master weights)")
    weight_decay: float = _f(0.0, "AdamW weight decay")
    adam_beta1: float = _f(0.9, "AdamW beta1")
    adam_beta2: float = _f(0.99, "AdamW beta2")
    adam_eps: float = _f(1e-8, "AdamW epsilon")
    grad_clip: float = _f(1.0, "clip the global gradient norm to this (0 disables); the logged grad norm is before clipping")
    warmup_steps: int = _f(0, "linear learning-rate warm-up steps")
    lr_schedule: str = _f("constant", "constant or cosine (to 10% of lr at the last step), after warm-up")

    # ---------------------------------------------------------------- run
    seed: int = _f(0, "RL seed: prompts, sampling and update order derive from (seed, step, rank)")
    device: str = _f("auto", "auto (cuda if available), cpu, cuda or cuda:N")
    out_dir: str = _f("runs/grpo", "run folder: config.yaml, log.jsonl, checkpoints/, summary.json")
    checkpoint_every: int = _f(10, "steps between checkpoints (the last step is always checkpointed)")
    keep_checkpoints: int = _f(2, "newest checkpoints kept; older ones are deleted")
    time_limit_s: float = _f(0.0, "stop (checkpointed, resumable) after this many seconds of this call; 0 disables")
    tensorboard: bool = _f(False, "also write TensorBoard events to out_dir/tb (needs the tensorboard package)")
    progress: bool = _f(True, "show a progress bar")
    fsdp: bool = _f(False, "shard the training side with FSDP2 (run under torchrun; each rank samples its share)")
    collapse_k3_factor: float = _f(10.0, "collapse signal: k3 above this times its step-0 value ...")
    collapse_grad_factor: float = _f(10.0, "... or grad norm above this times its running median ...")
    collapse_window: int = _f(5, "... together with the reward (mean over this many steps) ...")
    collapse_reward_drop: float = _f(0.05, "... falling this far below its best (docs/metrics.md)")

    def __post_init__(self) -> None:
        self._coerce_types()
        self._validate()

    # ------------------------------------------------------------------ validation
    def _coerce_types(self) -> None:
        hints = typing.get_type_hints(type(self))
        for f in dataclasses.fields(self):
            setattr(self, f.name, _coerce(f.name, getattr(self, f.name), hints[f.name]))
        if isinstance(self.align_regions, (str,)):
            self.align_regions = [self.align_regions]
        self.align_regions = list(self.align_regions)

    def _validate(self) -> None:
        from rla.profiles import REGIONS, aliases as profile_aliases, names as profile_names

        def need(cond: bool, msg: str) -> None:
            if not cond:
                raise ValueError(f"TrainConfig: {msg}")

        choice = lambda name, allowed: need(  # noqa: E731
            getattr(self, name) in allowed, f"{name}={getattr(self, name)!r} is not one of {', '.join(allowed)}"
        )
        choice("train_precision", PRECISIONS)
        choice("algorithm", ALGORITHMS)
        choice("pi_old", ("rollout", "train"))
        choice("scale_rewards", ("group", "none"))
        choice("loss_agg", ("token-mean", "seq-mean-token-mean"))
        choice("is_correction", ("none", "tis", "mis"))
        choice("lr_schedule", SCHEDULES)
        choice("rollout_dtype", ("auto", "bf16", "fp16", "fp32"))
        choice("rollout_cache", ("auto", "static", "dynamic"))
        choice("rollout_decode_attention", ("grouped", "model"))
        choice("routing_replay", ("none", "experts", "weights"))
        need(self.routing_replay == "none" or not self.fsdp,
             f"routing_replay={self.routing_replay!r} with fsdp=true: replay is not wired through FSDP2's sharded "
             "forward; run it on one process")
        choice("train_inv_freq", ("fp32", "rounded"))
        need(
            self.train_inv_freq == "fp32" or self.train_precision in ("bf16", "fp16"),
            f"train_inv_freq=rounded needs train_precision bf16 or fp16 (fp32 has nothing to round to; aligned's "
            f"RoPE region recomputes inv_freq in fp32), got {self.train_precision}",
        )
        need(
            self.rollout_profile in profile_names() or self.rollout_profile in profile_aliases(),
            f"rollout_profile={self.rollout_profile!r} is not a built-in profile "
            f"({', '.join(profile_names() + list(profile_aliases()))})",
        )
        regions = (*REGIONS, "router")  # rla.alignment.ALIGN_REGIONS, without importing torch here
        bad = [r for r in self.align_regions if r not in regions]
        need(not bad, f"align_regions has unknown region(s) {bad}; the regions are {', '.join(regions)}")
        need(len(set(self.align_regions)) == len(self.align_regions), f"align_regions repeats a region: {self.align_regions}")
        need(
            self.train_precision != "aligned" or self.align_regions,
            "train_precision=aligned with no align_regions is the bf16 baseline; use train_precision=bf16",
        )
        for name in ("steps", "prompts_per_step", "group_size", "ppo_epochs", "mini_batches", "max_tokens", "logprob_chunk"):
            need(getattr(self, name) >= 1, f"{name} must be >= 1, got {getattr(self, name)}")
        need(self.max_new_tokens >= 0, f"max_new_tokens must be >= 0 (0 = from the task), got {self.max_new_tokens}")
        need(
            self.group_size >= 2 or self.algorithm == "reinforce" and self.scale_rewards == "none",
            f"group_size={self.group_size}: a group advantage needs at least 2 responses per prompt "
            "(one response is its own mean, so its advantage is always 0)",
        )
        rollouts = self.prompts_per_step * self.group_size
        need(
            rollouts % self.mini_batches == 0 and rollouts // self.mini_batches >= 1,
            f"mini_batches={self.mini_batches} must divide the {rollouts} responses of a step "
            f"(prompts_per_step x group_size)",
        )
        need(0 < self.clip_eps < 1, f"clip_eps must be in (0, 1), got {self.clip_eps}")
        need(
            self.clip_eps_high is None or self.clip_eps_high > 0,
            f"clip_eps_high must be > 0 (or None for clip_eps), got {self.clip_eps_high}",
        )
        need(
            self.clip_ratio_c is None or self.clip_ratio_c > 1 + self.clip_high,
            f"clip_ratio_c must exceed 1 + the upper clip range ({1 + self.clip_high}), got {self.clip_ratio_c}",
        )
        need(self.is_cap > 1, f"is_cap must be > 1 (a weight cap below 1 down-weights on-policy tokens), got {self.is_cap}")
        need(
            not (self.is_correction != "none" and self.algorithm == "grpo" and self.pi_old == "rollout"),
            f"is_correction={self.is_correction!r} with algorithm=grpo and pi_old=rollout corrects the mismatch "
            "twice: the PPO ratio pi_theta / mu already carries it. Use pi_old=train (verl's decoupled PPO, "
            "where the IS weight pi_old_train / mu carries it) or algorithm=reinforce",
        )
        need(self.temperature > 0, f"temperature must be > 0, got {self.temperature}")
        need(0 < self.top_p <= 1, f"top_p must be in (0, 1], got {self.top_p}")
        need(self.top_k == -1 or self.top_k >= 1, f"top_k must be -1 (disabled) or >= 1, got {self.top_k}")
        need(self.lr > 0, f"lr must be > 0, got {self.lr}")
        need(self.grad_clip >= 0, f"grad_clip must be >= 0 (0 disables), got {self.grad_clip}")
        need(0 <= self.warmup_steps, f"warmup_steps must be >= 0, got {self.warmup_steps}")
        need(self.checkpoint_every >= 1, f"checkpoint_every must be >= 1, got {self.checkpoint_every}")
        need(self.keep_checkpoints >= 1, f"keep_checkpoints must be >= 1 (resume needs one), got {self.keep_checkpoints}")
        need(self.loss_scale_init > 0, f"loss_scale_init must be > 0, got {self.loss_scale_init}")
        need(self.loss_scale_growth_interval >= 1, "loss_scale_growth_interval must be >= 1")
        need(self.init in ("sft", "bundled", "random") or Path(self.init).exists(),
             f"init={self.init!r} is neither sft, bundled, random nor an existing model folder")
        need(0 <= self.sft_stop_sampled <= 1, f"sft_stop_sampled must be in [0, 1], got {self.sft_stop_sampled}")
        need(self.sft_eval_every >= 1, f"sft_eval_every must be >= 1, got {self.sft_eval_every}")
        need(self.sft_steps >= 1 or self.init != "sft", f"init=sft needs sft_steps >= 1, got {self.sft_steps}")
        need(self.collapse_window >= 1, "collapse_window must be >= 1")
        need(self.time_limit_s >= 0, f"time_limit_s must be >= 0 (0 disables), got {self.time_limit_s}")

    # ------------------------------------------------------------------ derived values
    @property
    def updates_per_step(self) -> int:
        """Optimizer updates per RL step; with 1 the PPO ratio is the pure mismatch."""
        return self.ppo_epochs * self.mini_batches

    @property
    def clip_high(self) -> float:
        return self.clip_eps if self.clip_eps_high is None else self.clip_eps_high

    def rollout_torch_dtype(self):
        import torch

        name = self.rollout_dtype
        if name == "auto":
            name = "fp16" if self.train_precision == "fp16" else "bf16"
        return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[name]

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_yaml(self) -> str:
        import yaml

        return yaml.safe_dump(self.to_dict(), sort_keys=False)

    def replace(self, **changes) -> "TrainConfig":
        return dataclasses.replace(self, **changes)


# ---------------------------------------------------------------------------------------------


def _coerce(name: str, value: Any, hint: Any) -> Any:
    """``value`` as the field's type, or a ValueError naming the field and what it expected."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if value is None or (isinstance(value, str) and value.lower() in ("none", "null")):
            return None
        return _coerce(name, value, args[0])
    try:
        if hint is bool:
            if isinstance(value, bool):
                return value
            if isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no"):
                return value.lower() in ("true", "1", "yes")
            if value in (0, 1):
                return bool(value)
            raise TypeError
        if hint is int:
            if isinstance(value, bool):
                raise TypeError
            if isinstance(value, float) and value.is_integer():
                return int(value)
            if not isinstance(value, (int, str)):
                raise TypeError
            return int(value)
        if hint is float:
            if isinstance(value, bool):
                raise TypeError
            return float(value)
        if hint is str:
            if isinstance(value, (str, int, float)) and not isinstance(value, bool):
                return str(value)
            raise TypeError
        if hint is list or origin is list:
            if isinstance(value, (list, tuple)):
                return list(value)
            if isinstance(value, str):
                return [v.strip() for v in value.strip("[]").split(",") if v.strip()]
            raise TypeError
        if hint is dict or origin is dict:
            if isinstance(value, dict):
                return dict(value)
            raise TypeError
    except (TypeError, ValueError):
        pass
    else:
        return value
    raise ValueError(f"TrainConfig: {name}={value!r} is not a valid {getattr(hint, '__name__', hint)}")


def _field_names() -> list[str]:
    return [f.name for f in dataclasses.fields(TrainConfig)]


def _check_keys(keys, where: str) -> None:
    known = _field_names()
    for key in keys:
        if key not in known:
            close = difflib.get_close_matches(key, known, n=3)
            hint = f"; did you mean {', '.join(close)}?" if close else "; rla train --help-config lists the fields"
            raise ValueError(f"{where}: unknown config field {key!r}{hint}")


def apply_overrides(values: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """``values`` updated by ``key=value`` strings (values parsed as YAML)."""
    import yaml

    out = dict(values)
    for item in overrides:
        if "=" not in item:
            raise ValueError(f"override {item!r} is not key=value (e.g. train_precision=aligned)")
        key, raw = item.split("=", 1)
        key = key.strip()
        try:
            value = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError as e:
            raise ValueError(f"override {item!r}: the value is not valid YAML ({e})") from None
        if key in RETIRED_FIELDS:
            without_retired({key: value}, "override")
            continue
        _check_keys([key], "override")
        out[key] = value
    return out


def read_yaml_mapping(path: str | Path, kind: str, shape: str) -> dict[str, Any]:
    """The mapping a YAML file holds (empty file: {}); errors name the file, its ``kind`` and the
    ``shape`` it should have."""
    import yaml

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{kind} {path} does not exist")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: {kind} is not UTF-8 text (byte {e.start}); is it the right file?") from None
    try:
        loaded = yaml.safe_load(text) or {}
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(path)
        problem = " ".join(x for x in (getattr(e, "context", None), getattr(e, "problem", None)) if x) or str(e)
        raise ValueError(f"{where}: {kind} is not valid YAML: {problem}") from None
    if not isinstance(loaded, dict):
        raise ValueError(f"{path}: {shape}, got {type(loaded).__name__}")
    return loaded


def load_config(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()) -> TrainConfig:
    """A validated ``TrainConfig`` from a YAML file (or the defaults) and ``key=value`` overrides."""
    values: dict[str, Any] = {}
    if path is not None:
        loaded = read_yaml_mapping(path, "config file", "a config file is a mapping of field: value")
        loaded = without_retired(loaded, str(path))
        _check_keys(loaded, str(path))
        values.update(loaded)
    values = apply_overrides(values, list(overrides))
    return TrainConfig(**values)


def config_help() -> str:
    """Every field with its default and help, for ``rla train --help-config``."""
    lines = []
    for f in dataclasses.fields(TrainConfig):
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        lines.append(f"{f.name} = {default!r}\n    {f.metadata.get('help', '')}")
    return "\n".join(lines)
