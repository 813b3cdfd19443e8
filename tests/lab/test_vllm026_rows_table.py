"""The vLLM 0.26 rows results README's table equals a fresh render of its data (and the check can fail)."""

import json
import shutil

from lab.bench import vllm026_rows_table as T
from repo_root import ROOT

FOLDER = ROOT / "results" / "benchmarks" / "vllm026_rows_h200_2026-12-02"


def test_the_committed_tables_are_the_render_of_the_data():
    text = (FOLDER / "README.md").read_text()
    for (begin, end), make in T.BLOCKS.items():
        assert T.block(text, begin, end) == make(FOLDER)


def test_a_changed_engine_forward_number_is_seen(tmp_path):
    shutil.copytree(FOLDER / "runs-engine-forward", tmp_path / "runs-engine-forward")
    f = tmp_path / "runs-engine-forward" / "qwen3-h2048-L4-default" / "report.json"
    data = json.loads(f.read_text())
    data["rows"][-1]["prefill"]["k3"] *= 1.01  # the engine-backed side's k3, 1% off
    f.write_text(json.dumps(data))
    begin, end = "<!-- engine-forward-table -->", "<!-- /engine-forward-table -->"
    assert T.block((FOLDER / "README.md").read_text(), begin, end) != T.render_engine_forward(tmp_path)


def test_a_changed_number_is_seen(tmp_path):
    shutil.copytree(FOLDER / "runs", tmp_path / "runs")
    shutil.copytree(FOLDER / "logs", tmp_path / "logs")
    f = tmp_path / "runs" / "qwen2-h1536-L28-eager" / "engine-attention" / "report.json"
    data = json.loads(f.read_text())
    data["rows"][-1]["prefill"]["equal"] *= 0.999  # the live row's bit-equal fraction, 0.1% off
    f.write_text(json.dumps(data))
    assert T.block((FOLDER / "README.md").read_text()) != T.render(tmp_path)
