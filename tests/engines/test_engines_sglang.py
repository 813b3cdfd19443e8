"""SGLang 0.5.23's own region code, found in its wheel (never in the repository).

On the CPU: the adapter finds, in the real wheel, every link of SGLang's default CUDA path that it
relies on (which function calls which kernel, which ``.cuh`` each JIT kernel is built from) and
fails with a clear error when a version moves one; SGLang's own cos/sin cache builder runs and
equals HF's rotary init; the errors name what a machine lacks to build the kernels. Where a CUDA
toolkit, ninja and tvm-ffi are present, the JIT kernels are compiled for Hopper without a GPU
(slow). On a GPU, the kernels run and calibration decides the points from them.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest
import torch

from rla import profiles
from rla.engines import EngineCodeError, EngineUnavailable
from rla.engines import sglang as S

BF = torch.bfloat16
LLAMA31 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
           "original_max_position_embeddings": 8192}


@pytest.fixture(scope="module")
def sglang_engine(sglang_wheel):
    return S.load(sglang_wheel)


def test_finds_the_default_path_and_its_kernel_sources_in_the_wheel(sglang_engine, sglang_wheel):
    assert sglang_engine.version == "0.5.23" and sglang_engine.profile_name == "sglang-0.5.23"
    prov = sglang_engine.provenance
    for d in S.DISPATCH:
        assert f"{d.function} ({d.op})" in prov
    for k in S.JIT_KERNELS:
        assert {f"{k.module}.{k.entry}", f"{k.module}.{k.builder}", k.kernel} <= set(prov)
        assert prov[k.kernel]["file"].endswith(f"!sglang/kernels/jit/csrc/{k.source}")
    assert {"RotaryEmbedding._compute_cos_sin_cache", "Llama3RotaryEmbedding._compute_inv_freq"} <= set(prov)
    for p in prov.values():
        assert p["file"].startswith(str(Path(sglang_wheel).resolve()) + "!sglang/") and len(p["sha256"]) == 64
    # the pins of the packages its kernel path needs, read from its METADATA
    assert sglang_engine.pins["apache-tvm-ffi"] == "apache-tvm-ffi==0.1.11"
    assert sglang_engine.pins["sglang-kernel"] == "sglang-kernel==0.4.10"


def _changed_wheel(src: Path, dst: Path, edits: dict[str, tuple[str, str]]) -> Path:
    """A copy of the members the adapter reads, with ``edits[member] = (old, new)`` applied."""
    needed = {S._ROPE_VARIANT, "sglang-0.5.23.dist-info/METADATA"} | {d.file for d in S.DISPATCH}
    needed |= {f for f, _, _ in S.SOURCE_FACTS} | {k.file for k in S.JIT_KERNELS}
    needed |= {S._CSRC + k.source for k in S.JIT_KERNELS}
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w") as zout:
        for name in sorted(needed):
            text = zin.read(name).decode()
            if name in edits:
                old, new = edits[name]
                assert old in text
                text = text.replace(old, new)
            zout.writestr(name, text)
    return dst


@pytest.mark.parametrize("member,old,new,match", [
    (S._ACTIVATION, "        silu_and_mul(x, out)\n", "        out = F.silu(x[..., :d]) * x[..., d:]\n",
     r"SiluAndMul\.forward_cuda no longer calls 'silu_and_mul\(x, out\)'"),
    (S._CSRC + "elementwise/rope.cuh", "struct FusedRopeKernel ", "struct RopeKernelV2 ",
     r"rope\.cuh no longer defines FusedRopeKernel"),
    (S._ROPE_BASE, "self.head_size not in [64, 128, 256, 512]", "self.head_size not in [64, 128, 256]",
     r"the head sizes of the fused RoPE kernel"),
])
def test_a_moved_link_is_a_clear_error(sglang_wheel, tmp_path, member, old, new, match):
    changed = _changed_wheel(Path(sglang_wheel), tmp_path / "sglang-0.5.23-changed.whl", {member: (old, new)})
    with pytest.raises(EngineCodeError, match=r"sglang 0\.5\.23: .*" + match):
        S.load(str(changed))


@pytest.mark.parametrize("base,scaling,max_pos", [(1e6, None, 32768), (5e5, LLAMA31, 131072)])
def test_cos_sin_cache_is_sglangs_and_equals_hf_on_the_same_device(sglang_engine, base, scaling, max_pos):
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    d = 128
    params = {"rope_type": "default", "rope_theta": base} if scaling is None else {**scaling, "rope_theta": base}
    hf = LlamaRotaryEmbedding(LlamaConfig(hidden_size=d, num_attention_heads=1, head_dim=d,
                                          max_position_embeddings=max_pos, rope_parameters=params))
    inv = sglang_engine.inv_freq(d, base, scaling, "cpu")
    assert inv.dtype == torch.float32 and torch.equal(inv, hf.inv_freq)
    cache = sglang_engine.cos_sin_cache(d, d, max_pos, base, scaling, torch.float32, "cpu")
    cos, sin = hf(torch.zeros(1), torch.arange(max_pos)[None])
    assert torch.equal(cache, torch.cat((cos[0, :, : d // 2], sin[0, :, : d // 2]), -1))
    # what the kernels read: the fp32 table for the fused kernel's head sizes, else the query dtype
    assert sglang_engine.rope_cache(d, d, max_pos, base, scaling, BF, "cpu").dtype == torch.float32
    small = sglang_engine.rope_cache(80, 80, 64, base, None, BF, "cpu")
    assert small.dtype == BF and torch.equal(small, sglang_engine.cos_sin_cache(80, 80, 64, base).to(BF))
    if scaling is not None:
        assert not torch.equal(inv, sglang_engine.inv_freq(d, base, None, "cpu"))


def test_missing_pieces_are_named(sglang_engine, tmp_path, monkeypatch):
    """Each thing the JIT build needs, taken away on a real filesystem, is named with its fix."""
    bare = tmp_path / "empty_bin"
    bare.mkdir()
    monkeypatch.setenv("PATH", str(bare))
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "no-cuda"))
    monkeypatch.delenv("CXX", raising=False)
    missing = "\n".join(sglang_engine.missing_requirements(need_device=False))
    assert f"nvcc: not found at {tmp_path}/no-cuda/bin/nvcc" in missing and "set CUDA_HOME" in missing
    assert "ninja: not on PATH (pip install ninja)" in missing
    assert "host C++ compiler: 'c++' not found" in missing
    for module, pip_name in S.IMPORT_NEEDS.items():
        import importlib.util

        if importlib.util.find_spec(module) is None:
            assert module in missing and (pip_name in missing)
    # a toolkit with nvcc but without the runtime library the link step needs
    toolkit = tmp_path / "cuda"
    (toolkit / "bin").mkdir(parents=True)
    (toolkit / "bin" / "nvcc").write_text("#!/bin/sh\n")
    monkeypatch.setenv("CUDA_HOME", str(toolkit))
    missing = "\n".join(sglang_engine.missing_requirements(need_device=False))
    assert f"libcudart: {toolkit}/lib64 has no libcudart.so" in missing and "nvcc:" not in missing
    if not torch.cuda.is_available():
        assert "CUDA: this torch" in "\n".join(sglang_engine.missing_requirements())
        with pytest.raises(EngineUnavailable, match="(?s)cannot build SGLang's JIT region kernels here:.*CUDA: this torch"):
            sglang_engine.kernels()


def test_calibrate_sglang_on_cpu_says_what_it_needs(sglang_wheel, capsys):
    from rla.cli import main
    from rla.engines.calibrate import calibrate

    if torch.cuda.is_available():
        pytest.skip("with CUDA, calibration runs the kernels (the GPU test)")
    with pytest.raises(EngineUnavailable, match="SGLang's region kernels run on CUDA"):
        calibrate("sglang", wheel=sglang_wheel, device="cpu")
    with pytest.raises(ValueError, match="unknown mode 'eager' for sglang; one of default"):
        calibrate("sglang", "eager", wheel=sglang_wheel, device="cpu")
    assert main(["calibrate", "--engine", "sglang", "--wheel", sglang_wheel, "--device", "cpu"]) == 2
    assert "run on CUDA" in capsys.readouterr().err


@pytest.mark.slow
def test_jit_kernels_compile_for_hopper_without_a_gpu(sglang_engine, tmp_path, monkeypatch):
    """SGLang's own loader compiles its region kernels for sm_90a, through nvcc and ninja, and
    loads each through tvm-ffi. Without CUDA, SGLang leaves ``--use_fast_math`` off the activation
    (it adds it only when CUDA is present), so this checks that the sources build, not the GPU's
    exact binary. Needs a CUDA toolkit, ninja and tvm-ffi; skipped (saying which) without them."""
    missing = sglang_engine.missing_requirements(need_device=False)
    if missing:
        pytest.skip("building SGLang's JIT kernels needs: " + "; ".join(missing))
    monkeypatch.setenv("SGLANG_JIT_CACHE_DIR", str(tmp_path))
    built = sglang_engine.kernels(need_device=False).build(arch=(9, 0))
    assert {op: ok for op, (ok, _, _) in built.items()} == {"silu_and_mul": True, "rope": True, "qk_norm": True}, built
    names = sorted(p.name for p in tmp_path.rglob("*.so"))
    assert names == ["sgl_kernel_jit_activation_bf16_t_true.so", "sgl_kernel_jit_fused_rope_true_128_true_bf16_t_bf16_t.so",
                     "sgl_kernel_jit_fused_rope_true_64_true_bf16_t_bf16_t.so", "sgl_kernel_jit_qknorm_128_true_bf16_t_true.so"]


@pytest.mark.gpu
def test_calibration_from_sglangs_kernels_on_gpu(sglang_wheel):
    """The JIT kernels run and decide their points (evidence ``kernel``): RoPE reads the fp32 cache
    and rounds once, SwiGLU rounds once (its fast-math silu leaves a last-bit rest), the q/k norm
    hands RoPE a rounded output. The norms run where sgl_kernel or FlashInfer loads into this
    torch; otherwise their points keep the checked-in row's evidence, and the report says so."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from rla.engines.calibrate import calibrate

    conf = calibrate("sglang", wheel=sglang_wheel, device="cuda", scale="small")
    pts = conf.points
    for point, choice in (("rope_cos_sin", "fp32"), ("rope_apply", "fused"), ("swiglu", "fused"), ("qk_norm_out", "round")):
        r = pts[point]
        assert (r.choice, r.evidence) == (choice, "kernel"), (point, r)
        other = next(c for c in r.fractions if c != choice)
        assert r.fractions[choice] > 0.99 > r.fractions[other], (point, r.fractions)
    baseline = profiles.get(S.BASELINE)
    for point in ("norm_weight", "norm_residual", "residual_stream", "norm_reduction"):
        r = pts[point]
        if r.fractions:  # the norms ran
            assert r.evidence == "kernel" and r.choice == getattr(baseline, point), (point, r)
        else:
            assert r.fallback.startswith("not run here") and r.choice == getattr(baseline, point), (point, r)
            assert any("did not run here" in n for n in conf.notes)
