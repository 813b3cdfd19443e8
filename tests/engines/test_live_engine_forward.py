"""`rla verify --live --engine-forward`: the engine-backed side of the live report, on CPU.

The stand-in engine is vLLM 0.26.0's default-mode code as the engine-backed forward runs it
(``rla.engines.live_verify.engine_backed_forward``: vLLM's own native region code from the 0.26
wheel, compiled by Inductor in pieces split at attention), on the bundled model: its prompt
logprobs and its response's logprobs are ``log_softmax(bf16 logits, fp32)`` of one forward through
those pieces, saved as ``rla verify --live`` saves a run. Re-scored from the saved files with
``--engine-forward`` and the 0.26 wheel (the CLI loads the wheel again; the compiled pieces are
shared within the process, so they are compiled once), the side ``engine-forward`` must be
bit-equal in prefill and decode, and rla's ``vllm-0.26`` row must not (Inductor's CPU kernels
reduce the bundled model's norms in another order than rla's ops), so the side runs the engine's
code and not a copy of its rounding. That these pieces equal the twin's own forward bit for bit
is ``tests/engines/test_vllm_forward.py``'s. The refusals come before any compile; the real engine
on a GPU is ``test_the_engine_forward_side_against_the_real_engine`` (marked ``gpu``).
"""

import json
import sys

import pytest
import torch

from rla.cli import main
from rla.engines import live_verify as V
from rla.models import build_model, bundled_path, tiny_config
from rla.rollout import rollouts
from rla.rollout.rollouts import RolloutRecord

META = {"name": "vllm", "version": "0.26.0", "mode": "default",
        "settings": {"mode": "default", "attention_backend": "TRITON_ATTN"}}


def _write(folder, data):
    folder.mkdir()
    (folder / "engine.json").write_text(json.dumps({"engine": data.engine, "prompts": data.prompts,
                                                    "prompt_logprobs": data.prompt_logprobs}))
    rollouts.save(folder / "rollouts.jsonl", data.records)


@pytest.fixture(scope="module")
def saved(vllm_uncalibrated_wheel, tmp_path_factory):
    """The engine-backed forward's run saved as ``rla verify --live`` leaves one, in default and
    (metadata only) eager mode."""
    from rla.alignment import aligned
    from rla.engines import vllm
    from rla.engines.live_calibration import train_logprobs
    from rla.hf import load_model
    from rla.rollout.fingerprint import weights_fingerprint

    model = load_model(str(bundled_path()), torch.bfloat16, "cpu")
    pieces = V.engine_backed_forward(vllm.load(vllm_uncalibrated_wheel), "default")  # the CLI reuses its compile
    vocab = model.config.vocab_size
    prompts = V.random_prompts(vocab, [40])
    with aligned(model, pieces.profile, ops=pieces):
        pre = [train_logprobs(model, p).tolist() for p in prompts]
        records = []
        for p, r in zip(V.random_prompts(vocab, [8], seed=1), V.random_prompts(vocab, [6], seed=2)):
            lps = train_logprobs(model, p + r)[len(p) - 1:].tolist()
            records.append(RolloutRecord(prompt_ids=p, response_ids=r, logprobs=lps, temperature=1.0, top_p=1.0,
                                         top_k=-1, engine="vllm", engine_version="0.26.0", metadata={"engine": META}))
    data = V.with_weights(V.EngineData(prompts, pre, records, dict(META)), weights_fingerprint(model))
    root = tmp_path_factory.mktemp("engine-run")
    _write(root / "default", data)
    eager = {**data.engine, "mode": "eager", "settings": {**META["settings"], "mode": "eager"}}
    _write(root / "eager", V.EngineData(data.prompts, data.prompt_logprobs, data.records, eager))
    return root


