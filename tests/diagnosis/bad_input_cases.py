"""The cases of docs/diagnosis.md's bad-input table, and the renderer that writes the table from them.

Each :class:`Case` says what a bad input gets and which tests show it (files, and a ``-k``
expression selecting tests in them). ``tests/diagnosis/test_bad_input_table.py`` checks that the
committed table is exactly :func:`render` of :data:`CASES` and that every case's ``-k`` selects
tests. After changing a case, write the table with::

    python tests/diagnosis/bad_input_cases.py

(it replaces the table in docs/diagnosis.md and nothing else).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

DOC = Path(__file__).resolve().parents[2] / "docs" / "diagnosis.md"
HEADER = "| bad input | outcome | check |"


@dataclass(frozen=True)
class Case:
    bad: str
    outcome: str
    files: list
    k: str | None = None

    def check(self) -> str:
        k = "" if self.k is None else (f' -k "{self.k}"' if " " in self.k else f" -k {self.k}")
        return f"`python -m pytest -q {' '.join(self.files)}{k}`"


CASES = [
    Case('rollout logprobs corrupt (all -50)',
         'verdict `corrupt_logprobs`, no attribution, exit 3',
         ['tests/diagnosis/test_diagnosis_verdicts.py'], 'corrupt or cli_exits'),
    Case("records carry the wrong temperature, beyond rounding's size (sampled at 2.0, recorded 1.0)",
         'verdict `temperature` ("recorded 1, fits 2")',
         ['tests/diagnosis/test_diagnosis_verdicts.py'], 'wrong_temperature'),
    Case("records carry the wrong temperature, within rounding's size (sampled at 0.7 or 0.9, recorded 1.0: k3 2.4x / 0.36x the rounding scale)",
         'verdict `temperature` ("not rounding\'s shape", "recorded 1, fits 0.9"); read as rounding before the temperature fit',
         ['tests/diagnosis/test_temperature_fit.py'], 'within_roundings_size'),
    Case('raw (pre-temperature) logprobs recorded, hot (2.0)',
         "verdict `raw_logprobs`, names vLLM's `processed_logprobs`",
         ['tests/diagnosis/test_diagnosis_verdicts.py'], 'raw_logprobs'),
    Case("raw logprobs recorded, cool (0.7; within rounding's size)",
         'verdict `raw_logprobs` ("recorded 0.7, fits 1")',
         ['tests/diagnosis/test_temperature_fit.py'], 'cool'),
    Case('rollouts from another checkpoint (5% weight noise)',
         'verdict `different_model`',
         ['tests/diagnosis/test_diagnosis_verdicts.py'], 'another_checkpoint'),
    Case('rollouts from a nearby checkpoint (2% noise, k3 18x the scale; 0.5% noise, within it)',
         '`different_model` / `rounding_weights_unverified` (the records carry no `policy`), never `temperature` (the per-sequence temperature grid named the 2% one a temperature before the fit, on an AMD EPYC; on an Intel AVX-512 Xeon only 1 of 10 of its sequences is beyond rounding and the grid says `different_model` too)',
         ['tests/diagnosis/test_temperature_fit.py'], 'another_checkpoint'),
    Case('sampled at temperature 1, recorded as 0.01 or 0.1 (the records-temperature scale is 100x+ larger: k3 1.99 was read as rounding, exit 0)',
         'verdict `raw_logprobs` ("fit temperature 1 without top-k / top-p, not the recorded settings"), exit 3: the check runs on a rounding scale measured at temperature 1, no top-k / top-p, which the records cannot move',
         ['tests/diagnosis/test_yardstick.py'], 'cannot_inflate or cli_exits_3'),
    Case('sampled with top-p 0.8 / 0.9 / 0.95, recorded as 1.0 (read as rounding before)',
         'verdict `top_p_top_k`: the share of logprobs exactly 0.0 where the fp32 forward gives a surprisal of at least 1e-5 (97-99% of tokens here), exit 3',
         ['tests/diagnosis/test_yardstick.py'], 'top_p_sampled'),
    Case('a record with `temperature: 1e-30` (training logprobs silently 0.0 before)',
         "refused before any forward: `record 3 (line 4 of its rollout file), field 'temperature'`, below 1e-5 (vLLM's greedy threshold)",
         ['tests/diagnosis/test_yardstick.py'], 'degenerate_temperature'),
    Case('records saying `engine: "sglang"` diagnosed with `--profile vllm` (never read before)',
         "refused before any forward: `field 'engine': the records say 'sglang' (engine 'sglang') but the profile vllm-0.33 is a row calibrated on 'vllm'`; the engine is read from the rows' `calibration.engine`, so `vllm` and `vllm-0.33` pass",
         ['tests/diagnosis/test_yardstick.py'], 'engine_field'),
    Case('rollouts from a checkpoint with 1% weight noise (2.75x the scale); half the records from a 2%-noised checkpoint (8.4x); records without a `policy` field',
         'never rounding: verdict `different_model`, exit 3, where a sequence crosses its own bound (an Intel AVX-512 Xeon); else `rounding_weights_unverified`, exit 0, its attribution said to hold only for these weights (an AMD EPYC: 1% noise at 3.6x, no sequence crosses; the half-and-half case there is 10.05x, beyond the bound)',
         ['tests/diagnosis/test_yardstick.py'], 'weights_that'),
    Case('rollouts sampled by the policy one optimizer step earlier (Adam, lr 1e-5, one SFT step on the fp32 master weights; k3 inside the rounding scale, read as rounding before), records carrying `policy` (rla\'s sampler and `rla train` write it)',
         'verdict `stale_weights` before any forward, exit 3: the records\' `policy.weights` fingerprint is not the checkpoint\'s; report.json `policy_check` holds both. Without the field no test here separates it (a weight-delta fit did not: `results/diagnosis/weight_delta.md`), and the verdict is `rounding_weights_unverified` (next row); see Known limits',
         ['tests/diagnosis/test_stale_weights.py'], 'one_step_earlier or cli_exits_3'),
    Case('rollouts of the policy one optimizer step earlier, or of the checkpoint itself (true rounding), in records without a `policy` field (an engine or loop that does not write it)',
         'verdict `rounding_weights_unverified`, not `rounding`: the mismatch is of rounding\'s size, but the records do not say which weights sampled them, and stale rollouts measured 0.10-1.2x the rounding scale where true rounding measured 0.0014-0.27x (`results/diagnosis/weight_delta.md`), so nothing measured on them can tell the two apart; the attribution is shown as holding only if these weights sampled them, exit 0, report.json `verdict.ok` false, `verdict.attributed` true; the message says how to add the field. One record without it is enough',
         ['tests/diagnosis/test_weights_unverified.py'], 'not_rounding or unverified_without or cli_exits_0'),
    Case('records from two checkpoints mixed in one file, carrying `policy`',
         'verdict `stale_weights` naming the fingerprints, their recorded steps and the records of each, exit 3',
         ['tests/diagnosis/test_stale_weights.py'], 'mixed_checkpoints'),
    Case('a `policy` field that is malformed (not an object, unknown key, no `weights`, a bad fingerprint, a negative step) or a fingerprint of another rule',
         '`FILE:LINE: field \'policy\': ...` when reading; another rule refused naming the record and both rules (it cannot be compared), exit 2',
         ['tests/diagnosis/test_stale_weights.py'], 'validated or another_rule'),
    Case('profile that increases the mismatch',
         'verdict `profile_increases`, names the best-fitting profile, no negative percentage',
         ['tests/diagnosis/test_diagnosis_verdicts.py'], 'increases'),
    Case('duplicated records',
         'counted once, with a message; detection unchanged',
         ['tests/diagnosis/test_diagnosis_verdicts.py'], 'duplicates'),
    Case('fewer than 8 distinct sequences for detection',
         '"not called", with the z value',
         ['tests/diagnosis/test_diagnosis_verdicts.py'], 'too_few'),
    Case('sequence past `max_position_embeddings`',
         'refused before any forward, naming the record',
         ['tests/diagnosis/test_diagnosis_verdicts.py'], 'past_the_context'),
    Case('a record longer than `--max-tokens` (the 40,000-token case)',
         'chunked prefill where a check at its own sizes shows it bit-identical, progress after every chunk, memory bounded; the report\'s "Long records" says what was done',
         ['tests/rollout/test_long_inputs.py'], 'one_call_bits or bounded or progress or long_records'),
    Case('a long record whose attention cannot be chunked exactly at its sizes (eager attention on some CPUs; a planted attention that rounds differently beyond 2600 positions, which the short probe cannot see)',
         'one forward with a warning giving the measured difference, or, when its one-call forward would not fit the memory available (so it cannot be checked either), a `MemoryError` before any record runs',
         ['tests/rollout/test_long_inputs.py', 'tests/rollout/test_prefill_check_geometry.py'], 'eager or cannot_fit or short_probe or cached_inexact'),
    Case('`rla verify --tokens/--batch` beyond the memory available',
         'refused before the twin is built, with the estimate',
         ['tests/rollout/test_long_inputs.py'], 'verify_refuses'),
    Case('`--out` non-empty / a file / under a file / unwritable',
         'refused before any work (`--overwrite` replaces only a folder rla wrote, see below)',
         ['tests/cli/test_outputs.py'], 'non_empty or bad_paths or unwritable'),
    Case('`--device banana`, `--device cuda` without a GPU',
         'one-line error before work',
         ['tests/cli/test_outputs.py'], 'bad_paths or cuda'),
    Case('`--max-new-tokens 0`, `-n 0`, `--until-step -1`, `--max-tokens 0`, `--memory-budget 0`',
         'argparse error, exit 2, nothing created',
         ['tests/cli/test_outputs.py', 'tests/rollout/test_long_inputs.py'], 'numeric or memory_budget'),
    Case('`rla train` with no config; overrides without `out_dir=`',
         'refused',
         ['tests/cli/test_outputs.py'], 'train_needs'),
    Case('malformed YAML (train config, experiment grid)',
         '`FILE:LINE:COL: ... is not valid YAML: ...`',
         ['tests/cli/test_outputs.py'], 'train_needs'),
    Case('a report folder mixed from two runs',
         'cannot happen: `rla demo` and `rla diagnose` have separate default folders, reports are staged and moved into place, `report.json` records its inputs (model weights hash, rollouts hash, profile, versions, command)',
         ['tests/cli/test_outputs.py'], 'default_folder or staged'),
    Case('kill -9 of `rla demo` / `rla diagnose` at random moments',
         "the folder is the old report or the new one, `report.json`'s rollouts hash matches its rollouts",
         ['tests/cli/test_outputs.py'], 'kill_9'),
    Case('kill -9 of `rla train`',
         'resume is bit-identical',
         ['tests/rl/test_trainer.py'], 'kill'),
    Case("clip-leak tokens outside `ratio_hist.png`'s range [0.8, 1.2]",
         'drawn in the edge bins, counted on the plot and in report.md',
         ['tests/diagnosis/test_bad_input_table.py'], 'tails'),
    Case('random records, bytes, metric inputs, numeric flags',
         'only the documented errors',
         ['tests/test_fuzz.py']),
    Case('`--out .` or a folder above the current one, with `--overwrite`',
         'refused; nothing deleted',
         ['tests/cli/test_overwrite.py'], 'current_folder'),
    Case('`--overwrite` on a folder with files rla did not write (not in its `.rla-manifest.json`, or changed since), or files put there while rla works',
         'refused naming them, nothing deleted (the new output kept beside, its folder named)',
         ['tests/cli/test_overwrite.py'], 'did_not_write or added_or_changed or while_rla_works'),
    Case('`--out` that is or holds an input (the rollouts file, the model folder)',
         'refused before any work, with or without `--overwrite`',
         ['tests/cli/test_overwrite.py'], 'holding_an_input'),
    Case('`--out /proc/x`, `/sys/x` (a folder nothing can be written in)',
         '`cannot write there`, before the run (a write probe)',
         ['tests/cli/test_overwrite.py'], 'nothing_can_be_written'),
    Case('rollouts or weights changed while rla reads them',
         'error naming the file, no report (hashed before the work, checked after)',
         ['tests/cli/test_overwrite.py'], 'changed_mid_run'),
    Case('a 400-digit number in a numeric field (temperature, top_p, top_k, reward, logprobs, token ids)',
         "`FILE:LINE: field '...'` error, the number cut short, exit 2",
         ['tests/test_clear_errors.py'], '400_digit'),
    Case('`metadata` nested deeper than 200 levels',
         '`not valid JSON: nested more than 200 levels deep` (reading), `nested too deeply` (writing)',
         ['tests/test_clear_errors.py'], 'nested'),
    Case('a key given twice in a record or a profile file',
         'refused naming the key and the line',
         ['tests/test_clear_errors.py'], 'duplicate'),
    Case('a malformed `calibration` block in a profile file',
         '`FILE: calibration ...` naming the part',
         ['tests/test_clear_errors.py'], 'calibration'),
    Case('a truncated or shape-mismatched `*.safetensors` in `--model`',
         'error naming the file (and tensor, with both shapes) before any weights are read, exit 2',
         ['tests/test_clear_errors.py'], 'truncated_or_mismatched'),
    Case('a damaged training checkpoint',
         '`CheckpointError` naming the file and what to do',
         ['tests/test_clear_errors.py'], 'damaged_training'),
    Case('one sequence',
         'no attribution: `needs at least 2 distinct sequences`',
         ['tests/test_clear_errors.py'], 'single_sequence'),
    Case('random numbers of any size, nesting to 3000 levels, safetensors truncated anywhere, profile files with any part replaced',
         'only the documented errors',
         ['tests/test_fuzz.py'], 'any_size or nesting_depth or truncated_safetensors or malformed_files'),
    Case('two `rla train` on one `out_dir`',
         "the second refused naming the first's pid, host, start time and command; the first's run identical to an undisturbed one",
         ['tests/rl/test_run_safety.py'], 'two_writers or lock_names'),
    Case('`kill -9` of `rla experiment`',
         'its `rla train` children get SIGTERM and stop after their step; the next call finishes them, identical to a run never interrupted',
         ['tests/rl/test_run_safety.py'], 'kill_9'),
    Case('a run still written by an orphan of an earlier `rla experiment` when it is called again',
         'the orphan stopped (SIGTERM, SIGKILL after `--grace`); a writer it did not start refused',
         ['tests/rl/test_run_safety.py'], 'orphan'),
    Case('a full disk during a checkpoint write',
         'a clear error, the partial files removed, the previous checkpoint intact byte for byte; the resume is bit-identical',
         ['tests/rl/test_run_safety.py'], 'full_disk'),
    Case('`steps` changed on resume under `lr_schedule: cosine`',
         'refused (the cosine decays over `steps`); allowed under `constant`',
         ['tests/rl/test_lr_schedule.py'], 'cosine_schedule'),
    Case('`torch.save` / `copy.deepcopy` / `pickle` of an aligned model',
         'the copy is aligned, logits equal bit for bit, `rla.unalign` works on it; an `ops=` alignment refuses naming `rla.unalign` and `save_pretrained`',
         ['tests/alignment/test_align_pickle.py'], 'pickles or engine_ops'),
    Case('`model.float()` after `rla.align`',
         'a `RuntimeWarning` at the next forward (once): the alignment does nothing in fp32',
         ['tests/alignment/test_align_pickle.py'], 'float_after'),
    Case('`rla.align` of a model on the meta device',
         'refused before anything changes',
         ['tests/alignment/test_align_pickle.py'], 'meta_device'),
]


def render(cases=CASES) -> str:
    """The table, header and separator included, one line per case."""
    lines = [HEADER, "|---|---|---|"]
    for c in cases:
        for text in (c.bad, c.outcome):
            if "|" in text or "\n" in text:
                raise ValueError(f"a case's text may not hold '|' or a newline: {text!r}")
        lines.append(f"| {c.bad} | {c.outcome} | {c.check()} |")
    return "\n".join(lines)


def table_in(text: str) -> tuple[int, int]:
    """(first, end) line indices of the table in ``text``'s lines."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(HEADER))
    end = start
    while end < len(lines) and lines[end].startswith("|"):
        end += 1
    return start, end


def write(doc: Path = DOC) -> None:
    text = doc.read_text()
    lines = text.splitlines()
    start, end = table_in(text)
    doc.write_text("\n".join(lines[:start] + render().splitlines() + lines[end:]) + "\n")


if __name__ == "__main__":
    write()
    print(f"wrote the bad-input table ({len(CASES)} cases) into {DOC}", file=sys.stderr)
