"""``profile="vllm"`` is the row of the vLLM in use (rla.profiles.versions).

The rows' versions come from the data files (``calibration.version``); the installed vLLM's version
from its package metadata, never by importing it. The two subprocess tests put a real vLLM wheel's
``vllm/__init__.py`` and ``*.dist-info`` (what ``pip install --no-deps --target DIR`` writes for
them; the rest of the 1 GB package plays no part) into a folder on ``sys.path``: vLLM 0.26.0, which
has no calibrated row, and vLLM 0.33.0, which has one. Both wheels come from rla's engine cache,
downloaded there once (``tests/conftest.py``).
"""

from __future__ import annotations

import json
import subprocess
import sys
import warnings
import zipfile
from pathlib import Path

import pytest

from engine_versions import VLLM_UNCALIBRATED_VERSION, VLLM_UNLISTED_VERSION, VLLM_VERSION
from rla.profiles import ProfileVersionWarning, for_engine, get, registry, rollout_version
from rla.rollout.rollouts import RolloutRecord, load, save

SRC = str(Path(__file__).resolve().parents[2] / "src")


def _install_metadata(wheel: str, target: Path) -> Path:
    with zipfile.ZipFile(wheel) as zf:
        members = [n for n in zf.namelist() if n.split("/")[0].endswith(".dist-info") or n == "vllm/__init__.py"]
        assert any(n.endswith(".dist-info/METADATA") for n in members) and "vllm/__init__.py" in members
        zf.extractall(target, members)
    old = target / f"vllm-{VLLM_UNCALIBRATED_VERSION}.dist-info"
    if old.is_dir():  # the real wheel's metadata, stamped as a version without a row (0.26 has rows now)
        meta = old / "METADATA"
        text = meta.read_text()
        assert f"Version: {VLLM_UNCALIBRATED_VERSION}\n" in text
        meta.write_text(text.replace(f"Version: {VLLM_UNCALIBRATED_VERSION}\n", f"Version: {VLLM_UNLISTED_VERSION}\n", 1))
        old.rename(target / f"vllm-{VLLM_UNLISTED_VERSION}.dist-info")
    return target


_ALIGN = r"""
import importlib.util, json, sys, warnings
sys.path.insert(0, sys.argv[1])
import torch, transformers, rla
from rla.models import bundled_path
assert importlib.util.find_spec("vllm").origin.startswith(sys.argv[1])  # rla's lookup finds this vLLM
model = transformers.AutoModelForCausalLM.from_pretrained(bundled_path(), dtype=torch.bfloat16)
out = {}
for alias in ("vllm", "vllm-eager"):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        report = rla.align(model, alias)
    out[alias] = dict(row=report.profile.name, choice=report.profile_choice, text=str(report),
                      warnings=[(w.category.__name__, str(w.message)) for w in caught])
out["imported"] = "vllm" in sys.modules
print(json.dumps(out))
"""


def _align_with(target: Path) -> dict:
    run = subprocess.run([sys.executable, "-c", _ALIGN, str(target)], capture_output=True, text=True,
                         env={"PYTHONPATH": SRC, "PATH": "/usr/bin:/bin"}, timeout=300)
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_an_installed_vllm_without_a_row_gets_the_nearest_and_a_warning_naming_both(vllm_uncalibrated_wheel, tmp_path):
    out = _align_with(_install_metadata(vllm_uncalibrated_wheel, tmp_path / "site"))
    assert out["imported"] is False
    for alias, row in (("vllm", "vllm-0.33"), ("vllm-eager", "vllm-0.33-eager")):
        r = out[alias]
        assert r["row"] == row
        [(category, message)] = r["warnings"]
        assert category == "ProfileVersionWarning"
        for text in (message, r["choice"]):
            assert f"vllm {VLLM_UNLISTED_VERSION} (installed) has no calibrated row" in text
            assert f"{row} (calibrated on vllm {VLLM_VERSION}" in text and "rla calibrate --engine vllm" in text
        assert r["choice"] in r["text"]  # printed with the report


def test_an_installed_vllm_with_a_row_gets_that_row_silently(vllm_wheel, tmp_path):
    out = _align_with(_install_metadata(vllm_wheel, tmp_path / "site"))
    assert out["imported"] is False
    for alias, row in (("vllm", "vllm-0.33"), ("vllm-eager", "vllm-0.33-eager")):
        assert out[alias]["row"] == row and out[alias]["warnings"] == []
        assert f"the row of vllm {VLLM_VERSION} (installed)" in out[alias]["choice"]


