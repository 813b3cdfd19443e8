"""The deliberately broken inputs of docs/triage.md's table, and the renderer that writes the table.

Each :class:`Case` is one broken input: how it is made from the bundled model's rollouts, the
verdict ``rla triage`` must give, and the test id that checks it
(``tests/diagnosis/test_triage.py::test_broken_input_gets_its_verdict[<name>]``). The test
checks every case's verdict and that the committed table is exactly :func:`render` of
:data:`CASES`. After changing a case, rewrite the table with::

    python tests/diagnosis/triage_cases.py
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

DOC = Path(__file__).resolve().parents[2] / "docs" / "triage.md"
BEGIN, END = "<!-- triage-table: begin -->", "<!-- triage-table: end -->"


@dataclass(frozen=True)
class Case:
    name: str
    broken: str
    verdict: str
    exit_code: int


CASES = [
    Case("rounding", "none: the vLLM-profile rollout stack's own records (true rounding mismatch)", "rounding", 0),
    Case("shift", "logprobs one token late (logprob j is token j+1's)", "shifted_positions", 10),
    Case("temperature", "scored at temperature 2.0, recorded 1.0", "temperature", 12),
    Case("raw_recorded", "raw logprobs (temperature 1, no filters) recorded as temperature 0.25", "raw_logprobs", 11),
    Case("vllm_raw_mode", "vLLM records read with `logprobs_mode='raw_logprobs'` at temperature 0.7", "raw_logprobs", 11),
    Case("top_p", "sampled with top-p 0.8, recorded as top-p 1.0", "top_p_top_k", 13),
    Case("not_renormalised", "top-p 0.8 at temperature 2 recorded, logprobs taken before renormalising over the kept tokens",
         "filters_not_renormalised", 14),
    Case("batch_variance", "a trainer whose forward depends on the micro-batch shape (planted: shape-seeded noise on "
         "the final hidden states)", "batch_variance", 15),
    Case("position_ids", "a verl batch whose row 3 has position ids off its attention mask", "position_ids", 16),
    Case("restart_positions", "the engine numbered the response's positions from 0 again (position ids restart)",
         "position_ids", 16),
    Case("left_padded_unmasked", "the engine scored left-padded rows without an attention mask (the pads attended to)",
         "padding", 20),
    Case("left_padded_no_position_ids", "the trainer's own logprobs scored left-padded without position ids "
         "(positions shifted by the padding), on this stack", "position_ids", 16),
    Case("trainer_logprobs", "the framework's own trainer logprobs from another checkpoint (5% weight noise)",
         "trainer_logprobs", 17),
    Case("stale_weights", "rollouts from a checkpoint with 5% weight noise", "beyond_rounding", 19),
    Case("one_step_stale", "rollouts from the policy one small optimizer step earlier (every weight moved by at most "
         "1e-5), the records carrying its weights fingerprint (`policy`)", "stale_weights", 18),
    Case("unrecorded_stale", "the same rollouts of the policy one step earlier, the records naming no weights "
         "(no `policy`): rounding-sized, so not called rounding", "rounding_weights_unverified", 0),
    Case("template", "the engine saw 4 template tokens after BOS that the records' prompt ids lack", "beyond_rounding", 19),
]


def render() -> str:
    rows = ["| broken input | verdict | exit | check |", "|---|---|---|---|"]
    for c in CASES:
        rows.append(f"| {c.broken} | `{c.verdict}` | {c.exit_code} | "
                    f"`python -m pytest -q tests/diagnosis/test_triage.py -k {c.name}` |")
    return "\n".join(rows)


def section(text: str) -> str:
    return text.split(BEGIN, 1)[1].split(END, 1)[0].strip("\n")


if __name__ == "__main__":
    text = DOC.read_text()
    if BEGIN not in text or END not in text:
        sys.exit(f"{DOC}: no {BEGIN} ... {END} markers")
    DOC.write_text(text.replace(BEGIN + "\n" + section(text) + "\n" + END, BEGIN + "\n" + render() + "\n" + END))
