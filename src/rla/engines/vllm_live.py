"""vLLM's own engine, run live: rollout records and prompt logprobs from ``vllm.LLM``.

Everything else in ``rla.engines`` reads vLLM's *code* (its native ops, its kernels, a twin of its
decoder). This module runs the engine itself -- its scheduler, its model runner, its CUDA graphs
and ``-O2`` compile (``VllmBackend`` with its own Inductor options and passes), its sampler -- on an
HF checkpoint folder, and turns what it returns into ``rla.rollout/1`` records. It is the ground
truth the profiles are checked against (``lab/bench/vllm_live_h200.py`` scores HF eager and each row
against it and searches the points; ``docs/engines.md``).

Two things come back:

- **prompt logprobs** (prefill): for each prompt token ``t >= 1``, the engine's log-probability of
  it given the tokens before it (``SamplingParams(prompt_logprobs=0)``). vLLM computes them from
  the raw bf16 logits as ``logits.log_softmax(-1, dtype=float32)``, whatever the sampling settings.
- **sampled responses** (decode): tokens drawn by vLLM's sampler with the KV cache, batching and
  CUDA graphs of the chosen mode, each with its logprob (``SamplingParams(logprobs=0)``). vLLM's
  default ``logprobs_mode`` is ``raw_logprobs`` (before temperature / top-k / top-p); the rollout
  format wants the logprob of the distribution the token was drawn from, so records are only
  made at ``temperature=1, top_p=1, top_k=-1`` unless the engine is started with
  ``logprobs_mode="processed_logprobs"``, where the two coincide by vLLM's own definition.

Every record carries the engine's identity in ``metadata["engine"]``: name, version, mode and the
settings it was started with (attention backend, batch-invariant mode, compile options), so a
result can always say what ran.

Nothing of vLLM is imported until a :class:`LiveVllm` is made; the checks a user hits first (no
CUDA, no vLLM, a version this adapter does not know) are plain errors before any engine starts.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

from rla.engines.source import EngineNotFound, EngineUnavailable
from rla.rollout.rollouts import RolloutRecord

__all__ = ["LiveSettings", "LiveVllm", "MODES", "SUPPORTED", "installed_version", "preflight", "engine_metadata",
           "engine_environment", "prompt_logprobs_of", "records_of", "check_sampling", "routes_of"]

MODES = ("default", "eager")
"""``default``: vLLM V1's own default (``-O2``: ``VllmBackend`` compile, piecewise CUDA graphs);
``eager``: ``enforce_eager=True`` (no compile, no CUDA graphs: vLLM's CUDA kernels op by op)."""

SUPPORTED = ("0.26",)
"""vLLM minor versions this adapter has been run against (their ``LLM`` keyword arguments and
output objects). vLLM pins torch exactly; 0.26 is the release that pins the torch of rla's GPU
machine (2.11)."""


#: vLLM 0.26's values of ``--gdn-prefill-backend`` (``engine/arg_utils.py``, ``EngineArgs.gdn_prefill_backend``).
GDN_PREFILL_BACKENDS = ("triton", "flashinfer", "cutedsl")


@dataclass(frozen=True)
class LiveSettings:
    """How the engine is started; every field ends up in each record's metadata."""

    mode: str = "default"
    """One of :data:`MODES`."""
    attention_backend: str | None = "TRITON_ATTN"
    """vLLM's ``attention_config.backend`` (``None``: vLLM's own choice). Triton attention needs no
    FlashAttention library, which keeps the engine's files small enough to carry."""
    batch_invariant: bool = False
    """``VLLM_BATCH_INVARIANT=1``: vLLM's batch-invariant kernels (set before the engine starts)."""
    compilation_config: dict[str, Any] | None = None
    """Passed to ``vllm.LLM(compilation_config=...)`` as is (default mode only)."""
    max_model_len: int = 8192
    gpu_memory_utilization: float = 0.5
    max_num_batched_tokens: int | None = None
    """The scheduler's token budget per step (``None``: vLLM's default); it sets the GEMMs' M."""
    logprobs_mode: str = "raw_logprobs"
    seed: int = 0
    language_model_only: bool = False
    """vLLM's ``language_model_only``: a multimodal checkpoint's language model alone, its vision tower
    not built (the commands set it for a checkpoint whose text model is what rla scores: Qwen3.5's).
    It changes the engine's code, not only its inputs: vLLM 0.26's Qwen3.5 attention fuses the gated
    q/k norm and RoPE into one Triton kernel only when it is set (``models/qwen3_next.py``)."""
    gdn_prefill_backend: str | None = None
    """vLLM's ``gdn_prefill_backend`` (``--gdn-prefill-backend``): the kernels of a Gated DeltaNet layer's
    prefill (Qwen3.5, Qwen3-Next), one of :data:`GDN_PREFILL_BACKENDS`; ``None``: vLLM's own choice
    (``layers/mamba/gdn/qwen_gdn_linear_attn.py`` ``_resolve_gdn_prefill_backend``: FlashInfer's on Hopper, which
    JIT-compiles; ``triton`` runs the FLA Triton kernels vLLM ships)."""
    return_routed_experts: bool = False
    """vLLM's ``enable_return_routed_experts``: each completion carries the experts every MoE layer
    routed each token to (``CompletionOutput.routed_experts``, [tokens, num_hidden_layers, k]), for
    routing replay on the training side (:func:`routes_of`)."""

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        if self.mode == "eager" and self.compilation_config:
            raise ValueError("compilation_config has no effect with mode='eager' (enforce_eager): drop one")
        if self.gdn_prefill_backend is not None and self.gdn_prefill_backend not in GDN_PREFILL_BACKENDS:
            raise ValueError(f"gdn_prefill_backend must be one of {GDN_PREFILL_BACKENDS} or None, "
                             f"got {self.gdn_prefill_backend!r}")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def installed_version() -> str | None:
    """The installed vLLM's version from its package metadata, without importing it (None: not
    installed)."""
    if importlib.util.find_spec("vllm") is None:
        return None
    try:
        return importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        return None


def _check_version(version: str | None) -> str:
    if version is None:
        raise EngineNotFound(
            "vLLM is not installed in this Python: the live engine needs the real package "
            "(pip install vllm==0.26.0 pins torch 2.11; see docs/engines.md)"
        )
    minor = ".".join(version.split(".")[:2])
    if minor not in SUPPORTED:
        raise EngineUnavailable(
            f"vLLM {version} is installed; rla's live adapter has been run against vLLM "
            f"{', '.join(SUPPORTED)} only. Its LLM arguments or output objects may differ: install "
            f"one of those, or read the engine's code instead (rla verify without --live runs the twin)"
        )
    return version


def preflight(model_path: str) -> str:
    """The checks a :class:`LiveVllm` makes before it imports vLLM, in its order, each a one-line
    error: ``model_path`` is an HF checkpoint folder, vLLM is installed (package metadata only),
    in a version this adapter has run, and torch sees a GPU. Returns the installed vLLM's version;
    the commands call it before anything expensive (``rla verify --live``, ``rla calibrate --live``)."""
    if not os.path.isfile(os.path.join(model_path, "config.json")):
        raise FileNotFoundError(f"{model_path}: not an HF checkpoint folder (no config.json)")
    version = _check_version(installed_version())
    import torch

    if not torch.cuda.is_available():
        raise EngineUnavailable(f"the live vLLM engine runs on CUDA; this torch ({torch.__version__}) sees no GPU")
    return version


def engine_metadata(version: str, settings: LiveSettings, environ=os.environ) -> dict[str, Any]:
    """What each record says of the engine that made it (``metadata["engine"]``): its settings and
    the ``VLLM_*`` environment variables it started under (e.g. ``VLLM_MLA_DISABLE=1``, which runs a
    DeepSeek model's attention as plain multi-head attention), so a result says what ran."""
    env = {k: v for k, v in sorted(environ.items()) if k.startswith("VLLM_")}
    return {"name": "vllm", "version": version, "mode": settings.mode, "settings": settings.as_dict(),
            "environment": env}


def engine_environment(settings: LiveSettings, environ=os.environ) -> None:
    """The environment variables vLLM reads at start: the engine core in this process
    (``VLLM_ENABLE_V1_MULTIPROCESSING=0`` unless already set), and ``VLLM_BATCH_INVARIANT`` set
    from ``settings.batch_invariant`` either way, so a variable left in the shell cannot make the
    engine batch-invariant while its records say it is not (or the reverse)."""
    environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    environ["VLLM_BATCH_INVARIANT"] = "1" if settings.batch_invariant else "0"


def prompt_logprobs_of(output) -> list[float]:
    """The engine's logprob of prompt token ``t`` given tokens ``< t``, for ``t = 1 .. n-1``, from
    a ``vllm.RequestOutput`` made with ``prompt_logprobs=k``. vLLM's entry 0 is ``None`` (no
    context); an entry that lacks the prompt token itself is an error, never skipped."""
    ids = list(output.prompt_token_ids)
    entries = output.prompt_logprobs
    if entries is None:
        raise ValueError("the request was made without prompt_logprobs: ask SamplingParams(prompt_logprobs=0)")
    entries = list(entries)
    if len(entries) != len(ids):
        raise ValueError(f"{len(entries)} prompt logprob entries for {len(ids)} prompt tokens")
    out = []
    for t in range(1, len(ids)):
        entry = entries[t]
        if entry is None or ids[t] not in entry:
            raise ValueError(f"prompt position {t}: no logprob for the prompt token {ids[t]}")
        out.append(float(entry[ids[t]].logprob))
    return out


def check_sampling(temperature: float, top_p: float, top_k: int, processed: bool) -> None:
    """Raw logprobs (vLLM's default ``logprobs_mode``) are the sampling logprobs only without
    temperature and truncation; anything else needs ``processed_logprobs``."""
    if not processed and (temperature != 1.0 or top_p != 1.0 or top_k not in (-1, 0)):
        raise ValueError(
            "vLLM's raw_logprobs are of the untempered, untruncated distribution: at temperature "
            f"{temperature}, top_p {top_p}, top_k {top_k} they are not the sampling logprobs a rollout "
            "record holds; start the engine with logprobs_mode='processed_logprobs'"
        )


def routes_of(completion, n_tokens: int, layers: Sequence[int], where: str) -> dict[str, Any]:
    """The ``routes`` of a rollout record (``rla.rollout.rollouts``: experts per token and MoE layer)
    from a ``vllm.CompletionOutput`` made with ``enable_return_routed_experts``: its ``routed_experts``
    ([tokens, num_hidden_layers, k], indexed by decoder layer) read at ``layers`` (the model's MoE
    decoder layers, ``rla.alignment.replay.moe_decoder_layers``). vLLM records the tokens its forward
    saw: ``n_tokens`` or one fewer (the last sampled token never went through a forward). Every
    other layer must be all zeros (vLLM's buffer where no MoE block wrote): an MoE layer of the
    engine's that the model does not have is an error, not dropped."""
    import numpy as np

    routed = getattr(completion, "routed_experts", None)
    if routed is None:
        raise ValueError(f"{where}: the engine returned no routed experts (start it with return_routed_experts=True)")
    routed = np.asarray(routed)
    if routed.ndim != 3 or routed.shape[0] not in (n_tokens, n_tokens - 1):
        raise ValueError(f"{where}: routed experts of shape {routed.shape}, expected [{n_tokens} or {n_tokens - 1} "
                         "tokens, layers, k]")
    layers = [int(i) for i in layers]
    if not layers or max(layers) >= routed.shape[1]:
        raise ValueError(f"{where}: MoE layers {layers} for routed experts of {routed.shape[1]} layers")
    extra = [i for i in range(routed.shape[1]) if i not in layers and routed[:, i].any()]
    if extra:
        raise ValueError(f"{where}: the engine routed tokens at layers the model has no MoE block in ({extra}): "
                         "the checkpoint the engine ran is not the one scored")
    return {"version": 1, "experts": routed[:, layers, :].astype(np.int64).tolist()}


def records_of(output, *, temperature: float, top_p: float, top_k: int, metadata: dict[str, Any],
               processed: bool, route_layers: Sequence[int] | None = None) -> list[RolloutRecord]:
    """``rla.rollout/1`` records, one per completion of a ``vllm.RequestOutput`` made with
    ``logprobs=k``. ``processed``: the engine's logprobs are of the processed distribution
    (``logprobs_mode="processed_logprobs"``), else they are raw and only valid as rollout
    logprobs at temperature 1 without truncation. ``metadata["engine"]["version"]`` (as
    :func:`engine_metadata` writes it), when present, is also the records' ``engine_version``:
    the field ``profile="vllm"`` resolves its row by. ``route_layers``: each record's ``routes``
    from the completion's routed experts at those decoder layers (:func:`routes_of`)."""
    check_sampling(temperature, top_p, top_k, processed)
    completions = list(output.outputs)
    if not completions:
        raise ValueError("the request output has no completions: nothing to make records of")
    engine = metadata.get("engine")
    version = engine.get("version") if isinstance(engine, dict) else None
    records = []
    for i, completion in enumerate(completions):
        ids = list(completion.token_ids)
        entries = completion.logprobs
        if entries is None:
            raise ValueError("the request was made without logprobs: ask SamplingParams(logprobs=0)")
        entries = list(entries)
        if not ids:
            raise ValueError(f"completion {i} has no tokens")
        if len(entries) != len(ids):
            raise ValueError(f"completion {i}: {len(entries)} logprob entries for {len(ids)} tokens")
        lps = []
        for t, (tok, entry) in enumerate(zip(ids, entries)):
            if entry is None or tok not in entry:
                raise ValueError(f"completion {i}, token {t}: no logprob for the sampled token {tok}")
            lps.append(float(entry[tok].logprob))
        meta = dict(metadata, finish_reason=getattr(completion, "finish_reason", None), completion=i)
        n = len(output.prompt_token_ids) + len(ids)
        routes = None if route_layers is None else routes_of(completion, n, route_layers, f"completion {i}")
        records.append(RolloutRecord(
            prompt_ids=list(output.prompt_token_ids), response_ids=ids, logprobs=lps,
            temperature=float(temperature), top_p=float(top_p), top_k=int(top_k), engine="vllm",
            engine_version=version, metadata=meta, routes=routes,
        ))
    return records


@dataclass
class LiveVllm:
    """vLLM's offline engine on an HF checkpoint folder, in one process (the engine core is kept
    in-process with ``VLLM_ENABLE_V1_MULTIPROCESSING=0``, so its errors surface here).

    ``LiveVllm(path, LiveSettings(mode="eager"))``; then :meth:`prompt_logprobs` and
    :meth:`sample`; :meth:`close` frees the GPU. One engine per process is the safe rule: vLLM does
    not promise to release everything it allocated.
    """

    model_path: str
    settings: LiveSettings = field(default_factory=LiveSettings)
    version: str = field(init=False)

    def __post_init__(self) -> None:
        self.version = preflight(self.model_path)
        engine_environment(self.settings)
        from vllm import LLM

        s = self.settings
        kwargs: dict[str, Any] = dict(
            model=self.model_path, dtype="bfloat16", skip_tokenizer_init=True, seed=s.seed,
            enforce_eager=s.mode == "eager", max_model_len=s.max_model_len,
            gpu_memory_utilization=s.gpu_memory_utilization, enable_prefix_caching=False,
            logprobs_mode=s.logprobs_mode,
        )
        if s.attention_backend:
            kwargs["attention_config"] = {"backend": s.attention_backend}
        if s.compilation_config:
            kwargs["compilation_config"] = s.compilation_config
        if s.max_num_batched_tokens:
            kwargs["max_num_batched_tokens"] = s.max_num_batched_tokens
        if s.language_model_only:
            kwargs["language_model_only"] = True
        if s.gdn_prefill_backend:
            kwargs["gdn_prefill_backend"] = s.gdn_prefill_backend
        if s.return_routed_experts:
            kwargs["enable_return_routed_experts"] = True
        self._llm = LLM(**kwargs)

    @property
    def metadata(self) -> dict[str, Any]:
        return engine_metadata(self.version, self.settings)

    def _generate(self, prompts: Sequence[Sequence[int]], params):
        if not prompts or any(len(p) == 0 for p in prompts):
            raise ValueError("every prompt needs at least one token")
        inputs = [{"prompt_token_ids": [int(t) for t in p]} for p in prompts]
        return self._llm.generate(inputs, params, use_tqdm=False)

    def prompt_logprobs(self, prompts: Sequence[Sequence[int]]) -> list[list[float]]:
        """Per prompt, the engine's logprobs of tokens ``1 .. n-1`` (see :func:`prompt_logprobs_of`)."""
        return self.prefill(prompts)[0]

    def prefill(self, prompts: Sequence[Sequence[int]], route_layers: Sequence[int] | None = None):
        """``(logprobs, routes)``: per prompt the engine's logprobs of tokens ``1 .. n-1`` and, with
        ``route_layers``, the experts it routed each of the ``n`` prompt tokens to at those decoder layers
        (``[n][layers][k]``, :func:`routes_of`; the settings' ``return_routed_experts`` must be on), else None."""
        from vllm import SamplingParams

        if any(len(p) < 2 for p in prompts):
            raise ValueError("prompt logprobs need prompts of at least two tokens")
        self._check_routes(route_layers)
        params = SamplingParams(max_tokens=1, temperature=1.0, prompt_logprobs=0, detokenize=False)
        outputs = self._generate(prompts, params)
        lps = [prompt_logprobs_of(o) for o in outputs]
        if route_layers is None:
            return lps, None
        routes = []
        for i, o in enumerate(outputs):
            n = len(o.prompt_token_ids)
            experts = routes_of(o.outputs[0], n + 1, route_layers, f"prompt {i}")["experts"]
            if len(experts) != n:
                raise ValueError(f"prompt {i}: routed experts for {len(experts)} tokens, the prompt has {n}")
            routes.append(experts)
        return lps, routes

    def _check_routes(self, route_layers) -> None:
        if route_layers is not None and not self.settings.return_routed_experts:
            raise ValueError("routes asked of an engine started without return_routed_experts=True")

    def sample(self, prompts: Sequence[Sequence[int]], *, max_tokens: int, temperature: float = 1.0,
               top_p: float = 1.0, top_k: int = -1, seed: int = 0, n: int = 1,
               ignore_eos: bool = True, route_layers: Sequence[int] | None = None) -> list[RolloutRecord]:
        """Sampled responses with their logprobs as rollout records (``n`` per prompt); with
        ``route_layers``, each with its ``routes`` (:func:`routes_of`)."""
        from vllm import SamplingParams

        processed = self.settings.logprobs_mode == "processed_logprobs"
        check_sampling(temperature, top_p, top_k, processed)  # before the engine runs
        self._check_routes(route_layers)
        params = SamplingParams(max_tokens=max_tokens, temperature=temperature, top_p=top_p, top_k=top_k,
                                seed=seed, n=n, logprobs=0, detokenize=False, ignore_eos=ignore_eos)
        out: list[RolloutRecord] = []
        for o in self._generate(prompts, params):
            out += records_of(o, temperature=temperature, top_p=top_p, top_k=top_k,
                              metadata={"engine": self.metadata}, processed=processed, route_layers=route_layers)
        return out

    def close(self) -> None:
        """Drop the engine and free what torch can of its GPU memory."""
        import gc

        import torch

        llm = self.__dict__.pop("_llm", None)
        if llm is not None:
            del llm
            gc.collect()
            torch.cuda.empty_cache()

