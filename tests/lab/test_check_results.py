"""lab/checks/check_results.py: every README number recomputes from its files, and an edit is caught."""

import importlib.util
import shutil
import sys

from repo_root import ROOT


def _checker():
    spec = importlib.util.spec_from_file_location("check_results", ROOT / "lab" / "checks" / "check_results.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["check_results"] = mod  # dataclasses look their module up by name
    spec.loader.exec_module(mod)
    return mod


def test_no_claim_mismatches_its_files():
    rows = _checker().run_all(ROOT)
    bad = [r for r in rows if r["status"] != "ok"]
    assert not bad, "\n".join(f"{r['claim']}: written {r['written']}, recomputed {r['recomputed']} ({r['status']})" for r in bad)
    # not an empty pass: every claim is recomputed (none left "not recomputable")
    assert len(rows) >= 41


def test_an_altered_readme_number_is_a_mismatch(tmp_path):
    mod = _checker()
    readme = (ROOT / "README.md").read_text()
    assert "22.5x (qwen3-10m) at step 0" in readme
    (tmp_path / "README.md").write_text(readme.replace("22.5x (qwen3-10m) at step 0", "25.5x (qwen3-10m) at step 0"))
    for rel in ("results/README.md",):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / rel, tmp_path / rel)
    texts = mod.readme_texts(tmp_path)
    rows = {r["claim"]: r for r in mod.run_all(ROOT, texts)}
    row = rows["GRPO step-0 k3 ratio"]
    assert row["status"] == "MISMATCH" and row["written"] == "18.8, 25.5" and row["recomputed"] == "18.8, 22.5"
    assert sum(r["status"].startswith("MISMATCH") for r in rows.values()) == 1


def test_a_removed_claim_text_is_a_mismatch_not_a_skip():
    mod = _checker()
    texts = mod.readme_texts(ROOT)
    texts["README"] = texts["README"].replace("collapsed in 6 of 6 runs", "collapsed in every run")
    row = next(r for r in mod.run_all(ROOT, texts) if r["claim"] == "GRPO rounded inv_freq collapses")
    assert row["status"].startswith("MISMATCH")


def test_the_per_op_claim_reads_its_isolated_runs():
    """The per-op / bandwidth-floor claim is recomputed, and a changed RoPE ratio is caught."""
    mod = _checker()
    texts = mod.readme_texts(ROOT)
    assert "and 1.00x (RoPE) of Liger's forward+backward time" in texts["README"]
    texts["README"] = texts["README"].replace("and 1.00x (RoPE) of Liger's forward+backward time", "and 0.95x (RoPE) of Liger's forward+backward time")
    row = next(r for r in mod.run_all(ROOT, texts) if r["claim"] == "per-op vs Liger, bandwidth floor")
    assert row["status"] == "MISMATCH" and row["recomputed"] == "0.91, 0.82, 1.00, 1.03, 1.10"
