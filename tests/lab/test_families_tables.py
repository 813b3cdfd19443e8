"""Issue #33's four H200 results READMEs of 2026-12-02: every rendered block equals a fresh render of
the folders' files (``lab/bench/families_tables.py``), and a changed number is seen."""

import json
import shutil

from lab.bench import families_tables as T
from repo_root import ROOT


def test_the_committed_blocks_are_the_render_of_the_data():
    rendered = T.render(ROOT)
    assert sum(len(b) for b in rendered.values()) == 38
    for readme, new in rendered.items():
        assert T.blocks((ROOT / readme).read_text()) == new, readme


def _copy(tmp_path):
    for rel in (*sorted({readme.parent for readme in T.BLOCKS}), *T.OPS_TIMINGS):  # every rendered folder
        src, dst = ROOT / rel, tmp_path / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        (shutil.copytree if src.is_dir() else shutil.copy)(src, dst)
    return tmp_path


def test_a_changed_number_is_seen(tmp_path):
    root = _copy(tmp_path)
    f = root / T.LIVE / "runs" / "gemma3-h2560-L4-eager" / "engine-attention" / "report.json"
    data = json.loads(f.read_text())
    data["rows"][1]["prefill"]["equal"] *= 0.999
    f.write_text(json.dumps(data))
    (e2e,) = (root / T.KERNELS / "e2e").glob("*.json")
    data = json.loads(e2e.read_text())
    data["results"][1]["step_ms"] += 10
    e2e.write_text(json.dumps(data))
    g = root / T.MOE_LIVE / "runs" / "default" / "verify-gptoss-h2880-default" / "report.json"
    data = json.loads(g.read_text())
    data["rows"][1]["prefill"]["k3"] *= 1.5
    g.write_text(json.dumps(data))
    c = root / T.EVENING / "runs" / "gptoss-default" / "calibrate-gptoss-h2880-default.report.json"
    data = json.loads(c.read_text())
    data["flips"]["rope_cos_sin"]["prefill_k3"] *= 1.5
    c.write_text(json.dumps(data))
    d = root / T.DEC3 / "runs" / "gemma4-default" / "verify-gemma4-h2560-default" / "report.json"
    data = json.loads(d.read_text())
    data["rows"][1]["decode"]["k3"] *= 1.5
    d.write_text(json.dumps(data))
    f3 = root / T.DEC3 / "runs" / "gemma4-calibrate-default" / "calibrate-gemma4-h2560-default.report.json"
    data = json.loads(f3.read_text())
    data["flips"]["qk_norm_out"]["prefill_k3"] *= 1.5
    f3.write_text(json.dumps(data))
    new = T.render(root)
    dec3 = T.DEC3 / "README.md"
    assert new[dec3]["dec3-live-table"] != T.render(ROOT)[dec3]["dec3-live-table"]
    assert new[dec3]["dec3-flips-table"] != T.render(ROOT)[dec3]["dec3-flips-table"]
    ev = T.EVENING / "README.md"
    assert new[ev]["evening-calibration-table"] != T.render(ROOT)[ev]["evening-calibration-table"]
    moe = T.MOE_LIVE / "README.md"
    assert new[moe]["moe-live-table"] != T.render(ROOT)[moe]["moe-live-table"]
    assert T.render(ROOT)[moe]["moe-live-table"].count("\n") == new[moe]["moe-live-table"].count("\n")
    assert new[T.LIVE / "README.md"]["live-table"] != T.render(ROOT)[T.LIVE / "README.md"]["live-table"]
    old = T.render(ROOT)[T.KERNELS / "README.md"]
    assert new[T.KERNELS / "README.md"]["e2e-table"] != old["e2e-table"]
    assert new[T.KERNELS / "README.md"]["prediction"] != old["prediction"]  # the prediction starts from that step


def test_a_changed_number_in_the_2026_12_03_folders_is_seen(tmp_path):
    root = _copy(tmp_path)
    r = root / T.RESCORE / "runs" / "gemma3-default" / "verify-gemma3-h2560-default" / "report.json"
    data = json.loads(r.read_text())
    data["rows"][1]["prefill"]["k3"] *= 1.5
    r.write_text(json.dumps(data))
    t = root / T.TWINS / "runs" / "qwen35" / "families" / "twin_families.json"
    data = json.loads(t.read_text())
    data["rows"][1]["logits_equal"] *= 0.5
    t.write_text(json.dumps(data))
    g = root / T.GPU_TESTS / "runs" / "gpu_tests.xml"
    g.write_text(g.read_text().replace("<failure", "<skipped", 1).replace("</failure>", "</skipped>", 1))
    new, old = T.render(root), T.render(ROOT)
    for folder, block in ((T.RESCORE, "rescore-live-table"), (T.TWINS, "twin-qwen35"), (T.GPU_TESTS, "gpu-tests-table")):
        assert new[folder / "README.md"][block] != old[folder / "README.md"][block], block
    assert new[T.RESCORE / "README.md"]["rescore-flips-qwen35-h2048"] == old[T.RESCORE / "README.md"]["rescore-flips-qwen35-h2048"]


def test_a_changed_number_in_the_2026_12_04_folder_is_seen(tmp_path):
    root = _copy(tmp_path)
    log = root / T.QUOTIENT / "runs" / "second" / "families.log"
    log.write_text(log.read_text().replace("eq=100.0000%", "eq=99.9990%", 1))
    probe = root / T.QUOTIENT / "runs" / "first" / "probe" / "gptoss_gap_probe.json"
    data = json.loads(probe.read_text())
    data["rows"][-1]["equal"] *= 0.999
    probe.write_text(json.dumps(data))
    new, old = T.render(root)[T.QUOTIENT / "README.md"], T.render(ROOT)[T.QUOTIENT / "README.md"]
    assert new["quotient-twin"] != old["quotient-twin"]
    assert new["quotient-kernels"] != old["quotient-kernels"]
    assert new["quotient-stages-512"] == old["quotient-stages-512"]


def test_a_changed_number_in_the_2026_12_05_folder_is_seen(tmp_path):
    root = _copy(tmp_path)
    t = root / T.TWINS_1205 / "runs" / "gemma4-qwen35moe" / "families" / "twin_families.json"
    data = json.loads(t.read_text())
    data["rows"][-1]["logits_equal"] *= 0.5
    t.write_text(json.dumps(data))
    new, old = T.render(root), T.render(ROOT)
    block = "twin-gemma4-qwen35moe"
    assert new[T.TWINS_1205 / "README.md"][block] != old[T.TWINS_1205 / "README.md"][block]
    assert new[T.TWINS / "README.md"]["twin-qwen35"] == old[T.TWINS / "README.md"]["twin-qwen35"]
