"""rla.engines.vllm_live without a GPU: record conversion against vLLM's own output containers,
the sampling-settings check, and the errors a user meets before any engine starts.

vLLM's logprob containers (``vllm/logprobs.py``: ``Logprob``, ``FlatLogprobs`` and the functions
its output processor fills them with) are a stdlib-only module; it is read from the real wheels
(0.33.0 and 0.26.0, the version run live) and executed as a module of its own, never copied here.
The request / completion objects are plain namespaces with the attribute names the same wheel's
``vllm/outputs.py`` gives ``RequestOutput`` and ``CompletionOutput``, checked against that file.
"""

from __future__ import annotations

import ast
import importlib.abc
import itertools
import math
import struct
import sys
import types
import zipfile

import pytest

from rla.engines import vllm_live
from rla.engines.source import EngineNotFound, EngineUnavailable, locate
from rla.engines.vllm_live import (
    LiveSettings, LiveVllm, check_sampling, engine_environment, engine_metadata, prompt_logprobs_of,
    records_of,
)
from rla.rollout import rollouts
from rla.rollout.rollouts import RolloutRecord

NONES = itertools.repeat(None)  # what vLLM passes as decoded tokens with skip_tokenizer_init


@pytest.fixture(scope="module", params=["vllm_uncalibrated_wheel", "vllm_wheel"], ids=["0.26", "0.33"])
def wheel(request):
    return request.getfixturevalue(request.param)


@pytest.fixture(scope="module")
def vlp(wheel):
    """The wheel's ``vllm/logprobs.py``, executed as a module named after its version."""
    pkg = locate("vllm", wheel)
    src = pkg.read_text("vllm/logprobs.py")
    name = f"_rla_test_vllm_logprobs_{pkg.version.replace('.', '_')}"
    mod = types.ModuleType(name)
    mod.__file__ = pkg.label("vllm/logprobs.py")
    sys.modules[name] = mod  # dataclasses look their module up while the classes are made
    try:
        exec(compile(src, mod.__file__, "exec"), mod.__dict__)
    finally:
        del sys.modules[name]
    for attr in ("Logprob", "FlatLogprobs", "create_prompt_logprobs", "create_sample_logprobs",
                 "append_logprobs_for_next_position"):
        assert hasattr(mod, attr), f"{attr} is no longer in {mod.__file__}"
    return mod


def _attributes(wheel) -> dict[str, set[str]]:
    """The fields of ``CompletionOutput`` and the ``self.X =`` attributes of ``RequestOutput``."""
    tree = ast.parse(zipfile.ZipFile(wheel).read("vllm/outputs.py").decode())
    out: dict[str, set[str]] = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name in ("RequestOutput", "CompletionOutput"):
            names = {s.target.id for s in node.body if isinstance(s, ast.AnnAssign)
                     and isinstance(s.target, ast.Name)}
            for sub in ast.walk(node):
                if isinstance(sub, ast.Attribute) and isinstance(sub.ctx, ast.Store) \
                        and isinstance(sub.value, ast.Name) and sub.value.id == "self":
                    names.add(sub.attr)
            out[node.name] = names
    return out


def test_output_attributes_are_vllms(wheel):
    attrs = _attributes(wheel)
    assert {"prompt_token_ids", "prompt_logprobs", "outputs"} <= attrs["RequestOutput"]
    assert {"token_ids", "logprobs", "finish_reason"} <= attrs["CompletionOutput"]


# -- building outputs as vLLM's output processor does ----------------------------------------------

PROMPT = [11, 7, 7, 3, 19, 5]
# per position t >= 1: (logprob of the prompt token, rank, [(top token, logprob), ...])
PROMPT_LPS = [-2.5, -0.0, -1.0000000000000002, -7.25e-05, -31.0]
TOP = [(7, -0.5), (7, -0.0), (1, -0.25), (5, -0.125), (4, -0.0625)]
RESPONSE = [4, 4, 9]
RESPONSE_LPS = [-0.0, -3.140625, -1e-300]


def _prompt_logprobs(vlp, flat: bool, top: int = 1):
    """``create_prompt_logprobs`` then one ``append_logprobs_for_next_position`` per position: the
    prompt token first, then the top-k (vLLM's row layout), ``num_logprobs=top``."""
    c = vlp.create_prompt_logprobs(flat)
    for t in range(1, len(PROMPT)):
        ids, lps = [PROMPT[t]], [PROMPT_LPS[t - 1]]
        if top:
            ids.append(TOP[t - 1][0])
            lps.append(TOP[t - 1][1] if TOP[t - 1][0] != PROMPT[t] else PROMPT_LPS[t - 1])
        vlp.append_logprobs_for_next_position(c, ids, lps, NONES, rank=t, num_logprobs=top)
    return c


