"""The evidence of the rows' ``moe_experts`` variant is in vLLM's wheels: each link of the routed
experts' path (the opaque fused-MoE op, the Triton backend on SM90, its ``silu_and_mul`` between the
GEMMs; the shared experts' compiled SiluAndMul) is in 0.33.0 and 0.26.0 as the evidence notes say; a
moved link is a clear error naming it."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from rla import profiles
from rla.engines import EngineCodeError
from rla.engines import vllm_moe
from rla.engines.source import locate


@pytest.mark.parametrize("which, row", [("vllm_wheel", "vllm-0.33"), ("vllm_uncalibrated_wheel", "vllm-0.26")])
def test_the_code_the_evidence_read_is_in_the_wheel(request, which, row):
    wheel = request.getfixturevalue(which)
    pkg = locate("vllm", wheel)
    assert pkg.version == profiles.get(row).calibration.version
    prov = vllm_moe.check_facts(pkg)
    assert len(prov) == len(vllm_moe.FACTS)
    assert all(p["file"].startswith(str(Path(wheel).resolve()) + "!vllm/") for p in prov.values())
    notes = {kind: profiles.get(row).variant_evidence["moe_experts"][point].note
             for kind, point in (("moe_experts", "swiglu"), ("moe_out", "moe_out"))}
    assert {f.family for f in vllm_moe.FACTS} == set(notes)
    for fact in vllm_moe.FACTS:  # the note of the fact's point names what each fact checks
        where, note = fact.function.split(".")[-1] or Path(fact.file).name, notes[fact.family]
        assert where in note or Path(fact.file).stem in note, (row, fact.function, fact.file)


def test_a_moved_link_is_a_clear_error(vllm_wheel, tmp_path):
    fact = next(f for f in vllm_moe.FACTS if f.function == "apply_moe_activation")
    changed = tmp_path / "vllm-0.33.0-changed.whl"
    members = {f.file for f in vllm_moe.FACTS} | {"vllm-0.33.0.dist-info/METADATA"}
    with zipfile.ZipFile(vllm_wheel) as zin, zipfile.ZipFile(changed, "w") as zout:
        for name in sorted(members):
            text = zin.read(name).decode()
            if name == fact.file:
                text = text.replace("torch.ops._C.silu_and_mul(output, input)", "fused_silu_mul(output, input)")
            zout.writestr(name, text)
    with pytest.raises(EngineCodeError, match=r"(?s)moe_experts evidence must be read again:.*apply_moe_activation "
                                              r"no longer says .*measured per_op"):
        vllm_moe.check_facts(locate("vllm", changed))
    with pytest.raises(ValueError, match="no vLLM fused-MoE facts for family 'llama'"):
        vllm_moe.check_facts(locate("vllm", vllm_wheel), "llama")
