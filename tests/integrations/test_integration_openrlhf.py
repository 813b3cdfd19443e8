"""rla.integrations.openrlhf against OpenRLHF 0.11.2's own ``Actor`` (models/actor.py).

OpenRLHF's wheel is installed without its dependencies (its pins need a GPU: flash-attn builds
CUDA kernels, DeepSpeed ops); that ``pip install rla openrlhf==0.11.2`` resolves is checked by
``pip install --dry-run`` (README). Two GPU-only modules that ``openrlhf.models`` imports at the
top but never calls on the path tested here (``Actor.__init__`` without DeepSpeed ZeRO-3 or
packing, ``Actor.forward`` with bf16 logits) is ``flash_attn``'s padding helpers (used only with
``packing_samples``); it is registered as a module whose functions raise if called. DeepSpeed
is the real package (pure Python, no ops built).
"""

from __future__ import annotations

import importlib.machinery
import sys
import types
from importlib.resources import files

import pytest
import torch

pytest.importorskip("openrlhf", reason="the OpenRLHF integration is tested where openrlhf is installed (README)")


def _empty_module(name, **attrs):
    module = types.ModuleType(name)
    module.__spec__ = importlib.machinery.ModuleSpec(name, None)  # no distribution metadata
    module.__dict__.update(attrs)
    return module


def _unavailable(*_, **__):
    raise RuntimeError("GPU-only helper called in a CPU test")


_STUBS = {
    "flash_attn": {},
    "flash_attn.bert_padding": dict(index_first_axis=_unavailable, pad_input=_unavailable,
                                    rearrange=_unavailable, unpad_input=_unavailable),
    "flash_attn.utils": {},
    "flash_attn.utils.distributed": dict(all_gather=_unavailable),
}
_registered = []
for _name, _attrs in _STUBS.items():
    try:
        __import__(_name)
    except ImportError:
        sys.modules[_name] = _empty_module(_name, **_attrs)
        _registered.append(_name)

from transformers import AutoModelForCausalLM  # noqa: E402

import rla  # noqa: E402
from rla.integrations import openrlhf as rla_openrlhf  # noqa: E402

from openrlhf.models import Actor  # noqa: E402

for _name in _registered:  # OpenRLHF holds what it imported; nothing else in this process sees them
    del sys.modules[_name]
MODEL = str(files("rla") / "assets" / "tiny-qwen2")
SEQ = torch.randint(3, 60, (2, 20), generator=torch.Generator().manual_seed(0))


@pytest.fixture
def patched():
    rla_openrlhf.patch(profile="vllm")  # the README line
    yield
    rla_openrlhf.unpatch()


def _reference_logits(profile):
    """The checkpoint in bf16, aligned by hand."""
    model = AutoModelForCausalLM.from_pretrained(MODEL, dtype=torch.bfloat16, attn_implementation="eager")
    rla.align(model, profile)
    with torch.no_grad():
        return model(SEQ, attention_mask=torch.ones_like(SEQ)).logits


def test_actor_built_from_a_path_is_aligned_and_its_logprobs_follow_the_profile(patched):
    actor = Actor(MODEL, attn_implementation="eager", param_dtype="bf16")  # OpenRLHF's own loader
    assert actor.rla_alignment.profile.name.startswith("vllm")
    assert rla.alignment_of(actor.model) is actor.rla_alignment
    action_mask = torch.ones(2, 8, dtype=torch.bool)
    with torch.no_grad():
        logprobs = actor(SEQ, action_mask=action_mask, attention_mask=torch.ones_like(SEQ))
    reference = _reference_logits(actor.rla_alignment.profile)
    with torch.no_grad():  # the model inside the Actor is the aligned one, bit for bit
        assert torch.equal(actor.model(SEQ, attention_mask=torch.ones_like(SEQ)).logits, reference)
    want = torch.log_softmax(reference[:, :-1].float(), -1).gather(-1, SEQ[:, 1:, None]).squeeze(-1)[:, -8:]
    # OpenRLHF computes log_softmax of the bf16 logits in bf16, row by row (models/utils.py);
    # the reference does it in fp32 from the same bf16 logits: they agree to bf16 resolution
    # of the logprob itself (2^-8 relative), far tighter than any mismatch (k3 ~1e-5 is a
    # statement about ~1e-3 logprob differences on a different stack).
    assert torch.allclose(logprobs.float(), want, rtol=2**-7, atol=2**-7)


