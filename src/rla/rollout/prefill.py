"""Chunked prefill: the training forward of a long sequence in bounded memory, bit for bit where checked.

A forward of ``S`` tokens in one call holds every layer's activations for all ``S`` positions at
once (``S x intermediate`` for the MLP, ``heads x S x S`` attention scores under eager attention).
A chunked prefill runs the decoder over query positions ``[s, e)`` at a time, earlier positions
read from a KV cache, so one step holds one chunk's activations plus the cache (the only state
that must grow with ``S``: ``2 x layers x kv_heads x head_dim`` per token) and the causal mask of
the chunk (``chunk x S`` booleans).

**Bits.** Mathematically the two are the same function; in floating point they need not be. What
was found on CPU (the cases tried -- bundled and test models, dtypes, alignments, batch sizes, thread
counts -- and the sizes of the differences are in docs/diagnosis.md):

- *SDPA* (torch's CPU flash-attention kernel) is bit-identical **when every chunk boundary is a
  multiple of 512**: the kernel walks the keys in blocks of 512 from position 0, and a block that
  ends at another length (a chunk boundary at 333, say) is reduced in another order (a large
  share of the hidden state's elements differ). Boundaries at multiples of :data:`ALIGN` keep
  every key block the one-call forward has.
- *fp32 GEMMs* round a block of 1-3, 5-7 or 9-11 rows differently from the same rows inside a
  larger product; bf16 GEMMs were row-count independent in every case tried.
  A final piece shorter than :data:`ALIGN` is therefore joined to the chunk before it.
- *eager* attention is not bit-identical chunked (softmax and ``P @ V`` run over ``e`` keys instead
  of ``S``), at any chunk size.

Because this depends on kernels, BLAS and devices that rla does not control, it is not assumed,
and it is not read off a short probe either: a kernel may pick its blocks by the sequence length
(on an Intel AVX-512 Xeon a 2,085-token probe of a bf16 SDPA model was bit-identical and its
2,048- and 8,192-token records were not). :func:`check` runs a probe at one geometry, ``rows`` x
``length`` seeded tokens in one call against their chunked prefill with chunks of ``step``, on the
model as it is (dtype, device, attention implementation, alignment, threads); the kernels' blocks
and reduction orders are functions of these shapes, not of the token values. :func:`rla.logprobs`
(``prefill_mode="auto"``) checks each long micro-batch at the rows, padded length and step it will
run with, and chunks it only when that check shows every bit equal. Otherwise the micro-batch runs
in one call, as before, and the check's numbers are in ``info``; a geometry whose one-call forward
would not fit in the memory available cannot be checked, and is refused with a ``MemoryError``
before any forward. ``prefill_mode="always"`` chunks anyway (bounded memory, a difference that is
rounding, of the measured size). docs/diagnosis.md has the measurements.

Note what the one-call forward is compared *to*: right padding also changes bits on CPU (the
padded length sets the last key block, so a row padded to another length is reduced in another
order). The training-side logprobs of a record are defined for its micro-batch, and chunking
leaves them exactly as the micro-batch's one-call forward computes them.
"""

from __future__ import annotations

import inspect
import weakref
from dataclasses import dataclass

import torch

__all__ = [
    "ALIGN",
    "PROBE_TOKENS",
    "PrefillCheck",
    "chunk_bounds",
    "check",
    "forward_chunks",
    "layer_bytes_per_token",
    "head_bytes_per_row",
    "plan_chunk",
    "head_rows",
    "one_call_bytes",
    "kv_cache_bytes",
    "available_bytes",
]

ALIGN = 512
"""Chunk boundaries are multiples of this: the key block of torch's CPU flash-attention kernel."""

PROBE_TOKENS = 4 * ALIGN + 37
"""Length of the probe: two chunk sizes (ALIGN, 2 ALIGN), several boundaries and a joined tail."""

PROBE_CHUNKS = (ALIGN, 2 * ALIGN)