def _sample_logprobs(vlp, flat: bool, tokens=RESPONSE, lps=RESPONSE_LPS):
    c = vlp.create_sample_logprobs(flat)
    for tok, lp in zip(tokens, lps):
        vlp.append_logprobs_for_next_position(c, [tok], [lp], NONES, rank=1, num_logprobs=0)
    return c


def _request(prompt_logprobs=None, outputs=(), prompt=PROMPT):
    return types.SimpleNamespace(prompt_token_ids=list(prompt), prompt_logprobs=prompt_logprobs,
                                 outputs=list(outputs))


def _completion(logprobs, token_ids=RESPONSE, finish_reason="length"):
    return types.SimpleNamespace(token_ids=list(token_ids), logprobs=logprobs, finish_reason=finish_reason)


def _bits(xs):
    return [struct.pack("<d", float(x)) for x in xs]


@pytest.mark.parametrize("flat", [True, False], ids=["flat", "lists"])
@pytest.mark.parametrize("top", [0, 1])
def test_prompt_logprobs_are_the_prompt_tokens_bit_for_bit(vlp, flat, top):
    c = _prompt_logprobs(vlp, flat, top)
    assert isinstance(c, vlp.FlatLogprobs) == flat
    assert len(c) == len(PROMPT)
    got = prompt_logprobs_of(_request(c))
    assert _bits(got) == _bits(PROMPT_LPS)  # -0.0 stays -0.0, no value rounds
    assert math.copysign(1.0, got[1]) == -1.0
    assert all(type(x) is float for x in got)


@pytest.mark.parametrize("flat", [True, False], ids=["flat", "lists"])
def test_prompt_logprobs_refuse_what_they_cannot_read(vlp, flat):
    with pytest.raises(ValueError, match="without prompt_logprobs"):
        prompt_logprobs_of(_request(None))
    short = _prompt_logprobs(vlp, flat)[: len(PROMPT) - 1]  # a slice is what vLLM's containers give
    with pytest.raises(ValueError, match=f"{len(PROMPT) - 1} prompt logprob entries for {len(PROMPT)}"):
        prompt_logprobs_of(_request(short))
    # position 3 holds a logprob, but of another token than the prompt's
    c = vlp.create_prompt_logprobs(flat)
    for t in range(1, len(PROMPT)):
        tok = PROMPT[t] if t != 3 else PROMPT[t] + 100
        vlp.append_logprobs_for_next_position(c, [tok], [-1.0], NONES, rank=1, num_logprobs=0)
    with pytest.raises(ValueError, match=f"prompt position 3: no logprob for the prompt token {PROMPT[3]}"):
        prompt_logprobs_of(_request(c))
    # a position with no entry at all (None in the list form, an empty position when flat)
    c = vlp.create_prompt_logprobs(flat)
    for t in range(1, len(PROMPT)):
        if t == 2:
            c.append(None)
        else:
            vlp.append_logprobs_for_next_position(c, [PROMPT[t]], [-1.0], NONES, rank=1, num_logprobs=0)
    with pytest.raises(ValueError, match="prompt position 2: no logprob"):
        prompt_logprobs_of(_request(c))


META = {"engine": engine_metadata("0.26.0", LiveSettings(mode="eager"), environ={"VLLM_MLA_DISABLE": "1", "PATH": "/x"}),
        "run": "cpu-test"}


