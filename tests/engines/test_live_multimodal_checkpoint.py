"""A released-style multimodal Qwen3.5 checkpoint (``Qwen3_5ForConditionalGeneration``, model_type
``qwen3_5``) on the live path: transformers' ``AutoModelForCausalLM`` loads its text model (the
``qwen3_5_text`` config), which is what a text RL trainer trains and rla aligns, so the live checks
resolve the family from that config (:func:`rla.hf.causal_lm_config`) and start the engine on the
language model alone (vLLM's ``language_model_only``). Configs transformers maps to themselves are
left as they are; a multimodal model whose CausalLM class is the multimodal one (Gemma 3) is still
refused by name."""

from __future__ import annotations

import argparse

import pytest
import torch
import transformers

from rla.commands._live import check_model, settings_of
from rla.engines.vllm_live import GDN_PREFILL_BACKENDS, LiveSettings
from rla.hf import causal_lm_config, load_model

pytest.importorskip("transformers.models.qwen3_5")


def _qwen3_5(layers=2):
    text = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=layers, num_attention_heads=4,
                num_key_value_heads=2, head_dim=16, layer_types=["linear_attention"] * (layers - 1) + ["full_attention"],
                linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=8,
                max_position_embeddings=512, tie_word_embeddings=False)
    vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64)
    return transformers.Qwen3_5Config(text_config=text, vision_config=vision, tie_word_embeddings=False)


def test_causal_lm_config_is_the_text_model_for_vlm_compatible_checkpoints():
    cfg = _qwen3_5()
    assert cfg.model_type == "qwen3_5" and causal_lm_config(cfg).model_type == "qwen3_5_text"
    assert causal_lm_config(cfg) is cfg.get_text_config()
    plain = transformers.Qwen3Config(num_hidden_layers=1, hidden_size=32, intermediate_size=64, num_attention_heads=2,
                                     num_key_value_heads=1, vocab_size=64)
    assert causal_lm_config(plain) is plain
    gemma = transformers.Gemma3Config()  # AutoModelForCausalLM builds the multimodal class itself: unchanged
    assert causal_lm_config(gemma) is gemma


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    torch.manual_seed(0)
    model = transformers.Qwen3_5ForConditionalGeneration._from_config(_qwen3_5(), dtype=torch.bfloat16)
    path = tmp_path_factory.mktemp("qwen3_5_vlm")
    model.save_pretrained(str(path))
    return path, model


def test_check_model_scores_the_text_model_and_asks_for_it_alone(folder):
    path, _ = folder
    info = check_model(str(path), 64)
    assert info["family"] == "qwen3_5_text" and info["hidden_size"] == 64 and info["qk_norm"] is True
    assert info["checkpoint"] == {"model_type": "qwen3_5", "architectures": ["Qwen3_5ForConditionalGeneration"]}
    assert info["language_model_only"] is True
    args = argparse.Namespace(attention_backend=None, mode="eager", seed=0, gpu_memory_utilization=None)
    assert settings_of(args, 64, info).language_model_only is True
    assert settings_of(args, 64, {"family": "qwen3"}).language_model_only is False
    with pytest.raises(ValueError, match="max_position_embeddings \\(512\\)"):  # the text config's limit
        check_model(str(path), 4096)


def test_the_loaded_text_model_is_the_checkpoints_language_model(folder):
    path, vlm = folder
    lm = load_model(str(path))
    assert type(lm).__name__ == "Qwen3_5ForCausalLM" and lm.config.model_type == "qwen3_5_text"
    want = {k.replace("model.language_model.", "model."): v for k, v in vlm.state_dict().items()
            if not k.startswith("model.visual.")}
    got = lm.state_dict()
    assert set(got) == set(want) and all(torch.equal(got[k], want[k]) for k in got)


def test_gdn_prefill_backend_reaches_the_engine_only_for_gated_deltanet_models(folder):
    path, _ = folder
    info = check_model(str(path), 64)
    args = argparse.Namespace(attention_backend=None, mode="default", seed=0, gpu_memory_utilization=None,
                              gdn_prefill_backend="triton")
    assert settings_of(args, 64, info).gdn_prefill_backend == "triton"
    with pytest.raises(ValueError, match="no Gated DeltaNet layers"):  # vLLM would ignore it: refused, named
        settings_of(args, 64, {"family": "qwen3"})
    args.gdn_prefill_backend = None
    assert settings_of(args, 64, info).gdn_prefill_backend is None
    with pytest.raises(ValueError, match="gdn_prefill_backend must be one of"):
        LiveSettings(gdn_prefill_backend="fla")


def test_gdn_prefill_backends_are_vllm_026s_own(vllm_uncalibrated_wheel):
    """The values and the keyword are vLLM 0.26's ``EngineArgs.gdn_prefill_backend`` (read from its wheel)."""
    import ast
    from rla.engines.source import locate

    tree = ast.parse(locate("vllm", vllm_uncalibrated_wheel).read_text("vllm/engine/arg_utils.py"))
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "EngineArgs")
    field = next(n for n in cls.body if isinstance(n, ast.AnnAssign) and getattr(n.target, "id", "") == "gdn_prefill_backend")
    literal = next(n for n in ast.walk(field.annotation) if isinstance(n, ast.Subscript) and getattr(n.value, "id", "") == "Literal")
    values = tuple(e.value for e in literal.slice.elts)
    assert set(values) == set(GDN_PREFILL_BACKENDS), values


def test_an_engines_config_class_registered_for_the_model_type_does_not_change_what_loads(folder, monkeypatch):
    """vLLM 0.26 registers its own ``Qwen3_5Config`` for ``qwen3_5`` with AutoConfig when it is imported
    (its ``transformers_utils/config.py``); after a live engine run in the same process the text model
    was built from the multimodal config and failed (H200, 2026-12-03). A class of another library
    registered the same way must not change the config rla reads nor the model it loads."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    from rla.hf import read_config

    class EngineQwen3_5Config(transformers.PretrainedConfig):  # what an engine registers: not transformers' class
        model_type = "qwen3_5"

    path, vlm = folder
    monkeypatch.setitem(CONFIG_MAPPING._extra_content, "qwen3_5", EngineQwen3_5Config)
    assert type(transformers.AutoConfig.from_pretrained(str(path))) is EngineQwen3_5Config  # the failure's cause
    assert type(read_config(path)) is transformers.Qwen3_5Config
    assert check_model(str(path), 64)["family"] == "qwen3_5_text"
    lm = load_model(str(path))
    assert type(lm).__name__ == "Qwen3_5ForCausalLM"
    torch.testing.assert_close(lm.lm_head.weight, vlm.lm_head.weight, rtol=0, atol=0)