_HEAD_BYTES_PER_LOGIT = 48
"""Transient bytes per vocabulary entry of one head row (``process_logits``): the logits, their fp32
copy, the tempered and filtered copies, top-p's sorted values (4) and int64 order (8), its softmax,
cumsum and masks, log_softmax; an upper estimate, checked in tests/test_long_inputs.py."""


@dataclass(frozen=True)
class PrefillCheck:
    """Whether chunked prefill gives the one-call forward's bits for a model in its current state."""

    exact: bool
    """Every final hidden-state element of the chunked prefill equals the one-call forward's."""
    equal: float
    """Fraction of bit-equal elements of the final hidden states (worst chunk size)."""
    max_abs: float
    """Largest |difference| of a final hidden state element (worst chunk size)."""
    tokens: int
    chunks: tuple[int, ...]
    attention: str
    dtype: str
    device: str
    rows: int = 1

    def describe(self) -> str:
        if not self.chunks:
            return f"never chunked: the model's context ({self.tokens} tokens) is not longer than one chunk ({ALIGN})"
        size = f"{self.rows} x {self.tokens}" if self.rows > 1 else f"{self.tokens}"
        how = f"probe of {size} tokens, chunks of {' and '.join(map(str, self.chunks))}"
        if self.exact:
            return f"chunked prefill is bit-identical to the one-call forward ({self.attention}, {self.dtype}, {self.device}; {how})"
        return (f"chunked prefill changes bits ({self.attention}, {self.dtype}, {self.device}; {how}): "
                f"{self.equal:.2%} of final hidden-state elements equal, max |difference| {self.max_abs:.3g}")

    def to_dict(self) -> dict:
        return {"exact": self.exact, "equal": self.equal, "max_abs": self.max_abs, "tokens": self.tokens,
                "chunks": list(self.chunks), "attention": self.attention, "dtype": self.dtype, "device": self.device,
                "rows": self.rows}


def chunk_bounds(length: int, chunk: int) -> list[tuple[int, int]]:
    """``[s, e)`` pieces of ``range(length)``: boundaries at multiples of ``chunk`` (itself a multiple of
    :data:`ALIGN`), a final piece shorter than :data:`ALIGN` joined to the one before it."""
    if length < 1:
        raise ValueError(f"length must be positive, got {length}")
    if chunk < ALIGN or chunk % ALIGN:
        raise ValueError(f"chunk must be a positive multiple of {ALIGN}, got {chunk}")
    starts = list(range(0, length, chunk))
    if len(starts) > 1 and length - starts[-1] < ALIGN:
        starts.pop()
    return [(s, starts[i + 1] if i + 1 < len(starts) else length) for i, s in enumerate(starts)]


def _attention(config) -> str:
    return getattr(config, "_attn_implementation", None) or "eager"


def _dims(config):
    hidden = config.hidden_size
    heads = config.num_attention_heads
    kv_heads = _largest(config, "num_key_value_heads") or heads
    head_dim = _largest(config, "head_dim") or hidden // heads
    inter = max(
        getattr(config, "intermediate_size", 0) or 0,
        (getattr(config, "moe_intermediate_size", 0) or 0) * (getattr(config, "num_experts_per_tok", 1) or 1),
        (getattr(config, "shared_expert_intermediate_size", 0) or 0),
        hidden,
    )
    return hidden, heads, kv_heads, head_dim, inter


def _largest(config, name: str):
    """``config.<name>``, or its largest per-layer value where the config has per-layer attributes
    (transformers' ``per_layer_config``, Gemma 4: reading them from the whole config raises)."""
    layers = getattr(config, "per_layer_config", None)
    if layers is not None and getattr(config, "num_hidden_layers", None):
        return max(getattr(layers[i], name, None) or 0 for i in range(config.num_hidden_layers)) or None
    return getattr(config, name, None)


