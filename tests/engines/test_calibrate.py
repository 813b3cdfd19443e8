"""Calibration of vLLM 0.33 from its own code (its wheel), on the CPU.

``default`` mode compiles vLLM's native ops with Inductor's CPU (C++) backend. What it decides
here, measured 2026-11-30 (torch 2.13 CPU), is the ``vllm-0.33`` row that ROUNDING.md reports
from the H200 for every point Inductor decides: rope_cos_sin=round, rope_apply=fused,
swiglu=fused, norm_weight=fused, norm_residual=fp32_sum, and from the compiled chains
residual_stream=fp32_carry and qk_norm_out=fp32 -- each at 100% of elements, with the other
choice clearly below. ``rope_inv_freq`` cannot be decided on a CPU (host and device are the same
place: both candidates match 100%); it is reported as ambiguous and taken from vLLM's source
(``source`` evidence). If a rounding point of the spec or of vLLM changes, the point moves and
these tests fail.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from cpu_orders import AVX512
from rla import profiles
from rla.engines.bit_match import Experiment
from rla.engines.calibrate import calibrate
from rla.engines.conformance import markdown, write
from rla.engines.decisions import decide

#: The points whose probes go through a norm's sum of squares, which Inductor and PyTorch's eager mean
#: add in the same partials on AVX-512 only (tests/cpu_orders.py).
REDUCING = ("norm_weight", "norm_residual", "residual_stream", "qk_norm_out")

#: Points Inductor decides on the CPU, and what the vllm-0.33 row says for them.
COMPILED_POINTS = ("rope_cos_sin", "rope_apply", "swiglu", "norm_weight", "norm_residual",
                   "residual_stream", "qk_norm_out")


@pytest.fixture(scope="module")
def default_run(vllm_wheel):
    return calibrate("vllm", "default", wheel=str(vllm_wheel), device="cpu", command="pytest")


def test_default_mode_on_cpu_finds_the_vllm_033_row(default_run):
    row = profiles.get("vllm-0.33")
    for point in COMPILED_POINTS:
        r = default_run.points[point]
        assert r.evidence == "native_compiled", point
        assert r.choice == getattr(row, point), (point, r.fractions)
        if AVX512 or point not in REDUCING:
            assert r.fractions[r.choice] == 1.0 and r.max_ulp == 0 and not r.ambiguous, (point, r.fractions)
        else:  # another CPU's sum of squares: a few elements an ulp apart (tests/cpu_orders.py)
            assert r.fractions[r.choice] >= 0.9999 and r.max_ulp <= 1 and not r.ambiguous, (point, r.fractions, r.max_ulp)
        other = next(c for c in r.fractions if c != r.choice)
        assert r.fractions[other] < 0.99, (point, r.fractions)  # the probes tell the choices apart
    inv = default_run.points["rope_inv_freq"]
    assert inv.ambiguous and inv.fractions == {"host": 1.0, "device": 1.0}
    for r in default_run.points.values():  # the column says what docs/rounding.md says: 2+ choices at 100%
        assert r.ambiguous == (sum(f == 1.0 for f in r.fractions.values()) > 1), (r.point, r.fractions)
    assert (inv.choice, inv.evidence) == ("device", "source") and "create the cache on GPU" in inv.fallback


def test_profile_and_reports_round_trip(default_run, tmp_path):
    paths = write(default_run, tmp_path / "vllm.json")
    loaded = profiles.load(paths["profile"])
    assert loaded.name == "vllm-0.33" and loaded.same_rounding(profiles.get("vllm-0.33"))
    cal = loaded.calibration
    assert (cal.engine, cal.version, cal.mode, cal.torch) == ("vllm", "0.33.0", "default", torch.__version__)
    assert cal.points["norm_weight"].matched >= (1.0 if AVX512 else 0.9999)  # tests/cpu_orders.py
    assert cal.points["rope_inv_freq"].evidence == "source"
    report = json.loads(paths["report_json"].read_text())
    assert report["command"] == "pytest" and "rms_norm" in report["provenance"]
    md = paths["report_md"].read_text()
    assert "| `residual_stream` | fp32_carry | native_compiled |" in md and "sha256" in md


def test_a_calibrated_row_names_no_machine_path(default_run, vllm_wheel, tmp_path):
    # the CPU run's rope_inv_freq comes from vLLM's source, whose label is the wheel's absolute
    # path; the row (shipped data) carries the path inside the package, the report the run's own
    import dataclasses
    import re

    conf = dataclasses.replace(default_run, command=f"rla calibrate --wheel {vllm_wheel} --out {tmp_path}/v.json")
    paths = write(conf, tmp_path / "v.json")
    absolute = re.compile(r"(^|[\s=(\"'])(/|~/|[A-Za-z]:[\\/])[^\s]")
    assert absolute.search(default_run.points["rope_inv_freq"].fallback)  # the run's own label
    row = paths["profile"].read_text()
    assert not absolute.search(row), row
    cal = profiles.load(paths["profile"]).calibration
    assert cal.command == f"rla calibrate --wheel {Path(vllm_wheel).name} --out v.json"
    assert "vllm/model_executor/layers/rotary_embedding/base.py" in cal.points["rope_inv_freq"].note
    assert str(vllm_wheel) in paths["report_json"].read_text()


def test_eager_mode_without_cuda_falls_back_and_says_so(vllm_wheel):
    if torch.cuda.is_available():
        pytest.skip("with CUDA, eager mode runs the kernels")
    conf = calibrate("vllm", "eager", wheel=str(vllm_wheel), device="cpu")
    # rope_inv_freq: host == device on a CPU; lm_head: a setting of the run, read from vLLM's source
    assert {r.evidence for p, r in conf.points.items() if p not in ("rope_inv_freq", "lm_head")} == {"native_eager"}
    assert (conf.points["lm_head"].choice, conf.points["lm_head"].evidence) == ("lp", "source")
    assert any("cannot run here" in n and "NOT the kernels" in n for n in conf.notes)
    # vLLM's native ops run one bf16 op at a time round per op, and nothing fuses across ops
    got = {p: conf.points[p].choice for p in ("rope_apply", "swiglu", "norm_weight", "residual_stream", "qk_norm_out")}
    assert got == {"rope_apply": "per_op", "swiglu": "per_op", "norm_weight": "per_op",
                   "residual_stream": "rounded", "qk_norm_out": "round"}
    from rla.engines.conformance import to_profile

    assert to_profile(conf).name == "vllm-0.33-eager-native"  # never mistaken for the kernels' row


def test_ambiguity_is_reported_not_guessed():
    exp = Experiment("x", ("swiglu",), {("per_op",): [10, 10, 0], ("fused",): [10, 10, 0]})
    r = decide("swiglu", [exp], "native_compiled")
    assert r.ambiguous and r.choice is None and r.fractions == {"per_op": 1.0, "fused": 1.0}
    exp = Experiment("y", ("swiglu",), {("per_op",): [7, 10, 3], ("fused",): [9, 10, 1]})
    r = decide("swiglu", [exp], "native_compiled")
    assert (r.choice, r.ambiguous, r.max_ulp) == ("fused", False, 1)


def test_undecided_point_writes_reports_but_no_profile(default_run, tmp_path):
    import copy

    conf = copy.deepcopy(default_run)
    conf.points["swiglu"].choice = None
    paths = write(conf, tmp_path / "p.json")
    assert "profile" not in paths and paths["report_md"].exists()
    assert "**undecided**" in markdown(conf)


def test_unknown_engine_missing_engine_and_cli_errors(capsys):
    from rla.cli import main
    from rla.engines import EngineNotFound

    with pytest.raises(ValueError, match="unknown engine 'tgi'; supported: vllm, sglang"):
        calibrate("tgi")
    assert main(["calibrate", "--engine", "tgi"]) == 2
    assert "unknown engine" in capsys.readouterr().err
    with pytest.raises(EngineNotFound, match="sglang is not installed in this Python .* --wheel"):
        calibrate("sglang")  # neither installed nor given as a wheel
    if not torch.cuda.is_available():
        assert main(["calibrate", "--device", "cuda"]) == 2
        assert "sees no CUDA device" in capsys.readouterr().err


def test_an_op_that_cannot_run_keeps_the_baseline_row_and_says_so(vllm_wheel, monkeypatch):
    """What the SGLang GPU run meets when a kernel does not build or a library does not load: the
    ops that ran decide their points, the points of the op that did not are the adapter's
    baseline row (choice and evidence), and the report names the op and why. Shown on vLLM's
    native ops with its eager fused add + norm failing as a kernel would."""
    from rla.engines import EngineUnavailable
    from rla.engines.vllm import VllmEngine

    real = VllmEngine.region_ops

    def region_ops(self, mode, device, library=None):
        ops = real(self, mode, device, library)

        def broken(*args):
            raise EngineUnavailable("its JIT kernel did not build: nvcc exited 1")

        ops.ops["fused_add_rms_norm"] = broken
        return ops

    monkeypatch.setattr(VllmEngine, "region_ops", region_ops)
    monkeypatch.setattr(VllmEngine, "baseline", "vllm-0.33-eager")
    conf = calibrate("vllm", "eager", wheel=str(vllm_wheel), device="cpu")
    row = profiles.get("vllm-0.33-eager")
    for point in ("norm_residual", "residual_stream"):
        r = conf.points[point]
        assert (r.choice, r.evidence, r.fractions) == (getattr(row, point), row.calibration.points[point].evidence, {})
        assert r.fallback.startswith("not run here (fused_add_rms_norm did not run); kept from profile vllm-0.33-eager")
    assert conf.points["norm_weight"].fractions and conf.points["norm_weight"].experiments == ["rms_norm"]
    assert conf.points["swiglu"].evidence == "native_eager"
    assert any(n.startswith("fused_add_rms_norm did not run here: its JIT kernel did not build: nvcc exited 1 -> "
                            "norm_residual, residual_stream kept from profile vllm-0.33-eager") for n in conf.notes), conf.notes
    from rla.engines.conformance import to_profile

    assert to_profile(conf).calibration.points["norm_residual"].matched is None  # not measured in this run


@pytest.mark.parametrize("fractions, choice, ambiguous", [
    ({"unpinned": 1.0, "vllm_block": 1.0}, "unpinned", True),     # the probes do not tell them apart
    ({"unpinned": 0.98, "vllm_block": 1.0}, "vllm_block", False),  # that order alone reproduces them
    ({"unpinned": 0.98, "vllm_block": 0.97}, "unpinned", False),   # no order rla has
])
def test_norm_reduction_ambiguity_follows_the_docs(fractions, choice, ambiguous):
    from rla.engines.decisions import settle_reduction as _settle_reduction
    from rla.engines.conformance import PointResult

    r = PointResult("norm_reduction", None, "kernel", dict(fractions), sum(f == 1.0 for f in fractions.values()) > 1)
    _settle_reduction(r, [])
    assert (r.choice, r.ambiguous) == (choice, ambiguous)


def _args(**kw):
    import argparse

    base = dict(engine="vllm", wheel=None, engine_version=None, download=False)
    return argparse.Namespace(**{**base, **kw})


def test_the_cli_finds_the_wheel_in_rlas_engine_cache(vllm_wheel, tmp_path, monkeypatch, capsys):
    """vLLM is not installed here: the wheel in the cache is used, the newest or the one asked
    for; none there is a clear error naming the cache and --download, before any work."""
    from pathlib import Path

    from rla.cli import main
    from rla.commands.calibrate import _wheel

    assert profiles.installed_version("vllm") is None
    cache = tmp_path / "cache"
    cache.mkdir()
    monkeypatch.setenv("RLA_ENGINE_CACHE", str(cache))
    (cache / "vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl").symlink_to(vllm_wheel)
    (cache / "vllm-0.9.2-cp38-abi3-manylinux_2_28_x86_64.whl").write_bytes(b"")  # older: not the default
    said = []
    assert Path(_wheel(_args(), said.append)).name.startswith("vllm-0.33.0-")
    assert "rla's engine cache" in said[-1]
    assert Path(_wheel(_args(engine_version="0.9.2"), said.append)).name.startswith("vllm-0.9.2-")
    with pytest.raises(FileNotFoundError, match=r"vllm 0\.40\.0 is not installed .* engine cache .* --download"):
        _wheel(_args(engine_version="0.40.0"), said.append)
    assert main(["calibrate", "--engine", "sglang", "--device", "cpu"]) == 2  # no sglang wheel in this cache
    assert "pass --download" in capsys.readouterr().err


def test_an_eager_row_needs_the_kernels_or_an_explicit_flag(vllm_wheel, tmp_path, monkeypatch, capsys):
    from rla.cli import main

    out = tmp_path / "e.json"
    cli = ["calibrate", "--mode", "eager", "--wheel", vllm_wheel, "--out", str(out)]
    assert main(cli + ["--device", "cpu"]) == 2  # refused before the run
    assert "--allow-native-eager" in capsys.readouterr().err and not out.exists()
    assert main(cli + ["--device", "cpu", "--allow-native-eager"]) == 0
    captured = capsys.readouterr()
    assert profiles.load(out).name == "vllm-0.33-eager-native"
    # progress on stderr while it runs, one line per experiment
    for step in ("rms_norm", "fused_add_rms_norm + silu_and_mul", "rope_inv_freq", "done"):
        assert f"{step}" in captured.err and "[rla calibrate" in captured.err, captured.err
    # where CUDA is asked for but the kernels did not run (a library that does not load), no row either
    conf = calibrate("vllm", "eager", wheel=vllm_wheel, device="cpu")
    monkeypatch.setattr("rla.engines.calibrate.calibrate", lambda *a, **k: conf)
    out.unlink()
    assert main(cli + ["--device", "cuda"]) == 2  # its reports are there: replaced only when asked
    assert "e.report.json exists; choose another --out or pass --overwrite" in capsys.readouterr().err
    assert main(cli + ["--device", "cuda", "--overwrite"]) == 1
    assert "no profile written: the engine's kernels did not run here" in capsys.readouterr().out
    assert not out.exists() and out.with_suffix(".report.md").exists()
    assert main(cli + ["--device", "cuda", "--allow-native-eager", "--overwrite"]) == 0 and out.exists()
