"""One decode step against a preallocated KV cache, optionally captured as a CUDA graph.

A small model's decode step is a few hundred tiny kernels: on GPU the host, not the GPU, sets the
pace (``results/benchmarks/h200_2026-11-29_sampler.md``). A CUDA graph replays the whole step as
one launch. That needs every tensor the step reads or writes to live at a fixed address with a
fixed shape, which this class provides:

- the KV cache is a ``StaticCache`` of ``max_len`` columns, reused across calls;
- the step's inputs (token, position, cache position) are static buffers, copied into per step;
- the attention mask is built *inside* the step from a static padding mask and the cache
  position, as the 4D mask HF's attention takes as is, so HF's mask construction (which inspects
  the mask on the host) never runs during capture.

Prefill is not captured (its shape changes with every batch); it runs eagerly into the same cache.
On CPU, or with ``capture=False``, the same step runs eagerly: the CPU tests exercise everything
but the capture itself, and the GPU test checks that replay equals eager bit for bit.

Two granularities. :meth:`StaticDecoder.decode` is one model step (the host samples between
steps). :meth:`StaticDecoder.run` is K whole tokens: sample from the logits buffer
(``rla.rollout.token_loop``), feed the token back, advance position and cache position on the
device, decode -- K times, captured once per sampling setting as one graph. The host then does
one replay per K tokens instead of ~20 op launches and a ``torch.multinomial`` sync per token.
Where the decode step's GPU time, not the host, sets the pace, that gains little (the small
models of ``results/benchmarks/h200_2026-12-01_decode_loop.md``); it matters where the host is
the bottleneck (a slower host, more runs per GPU).

The decode step attends with :func:`rla.rollout.decode_attention.grouped_decode_attention` (sdpa
models): the grouped K/V heads as they are, and only the first ``W`` cache columns, ``W`` the filled
columns rounded up to :data:`WINDOW`. Each width is its own captured graph (a 1,088-column cache has
nine); they share one memory pool. Eager-attention models keep HF's attention over all columns.
"""

from __future__ import annotations

import contextlib
import threading

import torch

from rla.rollout.decode_attention import decode_attention_of
from rla.rollout.token_loop import LoopParams, TokenLoop

__all__ = ["StaticDecoder", "bucket", "next_token_logits"]

#: captured token loops kept per decoder (one per sampling setting and chunk length)
_KEEP_LOOPS = 4

#: static caches are allocated in multiples of this many positions, so batches whose prompt
#: lengths differ a little share one cache and one captured graph
BUCKET = 64

#: the decode step reads the first ``W`` cache columns, ``W`` the filled ones rounded up to this
#: (each ``W`` is one captured graph per sampling setting)
WINDOW = 128

_CAPTURE_LOCK = threading.Lock()


def bucket(n: int) -> int:
    return -(-n // BUCKET) * BUCKET


def next_token_logits(model, cache_kw: str, cache, ids, mask, positions, *, cache_position=None) -> torch.Tensor:
    """The model's logits for the token after the last position of each row, filling ``cache``.

    ``cache_kw`` is the model's name for the cache argument (``past_key_values`` or ``cache``).
    """
    extra = {} if cache_position is None else {"cache_position": cache_position}
    out = model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True, logits_to_keep=1,
                **extra, **{cache_kw: cache})
    return out.logits[:, -1]