def layer_bytes_per_token(config, keys: int) -> int:
    """Upper estimate of the transient bytes one query token costs in one decoder layer (no grad),
    attending to ``keys`` positions: activations counted in fp32 (aligned regions compute in
    fp32), the causal mask's row, and under eager attention the score rows."""
    hidden, heads, kv_heads, head_dim, inter = _dims(config)
    acts = 4 * (4 * inter + 8 * hidden + 3 * (heads + 2 * kv_heads) * head_dim)
    mask = 6 * keys  # a bool row, and the additive mask HF derives from it (model dtype, up to fp32)
    scores = 10 * heads * keys if _attention(config) == "eager" else 0  # scores, +mask, fp32 softmax, cast
    return acts + mask + scores


def head_bytes_per_row(vocab: int) -> int:
    """Upper estimate of the transient bytes of one position through the LM head and ``process_logits``."""
    return _HEAD_BYTES_PER_LOGIT * vocab


def kv_cache_bytes(config, tokens: int, dtype: torch.dtype) -> int:
    """Bytes of the KV cache of ``tokens`` positions (the state a chunked prefill keeps)."""
    _, _, kv_heads, head_dim, _ = _dims(config)
    return 2 * config.num_hidden_layers * kv_heads * head_dim * tokens * torch.tensor([], dtype=dtype).element_size()


