"""vLLM's Qwen3.5 attention (``rla.engines.vllm_families``), from the 0.26.0 and 0.33.0 wheels, against
what the vLLM rows' ``qwen3_5`` variant and docs/families.md say of it.

- Every link the rows' evidence cites is in each wheel (``FACTS``); one that moved, or a version not
  read, is a clear error.
- The fused q/k norm + partial RoPE + gate kernel, vLLM's Triton file run by Triton's interpreter on a
  CPU, is rla's aligned q/k norm and partial rotary under each row's ``qwen3_5`` variant bit for bit
  (the default rows' ``qk_norm_out='fp32'`` is not; the eager rows' points already are the kernel's);
  on a GPU the compiled kernel is compared the same way (FMA contraction allowed).
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest
import torch

from rla.engines import EngineCodeError
from rla.engines import vllm_families as VF
from rla.engines.source import locate
from interpreted_env import interpreter_env

WHEELS = {"0.26.0": "vllm_uncalibrated_wheel", "0.33.0": "vllm_wheel"}


@pytest.fixture(params=sorted(WHEELS))
def wheel(request):
    return request.getfixturevalue(WHEELS[request.param])


def test_the_code_the_docs_read_is_in_the_wheel(wheel):
    pkg = locate("vllm", wheel)
    prov = VF.check_facts(pkg)
    assert len(prov) >= 7 and pkg.version in VF.FACTS
    assert all(p["file"].startswith(str(Path(wheel).resolve()) + "!vllm/") for p in prov.values())


def test_a_moved_fact_or_an_unread_version_is_a_clear_error(vllm_wheel, tmp_path):
    pkg = locate("vllm", vllm_wheel)
    members = {f.file for f in VF.FACTS[pkg.version]} | {"vllm-0.33.0.dist-info/METADATA"}

    def rewrite(path, change):
        with zipfile.ZipFile(pkg.location) as zin, zipfile.ZipFile(path, "w") as zout:
            for name in sorted(members):
                zout.writestr(name, change(name, zin.read(name).decode()))
        return locate("vllm", path)

    def no_round_trip(name, text):  # the kernel hands the rotation the unrounded norm
        if name.endswith("fused_qk_norm_rope.py"):
            assert "x_rot1 = (x_rot1 * inv_rms * w_rot1).to(INPUT_DTYPE).to(tl.float32)" in text
            text = text.replace("(x_rot1 * inv_rms * w_rot1).to(INPUT_DTYPE).to(tl.float32)", "x_rot1 * inv_rms * w_rot1")
        return text

    with pytest.raises(EngineCodeError, match=r"(?s)qwen3_5 evidence must be read again:.*_fused_qk_rmsnorm_rope_gate_"
                                              r"kernel no longer says .*rounded to bf16 before the rotation"):
        VF.check_facts(rewrite(tmp_path / "vllm-0.33.0-changed.whl", no_round_trip))

    def other_version(name, text):
        return text.replace("Version: 0.33.0", "Version: 0.34.0") if name.endswith("METADATA") else text

    with pytest.raises(EngineCodeError, match=r"vllm 0\.34\.0's Qwen3\.5 attention was not read; read versions are "
                                              r"\['0\.26\.0', '0\.33\.0'\]"):
        VF.check_facts(rewrite(tmp_path / "vllm-0.34.0.whl", other_version))


# The kernel's body under Triton's interpreter, with one repair (interpreter_compat.round_bf16_casts): the
# interpreter's fp32 -> bf16 cast rounds to nearest even, as the compiled kernel's does.
SCRIPT = textwrap.dedent('''
    import json, sys
    import interpreter_compat
    interpreter_compat.fix_scalar_index()
    interpreter_compat.round_bf16_casts()
    from qwen3_5_vllm_kernel_case import run
    print(json.dumps(run(sys.argv[1], sys.argv[2], "cpu")))
''')



def _check(cases: dict, at_least: float) -> None:
    default, eager = {"0.26.0": ("vllm-0.26", "vllm-0.26-eager"), "0.33.0": ("vllm-0.33", "vllm-0.33-eager")}[
        cases["version"]]
    for size in ("32/8", "64/16"):
        case = cases[size]
        assert case["gate"] and case["mrope_text"], size  # the gate copied verbatim; text through mRoPE the same
        row, variant = case[default], case[f"{default}/qwen3_5"]
        assert row["points"] == ["round", "fused", "fp32"] and variant["points"] == ["round", "fused", "round"]
        assert min(variant["q"], variant["k"]) >= at_least, (size, variant)
        assert max(row["q"], row["k"]) < 0.97, (size, row)  # the row's fp32 q/k-norm output is not the kernel
        assert f"{eager}/qwen3_5" in case and case[eager]["points"] == ["round", "fused", "round"]
        assert min(case[eager]["q"], case[eager]["k"]) >= at_least, (size, case[eager])


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs Triton (its interpreter)")
def test_qwen3_5_attention_kernel_is_rla_under_the_qwen3_5_variant(wheel, tmp_path):
    run = subprocess.run([sys.executable, "-c", SCRIPT, str(wheel), str(tmp_path)], env=interpreter_env(),
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-4000:]
    cases = json.loads(run.stdout.strip().splitlines()[-1])
    assert cases["version"] == locate("vllm", wheel).version
    _check(cases, 1.0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_qwen3_5_attention_kernel_compiled_on_cuda(wheel, tmp_path):
    """The compiled kernel on the GPU against rla on the CPU: Triton may contract a RoPE product into
    an FMA, and its rsqrt may differ from PyTorch's CPU one in the last bit, so a fraction is asserted."""
    from qwen3_5_vllm_kernel_case import run

    cases = run(str(wheel), str(tmp_path), "cuda")
    print(cases)
    _check(cases, 0.999)
