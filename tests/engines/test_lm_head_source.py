"""The engines' LM head default, read from their own source (``source_fact("lm_head")``), as calibration records it."""

from __future__ import annotations

import zipfile

import pytest

from rla.engines.source import EngineCodeError


def test_vllm_states_a_model_dtype_head(vllm_engine):
    fact = vllm_engine.source_fact("lm_head")
    assert fact["choice"] == "lp" and "LogitsProcessor.__init__" in fact["where"]
    assert "head_dtype" in fact["why"]


def test_sglang_states_a_weight_dtype_head(sglang_wheel):
    from rla.engines import sglang

    fact = sglang.load(sglang_wheel).source_fact("lm_head")
    assert fact["choice"] == "lp" and "enable_fp32_lm_head = False" in fact["where"]


def test_vllm_refuses_a_source_that_no_longer_says_it(vllm_wheel, tmp_path):
    """A wheel whose logits processor no longer reads head_dtype: an error, never a stale fact."""
    from rla.engines import vllm

    fake = tmp_path / "vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl"
    with zipfile.ZipFile(vllm_wheel) as src, zipfile.ZipFile(fake, "w") as dst:
        for item in src.infolist():
            if item.filename.endswith(".py") or item.filename.endswith("METADATA") or "dist-info" in item.filename:
                data = src.read(item.filename)
                if item.filename == "vllm/model_executor/layers/logits_processor.py":
                    data = data.replace(b"self.head_dtype = model_config.head_dtype", b"self.head_dtype = None")
                dst.writestr(item, data)
    try:
        eng = vllm.load(str(fake))
    except Exception as e:  # the adapter needs members this trimmed wheel lacks: nothing to check here
        pytest.skip(f"the trimmed wheel does not load: {e}")
    with pytest.raises(EngineCodeError, match="no longer says 'self.head_dtype = model_config.head_dtype'"):
        eng.source_fact("lm_head")
