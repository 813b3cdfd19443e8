"""The results stamp names the CPU model, not only the architecture (issue 37): CPU numbers move
with the CPU's kernels, so a CPU result must say which CPU made it."""

import platform
import subprocess

import pytest
import torch

from rla.environment import cpu_model, environment


def _model_name_from_lscpu():
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return next((line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name")), None)


def test_the_cpu_stamp_names_the_cpu_model_and_its_vector_unit():
    name = _model_name_from_lscpu()  # an independent reader of the same fact
    if name is None:
        pytest.skip("lscpu is not available here to read the CPU model independently")
    stamp = cpu_model()
    assert stamp.startswith(name) and stamp.endswith(torch.backends.cpu.get_cpu_capability())
    if not torch.cuda.is_available():
        cpu = environment()["cpu"]
        assert cpu.startswith(stamp) and f"({platform.machine()})" in cpu and f"{torch.get_num_threads()} threads" in cpu