def test_actor_wrapping_a_model_instance_and_unpatch(patched):
    model = AutoModelForCausalLM.from_pretrained(MODEL, dtype=torch.bfloat16, attn_implementation="eager")
    actor = Actor(model)
    assert rla.alignment_of(actor.model) is not None
    rla_openrlhf.patch("sglang")  # re-patching changes the profile, one wrapper
    assert Actor(model).rla_alignment.profile.name.startswith("sglang")
    rla_openrlhf.unpatch()
    assert rla_openrlhf.patched() is None
    fresh = AutoModelForCausalLM.from_pretrained(MODEL, dtype=torch.bfloat16, attn_implementation="eager")
    actor = Actor(fresh)
    assert not hasattr(actor, "rla_alignment") and rla.alignment_of(fresh) is None


def test_setup_worker_reads_the_profile_from_the_environment(monkeypatch):
    monkeypatch.delenv("RLA_PROFILE", raising=False)
    with pytest.raises(RuntimeError, match="set RLA_PROFILE"):
        rla_openrlhf.setup_worker()
    monkeypatch.setenv("RLA_PROFILE", "vllm-eager")
    try:
        rla_openrlhf.setup_worker()
        assert "eager" in rla_openrlhf.patched().name
    finally:
        rla_openrlhf.unpatch()


# --------------------------------------------------------------------------- metrics on OpenRLHF's dashboard

from importlib.util import find_spec  # noqa: E402

from openrlhf.trainer.ppo_utils.experience import Experience  # noqa: E402  (no Ray needed)
from openrlhf.utils.logging_utils import TensorboardLogger  # noqa: E402

from rla.metrics import mismatch, names_as  # noqa: E402

_PPO_ACTOR = find_spec("openrlhf").submodule_search_locations[0] + "/trainer/ray/ppo_actor.py"


def _experience(seed, batch=3, length=7):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(batch, length, generator=g) * 3
    roll = old + 1e-3 * torch.randn(batch, length, generator=g)
    mask = torch.rand(batch, length, generator=g) < 0.8
    mask[:, 0] = True
    return Experience(action_log_probs=old, rollout_log_probs=roll, action_mask=mask)


def test_token_metrics_reduce_to_the_whole_batch_exactly_as_openrlhf_reduces_them():
    """OpenRLHF's ppo_train (read here from its source, which needs Ray and vLLM to import)
    multiplies each micro-batch's "token" metric by its token count, all-reduces, and divides by
    the total: for rla's token means that is the whole batch's value."""
    source = open(_PPO_ACTOR).read()
    assert 'scale = n_tokens if weight == "token" else n_samples' in source
    assert 'denom = n_tokens if weights[k] == "token" else n_samples' in source
    assert 'return {\n            "metrics": metrics,\n            "weights": weights,' in source
    parts = [_experience(1), _experience(2, batch=2)]
    per_part = [rla_openrlhf.token_metrics(e) for e in parts]
    tokens = [float(e.action_mask.sum()) for e in parts]
    whole = mismatch(torch.cat([e.action_log_probs for e in parts]), torch.cat([e.rollout_log_probs for e in parts]),
                     torch.cat([e.action_mask for e in parts]))
    assert set(per_part[0]) == {k for k in whole if k in rla_openrlhf.TOKEN_MEAN_KEYS
                                or k.startswith(("mismatch/clip_leak/", "mismatch/bitwise/"))}
    for key in per_part[0]:
        reduced = sum(float(m[key]) * n for m, n in zip(per_part, tokens)) / sum(tokens)
        assert reduced == pytest.approx(whole[key], rel=1e-9, abs=1e-15), key
    assert "mismatch/k1" not in rla_openrlhf.token_metrics(parts[0], skip_k1=True)  # OpenRLHF's vllm_kl is -k1
    assert rla_openrlhf.token_metrics(Experience(action_log_probs=parts[0].action_log_probs,
                                                 action_mask=parts[0].action_mask)) == {}  # no rollout logprobs


