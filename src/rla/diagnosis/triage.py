"""Numerics or plumbing? The checks to run before blaming rounding, in the order they rule things out.

Most "training-inference mismatch" is not rounding: logprobs shifted by a token, raw logprobs
compared with processed ones, a trainer that disagrees with itself across micro-batch sizes,
position ids that do not follow the padding, weights that are not the rollout's. :func:`triage`
checks the records for each, in :data:`ORDER`; every check returns a :class:`Finding` (found, clean
or not checked, its evidence as numbers), the first one found is the verdict, and only a run in
which none is found and the mismatch is within rounding's size is called rounding (and handed to
``rla diagnose`` for the region attribution).

The yardstick. Every comparison is a token-mean k3 (docs/metrics.md) between two sets of
logprobs of the recorded tokens. The reference is the model's fp32 forward; rounding's size for
this model and these sequences is the k3 between its bf16 forward and that fp32 forward at
temperature 1 without top-k / top-p (``scale``: settings the records cannot move; at the
recorded ones a wrong temperature would scale its own yardstick, and a top-p that keeps one token
makes it 0). An engine of the same weights differs from fp32 by about that much; two rounding
stacks of the same weights by about as much again (docs/diagnosis.md). Two thresholds, both
stated in the evidence:

- *beyond rounding*: k3 above ``FACTOR`` (10) x the scale, the settings check's factor;
- *explains the records*: an alternative (a shift, another temperature, unrenormalised filters)
  whose k3 against the records is at most ``1 / BETTER`` (a quarter) of the as-recorded one.

A plumbing verdict from an alternative reading needs three things: the records are more than
``SEEN`` (2) x the scale from the reference as recorded, the alternative is ``BETTER`` times
closer, and it brings them within rounding's size. (As recorded, the truth is the closest
reading: fitted to a bf16 forward of the same weights, the temperature lands within 0.05% of the
true one, docs/diagnosis.md.) Settings errors small enough to hide inside rounding's size are the
temperature fit's (``rla diagnose``), which reads rounding's *shape*, not its size.

Self-consistency. The same records are scored by the model's bf16 forward once per record
(micro-batch 1) and all in one micro-batch (one padded length): the k3 between the two is the
forward's own batch variance on this machine. When it is half or more of the records' mismatch,
the trainer disagrees with itself about as much as with the engine, and the engine is not the
problem (verl #6280: 5-10% of tokens outside [0.9, 1.1] in bf16 from micro-batching alone).

Positions. Rows whose position ids do not follow their attention mask (a framework dump that
carries both) are named as they are. Then the records' logprobs, and the trainer's own where the
input has them, are compared with the model's bf16 forward in four other layouts (the response's
positions restarting at 0, left pads attended to, left padding without position ids, positions
from 1; :mod:`rla.diagnosis.positions`): a layout ``BETTER`` times closer than the correct one and
within rounding's size is the verdict (``position_ids``, or ``padding`` for attended pads). A
uniform shift of positions moves a RoPE model by rounding alone, so the two shifting layouts are
seen only in logprobs of this very stack (the module says why): they are read for the trainer's
logprobs, the two layouts that change the context for the records' (and only where the records
are beyond rounding's size: no wrong context fits better than that). None is read once an earlier
check has found the cause.

Weights. The check that the records were sampled by these weights (a stale checkpoint after a
weight sync) is made from the records' ``policy`` fingerprints (``"weights"``), never from size:
size alone cannot tell one optimizer step of staleness from rounding (docs/diagnosis.md, "Known
limits"). When some record names no weights, a rounding-sized mismatch is therefore
``rounding_weights_unverified`` (exit 0, as ``rla diagnose`` calls it), not ``rounding``.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

import numpy as np

import rla.metrics as M
from rla.diagnosis.vocab import vocab_kl_of_records, vocab_line, vocab_summary

__all__ = ["Finding", "Triage", "triage", "ORDER", "EXIT_CODES", "FACTOR", "BETTER", "FACTORS_GRID", "SEEN"]

ORDER = ("shift", "settings", "self_consistency", "positions", "weights", "rounding")
"""The checks, in the order they run: each rules out a cause the later ones would misread."""

FACTOR = 10.0
BETTER = 4.0
SEEN = 2.0
#: Temperature factors tried against the records (one forward; 1.0 is the records' own).
FACTORS_GRID = (0.25, 0.33, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.1, 1.25, 1.43, 1.67, 2.0, 3.0, 4.0)
#: Records scored one at a time (micro-batch 1) against the whole batch: a forward each.
SELF_CONSISTENCY_RECORDS = 16
ZERO_SHARE = 0.05  # the settings check's rule: 5% exact zeros where fp32 says surprisal >= 1e-5

#: verdict -> exit status of ``rla triage`` (0: rounding-sized, nothing else found; 2: bad input).
EXIT_CODES = {
    "rounding": 0,
    "rounding_weights_unverified": 0,
    "shifted_positions": 10,
    "raw_logprobs": 11,
    "temperature": 12,
    "top_p_top_k": 13,
    "filters_not_renormalised": 14,
    "batch_variance": 15,
    "position_ids": 16,
    "trainer_logprobs": 17,
    "stale_weights": 18,
    "beyond_rounding": 19,
    "padding": 20,
}


@dataclass
class Finding:
    check: str
    status: str
    """``"found"``, ``"clean"`` or ``"not_checked"``."""
    verdict: str | None
    message: str
    evidence: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclass
class Triage:
    findings: list[Finding]
    verdict: str
    exit_code: int
    scale: float
    n_records: int
    n_tokens: int
    vocab: dict | None = None
    """``rla.metrics.vocab_kl`` over the records carrying ``top_logprobs`` (the trainer: the bf16 model), else None."""

    @property
    def first(self) -> Finding:
        return next(f for f in self.findings if f.verdict == self.verdict)

    def to_dict(self) -> dict:
        return {"verdict": self.verdict, "exit_code": self.exit_code, "rounding_scale_k3": self.scale,
                "n_records": self.n_records, "n_tokens": self.n_tokens,
                "findings": [f.to_dict() for f in self.findings], "vocab_kl": vocab_summary(self.vocab)}

    def summary(self) -> str:
        lines = [f"verdict: {self.verdict} (exit {self.exit_code}); {self.n_records} records, {self.n_tokens} tokens, "
                 f"rounding scale k3 {self.scale:.3g}"]
        for f in self.findings:
            lines.append(f"  {f.check:17s} {f.status:11s} {f.message}")
        if self.vocab is not None:
            lines.append("  " + vocab_line(self.vocab))
        return "\n".join(lines)


def _k3(a_rows, b_rows) -> float:
    """Token-mean k3 of ``a - b``; ``inf`` when ``a`` gives a recorded token no probability (a
    candidate top-k / top-p that drops it cannot be what sampled it)."""
    if any(not np.isfinite(np.asarray(r)).all() for r in a_rows):
        return math.inf
    a, m = M.pad_rows([np.asarray(r, dtype=np.float64) for r in a_rows])
    b, _ = M.pad_rows([np.asarray(r, dtype=np.float64) for r in b_rows])
    return M.mismatch(a, b, m)["mismatch/k3"]


def _rows(tensors) -> list[np.ndarray]:
    return [t.double().numpy() for t in tensors]


def _shift(rec, ref, scale) -> Finding:
    """Each shift is compared with the records as recorded on the same tokens: a shift by -1 drops
    every response's first token, which is often the least certain one, so its k3 is lower on
    that account alone."""
    as_recorded = _k3(ref, rec)
    ev = {"k3_as_recorded": as_recorded}
    keep = [i for i, r in enumerate(rec) if len(r) >= 2]
    pairs = {}
    for s in (1, -1):
        # only tokens the records call uncertain (surprisal >= 1e-5): near-certain tokens have
        # logprobs near 0 at every position, so any shift of them matches
        a, b, same = [], [], []
        for i in keep:
            bi = rec[i][:-1] if s > 0 else rec[i][1:]
            sel = bi < -1e-5
            if sel.any():
                b.append(bi[sel])
                a.append((ref[i][1:] if s > 0 else ref[i][:-1])[sel])
                same.append((ref[i][:-1] if s > 0 else ref[i][1:])[sel])
        if not b:
            continue
        pairs[s] = (_k3(a, b), _k3(same, b))
        ev[f"k3_shifted_{s:+d}"], ev[f"k3_unshifted_same_tokens_{s:+d}"] = pairs[s]
    if not pairs:
        return Finding("shift", "not_checked", None, "no record has two tokens of which one is uncertain (recorded "
                       "surprisal >= 1e-5): a shift cannot be seen", ev)
    s, (best, base) = min(pairs.items(), key=lambda kv: kv[1][0] / max(kv[1][1], 1e-300))
    if base > SEEN * scale and best * BETTER <= base and best <= FACTOR * scale:
        side = "one token late (logprob j is token j+1's)" if s > 0 else "one token early (logprob j is token j-1's)"
        return Finding("shift", "found", "shifted_positions",
                       f"the logprobs sit {side}: k3 {best:.3g} shifted by {s:+d}, {base:.3g} unshifted on the same tokens", ev)
    return Finding("shift", "clean", None, f"no shift explains the records (k3 {as_recorded:.3g} as recorded; shifted "
                   f"by {s:+d} {best:.3g} against {base:.3g} unshifted on the same tokens)", ev)


def _settings(records, rec, ref, scale, fp32, logprobs) -> Finding:
    T = {r.temperature for r in records}
    filtered = any(r.top_p < 1.0 or r.top_k != -1 for r in records)
    modes = {(r.metadata or {}).get("logprobs_mode") for r in records} - {None}
    ev = {"logprobs_mode": sorted(modes)}
    if "raw_logprobs" in modes and (T != {1.0} or filtered):
        return Finding("settings", "found", "raw_logprobs",
                       "the engine returned raw logprobs (vLLM logprobs_mode='raw_logprobs', its default), before "
                       f"temperature {sorted(T)} / top-k / top-p: start vLLM with logprobs_mode='processed_logprobs'", ev)
    if not filtered:
        zeros = [(np.asarray(r) == 0.0) & (x < -1e-5) for r, x in zip(rec, ref)]
        share = float(np.concatenate(zeros).mean())
        ev["zero_share"] = share
        if share >= ZERO_SHARE:
            return Finding("settings", "found", "top_p_top_k",
                           f"{share:.0%} of the logprobs are exactly 0.0 where the fp32 forward gives a surprisal of at "
                           "least 1e-5: sampled with a top-p / top-k (or a far lower temperature) the records do not say",
                           ev)
    as_recorded = _k3(ref, rec)
    ev["k3_as_recorded"] = as_recorded
    best = (1.0, filtered, as_recorded)
    variants = [True] if not filtered else [True, False]
    for apply in variants:
        grid = logprobs(fp32, records, temperature_factors=FACTORS_GRID, apply_filters=apply)
        for j, f in enumerate(FACTORS_GRID):
            k = _k3(ref if (f == 1.0 and apply) else [g[:, j].double().numpy() for g in grid], rec)
            ev[f"k3_T_x{f}" + ("" if apply or not filtered else "_unfiltered")] = k
            if k < best[2]:
                best = (f, apply and filtered, k)
    f, kept_filters, k = best
    if as_recorded > SEEN * scale and k * BETTER <= as_recorded and k <= FACTOR * scale:
        if len(T) == 1 and abs(next(iter(T)) * f - 1.0) < 0.05 and not kept_filters:  # within the grid's spacing
            return Finding("settings", "found", "raw_logprobs",
                           f"the logprobs fit temperature 1 without top-k / top-p (k3 {k:.3g}), not the recorded "
                           f"temperature {next(iter(T))} (k3 {as_recorded:.3g}): raw logprobs were recorded", ev)
        if f == 1.0:
            return Finding("settings", "found", "filters_not_renormalised",
                           f"the logprobs fit the recorded temperature without top-k / top-p renormalisation (k3 {k:.3g}, "
                           f"{as_recorded:.3g} renormalised): the engine returned logprobs before renormalising over the "
                           "kept tokens; compare with apply_filters=False or record top_p=1, top_k=-1", ev)
        return Finding("settings", "found", "temperature",
                       f"the logprobs fit temperature x{f} (k3 {k:.3g}) better than the recorded one ({as_recorded:.3g})", ev)
    return Finding("settings", "clean", None, "the recorded temperature and filters fit best (temperatures x"
                   f"{FACTORS_GRID[0]}..x{FACTORS_GRID[-1]}" + (", with and without renormalised filters" if filtered else "")
                   + ")", ev)


def _self_consistency(records, rec, bf16, logprobs, alone_n) -> tuple[Finding, list[np.ndarray]]:
    together = _rows(logprobs(bf16, records, max_tokens=10**9))
    if alone_n == 0:
        return Finding("self_consistency", "not_checked", None, "not checked (alone=0: no record scored on its own)",
                       {}), together
    some = records[:alone_n]
    alone = [_rows(logprobs(bf16, [r]))[0] for r in some]
    var = _k3(alone, together[:len(some)])
    m = _k3(together[:len(some)], rec[:len(some)])
    ev = {"k3_microbatch_1_vs_all": var, "k3_records_vs_bf16": m,
          "tokens_equal": float(np.mean(np.concatenate([a == b for a, b in zip(alone, together)])))}
    if var > 0 and var >= 0.5 * m:
        return Finding("self_consistency", "found", "batch_variance",
                       f"the bf16 forward differs from itself between micro-batch 1 and one batch by k3 {var:.3g}, "
                       f"{var / m:.2g}x the records' mismatch ({m:.3g}): the trainer's own batch variance, not the engine", ev), together
    return Finding("self_consistency", "clean", None,
                   f"micro-batch 1 vs one batch: k3 {var:.3g} ({ev['tokens_equal']:.1%} of logprobs equal), under half "
                   f"the records' mismatch {m:.3g}", ev), together


_READING_TEXT = {
    "restart_at_response": "the response's position ids restart at 0",
    "left_padded_unmasked": "left padding attended to (no attention mask over the pads)",
    "left_padded_no_position_ids": "left padding without position ids (each row's positions shifted by its padding)",
    "positions_from_1": "position ids from 1 (cumsum(attention_mask) without the - 1)",
}


def _positions(records, rec, together, scale, bad_positions, trainer_logprobs, trainer_field, bf16, fp32,
               logprobs, alone_n, earlier_found) -> Finding:
    from rla.diagnosis import positions as P

    ev = {"rows_with_bad_position_ids": list(bad_positions)}
    if bad_positions:
        return Finding("positions", "found", "position_ids",
                       f"{len(bad_positions)} row(s) carry position ids that are not cumsum(attention_mask) - 1 over "
                       f"their tokens (rows {list(bad_positions)[:5]}): RoPE sees other positions than the engine did", ev)
    some = records[:alone_n]
    # which logprobs to read, in which layouts: the trainer's in all four where they are not this
    # model's forward bit for bit (a uniform shift is seen only there); the records' in the two
    # that change the context, only where they are beyond rounding (else no wrong context fits
    # better); none once an earlier check has found the cause
    subjects = []
    if some and not earlier_found:
        if trainer_logprobs is not None and _k3(trainer_logprobs, together) > 0:
            subjects.append((trainer_field or "trainer logprobs", [np.asarray(t, dtype=np.float64)
                                                                    for t in trainer_logprobs[:len(some)]], P.READINGS))
        if _k3(together, rec) > SEEN * scale:
            subjects.append(("the records' logprobs", rec[:len(some)], P.CONTEXT))
    ev["records_read"] = len(some) if subjects else 0
    if subjects:
        names = [n for n in P.READINGS if any(n in s[2] for s in subjects)]
        correct, alternatives = P.readings(bf16, some, logprobs, names)
    for name, rows, layouts in subjects:
        got = P.check(rows, correct, {n: alternatives[n] for n in layouts}, _k3, scale, better=BETTER, factor=FACTOR,
                      scale_in=lambda reading: P.scale_in(bf16, fp32, some, reading, logprobs, _k3))
        ev[f"layouts ({name})"] = got
        if got["found"]:
            best = got["found"]
            return Finding("positions", "found", P.VERDICTS[best],
                           f"{name} fit {_READING_TEXT[best]}: k3 {got['k3_' + best]:.3g} in that layout, "
                           f"{got['k3_correct_layout']:.3g} right-padded with positions 0..n-1", ev)
    if trainer_logprobs is None:
        why = ("an earlier check explains the records" if earlier_found else "alone=0" if not some
               else "the records are within rounding's size of this model's forward")
        return Finding("positions", "clean", None, "no row's position ids are off its attention mask; " + (
                           "no padding or position layout (restarted, unmasked left pads) fits the records better"
                           if ev["records_read"] else f"padding and position layouts not read ({why})")
                       + "; no trainer logprobs in the input to compare", ev)
    t = _k3(trainer_logprobs, rec)
    own = _k3(together, rec)
    ev.update({"k3_trainer_vs_records": t, "k3_model_vs_records": own, "trainer_field": trainer_field})
    if t > FACTOR * max(own, scale):
        return Finding("positions", "found", "trainer_logprobs",
                       f"the trainer's own logprobs ({trainer_field}) are k3 {t:.3g} from the records, this model's forward "
                       f"{own:.3g}: the trainer scores differently (template or its weights; no padding or position "
                       "layout tried here explains it)", ev)
    return Finding("positions", "clean", None, f"the trainer's {trainer_field} agree with the records as this model's "
                   f"forward does (k3 {t:.3g} vs {own:.3g}); no padding or position layout fits either better", ev)


def _weights(records, model) -> Finding:
    """The weights slot from the records' own ``policy`` fingerprints (:mod:`rla.diagnosis.policy`):
    records sampled by other weights than ``model``'s are ``stale_weights``; records that name no
    weights leave the slot not checked (a policy one optimizer step old is rounding-sized)."""
    from rla.diagnosis.policy import check_policy

    carried = sum(r.policy is not None for r in records)
    if not carried:
        return Finding("weights", "not_checked", None,
                       "not checked: no record says which weights sampled it (the `policy` field, "
                       "rla.rollout.fingerprint); a stale checkpoint one optimizer step old is rounding-sized")
    check = check_policy(model, records, range(len(records)))
    if check.stale:
        return Finding("weights", "found", "stale_weights", check.message, check.to_dict())
    rest = "" if carried == len(records) else f"; {len(records) - carried} record(s) name none and are unchecked"
    return Finding("weights", "clean", None, f"{carried} of {len(records)} records name the weights that sampled them, "
                   f"and they are this checkpoint's ({check.checkpoint}){rest}", check.to_dict())


def triage(records, *, bf16, fp32, trainer_logprobs=None, trainer_field=None, bad_positions=(),
           weights_check=None, alone: int = SELF_CONSISTENCY_RECORDS) -> Triage:
    """Run :data:`ORDER` on ``records`` with the model in bf16 (the trainer's stack) and fp32 (the
    reference). ``trainer_logprobs``: the framework trainer's own logprobs of the same tokens
    (from :class:`rla.rollout.framework_dumps.Dump`); ``bad_positions``: rows whose position ids
    do not follow their mask. ``weights_check``: a callable(records) -> Finding for the
    ``"weights"`` slot; without one it is reported as not checked. ``alone``: how many records
    the self-consistency check scores one at a time (a forward each), and the positions check
    reads in its padding and position layouts (one forward of them per layout; 0: neither)."""
    from rla.rollout.train_logprobs import logprobs

    from rla.diagnosis.inputs import check_records

    records = list(records)
    if len(records) < 1:
        raise ValueError("no records to triage")
    check_records(fp32, records)  # greedy temperatures and positions past the context, before any forward
    rec = [np.asarray(r.logprobs, dtype=np.float64) for r in records]
    ref = _rows(logprobs(fp32, records))
    consistency, together = _self_consistency(records, rec, bf16, logprobs, alone)
    fixed = [dataclasses.replace(r, temperature=1.0, top_p=1.0, top_k=-1) for r in records]
    if all((r.temperature, r.top_p, r.top_k) == (1.0, 1.0, -1) for r in records):
        scale = _k3(together, ref)
    else:  # the yardstick at settings the records cannot move (a top-p that keeps one token makes it 0)
        scale = _k3(_rows(logprobs(bf16, fixed, max_tokens=10**9)), _rows(logprobs(fp32, fixed)))
    scale = max(scale, 1e-300)
    findings = [_shift(rec, ref, scale)]
    findings.append(_settings(records, rec, ref, scale, fp32, logprobs))
    findings.append(consistency)
    findings.append(_positions(records, rec, together, scale, bad_positions, trainer_logprobs, trainer_field, bf16,
                               fp32, logprobs, alone, any(f.status == "found" for f in findings)))
    findings.append(weights_check(records) if weights_check is not None else _weights(records, bf16))
    weights = findings[-1]
    m = _k3(ref, rec)
    ev = {"k3_records_vs_fp32": m, "rounding_scale_k3": scale, "ratio": m / scale, "factor": FACTOR}
    if m <= FACTOR * scale and not (weights.status == "clean" and weights.evidence.get("verified") is not False):
        findings.append(Finding("rounding", "found", "rounding_weights_unverified",
                                f"k3 {m:.3g} = {m / scale:.2g}x the rounding scale: rounding-sized, but not called "
                                "rounding: not every record says which weights sampled it (weights, above), and "
                                "rollouts of a policy one optimizer step stale are rounding-sized too; `rla diagnose` "
                                "attributes it to regions on the condition that these weights sampled them", ev))
    elif m <= FACTOR * scale:
        findings.append(Finding("rounding", "found", "rounding",
                                f"k3 {m:.3g} = {m / scale:.2g}x the rounding scale: rounding-sized; `rla diagnose` "
                                "attributes it to regions", ev))
    else:
        findings.append(Finding("rounding", "found", "beyond_rounding",
                                f"k3 {m:.3g} = {m / scale:.3g}x what rounding produces for this model: not rounding. Not "
                                "checkable here: weights that are not the rollout's, another chat template or prompt ids "
                                "than the engine saw, another model", ev))
    verdict = next(f.verdict for f in findings if f.status == "found")
    return Triage(findings, verdict, EXIT_CODES[verdict], scale, len(records), int(sum(len(r) for r in rec)),
                  vocab=vocab_kl_of_records(bf16, records))
