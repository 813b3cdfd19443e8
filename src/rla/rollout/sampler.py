"""A rollout stack that rounds like a chosen engine: the stand-in for vLLM or SGLang in experiments.

What it reproduces: the engine's rounding locations in RoPE, SwiGLU and residual-add + RMSNorm
(its own copy of the weights in the engine dtype, aligned to the engine's profile with
:func:`rla.align`), the engine's logprob convention (fp32 logits / temperature, top-k / top-p,
log_softmax of what is left; see :mod:`rla.rollout.sampling`), and its decode structure (one prefill,
then one token per step against a KV cache, so the rollout forward differs from the training
forward the way a decode kernel differs from a prefill one).

What it does not reproduce: the engine's own GEMM and attention kernels (cuBLAS/FlashAttention
vs. PyTorch's), continuous batching, paged KV cache, CUDA-graph capture sizes, speculative
decoding. Those add mismatch that no rounding profile can remove; ``rla diagnose`` reports it as
the share that alignment leaves unexplained.

The sampler never touches the training model: :meth:`Sampler.load_weights` copies its weights
in, as a trainer syncs weights to vLLM after each step.
"""

from __future__ import annotations

import copy
import inspect
from dataclasses import dataclass, field

import torch

from rla.profiles import RoundingProfile, resolve
from rla.rollout.sampling import check_sampling_params
from rla.rollout.static_decode import StaticDecoder, bucket, next_token_logits
from rla.rollout.token_loop import LoopParams, TokenLoop
from rla.rollout.fingerprint import weights_fingerprint

__all__ = ["SamplingParams", "Sampler"]

_KEEP_DECODERS = 2  # static caches (and CUDA graphs) kept for reuse, per sampler