@pytest.fixture
def two_vllm_rows(monkeypatch):
    """A second default-mode vLLM row, 0.20.0, added to the table as a data file would add it."""
    base = get("vllm-0.33")
    old = base.replace(name="vllm-0.20", swiglu="per_op")
    object.__setattr__(old, "calibration", base.calibration.__class__(
        **{**base.calibration.__dict__, "version": "0.20.0"}))
    table = {**registry._TABLE, old.name: old}
    monkeypatch.setattr(registry, "_TABLE", table)
    monkeypatch.setattr(registry, "_ALIASES", registry._load_aliases(table))
    return old


@pytest.mark.parametrize("version, row, calibrated", [
    ("0.20.0", "vllm-0.20", True), ("0.20", "vllm-0.20", True), ("0.20.0+cu130", "vllm-0.20", True),
    ("0.25.0", "vllm-0.20", False),   # the newest calibrated release before it
    ("0.26.0", "vllm-0.26", True), ("0.27.0", "vllm-0.26", False),
    ("0.19.1", "vllm-0.20", False),   # older than every row: the oldest
    ("0.33.0", "vllm-0.33", True), ("0.33.1", "vllm-0.33", False), ("0.40.0", "vllm-0.33", False),
])
def test_the_row_is_the_versions_from_the_data_files(two_vllm_rows, version, row, calibrated):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        m = for_engine("vllm", version)
    assert (m.profile.name, m.calibrated, m.source) == (row, calibrated, "given")
    assert [w.category for w in caught] == ([] if calibrated else [ProfileVersionWarning])
    if not calibrated:
        assert version in str(caught[0].message) and m.profile.calibration.version in str(caught[0].message)
    assert get("vllm").name == "vllm-0.33"  # the plain alias stays the newest row


def test_non_engine_names_and_bad_versions(monkeypatch):
    assert for_engine("hf") is None and for_engine("vllm-0.33") is None
    with pytest.raises(ValueError, match="not a version number"):
        for_engine("vllm", "latest")
    monkeypatch.setattr("rla.profiles.versions.installed_version", lambda engine: None)
    m = for_engine("vllm")
    assert (m.profile.name, m.version, m.source) == ("vllm-0.33", None, "none")
    assert "no vllm version found" in m.message()


def _record(engine="vllm", version=None):
    return RolloutRecord([1, 2], [3], [-0.5], 1.0, 1.0, -1, engine, engine_version=version)


def test_the_version_recorded_in_the_rollouts(tmp_path, monkeypatch):
    monkeypatch.setattr("rla.profiles.versions.installed_version", lambda engine: "0.33.0")
    path = tmp_path / "r.jsonl"
    save(path, [_record(version="0.27.0"), _record()])
    assert json.loads(path.read_text().splitlines()[0])["engine_version"] == "0.27.0"
    assert "engine_version" not in json.loads(path.read_text().splitlines()[1])
    assert [r.engine_version for r in load(path)] == ["0.27.0", None]
    assert rollout_version(load(path)) == "0.27.0" and rollout_version(load(path), "sglang") is None
    with pytest.warns(ProfileVersionWarning, match=r"vllm 0\.27\.0 \(recorded in the rollouts\)"):
        m = for_engine("vllm", records=load(path))
    assert m.source == "rollouts"
    assert for_engine("vllm", "0.33.0", records=load(path)).calibrated  # a given version wins
    with pytest.raises(ValueError, match="several vllm versions"):
        rollout_version([_record(version="0.27.0"), _record(version="0.33.0")], "vllm")
    with pytest.raises(ValueError, match="engine_version"):
        _record(version="")


def test_align_engine_version_needs_an_engine_alias():
    import torch
    import transformers

    import rla
    from rla.models import bundled_path

    model = transformers.AutoModelForCausalLM.from_pretrained(bundled_path(), dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="not an engine alias"):
        rla.align(model, "hf", engine_version="0.33.0")
    report = rla.align(model, "vllm", engine_version="0.33.0")
    assert report.profile.name == "vllm-0.33" and "the row of vllm 0.33.0 (given)" in str(report)
    assert rla.align(model, "vllm-0.33").profile_choice == ""
