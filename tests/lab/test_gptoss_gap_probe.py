"""lab/bench/gptoss_gap_probe.py at toy size on the CPU: the twin's native mode against its row (the native row
of tests/engines/test_vllm_twin_families.py) is bit-equal at every stage the probe records, and every stage is
recorded on both sides (a stage the probe stopped seeing would read n/a, not 100%); under HF's own row the probe
sees the first difference at layer 0's input norm (HF's GPT-OSS norm rounds once, vLLM's native norm twice)."""

import sys

ARGS = ["--device", "cpu", "--scale", "0.05", "--tokens", "32"]

from repo_root import ROOT  # noqa: E402

BENCH = ROOT / "lab" / "bench"


def test_probe_cpu_every_stage_bit_equal(vllm_wheel, tmp_path):
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    import gptoss_gap_probe as probe

    rows = probe.main(["--wheel", vllm_wheel, "--out", str(tmp_path), *ARGS])
    seen = {(r["stage"], r.get("layer")) for r in rows if r.get("equal") is not None}
    for stage in probe.STAGES:
        assert (stage, 0) in seen, stage
    for stage in ("logits", "isolated: swiglu_oai(twin gate_up)", "isolated: aligned MoE block(twin post_norm)",
                  "isolated: rope(twin q, aligned tables)", "tables: cos/sin bf16, inv_freq on host (the row's)"):
        assert any(r["stage"] == stage for r in rows if r.get("equal") is not None), stage
    off = [r for r in rows if r.get("equal") is not None and r["equal"] != 1.0]
    assert not off, off
    assert (tmp_path / "gptoss_gap_probe.json").is_file()


def test_probe_cpu_locates_another_rows_difference(vllm_wheel, tmp_path):
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    import gptoss_gap_probe as probe

    rows = probe.main(["--wheel", vllm_wheel, "--out", str(tmp_path), *ARGS, "--profile", "hf"])
    at = {(r["stage"], r.get("layer")): r["equal"] for r in rows if r.get("equal") is not None}
    assert at[("tables: cos/sin bf16, inv_freq on host (the row's)", None)] == 1.0
    assert at[("input_norm", 0)] < 1.0 and at[("logits", None)] < 1.0