class StaticDecoder:
    """Prefill + single-token decode steps for ``batch`` sequences of up to ``max_len`` tokens."""

    def __init__(self, model, cache_kw: str, batch: int, max_len: int, *, capture: bool, pad_id: int = 0,
                 attention: str = "grouped"):
        """``attention``: ``"grouped"`` (:mod:`rla.rollout.decode_attention`, sdpa models) or
        ``"model"`` (the model's own attention over every cache column)."""
        from transformers import StaticCache

        if attention not in ("grouped", "model"):
            raise ValueError(f"attention must be 'grouped' or 'model', got {attention!r}")

        impl = getattr(model.config, "_attn_implementation", None) or "eager"
        if impl not in ("sdpa", "eager"):
            raise ValueError(
                f"the static-cache sampler builds sdpa/eager attention masks; the model uses "
                f"attn_implementation={impl!r} (use cache='dynamic')"
            )
        self.model, self.cache_kw, self.batch, self.max_len = model, cache_kw, batch, max_len
        self.capture = capture
        self._bool_mask = impl == "sdpa"
        # the grouped decode attention takes boolean masks of W columns: sdpa models only
        self._windowed = impl == "sdpa" and attention == "grouped"
        device = next(model.parameters()).device
        self.cache = StaticCache(config=model.config, max_cache_len=max_len)
        if capture and not _graphable(self.cache):
            kinds = sorted({type(layer).__name__ for layer in self.cache.layers})
            raise ValueError(
                f"CUDA-graph decode needs plain StaticLayer caches whose write position is a device tensor; "
                f"this model's cache has {kinds} (sliding-window layers count on the host). Use cuda_graph=False"
            )
        self.tokens = torch.zeros((batch, 1), dtype=torch.long, device=device)
        self.positions = torch.zeros((batch, 1), dtype=torch.long, device=device)
        self.cache_position = torch.zeros((1,), dtype=torch.long, device=device)
        self.key_mask = torch.zeros((batch, max_len), dtype=torch.bool, device=device)
        self._cols = torch.arange(max_len, device=device)
        self._graph = None
        self._logits = None
        self._pool = None  # one memory pool for every graph of this decoder (they never run at once)
        self.loop = TokenLoop(batch, max_len, model.config.vocab_size, model.dtype, device, pad_id)
        # (k, params) -> {width: graph}
        self._loops: dict[tuple[int, LoopParams], dict[int, torch.cuda.CUDAGraph]] = {}

    def width(self, columns: int) -> int:
        """The cache columns a decode step reads when the first ``columns`` may be filled."""
        if not self._windowed:
            return self.max_len
        return min(self.max_len, -(-columns // WINDOW) * WINDOW)

    # ---------------------------------------------------------------- prefill
    def prefill(self, ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Run the (left-padded) prompts through the model into the cache -> last logits, fp32-able.

        ``mask`` is the prompts' 0/1 padding mask; the columns after them count as real tokens
        (each is written by the decode step before any query may see it).
        """
        n, p = ids.shape
        if n != self.batch or p >= self.max_len:
            raise ValueError(f"prefill of {n} x {p} does not fit a decoder for {self.batch} x {self.max_len}")
        self.cache.reset()
        self.key_mask.fill_(True)
        self.key_mask[:, :p] = mask.bool()
        full = self.key_mask.to(mask.dtype)
        return next_token_logits(self.model, self.cache_kw, self.cache, ids, full, positions,
                                 cache_position=torch.arange(p, device=ids.device))

    # ---------------------------------------------------------------- decode
    def _step(self, width: int | None = None) -> torch.Tensor:
        """One token per row at ``cache_position``, attending over the first ``width`` cache columns
        (default all; the caller keeps ``cache_position < width``); everything it touches is a
        static buffer."""
        width = self.max_len if width is None else width
        visible = self.key_mask[:, :width] & (self._cols[:width] <= self.cache_position)  # causal + padding
        mask = visible[:, None, None, :]
        if not self._bool_mask:  # eager attention adds the mask to the scores
            dtype = next(self.model.parameters()).dtype
            mask = torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(~mask, torch.finfo(dtype).min)
        with decode_attention_of(self.model) if self._windowed else contextlib.nullcontext():
            return next_token_logits(self.model, self.cache_kw, self.cache, self.tokens, mask, self.positions,
                                     cache_position=self.cache_position)

    def decode(self, tokens: torch.Tensor, positions: torch.Tensor, cache_position: int) -> torch.Tensor:
        """Logits of the next token after ``tokens`` (``[batch, 1]``) at ``cache_position``.

        The returned tensor is the graph's output buffer when captured: read it before the next call.
        """
        self.tokens.copy_(tokens)
        self.positions.copy_(positions)
        self.cache_position.fill_(cache_position)
        if not self.capture:
            return self._step()
        if self._graph is None:
            self._capture()
        self._graph.replay()
        return self._logits

    # ---------------------------------------------------------------- K tokens per call
    def begin(self, logits: torch.Tensor, last_positions: torch.Tensor, prompt_len: int) -> None:
        """Start the token loop after :meth:`prefill`: its logits, each row's last prompt position
        (``[batch, 1]``) and the padded prompt length."""
        self.loop.begin(logits)
        self.positions.copy_(last_positions)
        self.cache_position.fill_(prompt_len - 1)

    def _tokens(self, k: int, params: LoopParams, width: int | None = None) -> None:
        """``k`` tokens: sample from the logits buffer, feed the token back, decode the next logits
        (over the first ``width`` cache columns).

        Reads and writes only static buffers and advances positions on the device, so the same
        code runs eagerly and under capture.
        """
        for _ in range(k):
            self.tokens.copy_(self.loop.sample(params))
            self.positions.add_(1)
            self.cache_position.add_(1)
            self.loop.logits.copy_(self._step(width))

    @torch.no_grad()
    def prepare(self, k: int, params: LoopParams, widths=None) -> None:
        """Capture the ``k``-token loop for ``params`` at each of ``widths`` (default: all columns)
        if capturing and not yet captured.

        Call after :meth:`begin` and *before* seeding ``loop.generator``: the warm-up draws from it.
        """
        if not self.capture:
            return
        key = (k, params)
        if key not in self._loops:
            while len(self._loops) >= _KEEP_LOOPS:
                self._loops.pop(next(iter(self._loops)))
            self._loops[key] = {}
        graphs = self._loops[key]
        for w in sorted(set(widths or [self.max_len])):
            if w not in graphs:
                graphs[w] = self._capture_loop(k, params, w)

    @torch.no_grad()
    def run(self, k: int, params: LoopParams, width: int | None = None) -> None:
        """Sample and decode ``k`` tokens over the first ``width`` cache columns (default all): one
        graph replay if :meth:`prepare` captured them, else eagerly.

        Each call writes columns ``[c, c + k)`` of ``loop.ids`` / ``loop.logprobs`` and cache
        positions ``prompt_len + c ..`` for the ``c`` tokens sampled so far: the caller keeps
        ``c + k`` within the ``max_len - prompt_len`` columns the cache has left, and ``width`` at
        least ``prompt_len + c + k`` (:meth:`width`).
        """
        width = self.max_len if width is None else width
        graph = self._loops.get((k, params), {}).get(width) if self.capture else None
        if graph is None:
            self._tokens(k, params, width)
        else:
            graph.replay()

    def _warm_up(self, times: int = 2, run=None) -> None:
        """Run ``run`` (default: one decode step) ``times`` times, each time putting back the
        cache and every buffer it writes as they were.

        The cache's write position is its own device-side counter (``StaticLayer.cumulative_length``,
        advanced by every update; transformers ignores ``cache_position`` for the write), so a warm-up
        step that is not undone would shift every later write past what the mask and positions say.
        The token loop also advances positions and output columns, so each warm-up run starts
        where the real one will and stays inside the cache.
        """
        run = run or self._step
        tensors = [t for layer in self.cache.layers for t in vars(layer).values() if isinstance(t, torch.Tensor)]
        tensors += [self.tokens, self.positions, self.cache_position, *self.loop.state()]
        saved = [t.clone() for t in tensors]
        for _ in range(times):
            run()
            for t, s in zip(tensors, saved):
                t.copy_(s)

    def _capture(self) -> None:
        self._graph, self._logits = self._graph_of(self._step)

    def _capture_loop(self, k: int, params: LoopParams, width: int) -> torch.cuda.CUDAGraph:
        # the graph's RNG kernels read the generator's seed and offset at each replay (and advance
        # the offset by the graph's draws), so a manual_seed between replays takes effect
        graph, _ = self._graph_of(lambda: self._tokens(k, params, width), generator=self.loop.generator)
        return graph

    def _graph_of(self, run, generator: torch.Generator | None = None) -> tuple[torch.cuda.CUDAGraph, object]:
        """``run`` captured as a CUDA graph, after a warm-up that leaves no trace -> (graph, run's output)."""
        # warm-up on a side stream (lazy inits, Triton/cuBLAS setup), as torch.cuda.graphs asks
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            self._warm_up(run=run)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        if generator is not None:
            graph.register_generator_state(generator)
        # one capture at a time per process, on its own stream (torch.cuda.graph's default capture
        # stream is shared), and only this thread's calls checked: several runs of one process
        # (rla.rl.run_group) keep their other threads' kernels going meanwhile
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        # every graph's state lives in static buffers allocated outside the pool: what one replay
        # leaves in the pool is dead by the next, so the graphs of one decoder can share it
        with _CAPTURE_LOCK, torch.cuda.graph(graph, pool=self._pool, stream=torch.cuda.Stream(),
                                             capture_error_mode="thread_local"):
            out = run()
        return graph, out


def _graphable(cache) -> bool:
    from transformers.cache_utils import StaticLayer

    return all(type(layer) is StaticLayer for layer in cache.layers)
