"""The LM head point: whether the logits are rounded to ``lp`` before the logprob's softmax.

The head is one GEMM outside the three regions, but it changes every logprob: the logprob of a
token is ``log_softmax`` of the logits, and a bf16 logit has 8 significant bits (a logit near 16
moves in steps of 0.0625 nats before the softmax sees it). Notation as in ``docs/rounding.md``:
``h`` is the final norm's output (an ``lp`` tensor, the hidden state the head reads), ``W`` the
head's weight as the engine holds it (``RN(w)`` of a trainer's fp32 master weight), ``b`` its bias
where it has one; ``h @ W^T`` is the GEMM of ``lp`` operands with fp32 accumulation (every
product of two bf16 values is exact in fp32; the order of the sum is the running GEMM's, as for
every other GEMM the rows leave alone).

- ``lp``: logits = RN(h @ W^T + b), one rounding at the GEMM's store. HF's ``nn.Linear`` on bf16
  weights (or under bf16 autocast), vLLM's default (``head_dtype`` = the model dtype:
  ``LogitsProcessor._apply_head`` -> ``quant_method.apply`` -> ``F.linear``), SGLang's default
  (``LogitsProcessor._compute_lm_head``: ``torch.matmul(hidden_states.to(W.dtype), W.T)``), TRL's
  fused LM head without ``cast_lm_head_to_fp32`` (its tiles in the hidden state's dtype).
- ``fp32``: logits = h @ W^T + b kept in fp32, never rounded. vLLM with
  ``hf_overrides={"head_dtype": "float32"}`` (on CUDA ``torch.mm(h, W.t(), out_dtype=float32)``,
  elsewhere ``F.linear`` of the operands cast to fp32), SGLang with ``--enable-fp32-lm-head`` (on
  CUDA ``torch.mm(h, W.T, out_dtype=float32)``, elsewhere ``torch.matmul`` of fp32 casts). TRL's
  ``cast_lm_head_to_fp32=True`` computes fp32 logits too, but from the fp32 master weight itself
  (``lm_head.float()``), not from ``RN(w)``: after the first update its numbers are not the
  engine's even with an fp32 engine head.

Both then take the log-softmax in fp32 (vLLM ``Sampler.compute_logprobs``:
``logits.log_softmax(dim=-1, dtype=torch.float32)`` of the raw logits; SGLang: ``.float()`` of the
logits, then ``log_softmax`` or ``log(softmax)`` after temperature), so under ``lp`` the fp32
softmax reads bf16 values exactly upcast and under ``fp32`` the unrounded sums. The point is a
setting of the engine, not of its version: every built-in row holds its engine's default
(``lp``); a run started with the switch is described by ``row.replace(name=..., lm_head="fp32")``.
"""

from __future__ import annotations

__all__ = ["HEAD_POINTS", "HEAD_SETTINGS"]

#: The head point and its choices, the first HF eager's.
HEAD_POINTS: dict[str, tuple[str, str]] = {"lm_head": ("lp", "fp32")}

#: What makes each stack compute ``lm_head='fp32'`` (for messages and docs; the rows say the defaults).
HEAD_SETTINGS: dict[str, str] = {
    "vllm": "LLM(..., hf_overrides={'head_dtype': 'float32'}) / --hf-overrides '{\"head_dtype\": \"float32\"}'",
    "sglang": "--enable-fp32-lm-head (ServerArgs(enable_fp32_lm_head=True))",
    "trl": "GRPOConfig(cast_lm_head_to_fp32=True) (the training side; fp32 master weight, not RN(w))",
}