def test_the_engine_forward_side_is_the_engines_code(saved, vllm_uncalibrated_wheel, tmp_path):
    out = tmp_path / "report"
    assert main(["verify", "--live", "--engine-outputs", str(saved / "default"), "--model", "bundled",
                 "--engine-forward", "--wheel", vllm_uncalibrated_wheel, "--out", str(out)]) == 0
    rep = json.loads((out / "report.json").read_text())
    by = {r["side"]: r for r in rep["rows"]}
    assert list(by) == ["hf", "vllm-0.26", "vllm-0.26-eager", V.ENGINE_SIDE]
    side = by[V.ENGINE_SIDE]
    assert side["prefill"]["equal"] == 1.0 and side["decode"]["equal"] == 1.0
    assert side["prefill"]["k3"] == 0.0 and side["decode"]["max_abs"] == 0.0
    assert side["prefill"]["tokens"] == 39 and side["decode"]["tokens"] == 6
    assert side["forward"] == "vLLM 0.26.0 default-mode pieces" and side["points"] is None
    assert side["gradient_row"] == "vllm-0.26"  # the row of its version and mode, for the backward
    # the row's ops are another forward (on this bundled model they can equal the engine's code on one CPU
    # and part by an ulp on another: tests/cpu_orders.py); what the side names is checked, not its bits
    assert by["vllm-0.26"]["forward"] == "rla.ops"
    assert by["hf"]["forward"] == "HF eager" and by["hf"]["prefill"]["k3"] > by["vllm-0.26"]["prefill"]["k3"]
    text = (out / "report.md").read_text()
    assert "Side `engine-forward`: vLLM 0.26.0 default-mode pieces, the engine's own code" in text
    assert f"| {V.ENGINE_SIDE} | 100.000% | 0.00e+00 | 100% | 0 | 100.000% | 0.00e+00 | 100% | 0 |" in text
    assert rep["engine"]["settings"]["train_attention"] == "model" and "vllm" not in sys.modules


def test_what_the_engine_forward_side_refuses_before_any_compile(saved, vllm_uncalibrated_wheel, vllm_wheel,
                                                                 tmp_path, capsys, monkeypatch):
    from rla.engines import vllm_twin

    def no_twin(*a, **k):
        raise AssertionError("a twin was built before the refusal")

    monkeypatch.setattr(vllm_twin.VllmTwin, "__init__", no_twin)
    run = str(saved / "default")
    cases = [
        (["--engine-forward", "--wheel", vllm_wheel], "runs vLLM 0.33.0's code (wheel); the engine outputs are "
         "vLLM 0.26.0: give --wheel vLLM 0.26.0"),
        (["--wheel", vllm_uncalibrated_wheel], "--wheel: with --live, only used by --engine-forward"),
        (["--engine-forward", "--wheel", vllm_uncalibrated_wheel, "--library", "x.so"],
         "--library: vLLM's CUDA kernels serve --engine-forward in eager mode only"),
        (["--engine-forward", "--wheel", str(tmp_path / "none.whl")], "none.whl does not exist"),
    ]
    moe = tmp_path / "moe"
    build_model(tiny_config("qwen3_moe", "micro"), torch.bfloat16, seed=0).save_pretrained(moe)
    cases.append((["--engine-forward", "--wheel", vllm_uncalibrated_wheel, "--model", str(moe)],
                  "the engine-backed forward covers qwen2, qwen3, llama; --model is 'qwen3_moe'"))
    if not torch.cuda.is_available():
        run_eager = ["--engine-outputs", str(saved / "eager"), "--engine-forward", "--wheel", vllm_uncalibrated_wheel]
        cases.append((run_eager, "--engine-forward in eager mode runs vLLM's CUDA kernels per op"))
    for argv, message in cases:
        if "--engine-outputs" not in argv:
            argv = ["--engine-outputs", run, *argv]
        if "--model" not in argv:
            argv = ["--model", "bundled", *argv]
        assert main(["verify", "--live", "--out", str(tmp_path / "x"), *argv]) == 2, argv
        err = " ".join(capsys.readouterr().err.split())
        assert message in err and "Traceback" not in err, (argv, err)
    assert not (tmp_path / "x").exists()


@pytest.mark.gpu
def test_the_engine_forward_side_against_the_real_engine(tmp_path):
    """Both modes of the real vLLM 0.26 on the bundled model, the engine-backed side beside the rows,
    with each attention (needs CUDA and vLLM 0.26 installed)."""
    from rla.engines.vllm_live import installed_version

    if not torch.cuda.is_available() or installed_version() != "0.26.0":
        pytest.skip("needs CUDA and vLLM 0.26.0 installed")
    for mode in ("default", "eager"):
        for attention in ("model", "engine"):
            out = tmp_path / f"{mode}-{attention}"
            assert main(["verify", "--live", "--model", str(bundled_path()), "--mode", mode, "--engine-forward",
                         "--train-attention", attention, "--prompt-tokens", "512,2048", "--responses", "4",
                         "--max-new-tokens", "64", "--out", str(out)]) == 0
            rep = json.loads((out / "report.json").read_text())
            side = rep["rows"][-1]
            assert side["side"] == V.ENGINE_SIDE and side["forward"].startswith("vLLM 0.26.0")
            assert side["prefill"]["tokens"] == 511 + 2047 and side["decode"]["tokens"] == 4 * 64
            assert rep["engine"]["settings"]["train_attention"].startswith(attention)
