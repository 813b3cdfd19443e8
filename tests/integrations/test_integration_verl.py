"""rla.integrations.verl against the real verl package (0.9.1): its FSDP engine builds the model on
CPU, in one process, without Ray.

verl picks its device through a platform plugin and ships none for CPU; ``verl_cpu`` registers
one (``verl.plugin.platform.set_platform``, verl's documented extension point) whose device is the
CPU and whose collective backend is gloo. Everything else is verl's own code: ``HFModelConfig``
(which imports ``external_lib``), ``FSDPEngine._build_module`` (load, monkey patches, dtype cast)
and ``_build_fsdp_module`` (FSDP2 with verl's ``MixedPrecisionPolicy``, FSDP1 with its
``MixedPrecision``; FSDP1 with ``verl_cpu``'s two device shims). Two processes:
``test_integration_verl_fsdp1.py``.

Not run here: the critic (verl's ``load_valuehead_model`` hard-codes flash_attention_2, which
needs a GPU; it is built by the same ``_build_module`` hook) and the older ``fsdp_workers``
layout (not in verl 0.9.1).
"""

from __future__ import annotations

import os
from importlib.resources import files

import pytest
import torch

pytest.importorskip("verl", reason="the verl integration is tested where verl is installed (README)")

from verl_cpu import fsdp1_on_cpu  # noqa: E402  (registers verl's CPU platform before verl's engine modules load)
from fsdp_compare import compare_with_unsharded  # noqa: E402
from free_port import free_port  # noqa: E402

from transformers import AutoModelForCausalLM  # noqa: E402
from verl.trainer.config import CheckpointConfig  # noqa: E402
from verl.workers.config import FSDPEngineConfig, FSDPOptimizerConfig, HFModelConfig  # noqa: E402
from verl.workers.engine.fsdp import transformer_impl  # noqa: E402

import rla  # noqa: E402

MODEL = str(files("rla") / "assets" / "tiny-qwen2")
EXTERNAL_LIB = "rla.integrations.verl"  # the README's config line: actor_rollout_ref.model.external_lib=...


@pytest.fixture(scope="module", autouse=True)
def process_group():
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    dist.init_process_group("gloo", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _engine(forward_only=False, override=None, model_dtype=None, strategy="fsdp2"):
    model_config = HFModelConfig(
        path=MODEL, external_lib=EXTERNAL_LIB,
        override_config={"attn_implementation": "eager", **(override or {})},
        use_remove_padding=False, enable_gradient_checkpointing=False,
    )
    engine_config = FSDPEngineConfig(strategy=strategy, forward_only=forward_only, model_dtype=model_dtype)
    return transformer_impl.FSDPEngine(model_config, engine_config, FSDPOptimizerConfig(lr=1e-5), CheckpointConfig())


def _reference_logits(profile, ids):
    """The same checkpoint loaded in bf16 and aligned by hand: what verl's model must compute."""
    model = AutoModelForCausalLM.from_pretrained(MODEL, dtype=torch.bfloat16, attn_implementation="eager")
    rla.align(model, profile)
    with torch.no_grad():
        return model(ids).logits


IDS = torch.randint(3, 60, (2, 24), generator=torch.Generator().manual_seed(0))


def test_trainable_actor_is_aligned_and_fsdp2_stops_casting_inputs():
    engine = _engine()
    engine.initialize()  # verl's whole build: load fp32, cast, align (rla), FSDP2 wrap
    report = rla.alignment_of(engine.module)
    assert report is not None and report.profile.name.startswith("vllm")
    from torch.distributed.fsdp import FSDPModule

    policies = [m._get_fsdp_state()._mp_policy for m in engine.module.modules() if isinstance(m, FSDPModule)]
    assert len(policies) >= 2 and all(not p.cast_forward_inputs for p in policies)
    assert all(p.param_dtype == torch.bfloat16 for p in policies)  # verl's own choice, unchanged
    with torch.no_grad():
        logits = engine.module(IDS).logits
    # FSDP2 (world size 1) hands each layer bf16 weights: bit for bit the bf16-loaded aligned model.
    assert torch.equal(logits, _reference_logits(report.profile, IDS))


def test_forward_only_reference_is_aligned_after_verls_bf16_cast():
    """A forward-only (reference) engine loads and casts to bf16; the alignment comes after the
    cast. (verl puts a reference under a pinned-memory CPU offload policy, which needs an
    accelerator, so this test stops at ``_build_module``, verl's build up to FSDP wrapping.)"""
    engine = _engine(forward_only=True)
    module = engine._build_module()
    assert {p.dtype for p in module.parameters()} == {torch.bfloat16}
    report = rla.alignment_of(module)
    assert report is not None and report.notes == []
    with torch.no_grad():
        assert torch.equal(module(IDS).logits, _reference_logits(report.profile, IDS))


def test_profile_from_config_then_environment(monkeypatch):
    module = _engine(model_dtype="bf16", override={"rla_profile": "sglang"})._build_module()
    assert rla.alignment_of(module).profile.name.startswith("sglang")
    monkeypatch.setenv("RLA_PROFILE", "vllm-eager")
    module = _engine(model_dtype="bf16")._build_module()
    assert rla.alignment_of(module).profile.name.startswith("vllm") and "eager" in rla.alignment_of(module).profile.name
    monkeypatch.setenv("RLA_PROFILE", "no-such-engine")
    with pytest.raises(Exception, match="no-such-engine"):
        _engine(model_dtype="bf16")._build_module()


def test_uninstall_restores_verls_code():
    from rla.integrations import verl as rla_verl

    assert rla_verl.installed()
    patched_build = transformer_impl.FSDPEngine._build_module
    rla_verl.uninstall()
    try:
        assert transformer_impl.FSDPEngine._build_module is not patched_build
        policy = transformer_impl.MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32,
                                                       cast_forward_inputs=True)
        assert policy.cast_forward_inputs  # verl's own class again
        module = _engine(model_dtype="bf16")._build_module()
        assert rla.alignment_of(module) is None
    finally:
        rla_verl.install()
    assert rla_verl.installed() and rla.alignment_of(_engine(model_dtype="bf16")._build_module()) is not None


