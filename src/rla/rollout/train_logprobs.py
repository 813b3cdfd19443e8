"""Training-side logprobs of recorded rollout tokens: what pi_theta assigns to what mu sampled.

Memory stays bounded for long sequences: records are packed into micro-batches by a token
budget, the decoder runs without grad, and the LM head is applied only at response positions,
``chunk`` tokens at a time, so full-vocab fp32 logits never exist for a whole batch at once.
Temperature and top-k / top-p are applied exactly as the rollout engine applied them
(:func:`rla.rollout.sampling.process_logits`, with each record's own settings), so the comparison
measures the forward pass and nothing else.

Padding is on the right with plain causal attention and no mask: a real token never attends to a
later position, so right padding cannot change it.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from rla.rollout.sampling import process_logits

__all__ = ["logprobs", "micro_batches", "token_logprobs", "decoder_and_head"]


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


@torch.inference_mode()
def logprobs(
    model: torch.nn.Module,
    records,
    *,
    max_tokens: int = 16384,
    chunk: int = 1024,
    apply_filters: bool = True,
    progress=None,
) -> list[torch.Tensor]:
    """Per record, the training forward's logprob of each recorded response token (fp32, CPU).

    ``records``: :class:`rla.rollout.rollouts.RolloutRecord` objects. ``max_tokens`` bounds rows x length
    of a micro-batch; ``chunk`` bounds the response positions sent through the LM head at once.
    ``apply_filters=False`` ignores recorded top-k / top-p (the full tempered distribution, as
    most trainers compute it). ``progress``: optional callable(done, total) for progress bars.
    """
    records = list(records)
    if not records:
        raise ValueError("no records given")
    if max_tokens < 1 or chunk < 1:
        raise ValueError(f"max_tokens and chunk must be positive, got {max_tokens} and {chunk}")
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
    out: list[torch.Tensor | None] = [None] * len(records)
    groups = micro_batches(lengths, max_tokens)
    for done, group in enumerate(groups):
        longest = max(lengths[i] for i in group)
        ids = torch.zeros((len(group), longest), dtype=torch.long)
        for row, i in enumerate(group):
            r = records[i]
            ids[row, : lengths[i]] = torch.tensor(list(r.prompt_ids) + list(r.response_ids))
        ids = ids.to(device)
        pos = torch.arange(longest, device=device)[None].expand(len(group), -1)
        hidden = decoder(input_ids=ids, position_ids=pos, use_cache=False).last_hidden_state
        for row, i in enumerate(group):
            r = records[i]
            p, n_resp = len(r.prompt_ids), len(r.response_ids)
            h = hidden[row, p - 1 : p - 1 + n_resp]
            target = ids[row, p : p + n_resp]
            top_k = r.top_k if apply_filters else -1
            top_p = r.top_p if apply_filters else 1.0
            pieces = []
            for s in range(0, n_resp, chunk):
                pieces.append(token_logprobs(head, h[s : s + chunk], target[s : s + chunk], r.temperature, top_k,
                                             top_p)[0])
            out[i] = torch.cat(pieces).float().cpu()
        if progress is not None:
            progress(done + 1, len(groups))
    return out  # type: ignore[return-value]
