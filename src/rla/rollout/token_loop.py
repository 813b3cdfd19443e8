"""The sampling half of a decode step, on static buffers and without a host sync.

Per token, the rollout sampler turns the model's next-token logits into the engine's processed
logprobs (:func:`rla.rollout.sampling.process_logits`), draws a token (:func:`sample_token`,
bit-identical to ``torch.multinomial``), records the token and its logprob, and marks the rows
that stopped: ~20 small op launches per token, and ``torch.multinomial`` blocked the host once
per token (an ``.item()`` check). Here every tensor
they touch lives at a fixed address (the logits they read, the ``[batch, width]`` output columns
they write at a device-side column index, the done mask, the generator), so
``rla.rollout.static_decode.StaticDecoder`` can capture K tokens of sampling *and* decoding as one
CUDA graph, and the dynamic-cache path runs the very same step eagerly.

What a step records is what ``Sampler.generate`` always returned: after a row has stopped it gets
the pad token with logprob 0 (dropped when the records are cut at the stop token), and the stop
token itself is kept with its logprob.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rla.rollout.sampling import process_logits, sample_token

__all__ = ["LoopParams", "TokenLoop"]


@dataclass(frozen=True)
class LoopParams:
    """What a captured token loop bakes in: the sampling settings and the stop ids (sorted)."""

    temperature: float
    top_k: int
    top_p: float
    stop_ids: tuple[int, ...]


class TokenLoop:
    """Static buffers for ``batch`` rows of up to ``width`` sampled tokens, and the step over them.

    ``generator`` is the loop's own and persists across calls (a CUDA graph that samples must
    register the generator it draws from once, at capture); reseed it per rollout with
    ``generator.manual_seed``.
    """

    def __init__(self, batch: int, width: int, vocab: int, logits_dtype: torch.dtype, device, pad_id: int):
        if batch < 1 or width < 1 or vocab < 1:
            raise ValueError(f"a token loop needs batch, width and vocab >= 1, got {batch}, {width}, {vocab}")
        self.batch, self.width, self.pad_id = batch, width, pad_id
        self.device = torch.device(device)
        self.logits = torch.zeros((batch, vocab), dtype=logits_dtype, device=self.device)
        self.ids = torch.zeros((batch, width), dtype=torch.long, device=self.device)
        self.logprobs = torch.zeros((batch, width), dtype=torch.float32, device=self.device)
        self.done = torch.zeros(batch, dtype=torch.bool, device=self.device)
        self.column = torch.zeros(1, dtype=torch.long, device=self.device)
        self.saw_nan = torch.zeros((), dtype=torch.bool, device=self.device)
        self.generator = torch.Generator(device=self.device)
        self._stops: dict[tuple[int, ...], torch.Tensor] = {}

    def state(self) -> list[torch.Tensor]:
        """Every buffer a step writes (for a warm-up that must leave no trace)."""
        return [self.logits, self.ids, self.logprobs, self.done, self.column, self.saw_nan]

    def begin(self, logits: torch.Tensor) -> None:
        """Start a rollout from the prefill's next-token logits ``[batch, vocab]``."""
        if logits.shape != self.logits.shape or logits.dtype != self.logits.dtype:
            raise ValueError(
                f"logits of {tuple(logits.shape)} {logits.dtype} do not fit the token loop's "
                f"{tuple(self.logits.shape)} {self.logits.dtype}"
            )
        self.logits.copy_(logits)
        self.done.zero_()
        self.column.zero_()
        self.saw_nan.zero_()

    def stops(self, stop_ids: tuple[int, ...]) -> torch.Tensor:
        """The stop ids as a device tensor, one per tuple, kept (a captured graph reads its address)."""
        if stop_ids not in self._stops:
            self._stops[stop_ids] = torch.tensor(stop_ids, dtype=torch.long, device=self.device)
        return self._stops[stop_ids]

    def sample(self, params: LoopParams) -> torch.Tensor:
        """Sample one token per row from :attr:`logits`, record it, return it as ``[batch, 1]``.

        The returned token is the pad id for rows that had already stopped.
        """
        stops = self.stops(params.stop_ids)
        logp = process_logits(self.logits, params.temperature, params.top_k, params.top_p)
        probs = logp.exp()
        # torch.multinomial refused NaN probabilities with a host check; flag them here instead
        torch.logical_or(self.saw_nan, probs.isnan().any(), out=self.saw_nan)
        token = sample_token(probs, self.generator)
        lp = logp.gather(-1, token)
        stopped = self.done[:, None]
        token = token.masked_fill(stopped, self.pad_id)
        lp = lp.masked_fill(stopped, 0.0)
        self.ids.index_copy_(1, self.column, token)
        self.logprobs.index_copy_(1, self.column, lp)
        self.column.add_(1)
        # (token == stop).any() rather than torch.isin: the same mask from plain elementwise ops
        torch.logical_or(self.done, (token == stops).any(-1), out=self.done)
        return token

    def result(self, steps: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The first ``steps`` sampled columns on the host: token ids (long) and logprobs (fp64)."""
        if bool(self.saw_nan):
            raise FloatingPointError(
                "the model's next-token probabilities contained NaN during the rollout "
                "(torch.multinomial would have refused them): check the weights and inputs"
            )
        return self.ids[:, :steps].cpu(), self.logprobs[:, :steps].double().cpu()
