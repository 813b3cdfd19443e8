"""The live-engine results README's tables equal a fresh render of its data (and the check can fail)."""

import json

from lab.bench import vllm_live_table as T
from repo_root import ROOT

FOLDER = ROOT / "results" / "benchmarks" / "vllm026_live_h200_2026-12-01"


def test_the_committed_tables_are_the_render_of_the_data():
    text = (FOLDER / "README.md").read_text()
    assert T.block(text) == T.render(FOLDER)
    assert T.block(text, T.SEARCH_BEGIN, T.SEARCH_END) == T.render_search(FOLDER)


def test_a_changed_number_is_seen(tmp_path):
    for f in FOLDER.glob("compare_*.json"):
        data = json.loads(f.read_text())
        if f.name == "compare_l28.json":
            data["rows"][1]["prefill"]["k3"] *= 1.01  # one side's k3, 1% off
        (tmp_path / f.name).write_text(json.dumps(data))
    text = (FOLDER / "README.md").read_text()
    assert T.block(text) != T.render(tmp_path)
    assert T.block(text, T.SEARCH_BEGIN, T.SEARCH_END) == T.render_search(tmp_path)
