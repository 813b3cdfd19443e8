"""docs/diagnosis.md's bad-input table is whole, and the ratio histogram states what it cannot draw.

The table is rendered from ``tests/diagnosis/bad_input_cases.py``; this file checks that the
committed table is that render, that each row's command files exist and each ``-k`` name selects
a test in them, so a row cannot point at nothing.
"""

import dataclasses
import re
from pathlib import Path

import numpy as np
import torch

from repo_root import ROOT  # noqa: E402
DOC = ROOT / "docs" / "diagnosis.md"


def _table_rows():
    lines = DOC.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| bad input |"))
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip("|").split("|")])
    return rows


def _tests_in(path: Path) -> list[str]:
    return re.findall(r"^def (test_\w+)", path.read_text(), flags=re.M)


def test_the_committed_table_is_the_render_of_the_cases():
    import bad_input_cases

    start, end = bad_input_cases.table_in(DOC.read_text())
    committed = "\n".join(DOC.read_text().splitlines()[start:end])
    assert committed == bad_input_cases.render(), "run: python tests/diagnosis/bad_input_cases.py"
    assert len(bad_input_cases.CASES) == len(_table_rows())


def test_every_row_of_the_bad_input_table_has_a_command_that_selects_tests():
    rows = _table_rows()
    assert len(rows) >= 20
    for bad, outcome, check in rows:
        assert bad and outcome, (bad, outcome)
        m = re.fullmatch(r"`python -m pytest -q ((?:tests/\S+\.py ?)+)(?: -k (\"[^\"]+\"|\S+))?`", check)
        assert m, f"row {bad!r}: no pytest command in {check!r}"
        files = [ROOT / f for f in m.group(1).split()]
        assert all(f.is_file() for f in files), (bad, files)
        names = [n for f in files for n in _tests_in(f)]
        if m.group(2):
            for word in re.split(r"\s+(?:or|and)\s+", m.group(2).strip('"')):
                assert any(word in n for n in names), f"row {bad!r}: -k {word!r} selects no test in {files}"
    block = DOC.read_text().split("Check them all", 1)[1].split("```")[1]
    assert all((ROOT / f).is_file() for f in re.findall(r"tests/\S+\.py", block))


def test_ratio_tails_are_counted_and_stated(tmp_path):
    from rla.diagnosis.core import diagnose
    from rla.diagnosis.report import RATIO_RANGE, ratio_tails, write_report_files
    from rla.rl.bundled import bundled_task, load_bundled
    from rla.rollout.sampler import Sampler, SamplingParams

    torch.manual_seed(0)
    model, tok = load_bundled()
    prompts = [[tok.bos_token_id] + tok(p.prompt, add_special_tokens=False)["input_ids"]
               for p in bundled_task().sample(0, 4)]
    recs = Sampler(model, "vllm").generate(prompts, SamplingParams(max_new_tokens=16, seed=0, temperature=2.0))
    i = min(range(len(recs)), key=lambda k: min(recs[k].logprobs))
    lp = list(recs[i].logprobs)
    j = int(np.argmin(lp))
    assert lp[j] < -0.3  # the premise: a token whose mu can be raised past the clip range
    k = (j + 1) % len(lp)
    lp[j], lp[k] = 0.0, lp[k] - 0.7  # pi/mu = exp(lp[j]) < 0.74 and about 2.0: outside [0.8, 1.2]
    recs[i] = dataclasses.replace(recs[i], logprobs=lp)
    d = diagnose(model, recs, "vllm", regions=("rope",), detect=False)
    tails = ratio_tails(d)
    lo, hi = RATIO_RANGE
    for label, t in tails.items():
        rho = np.exp(d.deltas[label])
        assert (t["below"], t["above"]) == (int((rho < lo).sum()), int((rho > hi).sum()))
        assert t["below"] >= 1 and t["above"] >= 1 and t["min"] < lo and t["max"] > hi
    write_report_files(d, tmp_path)
    md = (tmp_path / "report.md").read_text()
    first = next(iter(tails.values()))
    assert f"({first['below']} below, {first['above']} above" in md and (tmp_path / "ratio_hist.png").is_file()