@dataclass(frozen=True)
class SamplingParams:
    """Sampling settings, named as in vLLM's ``SamplingParams``."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    """-1 disables top-k (vLLM's convention; 0 is accepted too)."""
    max_new_tokens: int = 256
    stop_token_ids: tuple[int, ...] = ()
    """Extra stop tokens; the model's eos_token_id always stops. The stop token is kept in the
    response, with its logprob, as engines return it."""
    seed: int | None = None
    """Seed of the sampling generator; the same seed, prompts and weights give the same rollouts."""
    ignore_eos: bool = False
    """As in vLLM: keep sampling past the model's eos token (``stop_token_ids`` still stop), e.g.
    to measure mismatch at long positions with a model that answers briefly."""

    def __post_init__(self):
        check_sampling_params(self.temperature, self.top_p, self.top_k)
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")


def _cache_kwarg(model) -> str:
    """transformers renamed ``past_key_values`` to ``cache``; pass whichever the model takes."""
    params = inspect.signature(inspect.unwrap(type(model).forward)).parameters
    return "cache" if "cache" in params else "past_key_values"


@dataclass
class _Batch:
    ids: torch.Tensor
    mask: torch.Tensor
    prompt_lens: list[int] = field(default_factory=list)


class Sampler:
    """Batched KV-cache sampling from an HF causal LM whose regions follow an engine profile.

    >>> sampler = Sampler(model, profile="vllm")          # own bf16 copy, aligned to vLLM
    >>> records = sampler.generate(prompt_ids, SamplingParams(temperature=1.0, seed=0))
    >>> sampler.load_weights(model)                        # after an optimizer step
    """

    def __init__(
        self,
        model: torch.nn.Module,
        profile: str | RoundingProfile = "vllm",
        *,
        dtype: torch.dtype = torch.bfloat16,
        device: str | torch.device | None = None,
        cache: str = "auto",
        cuda_graph: bool | None = None,
        tokens_per_check: int = 8,
        decode_attention: str = "grouped",
        regions: tuple[str, ...] | None = None,
        step: int | None = None,
        record_routes: bool = False,
    ):
        """``regions``: what ``rla.align`` aligns on the engine copy (None: RoPE, SwiGLU and the norms;
        add ``"router"`` for an MoE model to route as the profile's router points say. The router's
        forward loops over the experts a batch hits, which a CUDA graph cannot capture: with it,
        pass ``cuda_graph=False``).

        ``cache="auto"`` is ``"static"`` on a CUDA device and ``"dynamic"`` elsewhere.
        ``cache="static"`` preallocates the KV cache (prompt + max_new_tokens, rounded up to
        :data:`rla.rollout.static_decode.BUCKET`), so every decode step has the same shapes, and on GPU
        captures the decode step as a CUDA graph (``cuda_graph``: None = on GPU, True = required,
        False = eager). The throughput of each path is in ``results/benchmarks/``.

        ``tokens_per_check``: tokens sampled between checks whether every row has stopped (each
        check is a host sync). With the static cache it is also the number of tokens one CUDA-graph
        replay samples and decodes; a response length that is not a multiple runs its last
        ``max_new_tokens % tokens_per_check`` tokens eagerly. The rollouts do not depend on it.

        ``decode_attention`` (static cache): ``"grouped"`` attends over the grouped K/V heads as
        they are and the filled cache columns only (:mod:`rla.rollout.decode_attention`); ``"model"``
        runs the model's own attention over the whole cache (HF's SDPA repeats grouped K/V heads).

        ``step``: the trainer's optimizer step of ``model``'s weights, recorded in every record's
        ``policy`` field beside the weights' fingerprint (:meth:`load_weights` sets both).

        ``record_routes`` (MoE models): every record carries ``routes`` (docs/rollouts.md, version
        1), the experts each MoE layer of the engine copy routed each token to, in slot order, and
        their fp32 routing weights (before the routed scale and the cast to the weights' dtype,
        what :func:`rla.capture_routes` sees): one entry per prompt token (from the prefill) and per
        response token but the last (each from the decode step that fed it; the last sampled token
        never goes through the forward). It needs ``cache='dynamic'``: a static cache's CUDA graph
        cannot append to the capture lists, and its chunked decode feeds tokens past a row's end."""
        from rla.alignment import align

        if cache not in ("auto", "dynamic", "static"):
            raise ValueError(f"cache must be 'auto', 'dynamic' or 'static', got {cache!r}")
        if not isinstance(tokens_per_check, int) or tokens_per_check < 1:
            raise ValueError(f"tokens_per_check must be an int >= 1, got {tokens_per_check!r}")
        self.tokens_per_check = tokens_per_check
        if decode_attention not in ("grouped", "model"):
            raise ValueError(f"decode_attention must be 'grouped' or 'model', got {decode_attention!r}")
        self.decode_attention = decode_attention
        self.profile = resolve(profile)
        self.dtype = dtype
        self.device = torch.device(device) if device is not None else next(model.parameters()).device
        if cache == "auto":
            cache = "static" if self.device.type == "cuda" else "dynamic"
        self.cache = cache
        if cuda_graph and (cache != "static" or self.device.type != "cuda"):
            raise ValueError("cuda_graph=True needs cache='static' and a CUDA device")
        self.cuda_graph = cache == "static" and self.device.type == "cuda" and cuda_graph is not False
        if record_routes and cache != "dynamic":
            raise ValueError("record_routes=True needs cache='dynamic' (the static cache's CUDA graph and chunked "
                             f"decode cannot record per-token routes), got cache={cache!r}")
        self.record_routes = bool(record_routes)
        engine = _fresh_copy(model, dtype)
        engine.to(device=self.device)
        self.model = engine
        self.load_weights(model, step=step)
        self.alignment = align(engine, profile=self.profile) if regions is None else align(
            engine, profile=self.profile, regions=tuple(regions))
        if self.record_routes:
            from rla.alignment import moe_layers

            if not moe_layers(engine):
                raise ValueError(f"record_routes=True: {type(engine).__name__} has no MoE block, so no routes")
        self.model.eval()
        self._cache_kw = _cache_kwarg(engine)
        self._decoders: dict[tuple[int, int], StaticDecoder] = {}
        eos = engine.config.eos_token_id
        self.eos_ids = tuple(eos if isinstance(eos, (list, tuple)) else ([] if eos is None else [eos]))
        self.pad_id = engine.config.pad_token_id if engine.config.pad_token_id is not None else 0

    @torch.no_grad()
    def load_weights(self, model: torch.nn.Module, *, step: int | None = None) -> None:
        """Copy ``model``'s weights into the engine copy, rounded to the engine dtype.

        Takes a plain HF model (merge LoRA adapters first) or its ``state_dict()``; names and
        shapes must match the engine copy exactly, else the error lists what differs. Records
        sampled afterwards carry ``policy = {"weights": fingerprint, "step": step}``: the
        :func:`rla.rollout.fingerprint.weights_fingerprint` of the engine copy's weights as
        loaded, and ``step`` (the trainer's optimizer step; left out when None), so ``rla
        diagnose`` can tell rollouts of other weights from rounding.
        """
        if step is not None and (isinstance(step, bool) or not isinstance(step, int) or step < 0):
            raise ValueError(f"step must be an int >= 0 or None, got {step!r}")
        src = model.state_dict() if isinstance(model, torch.nn.Module) else dict(model)
        dst = self.model.state_dict()
        missing, extra = set(dst) - set(src), set(src) - set(dst)
        if missing or extra:
            raise ValueError(
                f"load_weights: parameter names differ (missing {sorted(missing)[:5]}, unexpected "
                f"{sorted(extra)[:5]}); pass the same architecture, with LoRA merged"
            )
        for name, t in dst.items():
            s = src[name]
            if s.shape != t.shape:
                raise ValueError(f"load_weights: {name} has shape {tuple(s.shape)}, engine has {tuple(t.shape)}")
            t.copy_(s.detach().to(device=t.device, dtype=t.dtype))
        self.policy = {"weights": weights_fingerprint(dst)} | ({} if step is None else {"step": step})

    def _decoder(self, n: int, max_len: int) -> StaticDecoder:
        """The static decoder (cache + captured graph) for this shape, kept for the next call."""
        key = (n, max_len)
        if key not in self._decoders:
            while len(self._decoders) >= _KEEP_DECODERS:  # drop the oldest cache and graph
                self._decoders.pop(next(iter(self._decoders)))
            self._decoders[key] = StaticDecoder(self.model, self._cache_kw, n, max_len, capture=self.cuda_graph,
                                                pad_id=self.pad_id, attention=self.decode_attention)
        return self._decoders[key]

    def _left_pad(self, prompts: list[list[int]]) -> _Batch:
        longest = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), longest), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(prompts), longest), dtype=torch.long)
        for i, p in enumerate(prompts):
            if p:
                ids[i, longest - len(p):] = torch.tensor(p, dtype=torch.long)
                mask[i, longest - len(p):] = 1
        return _Batch(ids.to(self.device), mask.to(self.device), [len(p) for p in prompts])

    def _check_prompts(self, prompts) -> list[list[int]]:
        vocab = self.model.config.vocab_size
        out = []
        for i, p in enumerate(prompts):
            p = [int(t) for t in (p.tolist() if isinstance(p, torch.Tensor) else p)]
            if not p:
                raise ValueError(f"prompt {i} is empty; a rollout needs at least one prompt token")
            bad = [t for t in p if not 0 <= t < vocab]
            if bad:
                raise ValueError(f"prompt {i} has token ids outside the vocab [0, {vocab}): {bad[:5]}")
            out.append(p)
        if not out:
            raise ValueError("no prompts given")
        return out

    @torch.no_grad()
    def generate(self, prompts, params: SamplingParams = SamplingParams(), *, metadata=None):
        """Sample one response per prompt -> list of :class:`rla.rollout.rollouts.RolloutRecord`.

        ``prompts`` are token-id lists (variable lengths are left-padded). Each record holds the
        response ids and, per response token, the processed logprob of the sampled token.
        """
        from rla.rollout.rollouts import RolloutRecord

        prompts = self._check_prompts(prompts)
        batch = self._left_pad(prompts)
        seed = params.seed if params.seed is not None else torch.seed()
        eos = () if params.ignore_eos else self.eos_ids
        loop_params = LoopParams(float(params.temperature), int(params.top_k), float(params.top_p),
                                 tuple(sorted(set(eos) | set(params.stop_token_ids))))
        positions = (batch.mask.cumsum(-1) - 1).clamp(min=0)
        capture = None
        if self.cache == "static":
            ids, lps = self._generate_static(batch, positions, loop_params, params.max_new_tokens, seed)
        elif self.record_routes:
            from rla.alignment import capture_routes

            with capture_routes(self.model) as capture:
                ids, lps = self._generate_dynamic(batch, positions, loop_params, params.max_new_tokens, seed)
        else:
            ids, lps = self._generate_dynamic(batch, positions, loop_params, params.max_new_tokens, seed)
        records = []
        stop_set = set(loop_params.stop_ids)
        routes_of = None if capture is None else _routes_on_host(capture, batch.ids.shape)
        # .tolist() once, not int()/float() per element: the same Python ints and floats (fp64
        # logprobs convert exactly), without ~5 us of tensor indexing per token (0.4 s for 64 x 1024)
        for i, (row, row_lp) in enumerate(zip(ids.tolist(), lps.tolist())):
            end = next((t + 1 for t, tok in enumerate(row) if tok in stop_set), len(row))
            resp, lp = row[:end], row_lp[:end]
            routes = None if routes_of is None else routes_of(i, len(prompts[i]), len(resp))
            records.append(
                RolloutRecord(
                    prompt_ids=prompts[i],
                    response_ids=resp,
                    logprobs=lp,
                    temperature=float(params.temperature),
                    top_p=float(params.top_p),
                    top_k=int(params.top_k),
                    engine=self.profile.name,
                    metadata=dict(metadata or {}),
                    policy=dict(self.policy),
                    routes=routes,
                )
            )
        return records


    def _generate_static(self, batch: _Batch, positions, params: LoopParams, max_new: int, seed: int):
        """Prefill, then whole chunks of ``tokens_per_check`` tokens (one graph replay each on GPU)
        with a done check after each, then the remainder eagerly. Every decode step writes a cache
        column below ``prompt_len + max_new <= max_len``, so the cache is sized as for one token per
        step and the rollouts equal the per-token loop's to the bit."""
        n, prompt_len = batch.ids.shape
        k = self.tokens_per_check
        dec = self._decoder(n, bucket(prompt_len + max_new))
        dec.begin(dec.prefill(batch.ids, batch.mask, positions), positions[:, -1:], prompt_len)
        chunks, rest = divmod(max_new, k)
        # chunk i decodes into cache columns up to prompt_len + (i + 1) k - 1: its attention width
        widths = [dec.width(prompt_len + (i + 1) * k) for i in range(chunks)]
        if chunks:
            dec.prepare(k, params, widths)  # captures on first use: before seeding, the warm-up draws
        dec.loop.generator.manual_seed(seed)
        steps = 0
        for width in widths:
            dec.run(k, params, width)
            steps += k
            if steps == max_new or bool(dec.loop.done.all()):
                break
        else:
            dec.run(rest, params, dec.width(prompt_len + max_new))
            steps += rest
        return dec.loop.result(steps)

    def _generate_dynamic(self, batch: _Batch, positions, params: LoopParams, max_new: int, seed: int):
        """One token per step against a growing ``DynamicCache``; the same sampling step as the
        static path (:class:`rla.rollout.token_loop.TokenLoop`), run eagerly."""
        n = batch.ids.shape[0]
        cache = _new_cache(self.model)
        mask = batch.mask
        logits = next_token_logits(self.model, self._cache_kw, cache, batch.ids, mask, positions)
        loop = TokenLoop(n, max_new, logits.shape[-1], logits.dtype, self.device, self.pad_id)
        loop.begin(logits)
        loop.generator.manual_seed(seed)
        for step in range(1, max_new + 1):
            token = loop.sample(params)
            # a host sync per step would stall the GPU behind the host; check every few steps
            # (rows already done only add pad tokens, dropped when the records are cut)
            if step == max_new or (step % self.tokens_per_check == 0 and bool(loop.done.all())):
                break
            positions = positions[:, -1:] + 1
            mask = torch.cat([mask, mask.new_ones((n, 1))], dim=1)
            loop.logits.copy_(next_token_logits(self.model, self._cache_kw, cache, token, mask, positions))
        return loop.result(step)