def test_fsdp1_strategy_is_aligned_and_exact_forward_and_backward():
    """verl's default strategy (fsdp = FSDP1), verl's whole build (``initialize()``: load fp32,
    cast, align, wrap with ``MixedPrecision(param_dtype=bf16, reduce_dtype=fp32,
    buffer_dtype=fp32)``, ``sync_module_states=True``): FSDP1 leaves forward inputs uncast (it
    casts the root's, token ids), keeps the fp32 RoPE buffers fp32, and the wrapped model's logits
    (plain and under verl's bf16 autocast) and every gradient equal the unsharded aligned model's,
    bit for bit. The actor's report says its fp32 weights compute in bf16 under FSDP."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    engine = _engine(strategy="fsdp")
    with fsdp1_on_cpu():
        engine.initialize()
    module = engine.module
    units = [m for m in module.modules() if isinstance(m, FSDP)]
    assert len(units) == 7 and all(not u.mixed_precision.cast_forward_inputs for u in units)
    assert {(u.mixed_precision.param_dtype, u.mixed_precision.buffer_dtype) for u in units} == {
        (torch.bfloat16, torch.float32)}  # verl's own choice, unchanged
    report = rla.alignment_of(module)
    assert any("FSDP mixed precision" in n for n in report.notes)
    assert not any(n.startswith("nothing to round") for n in report.notes)
    result = compare_with_unsharded(module, MODEL, report.profile, IDS[:1, :12])
    assert result == {"logits_equal_plain": True, "logits_equal_autocast": True, "grads_compared": 74,
                      "grads_unequal": [], "grads_max_abs_diff": 0.0, "grads_missing": []}
    assert {str(b.dtype) for b in module.buffers()} == {"torch.float32"}
    hf = AutoModelForCausalLM.from_pretrained(MODEL, dtype=torch.bfloat16, attn_implementation="eager")
    with torch.no_grad():  # the check can fail: HF's own rounding differs from the aligned model's
        assert not torch.equal(module(IDS).logits, hf(IDS).logits)


def test_liger_in_verls_own_path_is_aligned_over():
    """actor_rollout_ref.model.use_liger=True: verl applies Liger to the built model
    (_apply_liger_kernel_to_instance, fused linear cross-entropy off) before its dtype cast; rla
    aligns after, over Liger: the logits equal the plain aligned model's (Liger's Triton kernels
    cannot run on this CPU, so none of them runs)."""
    import importlib

    pytest.importorskip("liger_kernel")
    modeling = importlib.import_module("transformers.models.qwen2.modeling_qwen2")
    saved = dict(vars(modeling))
    try:
        model_config = HFModelConfig(path=MODEL, external_lib=EXTERNAL_LIB, use_liger=True,
                                     override_config={"attn_implementation": "eager"},
                                     use_remove_padding=False, enable_gradient_checkpointing=False)
        engine = transformer_impl.FSDPEngine(model_config, FSDPEngineConfig(strategy="fsdp2", model_dtype="bf16"),
                                             FSDPOptimizerConfig(lr=1e-5), CheckpointConfig())
        module = engine._build_module()
        report = rla.alignment_of(module)
        assert any("Liger" in n and "RMSNorm" in n for n in report.notes)
        with torch.no_grad():
            logits = module(IDS).logits
    finally:
        for name, value in saved.items():
            setattr(modeling, name, value)
    assert torch.equal(logits, _reference_logits(report.profile, IDS))


def test_mismatch_metrics_join_verls_step_metrics():
    """verl's own calculate_debug_metrics, which RayPPOTrainer.fit imports from its module at call
    time and merges into the step's metrics dict (logged by verl's Tracking), now also returns
    rla's mismatch/* metrics, except those it computes itself under its own names."""
    from importlib.util import find_spec

    from verl import DataProto
    from verl.utils.debug import metrics as debug_metrics

    from rla.integrations.verl import VERL_OWN_KEYS
    from rla.metrics import mismatch

    # ray_trainer.py is read, not imported: its imports need packages verl does not depend on (cachetools)
    fit = open(find_spec("verl.trainer.ppo").submodule_search_locations[0] + "/ray_trainer.py").read()
    assert "from verl.utils.debug.metrics import calculate_debug_metrics" in fit
    assert "metrics.update(calculate_debug_metrics(batch))" in fit
    g = torch.Generator().manual_seed(0)
    old = -torch.rand(4, 6, generator=g) * 2
    roll = old + 1e-3 * torch.randn(4, 6, generator=g)
    mask = torch.ones(4, 6, dtype=torch.int64)
    mask[1, 4:] = 0
    batch = DataProto.from_dict({"old_log_probs": old, "rollout_log_probs": roll, "response_mask": mask,
                                 "responses": torch.zeros(4, 6, dtype=torch.int64)})
    got = debug_metrics.calculate_debug_metrics(batch)
    want = mismatch(old, roll, mask.bool(), nan_policy="mask")  # NaN tokens, if any, counted in n_nan_masked
    assert {k for k in got if k.startswith("mismatch/")} == set(want) - set(VERL_OWN_KEYS)
    assert all(got[k] == want[k] for k in want if k not in VERL_OWN_KEYS)
    # the same numbers under verl's names (verl takes exp in fp32, rla in fp64): why they are left out
    assert got["training/rollout_probs_diff_mean"] == pytest.approx(want["mismatch/prob_abs/mean"], rel=1e-4)
    assert got["training/rollout_probs_diff_max"] == pytest.approx(want["mismatch/prob_abs/max"], rel=1e-4)


def test_the_alias_is_the_row_of_the_rollouts_engine_version(monkeypatch):
    from rla.profiles import ProfileVersionWarning

    monkeypatch.setenv("RLA_PROFILE", "vllm-eager")
    monkeypatch.setenv("RLA_ENGINE_VERSION", "0.34.0")
    with pytest.warns(ProfileVersionWarning, match=r"vllm 0\.34\.0 \(given\) has no calibrated row"):
        module = _engine(model_dtype="bf16")._build_module()
    report = rla.alignment_of(module)
    assert report.profile.name == "vllm-0.33-eager" and "nearest calibrated row" in report.profile_choice
    monkeypatch.setenv("RLA_ENGINE_VERSION", "0.33.0")
    module = _engine(model_dtype="bf16")._build_module()
    assert "the row of vllm 0.33.0 (given)" in rla.alignment_of(module).profile_choice
