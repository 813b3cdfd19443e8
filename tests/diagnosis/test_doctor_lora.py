"""``rla doctor`` names the merged-weights mismatch of LoRA trained against an external engine."""

from __future__ import annotations

import pytest
import torch

import rla
from align_spec import tiny_model

peft = pytest.importorskip("peft")


def _lora(model):
    return peft.get_peft_model(model, peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))


def test_unmerged_lora_with_an_engine_is_named_and_merged_or_no_engine_is_not():
    model = _lora(tiny_model("qwen2"))
    names = [h.name for h in rla.doctor(model)]
    assert "unmerged LoRA vs merged engine weights" in names
    hazard = next(h for h in rla.doctor(model) if h.name.startswith("unmerged LoRA"))
    assert "r=[4]" in hazard.detail and "cannot remove" in hazard.detail
    assert not any(h.name.startswith("unmerged LoRA") for h in rla.doctor(model, external_engine=False))
    merged = model.merge_and_unload()
    assert not any(h.name.startswith("unmerged LoRA") for h in rla.doctor(merged))
    assert not any(h.name.startswith("unmerged LoRA") for h in rla.doctor(tiny_model("qwen2")))


def test_cli_doctor_loads_an_adapter(tmp_path, capsys):
    from rla.cli import main
    from rla.hf import load_model
    from rla.models import bundled_path

    _lora(load_model(str(bundled_path()), dtype=torch.bfloat16)).save_pretrained(tmp_path / "adapter")
    main(["doctor", "--adapter", str(tmp_path / "adapter")])
    assert "unmerged LoRA" in capsys.readouterr().out
