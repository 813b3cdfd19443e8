"""Training-side logprobs of recorded rollout tokens: what pi_theta assigns to what mu sampled.

Memory stays bounded at any length the model supports: records are packed into micro-batches by
a token budget (``max_tokens``), a record longer than the budget runs as a chunked prefill
(:mod:`rla.rollout.prefill`) where that gives the one-call forward's bits, the decoder runs
without grad, and the LM head is applied only at response positions, ``chunk`` positions at a
time, so full-vocab fp32 logits never exist for a whole sequence. Temperature and top-k / top-p
are applied exactly as the rollout engine applied them (:func:`rla.rollout.sampling.process_logits`,
with each record's own settings), so the comparison measures the forward pass and nothing else.

Padding is on the right with plain causal attention and no mask: a real token never attends to a
later position, so right padding cannot change it mathematically. In bits it can: on CPU the
padded length sets the attention kernel's last key block (torch 2.13, SDPA: 0.1-2% of a record's
hidden-state elements differ when it is padded to another length), so a record's logprobs are
those of its micro-batch, as a trainer's are of its own micro-batch.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import torch

from rla.rollout import prefill
from rla.rollout.sampling import process_logits

__all__ = ["logprobs", "micro_batches", "token_logprobs", "decoder_and_head", "PREFILL"]


def micro_batches(lengths: Sequence[int], max_tokens: int) -> list[list[int]]:
    """Group indices (longest first) so that rows x longest row <= max_tokens per group."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    groups, cur, cur_max = [], [], 0
    for i in order:
        longest = max(cur_max, lengths[i])
        if cur and longest * (len(cur) + 1) > max_tokens:
            groups.append(cur)
            cur, longest = [], lengths[i]
        cur.append(i)
        cur_max = longest
    if cur:
        groups.append(cur)
    return groups


def decoder_and_head(model):
    """``(decoder, lm_head)`` of an HF causal LM: both logprob paths run them apart."""
    decoder = model.get_decoder()
    head = model.get_output_embeddings()
    if decoder is None or head is None:
        raise TypeError(
            f"{type(model).__name__} does not expose get_decoder()/get_output_embeddings(); "
            "rla.logprobs and the training forward need an HF causal LM"
        )
    return decoder, head