@pytest.mark.parametrize("flat", [True, False], ids=["flat", "lists"])
def test_records_of_vllm_outputs(vlp, flat, tmp_path):
    other = [9, 2]
    out = _request(_prompt_logprobs(vlp, flat), [
        _completion(_sample_logprobs(vlp, flat)),
        _completion(_sample_logprobs(vlp, flat, other, [-0.5, -2.0]), other, "stop"),
    ])
    recs = records_of(out, temperature=1.0, top_p=1.0, top_k=-1, metadata=META, processed=False)
    assert [type(r) for r in recs] == [RolloutRecord, RolloutRecord]
    a, b = recs
    assert a.prompt_ids == PROMPT and b.prompt_ids == PROMPT
    assert a.response_ids == RESPONSE and b.response_ids == other
    assert _bits(a.logprobs) == _bits(RESPONSE_LPS) and b.logprobs == [-0.5, -2.0]
    assert (a.temperature, a.top_p, a.top_k, a.engine, a.engine_version) == (1.0, 1.0, -1, "vllm", "0.26.0")
    assert a.metadata == dict(META, finish_reason="length", completion=0)
    assert b.metadata == dict(META, finish_reason="stop", completion=1)
    assert a.metadata["engine"] == {"name": "vllm", "version": "0.26.0", "mode": "eager",
                                    "settings": LiveSettings(mode="eager").as_dict(),
                                    "environment": {"VLLM_MLA_DISABLE": "1"}}  # vLLM's variables only
    assert META == {"engine": META["engine"], "run": "cpu-test"}  # the caller's dict is not changed
    # the records are valid rla.rollout/1 lines and come back bit for bit
    path = tmp_path / "r.jsonl"
    rollouts.save(path, recs)
    back = rollouts.load(path)
    assert [(r.response_ids, _bits(r.logprobs), r.engine_version, r.metadata) for r in back] == \
        [(r.response_ids, _bits(r.logprobs), r.engine_version, r.metadata) for r in recs]
    # metadata without the engine's identity: no engine_version is made up
    plain = records_of(out, temperature=1.0, top_p=1.0, top_k=0, metadata={}, processed=False)
    assert plain[0].engine_version is None and plain[0].top_k == -1


@pytest.mark.parametrize("flat", [True, False], ids=["flat", "lists"])
def test_records_of_drops_nothing_silently(vlp, flat):
    def records(*completions):
        return records_of(_request(None, completions), temperature=1.0, top_p=1.0, top_k=-1,
                          metadata=META, processed=False)

    good = _completion(_sample_logprobs(vlp, flat))
    with pytest.raises(ValueError, match="made without logprobs"):
        records(good, _completion(None))
    with pytest.raises(ValueError, match="no completions"):
        records()
    with pytest.raises(ValueError, match="completion 0 has no tokens"):
        records(_completion(vlp.create_sample_logprobs(flat), token_ids=[]))
    with pytest.raises(ValueError, match="completion 1: 2 logprob entries for 3 tokens"):
        records(good, _completion(_sample_logprobs(vlp, flat, RESPONSE[:2], RESPONSE_LPS[:2])))
    wrong = _sample_logprobs(vlp, flat, [4, 5, 9], RESPONSE_LPS)  # token 1's entry is of token 5
    with pytest.raises(ValueError, match="completion 0, token 1: no logprob for the sampled token 4"):
        records(_completion(wrong))
    # an engine value the rollout format refuses is not clipped either
    with pytest.raises(rollouts.RolloutFormatError):
        records(_completion(_sample_logprobs(vlp, flat, RESPONSE, [-1.0, 0.5, -1.0])))


# -- sampling settings -----------------------------------------------------------------------------

@pytest.mark.parametrize("t, p, k", [(0.7, 1.0, -1), (1.3, 1.0, -1), (1.0, 0.9, -1), (1.0, 1.0, 1),
                                     (1.0, 1.0, 50)])
def test_raw_logprobs_refused_unless_untempered_and_untruncated(vlp, t, p, k):
    with pytest.raises(ValueError, match="processed_logprobs"):
        check_sampling(t, p, k, processed=False)
    check_sampling(t, p, k, processed=True)
    out = _request(None, [_completion(_sample_logprobs(vlp, True))])
    with pytest.raises(ValueError, match="raw_logprobs are of the untempered"):
        records_of(out, temperature=t, top_p=p, top_k=k, metadata=META, processed=False)
    (rec,) = records_of(out, temperature=t, top_p=p, top_k=k, metadata=META, processed=True)
    assert (rec.temperature, rec.top_p, rec.top_k) == (t, p, k)


@pytest.mark.parametrize("k", [-1, 0])
def test_raw_logprobs_accepted_at_temperature_one(k):
    check_sampling(1.0, 1.0, k, processed=False)


# -- what a user sees before any engine starts -----------------------------------------------------

class _NoVllm(importlib.abc.MetaPathFinder):
    """Fails any import of vLLM, so a check that would come after ``from vllm import LLM`` shows."""

    def __init__(self):
        self.tried: list[str] = []

    def find_spec(self, name, path=None, target=None):
        if name == "vllm" or name.startswith("vllm."):
            self.tried.append(name)
            raise AssertionError(f"{name} was imported before the check fired")
        return None