def _routes_on_host(capture, padded: tuple[int, int]):
    """``routes_of(row, prompt_len, response_len)`` -> a record's ``routes``, from a dynamic-cache
    rollout's capture: row ``row``'s prompt tokens' routes from the prefill forward
    (``[rows * padded_prompt]`` tokens, left-padded) and one per decode forward after it (``[rows]``
    tokens each) for response tokens ``0 .. response_len - 2``. Every forward's routes stay on the
    device during the rollout and come to the host here, in one copy of the ids and one of the weights."""
    rows, padded_prompt = padded
    # [tokens of every forward, layers, k] as Python lists, converted once: the prefill's
    # rows * padded_prompt tokens, then each decode forward's rows (each token belongs to one row);
    # numpy's tolist gives the same Python ints and floats as torch's, ~10x faster
    experts = capture.ids().transpose(0, 1).numpy().tolist()
    weights = capture.weights().transpose(0, 1).numpy().tolist()
    prefill = rows * padded_prompt

    def routes_of(row: int, prompt_len: int, response_len: int) -> dict:
        start = row * padded_prompt + padded_prompt - prompt_len
        at = [*range(start, start + prompt_len), *range(prefill + row, prefill + row + rows * (response_len - 1), rows)]
        # [tokens, layers, k]: the record layout
        return {"version": 1, "experts": [experts[t] for t in at], "weights": [weights[t] for t in at]}

    return routes_of


def _fresh_copy(model: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    """A new, unaligned instance of the same architecture with parameters in the engine dtype.

    Built from the config (weights are loaded afterwards), never by casting a model: ``.to(bf16)``
    would also round RoPE's ``inv_freq`` buffer, which engines keep in fp32.
    """
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_config(copy.deepcopy(model.config), dtype=dtype)


def _new_cache(model):
    from transformers import DynamicCache

    return DynamicCache(config=model.config)