def token_logprobs(head, hidden: torch.Tensor, targets: torch.Tensor, temperature: float, top_k: int,
                   top_p: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``(logprob of each target, the processed full-vocab logprobs)`` for one chunk of hidden states.

    The one place a hidden state becomes a training logprob: the LM head, then the engines'
    processing (:func:`rla.rollout.sampling.process_logits`: fp32, temperature, top-k / top-p,
    log_softmax), then the target's entry. Two callers, apart on purpose:

    - :func:`logprobs` (here): measurement. No grad (``inference_mode``), each record's own
      sampling settings, chunks taken per record, results on CPU.
    - :class:`rla.rl.forward.PolicyForward`: the loss. Gradients through activation-checkpointed
      chunks of a flat token layout (one root module for FSDP2), one run's fixed settings, and
      the entropy from the same processed logprobs.

    They share the numerics (this function), not the batching.
    """
    logp = process_logits(head(hidden), temperature, top_k, top_p)
    return logp.gather(-1, targets[:, None]).squeeze(-1), logp


PREFILL = ("auto", "always", "never")
"""How a sequence longer than ``max_tokens`` runs (see :func:`logprobs`)."""

DEFAULT_MAX_TOKENS = 16384
DEFAULT_CHUNK = 1024


def _resolve_sizes(model, lengths, max_tokens, chunk, memory_budget) -> tuple[int, int]:
    for name, v in (("max_tokens", max_tokens), ("chunk", chunk), ("memory_budget", memory_budget)):
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
            raise ValueError(f"{name} must be a positive int, got {v!r}")
    if memory_budget is None:
        return max_tokens or DEFAULT_MAX_TOKENS, chunk or DEFAULT_CHUNK
    if max_tokens is None:
        longest = max(lengths)
        max_tokens = prefill.plan_chunk(model.config, memory_budget, 1, longest)
    if chunk is None:
        chunk = prefill.head_rows(model.config.vocab_size, memory_budget)
    return max_tokens, chunk


class _Row:
    """One record's response positions as they come out of the prefill, sent through the head in
    pieces of ``chunk`` positions counted from the response start, as a one-call forward does."""

    def __init__(self, record, row, ids, chunk, apply_filters, factors=None):
        self.p, self.n = len(record.prompt_ids), len(record.response_ids)
        self.row, self.chunk = row, chunk
        self.target = ids[row, self.p : self.p + self.n]
        self.settings = (record.temperature, record.top_k if apply_filters else -1,
                         record.top_p if apply_filters else 1.0)
        self.factors = factors
        self.pending: torch.Tensor | None = None
        self.done = 0
        self.pieces: list[torch.Tensor] = []

    def feed(self, head, s: int, e: int, hidden: torch.Tensor) -> None:
        a, b = self.p - 1, self.p - 1 + self.n  # hidden positions that predict the response
        lo, hi = max(a, s), min(b, e)
        if lo >= hi:
            return
        seg = hidden[self.row, lo - s : hi - s]
        if self.pending is not None:
            seg, self.pending = torch.cat([self.pending, seg]), None
        k, final = 0, hi == b
        while seg.shape[0] - k >= self.chunk or (final and k < seg.shape[0]):
            take = min(self.chunk, seg.shape[0] - k)
            t = self.target[self.done : self.done + take]
            self.pieces.append(self._logprobs(head, seg[k : k + take], t))
            k, self.done = k + take, self.done + take
        if k < seg.shape[0]:
            self.pending = seg[k:].clone()  # not a view: the chunk's hidden states are freed

    def _logprobs(self, head, hidden, targets):
        if self.factors is None:
            return token_logprobs(head, hidden, targets, *self.settings)[0]
        logits = head(hidden)  # once; each temperature is a processing of the same logits
        t, top_k, top_p = self.settings
        return torch.stack([process_logits(logits, t * f, top_k, top_p).gather(-1, targets[:, None])[:, 0]
                            for f in self.factors], dim=-1)

    def result(self) -> torch.Tensor:
        assert self.done == self.n and self.pending is None
        return torch.cat(self.pieces).float().cpu()


@torch.inference_mode()
def logprobs(
    model: torch.nn.Module,
    records,
    *,
    max_tokens: int | None = None,
    chunk: int | None = None,
    memory_budget: int | None = None,
    prefill_mode: str = "auto",
    apply_filters: bool = True,
    temperature_factors=None,
    position_ids=None,
    progress=None,
    info: dict | None = None,
) -> list[torch.Tensor]:
    """Per record, the training forward's logprob of each recorded response token (fp32, CPU).

    ``records``: :class:`rla.rollout.rollouts.RolloutRecord` objects.

    Memory. ``max_tokens`` (default 16384) bounds the tokens of one forward step: records are
    packed into right-padded micro-batches of rows x longest <= ``max_tokens``, and a record longer
    than that is run as a chunked prefill (:mod:`rla.rollout.prefill`: query positions in chunks
    of ``max_tokens`` rounded down to a multiple of 512, earlier positions from a KV cache).
    ``chunk`` (default 1024) bounds the response positions sent through the LM head at once, so
    full-vocab fp32 logits never exist for a sequence. ``memory_budget`` (bytes) derives whichever
    of the two is not given from an estimate of the bytes per token
    (:func:`rla.rollout.prefill.layer_bytes_per_token`, :func:`~rla.rollout.prefill.head_bytes_per_row`).
    What stays and grows with the length is the KV cache and the chunk's causal mask.

    ``prefill_mode``: ``"auto"`` chunks a long micro-batch only when :func:`rla.rollout.prefill.check`
    at its geometry (its rows, padded length and prefill step) shows chunked prefill bit-identical
    to the one-call forward for this model as it is now (the diagnosis compares these logprobs with
    the engine's, so a chunking difference would read as rounding); otherwise it runs in one call.
    The check is itself a one-call forward of that size (cached per model state and geometry), so a
    micro-batch whose one-call forward is estimated not to fit the memory available is refused
    with a ``MemoryError`` before any forward. ``"always"`` chunks regardless (unchecked);
    ``"never"`` never.

    ``apply_filters=False`` ignores recorded top-k / top-p (the full tempered distribution, as
    most trainers compute it). ``temperature_factors``: a sequence of factors f; each record's
    result is then ``[n, len(f)]``, column j the logprobs at temperature ``f[j]`` x the record's (the
    forward runs once; a factor 1.0 column equals the plain result bit for bit).
    ``progress``: optional callable(done, total), called after every
    forward step (probe forwards included). ``position_ids``: per record, the position id of each
    of its tokens (prompt and response; default ``0..n-1``), to score a record as a trainer with
    other position ids would (``rla.diagnosis.positions``); the decoder runs as a training forward
    does (no cache, no attention mask), so transformers reads position ids that do not step by 1 as
    packed sequences (``find_packed_sequence_indices``): a restart at 0 begins a sequence that
    attends only to itself. ``info``: an optional dict, filled with what was done
    (sizes, how many records were chunked or run in one call, ``checks``: every geometry's check,
    ``check``: the first inexact one, else the largest).
    """
    records = list(records)
    if not records:
        raise ValueError("no records given")
    if prefill_mode not in PREFILL:
        raise ValueError(f"prefill_mode must be one of {PREFILL}, got {prefill_mode!r}")
    factors = None
    if temperature_factors is not None:
        factors = [float(f) for f in temperature_factors]
        if not factors or not all(f > 0 and f != float("inf") for f in factors):
            raise ValueError(f"temperature_factors must be positive finite numbers, got {temperature_factors!r}")
    decoder, head = decoder_and_head(model)
    vocab = model.config.vocab_size
    device = next(model.parameters()).device
    for n, r in enumerate(records):
        ids = list(r.prompt_ids) + list(r.response_ids)
        if not r.prompt_ids or not r.response_ids:
            raise ValueError(f"record {n}: prompt and response must both be non-empty")
        if min(ids) < 0 or max(ids) >= vocab:
            raise ValueError(f"record {n}: token ids outside the model's vocab [0, {vocab})")
    lengths = [len(r.prompt_ids) + len(r.response_ids) for r in records]
    if position_ids is not None:
        position_ids = [list(p) for p in position_ids]
        if len(position_ids) != len(records):
            raise ValueError(f"position_ids: {len(position_ids)} rows for {len(records)} records")
        for n, (p, L) in enumerate(zip(position_ids, lengths)):
            if len(p) != L or not all(isinstance(x, int) and x >= 0 for x in p):
                raise ValueError(f"record {n}: position_ids must be {L} non-negative ints (one per token), got "
                                 f"{len(p)} values")
    max_tokens, chunk = _resolve_sizes(model, lengths, max_tokens, chunk, memory_budget)
    groups = micro_batches(lengths, max_tokens)
    step = max(prefill.ALIGN, max_tokens // prefill.ALIGN * prefill.ALIGN)
    longest = [max(lengths[i] for i in g) for g in groups]
    pieces = [prefill.chunk_bounds(n, step) if len(g) * n > max_tokens else [(0, n)] for g, n in zip(groups, longest)]
    long = [len(p) > 1 for p in pieces]
    done, total, checks = 0, sum(len(p) for p in pieces), {}
    geometries = sorted({(len(g), n) for g, n, is_long in zip(groups, longest, long) if is_long})
    if any(long) and prefill_mode == "auto":
        checks = {geo: prefill.cached_check(model, rows=geo[0], length=geo[1], step=step) for geo in geometries}
        todo = [geo for geo, c in checks.items() if c is None]
        avail = prefill.available_bytes(device) if todo else None
        for r, n in todo:  # every check fits, or none runs
            need = prefill.one_call_bytes(model.config, r, n)
            if avail is not None and need > avail:
                raise MemoryError(
                    f"a micro-batch of {r} x {n} tokens would be chunked only where chunked prefill is bit-identical "
                    f"to its one-call forward at these sizes, and that forward, estimated {prefill.gib(need)} of "
                    f"activations, does not fit the {prefill.gib(avail)} available: it cannot be checked, so it is not "
                    "chunked by default. Use prefill_mode='always' (bounded memory; the logprobs may then differ from "
                    "the one-call forward's by rounding), or more memory."
                )
        probe = 2 * len(todo)
        for r, n in todo:
            base = done

            def probed(k, base=base):
                if progress is not None:
                    progress(base + k, total + probe)

            checks[(r, n)] = prefill.check(model, on_forward=probed, rows=r, length=n, step=step)
            done = base + 2
    chunk_it = {geo: prefill_mode == "always" or (prefill_mode == "auto" and checks[geo].exact) for geo in geometries}
    bounds = [p if is_long and chunk_it[(len(g), n)] else [(0, n)]
              for p, g, n, is_long in zip(pieces, groups, longest, long)]
    total = done + sum(len(b) for b in bounds)
    one_call = [i for i, (is_long, b) in enumerate(zip(long, bounds)) if is_long and len(b) == 1]
    inexact = [c for c in checks.values() if not c.exact]
    chk = inexact[0] if inexact else (checks[max(geometries, key=lambda geo: geo[0] * geo[1])] if checks else None)
    if one_call and prefill_mode == "auto":
        need = max(prefill.one_call_bytes(model.config, len(groups[i]), longest[i]) for i in one_call)
        avail = prefill.available_bytes(device)
        reason = "; ".join(dict.fromkeys(c.describe() for c in inexact))
        if avail is not None and need > avail:
            raise MemoryError(
                f"the longest record ({max(longest)} tokens) would run in one forward, estimated "
                f"{prefill.gib(need)} of activations, {prefill.gib(avail)} available: {reason}, so it is not "
                "chunked by default. Use attention that chunks exactly on this machine (its check says; SDPA did on the "
                "CPUs measured), or "
                "prefill_mode='always' (bounded memory; the logprobs then differ by rounding, of the size above)."
            )
        warnings.warn(f"{len(one_call)} record(s) longer than max_tokens={max_tokens} run in one forward "
                      f"(memory grows with their length, about {prefill.gib(need)}): {reason}.",
                      RuntimeWarning, stacklevel=2)
    out: list[torch.Tensor | None] = [None] * len(records)
    for group, n, b in zip(groups, longest, bounds):
        ids = torch.zeros((len(group), n), dtype=torch.long)
        for row, i in enumerate(group):
            r = records[i]
            ids[row, : lengths[i]] = torch.tensor(list(r.prompt_ids) + list(r.response_ids))
        ids = ids.to(device)
        pos = torch.arange(n, device=device)[None].expand(len(group), -1)
        if position_ids is not None:
            pos = pos.clone()
            for row, i in enumerate(group):
                pos[row, : lengths[i]] = torch.tensor(position_ids[i], device=device)
        rows = [_Row(records[i], row, ids, chunk, apply_filters, factors) for row, i in enumerate(group)]
        for s, e, hidden in prefill.forward_chunks(decoder, model.config, ids, pos, b):
            for row in rows:
                row.feed(head, s, e, hidden)
            del hidden
            done += 1
            if progress is not None:
                progress(done, total)
        for i, row in zip(group, rows):
            out[i] = row.result()
    if info is not None:
        info.update({
            "max_tokens": max_tokens,
            "chunk": chunk,
            "memory_budget": memory_budget,
            "prefill_mode": prefill_mode,
            "prefill_step": step,
            "records_chunked": sum(len(groups[i]) for i, bb in enumerate(bounds) if len(bb) > 1),
            "records_one_call": sum(len(groups[i]) for i in one_call),
            "check": chk.to_dict() if chk is not None else None,
            "checks": [c.to_dict() for c in checks.values()],
        })
    return out  # type: ignore[return-value]