@pytest.fixture
def no_vllm(monkeypatch):
    for name in [n for n in sys.modules if n == "vllm" or n.startswith("vllm.")]:
        monkeypatch.delitem(sys.modules, name)
    guard = _NoVllm()
    monkeypatch.setattr(sys, "meta_path", [guard, *sys.meta_path])
    yield guard
    assert "vllm" not in sys.modules and not guard.tried


@pytest.fixture
def checkpoint(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    return str(tmp_path)


def test_no_vllm_names_the_install(no_vllm, checkpoint, monkeypatch):
    monkeypatch.setattr(vllm_live, "installed_version", lambda: None)
    with pytest.raises(EngineNotFound, match=r"vLLM is not installed.*pip install vllm==0\.26\.0"):
        LiveVllm(checkpoint)
    assert "vllm" not in sys.modules


def test_installed_version_reads_metadata_only(no_vllm, monkeypatch):
    import importlib.metadata
    import importlib.util

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    assert vllm_live.installed_version() is None
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: object() if name == "vllm" else None)
    monkeypatch.setattr(importlib.metadata, "version", lambda name: {"vllm": "0.26.0"}[name])
    assert vllm_live.installed_version() == "0.26.0"

    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", missing)  # a stray vllm/ folder, no package
    assert vllm_live.installed_version() is None
    assert "vllm" not in sys.modules


def test_version_not_run_against_names_both(no_vllm, checkpoint, monkeypatch, vllm_wheel,
                                            vllm_uncalibrated_wheel):
    newer = locate("vllm", vllm_wheel).version  # 0.33.0, a real release the adapter never ran
    assert newer.startswith("0.33")
    monkeypatch.setattr(vllm_live, "installed_version", lambda: newer)
    with pytest.raises(EngineUnavailable, match=rf"vLLM {newer} is installed.*run against vLLM 0\.26 only"):
        LiveVllm(checkpoint)
    assert "vllm" not in sys.modules
    ran = locate("vllm", vllm_uncalibrated_wheel).version
    assert vllm_live._check_version(ran) == ran == "0.26.0"
    assert vllm_live._check_version("0.26.1+cu130") == "0.26.1+cu130"
    for v in ("0.2.6", "0.260.0", "1.26.0"):
        with pytest.raises(EngineUnavailable, match=f"vLLM {v} is installed"):
            vllm_live._check_version(v)


def test_no_cuda(no_vllm, checkpoint, monkeypatch):
    import torch

    monkeypatch.setattr(vllm_live, "installed_version", lambda: "0.26.0")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    env = {k: v for k, v in vllm_live.os.environ.items()}
    with pytest.raises(EngineUnavailable, match="runs on CUDA.*sees no GPU"):
        LiveVllm(checkpoint, LiveSettings(mode="eager", batch_invariant=True))
    assert "vllm" not in sys.modules
    assert dict(vllm_live.os.environ) == env  # nothing set for an engine that never started


def test_folder_without_config(no_vllm, tmp_path, monkeypatch):
    monkeypatch.setattr(vllm_live, "installed_version", lambda: "0.26.0")
    with pytest.raises(FileNotFoundError, match="not an HF checkpoint folder"):
        LiveVllm(str(tmp_path))
    with pytest.raises(FileNotFoundError, match="no config.json"):
        LiveVllm(str(tmp_path / "missing"))
    assert "vllm" not in sys.modules


def test_settings_validation(no_vllm):
    with pytest.raises(ValueError, match="mode must be one of"):
        LiveSettings(mode="O2")
    with pytest.raises(ValueError, match="compilation_config has no effect with mode='eager'"):
        LiveSettings(mode="eager", compilation_config={"mode": 3})
    for bad in (0, 1.5, -0.1):
        with pytest.raises(ValueError, match="gpu_memory_utilization"):
            LiveSettings(gpu_memory_utilization=bad)
    ok = LiveSettings(compilation_config={"cudagraph_mode": "PIECEWISE"})
    assert ok.as_dict()["compilation_config"] == {"cudagraph_mode": "PIECEWISE"}
    assert LiveSettings().attention_backend == "TRITON_ATTN"
    assert "vllm" not in sys.modules


def test_engine_environment():
    env = {"VLLM_BATCH_INVARIANT": "1"}  # left in the shell by an earlier run
    engine_environment(LiveSettings(), env)
    assert env == {"VLLM_BATCH_INVARIANT": "0", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    env = {"VLLM_ENABLE_V1_MULTIPROCESSING": "1"}  # the user's own choice is kept
    engine_environment(LiveSettings(batch_invariant=True), env)
    assert env == {"VLLM_BATCH_INVARIANT": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "1"}