def test_openrlhf_loggers_prefix_train_so_names_as_gives_status_keys():
    """OpenRLHF's own TensorboardLogger.log_train (its writer records instead of writing files):
    keys go out as train/<key>; names_as(.., "openrlhf") must not carry train/ itself."""

    class Writer:
        def __init__(self):
            self.tags = []

        def add_scalar(self, tag, value, step):
            self.tags.append(tag)

    logger = TensorboardLogger.__new__(TensorboardLogger)
    logger.writer = Writer()
    exp = _experience(3)
    keys = names_as(mismatch(exp.action_log_probs, exp.rollout_log_probs, exp.action_mask), "openrlhf")
    logger.log_train(1, {k: v for k, v in keys.items() if k in ("vllm_kl", "mismatch/k3")})
    assert sorted(logger.writer.tags) == ["train/mismatch/k3", "train/vllm_kl"]


def test_patch_says_where_the_metrics_hook_is_off():
    """Without Ray/vLLM (this CPU test) OpenRLHF's PPO actor cannot be imported: patch() aligns
    and says the metrics hook is off here; in the policy's Ray worker it wraps training_step."""
    try:
        import ray  # noqa: F401
        import vllm  # noqa: F401
        pytest.skip("Ray and vLLM are installed: the hook is on here")
    except ImportError:
        pass
    try:
        assert "off in this process" in rla_openrlhf.patch("vllm")
        assert rla_openrlhf.patch("vllm", metrics=False) == "off (metrics=False)"
    finally:
        rla_openrlhf.unpatch()


def test_actor_with_liger_kernel_is_aligned_over_liger(patched):
    """OpenRLHF's --ds.use_liger_kernel loads through Liger's AutoLigerKernelForCausalLM (Liger's
    classes in the model); rla aligns over them: the same logits as the plain aligned model."""
    import importlib

    pytest.importorskip("liger_kernel")
    modeling = importlib.import_module("transformers.models.qwen2.modeling_qwen2")
    saved, forward = dict(vars(modeling)), modeling.Qwen2ForCausalLM.__dict__["forward"]
    try:
        actor = Actor(MODEL, attn_implementation="eager", param_dtype="bf16", use_liger_kernel=True)
        assert type(actor.model.model.norm).__name__ == "LigerRMSNorm"
        assert any("Liger" in n for n in actor.rla_alignment.notes)
        with torch.no_grad():
            logits = actor.model(SEQ, attention_mask=torch.ones_like(SEQ)).logits
    finally:
        for name, value in saved.items():
            setattr(modeling, name, value)
        modeling.Qwen2ForCausalLM.forward = forward
    assert torch.equal(logits, _reference_logits(actor.rla_alignment.profile))


def test_the_profile_is_the_row_of_the_rollout_engines_vllm(monkeypatch):
    """RLA_ENGINE_VERSION (the vLLM the rollout actors run) picks the row; an uncalibrated one
    warns naming the nearest row, and every Actor's report says which version it was matched to."""
    import warnings

    from rla.profiles import ProfileVersionWarning

    monkeypatch.setenv("RLA_PROFILE", "vllm")
    monkeypatch.setenv("RLA_ENGINE_VERSION", "0.34.0")
    model = AutoModelForCausalLM.from_pretrained(MODEL, dtype=torch.bfloat16, attn_implementation="eager")
    try:
        with pytest.warns(ProfileVersionWarning, match=r"vllm 0\.34\.0 \(given\) has no calibrated row"):
            rla_openrlhf.setup_worker()
        assert rla_openrlhf.patched().name == "vllm-0.33"
        assert "vllm 0.34.0" in Actor(model).rla_alignment.profile_choice
        monkeypatch.setenv("RLA_ENGINE_VERSION", "0.33.0")
        with warnings.catch_warnings():
            warnings.simplefilter("error", ProfileVersionWarning)
            rla_openrlhf.setup_worker()
        assert "the row of vllm 0.33.0" in str(Actor(model).rla_alignment)
        with pytest.raises(ValueError, match="needs an engine alias"):
            rla_openrlhf.patch("hf", engine_version="0.33.0")
    finally:
        rla_openrlhf.unpatch()
