"""lab/checks/check_results.py: every number the README's "Results so far" and results/README.md cite
(between render markers) equals its value rendered from the results' files; a changed number is
caught, a reworded sentence is not, a claim whose markers are gone is not skipped."""

import importlib.util
import sys

from repo_root import ROOT


def _checker():
    here = str(ROOT / "lab" / "checks")
    if here not in sys.path:
        sys.path.insert(0, here)
    spec = importlib.util.spec_from_file_location("check_results", ROOT / "lab" / "checks" / "check_results.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["check_results"] = mod  # dataclasses look their module up by name
    spec.loader.exec_module(mod)
    return mod


def _plant(mod, texts, where, claim, index, new):
    """``texts`` with marker ``claim#index`` of ``texts[where]`` holding ``new``."""
    text = texts[where]
    (mk,) = [mk for mk in mod.markers(text) if (mod.slug(claim), index) in mk["names"]]
    a, b = mk["span"]
    return {**texts, where: text[:a] + new + text[b:]}


def test_no_claim_mismatches_its_files():
    rows = _checker().run_all(ROOT)
    bad = [r for r in rows if r["status"] != "ok"]
    assert not bad, "\n".join(f"{r['claim']}: written {r['written']}, recomputed {r['recomputed']} ({r['status']})" for r in bad)
    # not an empty pass: every claim is recomputed (none left "not recomputable")
    assert len(rows) >= 41


def test_an_altered_readme_number_is_a_mismatch():
    mod = _checker()
    texts = mod.readme_texts(ROOT)
    assert "<!--n:grpo-step-0-k3-ratio#2:00.0-->22.5<!--/n-->x (qwen3-10m) at step 0" in texts["README"]
    rows = {r["claim"]: r for r in mod.run_all(ROOT, _plant(mod, texts, "README", "GRPO step-0 k3 ratio", 2, "25.5"))}
    row = rows["GRPO step-0 k3 ratio"]
    assert row["status"] == "MISMATCH" and row["written"] == "18.8, 25.5" and row["recomputed"] == "18.8, 22.5"
    assert sum(r["status"].startswith("MISMATCH") for r in rows.values()) == 1


def test_rewording_the_results_section_changes_nothing():
    mod = _checker()
    texts = mod.readme_texts(ROOT)
    reworded = texts["README"].replace(" the ", " the very ").replace("**", "").replace(" collapsed in ", " fell over in ")
    assert reworded != texts["README"]
    assert all(r["status"] == "ok" for r in mod.run_all(ROOT, {**texts, "README": "New words. " + reworded}))


def test_a_removed_claim_is_a_mismatch_not_a_skip():
    mod = _checker()
    texts = mod.readme_texts(ROOT)
    name = mod.slug("GRPO rounded inv_freq collapses")
    text = texts["README"]
    for mk in reversed(mod.markers(text)):  # its numbers left as plain text
        if any(c == name for c, _ in mk["names"]):
            start = text.rindex("<!--n:", 0, mk["span"][0])
            text = text[:start] + mk["written"] + text[mk["span"][1] + len("<!--/n-->"):]
    row = next(r for r in mod.run_all(ROOT, {**texts, "README": text}) if r["claim"] == "GRPO rounded inv_freq collapses")
    assert row["status"].startswith("MISMATCH") and "not cited" in row["status"]


def test_the_per_op_claim_reads_its_isolated_runs():
    """The per-op / bandwidth-floor claim is recomputed, and a changed RoPE ratio is caught."""
    mod = _checker()
    texts = mod.readme_texts(ROOT)
    row = next(r for r in mod.run_all(ROOT, _plant(mod, texts, "README", "per-op vs Liger, bandwidth floor", 3, "0.95"))
               if r["claim"] == "per-op vs Liger, bandwidth floor")
    assert row["status"] == "MISMATCH" and row["recomputed"] == "0.91, 0.82, 1.00, 1.03, 1.10"
    assert row["written"] == "0.91, 0.82, 0.95, 1.03, 1.10"