def plan_chunk(config, budget: int, rows: int, keys: int) -> int:
    """Query positions per prefill step so that ``rows`` rows attending to at most ``keys`` positions
    stay within ``budget`` bytes: a multiple of :data:`ALIGN`, at least :data:`ALIGN` (a joined
    tail, :func:`chunk_bounds`, can add up to ``ALIGN - 1`` positions to the last step)."""
    per = layer_bytes_per_token(config, keys) * rows
    return max(ALIGN, budget // per // ALIGN * ALIGN)


def head_rows(vocab: int, budget: int) -> int:
    """Positions sent through the LM head at once within ``budget`` bytes (at least one)."""
    return max(1, budget // head_bytes_per_row(vocab))


def one_call_bytes(config, rows: int, length: int) -> int:
    """Estimated transient bytes of a one-call forward of ``rows x length`` tokens (see
    :func:`layer_bytes_per_token`)."""
    return layer_bytes_per_token(config, length) * rows * length


def available_bytes(device: torch.device) -> int | None:
    """Memory free for this process on ``device`` (MemAvailable on Linux CPUs), None when unknown."""
    if device.type == "cuda":
        try:
            return int(torch.cuda.mem_get_info(device)[0])
        except Exception:
            return None
    if device.type == "cpu":
        try:
            with open("/proc/meminfo") as f:
                for line in f:
                    if line.startswith("MemAvailable:"):
                        return int(line.split()[1]) * 1024
        except OSError:
            return None
    return None


def _cache_kwarg(decoder) -> str:
    params = inspect.signature(decoder.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def forward_chunks(decoder, config, ids: torch.Tensor, pos: torch.Tensor, bounds):
    """Yield ``(s, e, last_hidden_state[:, s:e])`` for each ``[s, e)`` of ``bounds`` (in order, covering
    the sequence): one forward when there is a single piece, else a prefill through a KV cache."""
    if len(bounds) == 1:
        s, e = bounds[0]
        yield s, e, decoder(input_ids=ids[:, s:e], position_ids=pos[:, s:e], use_cache=False).last_hidden_state
        return
    from transformers import DynamicCache

    cache = DynamicCache(config=config)
    kw = _cache_kwarg(decoder)
    for s, e in bounds:  # nothing here keeps a chunk's hidden states past the caller's use of them
        yield s, e, decoder(input_ids=ids[:, s:e], position_ids=pos[:, s:e], use_cache=True, **{kw: cache}).last_hidden_state


_CHECKS: "weakref.WeakKeyDictionary[torch.nn.Module, dict]" = weakref.WeakKeyDictionary()


def _state_key(model) -> tuple:
    from rla.alignment import alignment_of

    p = next(model.parameters())
    a = alignment_of(model)
    aligned = None if a is None else (tuple(sorted(a.profile.points().items())), tuple(a.regions), a.ops)
    return (_attention(model.config), str(p.dtype), str(p.device), aligned, torch.get_num_threads())


def _geometry(model, rows, length, step) -> tuple[int, int, tuple[int, ...]]:
    """``(rows, tokens, chunk sizes)`` of a probe: the default probe, or the one geometry asked for."""
    if length is None:
        if step is not None or rows != 1:
            raise ValueError("step and rows describe a geometry: give length with them")
        limit = getattr(model.config, "max_position_embeddings", None) or PROBE_TOKENS
        n = min(PROBE_TOKENS, int(limit))
        return 1, n, tuple(c for c in PROBE_CHUNKS if c < n)
    for name, v in (("rows", rows), ("length", length), ("step", step)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ValueError(f"{name} must be a positive int, got {v!r}")
    chunk_bounds(length, step)  # refuses a step that is not a multiple of ALIGN
    return rows, length, (step,) if len(chunk_bounds(length, step)) > 1 else ()


def cached_check(model, *, rows: int = 1, length: int | None = None, step: int | None = None) -> PrefillCheck | None:
    """:func:`check`'s result for ``model`` in its current state and this geometry, if it ran already;
    else None."""
    return _CHECKS.get(model, {}).get(_state_key(model) + _geometry(model, rows, length, step))


@torch.inference_mode()
def check(model, on_forward=None, *, rows: int = 1, length: int | None = None, step: int | None = None) -> PrefillCheck:
    """Probe whether chunked prefill reproduces ``model``'s one-call forward bit for bit, as the model
    is now (dtype, device, attention implementation, alignment, threads). Cached per model, state
    and geometry.

    With ``length`` and ``step``: a one-call forward of ``rows x length`` seeded random tokens against
    their chunked prefill with boundaries at multiples of ``step`` (:func:`chunk_bounds`), the shapes
    a micro-batch of that padded length runs with; this is what :func:`rla.logprobs` decides on.
    Without: a probe of :data:`PROBE_TOKENS` tokens (fewer when the model's context is shorter) at
    chunks of :data:`ALIGN` and ``2 ALIGN``; it says nothing about other lengths (a kernel may choose
    its blocks by the length). Exact when every final hidden-state element is equal.
    ``on_forward(k)`` is called after the k-th of its forwards (for progress).
    """
    geometry = _geometry(model, rows, length, step)
    key = _state_key(model) + geometry
    cached = _CHECKS.setdefault(model, {})
    if key in cached:
        return cached[key]
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
    if decoder is None:
        raise TypeError(f"{type(model).__name__} does not expose get_decoder(); chunked prefill needs an HF causal LM")
    config = model.config
    device = next(model.parameters()).device
    rows, n, sizes = geometry
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, config.vocab_size, (rows, n), generator=g).to(device)
    pos = torch.arange(n, device=device)[None].expand(rows, -1)
    whole = next(forward_chunks(decoder, config, ids, pos, [(0, n)]))[2]
    if on_forward is not None:
        on_forward(1)
    equal, worst, chunks = 1.0, 0.0, []
    for c in sizes:
        chunks.append(c)
        parts = torch.cat([h for _, _, h in forward_chunks(decoder, config, ids, pos, chunk_bounds(n, c))], dim=1)
        equal = min(equal, float((parts == whole).double().mean()))
        worst = max(worst, float((parts.float() - whole.float()).abs().max()))
        del parts
        if on_forward is not None:
            on_forward(1 + len(chunks))
    p = next(model.parameters())
    result = PrefillCheck(exact=equal == 1.0 and bool(chunks), equal=equal, max_abs=worst, tokens=n,
                          chunks=tuple(chunks), attention=_attention(config), dtype=str(p.dtype).replace("torch.", ""),
                          device=str(device), rows=rows)
    cached[key] = result
    return result


def gib(n: float) -> str:
    return f"{n / 2**30:.3g} GiB" if n >= 2**28 else f"{n / 2**20:.3g} MiB"
