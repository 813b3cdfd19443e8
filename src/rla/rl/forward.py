"""The training forward: log pi_theta and entropy of the sampled tokens, in bounded memory.

``PolicyForward`` wraps an HF causal LM so that the decoder *and* the chunked LM head run inside
one module call. That matters for FSDP2: the wrapper is the root FSDP module, so the embedding,
final norm and LM head are unsharded for the whole call (and for the backward recomputation of
the head chunks), and the decoder layers are sharded units of their own.

Memory: a micro-batch is right-padded ``[rows, longest]`` (packed by a token budget, see
``micro_batches``); the LM head is applied only at response positions, ``chunk`` tokens at a
time, and each chunk runs under activation checkpointing, so at most one chunk's full-vocab fp32
logits exist at any time, in the forward and in the backward. Right padding with plain causal
attention and no mask is exact: a real token never attends to a later position.

Logprobs follow the engines' convention (``rla.rollout.sampling.process_logits``: fp32 logits divided by
the temperature, top-k / top-p, log_softmax), the same function the rollout sampler calls, so the
ratio measures the forward pass and nothing else. The head-to-logprob step is
``rla.rollout.train_logprobs.token_logprobs``, shared with ``rla.logprobs`` (which measures without
grad, per record's settings); see its docstring for why the batching stays apart. The entropy is that of the same processed
distribution, computed from the same chunks and detached.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch.utils.checkpoint import checkpoint

from rla.rl.grpo import entropy_from_logprobs
from rla.rollout.train_logprobs import decoder_and_head, token_logprobs

__all__ = ["PolicyForward", "MicroBatch", "make_micro_batch"]


@dataclass
class MicroBatch:
    """Right-padded sequences and where their response tokens are (flat layout)."""

    input_ids: torch.Tensor  # [rows, longest] long
    position_ids: torch.Tensor  # [rows, longest] long
    rows: torch.Tensor  # [N] row of each response token
    cols: torch.Tensor  # [N] column whose hidden state predicts it (its position - 1)
    targets: torch.Tensor  # [N] the sampled token ids
    seq: torch.Tensor  # [N] caller's sequence index of each token
    index: list[int]  # caller's sequence indices, one per row

    def to(self, device) -> "MicroBatch":
        t = lambda x: x.to(device, non_blocking=True)  # noqa: E731
        return MicroBatch(t(self.input_ids), t(self.position_ids), t(self.rows), t(self.cols),
                          t(self.targets), t(self.seq), self.index)


def make_micro_batch(prompts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]],
                     index: Sequence[int], pad_id: int = 0) -> MicroBatch:
    """Pack ``prompt + response`` rows (right-padded) for the sequences ``index``."""
    lengths = [len(p) + len(r) for p, r in zip(prompts, responses)]
    longest = max(lengths)
    ids = torch.full((len(lengths), longest), pad_id, dtype=torch.long)
    rows, cols, targets, seq = [], [], [], []
    for row, (p, r, i) in enumerate(zip(prompts, responses, index)):
        if not p or not r:
            raise ValueError(f"sequence {i}: prompt and response must both be non-empty")
        ids[row, : len(p) + len(r)] = torch.tensor(list(p) + list(r), dtype=torch.long)
        n = len(r)
        rows += [row] * n
        cols += range(len(p) - 1, len(p) - 1 + n)
        targets += list(r)
        seq += [i] * n
    pos = torch.arange(longest, dtype=torch.long)[None].expand(len(lengths), -1).contiguous()
    as_long = lambda x: torch.tensor(x, dtype=torch.long)  # noqa: E731
    return MicroBatch(ids, pos, as_long(rows), as_long(cols), as_long(targets), as_long(seq), list(index))


class PolicyForward(torch.nn.Module):
    """``forward(micro_batch) -> (logprobs [N] fp32, entropy [N] fp32 detached)``.

    ``lm`` is an HF causal LM (``get_decoder()`` / ``get_output_embeddings()``). Sampling
    settings are fixed per run, as the rollouts' are.
    """

    def __init__(self, lm: torch.nn.Module, *, temperature: float, top_k: int = -1, top_p: float = 1.0,
                 chunk: int = 1024):
        super().__init__()
        decoder_and_head(lm)  # an HF causal LM, or a TypeError now rather than at the first step
        self.lm = lm
        self.temperature, self.top_k, self.top_p, self.chunk = temperature, top_k, top_p, chunk

    def _head(self, h: torch.Tensor, targets: torch.Tensor):
        token_logp, logp = token_logprobs(self.lm.get_output_embeddings(), h, targets, self.temperature, self.top_k,
                                          self.top_p)
        with torch.no_grad():
            entropy = entropy_from_logprobs(logp.detach())
        return token_logp, entropy

    def forward(self, mb: MicroBatch):
        out = self.lm.get_decoder()(input_ids=mb.input_ids, position_ids=mb.position_ids, use_cache=False)
        h = out.last_hidden_state[mb.rows, mb.cols]
        lps, ents = [], []
        for s in range(0, h.shape[0], self.chunk):
            args = (h[s : s + self.chunk], mb.targets[s : s + self.chunk])
            if torch.is_grad_enabled():
                lp, ent = checkpoint(self._head, *args, use_reentrant=False)
            else:
                lp, ent = self._head(*args)
            lps.append(lp)
            ents.append(ent)
        return torch.cat(lps).float(), torch.cat(ents).float()
