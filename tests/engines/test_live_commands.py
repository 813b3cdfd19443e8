"""`rla verify --live` and `rla calibrate --live` without vLLM: everything after the engine, driven
by engine data that rla's own code made under a known row, and every refusal before the engine.

The stand-in engine is a tiny Qwen2 aligned under ``vllm-0.26-eager``: its prompt
logprobs are one forward per prompt under that row, its responses are sampled by rla's rollout
stack (``rla.rollout.sampler``) under that row, with the logprob of each sampled token from one
forward over prompt + response (a batch-invariant engine). So the verify report must show that row
bit-equal in prefill and decode and every other side not, and the live search, started from
``vllm-0.33``, must come back to that row's values at every point the model decides and write them
as a row with ``live`` evidence (named anew: rla ships ``vllm-0.26-eager``) that ``rla.profiles.load`` reads back. The only
part not run here is vLLM itself (``test_the_real_commands_on_a_gpu``, marked ``gpu``).
"""

import json
import sys

import pytest
import torch

from rla import profiles
from rla.alignment import aligned
from rla.cli import main
from rla.engines import live_verify as V
from rla.engines.live_calibration import train_logprobs
from rla.engines.live_profile import live_name
from rla.models import build_model, bundled_path, tiny_config
from rla.rollout.rollouts import RolloutRecord
from rla.rollout.sampler import Sampler, SamplingParams

TRUTH = "vllm-0.26-eager"


class RowEngine:
    """The engine's side made by rla: ``model`` under ``row`` (module docstring)."""

    def __init__(self, model, row):
        self.model, self.row = model, profiles.get(row)
        self.metadata = {"name": "vllm", "version": "0.26.0", "mode": "eager",
                         "settings": {"mode": "eager", "attention_backend": "TRITON_ATTN"}}

    def prompt_logprobs(self, prompts):
        with aligned(self.model, self.row):
            return [train_logprobs(self.model, p).tolist() for p in prompts]

    def sample(self, prompts, *, max_tokens, seed):
        sampled = Sampler(self.model, profile=self.row).generate(
            prompts, SamplingParams(max_new_tokens=max_tokens, seed=seed, ignore_eos=True))
        out = []
        with aligned(self.model, self.row):
            for r in sampled:
                lps = train_logprobs(self.model, r.prompt_ids + r.response_ids)[len(r.prompt_ids) - 1:].tolist()
                out.append(RolloutRecord(prompt_ids=r.prompt_ids, response_ids=r.response_ids, logprobs=lps,
                                         temperature=1.0, top_p=1.0, top_k=-1, engine="vllm",
                                         engine_version="0.26.0", metadata={"engine": self.metadata}))
        return out


@pytest.fixture(scope="module")
def model():
    """A 2-layer Qwen2 at the micro size, hidden 64 (the search runs ~140 scorings: the bundled 6-layer model
    takes minutes on a CPU, and the tiny size's GEMMs at hidden 256 were most of the rest); norm weights drawn
    around 1, where HF's init of 1 would make per_op and fused norms equal."""
    m = build_model(tiny_config("qwen2", "micro"), torch.bfloat16, seed=0).eval()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in m.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.2 * torch.randn(p.shape, generator=g))
    return m


@pytest.fixture(scope="module")
def data(model):
    vocab = model.config.vocab_size
    return V.collect(RowEngine(model, TRUTH), V.random_prompts(vocab, [64, 32]),
                     V.random_prompts(vocab, [16, 16], seed=1), max_new_tokens=8)


def test_the_report_shows_the_row_that_made_the_engine_bit_equal(model, data, tmp_path):
    sides = V.candidates("vllm", "0.26.0", "eager", ("default", "eager"))
    assert list(sides) == ["hf", "vllm-0.26-eager", "vllm-0.26"]  # the rows calibrated on 0.26, mode first
    assert list(V.candidates("vllm", "0.27.1", "default", ("default", "eager"))) == ["hf", "vllm-0.26", "vllm-0.26-eager"]
    rows = V.compare(model, sides, data)
    by = {r["side"]: r for r in rows}
    assert by[TRUTH]["prefill"]["equal"] == 1.0 and by[TRUTH]["decode"]["equal"] == 1.0
    assert by[TRUTH]["prefill"]["k3"] == 0.0 and by[TRUTH]["decode"]["max_abs"] == 0.0
    for side in ("hf", "vllm-0.26"):
        assert by[side]["prefill"]["equal"] < 1.0 and by[side]["prefill"]["k3"] > 0
    assert by[TRUTH]["prefill"]["tokens"] == 63 + 31 and by[TRUTH]["decode"]["tokens"] == 16
    # k3 against an independent fp64 expression of its definition
    with torch.no_grad():
        t = torch.cat([train_logprobs(model, p) for p in data.prompts])
    d = t - torch.tensor(sum(data.prompt_logprobs, []), dtype=torch.float64)
    assert by["hf"]["prefill"]["k3"] == pytest.approx(float((d.exp() - 1 - d).mean()), rel=1e-12)
    rep = V.report(data, rows, V.model_info(model.config))
    text = V.render(rep)
    assert f"| {TRUTH} | 100.000% | 0.00e+00 | 100% | 0 | 100.000% | 0.00e+00 | 100% | 0 |" in text
    assert "| hf | " in text and "0-1024" in text
    from rla.commands.verify_live import publish

    out = tmp_path / "report"
    publish(rep, data, out, overwrite=False)
    assert json.loads((out / "report.json").read_text())["rows"][1]["side"] == TRUTH
    assert (out / "report.md").read_text() == text
    from rla.rollout import rollouts

    assert [r.logprobs for r in rollouts.load(out / "rollouts.jsonl")] == [r.logprobs for r in data.records]
    with pytest.raises(FileExistsError, match="not empty.*--overwrite"):
        publish(rep, data, out, overwrite=False)
    publish(rep, data, out, overwrite=True)  # a folder rla wrote may be replaced


def test_regions_reach_every_rows_alignment(model, data):
    """``compare(..., regions=)`` aligns each row's side with those regions only: the truth row aligned in RoPE alone
    is no longer the engine (its norms and SwiGLU are HF's), and equals a side aligned so by hand."""
    sides = {"hf": None, TRUTH: profiles.get(TRUTH)}
    rows = {r["side"]: r for r in V.compare(model, sides, data, regions=("rope",))}
    assert rows[TRUTH]["regions"] == ["rope"] and rows["hf"]["regions"] is None
    assert rows[TRUTH]["prefill"]["equal"] < 1.0
    with aligned(model, TRUTH, regions=("rope",)):
        by_hand = torch.cat([train_logprobs(model, p) for p in data.prompts])
    d = by_hand - torch.tensor(sum(data.prompt_logprobs, []), dtype=torch.float64)
    assert rows[TRUTH]["prefill"]["k3"] == pytest.approx(float((d.exp() - 1 - d).mean()), rel=1e-12)
    full = {r["side"]: r for r in V.compare(model, sides, data)}
    assert full[TRUTH]["regions"] == ["rope", "swiglu", "rmsnorm"] and full[TRUTH]["prefill"]["equal"] == 1.0


@pytest.fixture(scope="module")
def saved(model, data, tmp_path_factory):
    """The stand-in engine's run as ``rla verify --live`` leaves it (its engine.json and
    rollouts.jsonl), and the checkpoint it ran, both as files."""
    from rla.commands.verify_live import publish
    from rla.rollout.fingerprint import weights_fingerprint

    root = tmp_path_factory.mktemp("saved")
    model.save_pretrained(root / "ckpt")
    stamped = V.with_weights(data, weights_fingerprint(model))
    rows = V.compare(model, {"hf": None}, stamped)
    publish(V.report(stamped, rows, V.model_info(model.config)), stamped, root / "run", overwrite=False)
    return root


def test_saved_engine_outputs_are_scored_without_the_engine(saved, tmp_path, capsys):
    """``--engine-outputs``: the report of a saved run, on a CPU, without vLLM; what it refuses."""
    run, ckpt = str(saved / "run"), str(saved / "ckpt")
    assert main(["verify", "--live", "--engine-outputs", run, "--model", ckpt, "--profile", "rla",
                 "--out", str(tmp_path / "v")]) == 0
    rep = json.loads((tmp_path / "v" / "report.json").read_text())
    by = {r["side"]: r for r in rep["rows"]}
    assert list(by) == ["hf", TRUTH, "vllm-0.26", "rla"] and rep["engine"]["mode"] == "eager"
    assert by[TRUTH]["prefill"]["equal"] == 1.0 and by[TRUTH]["decode"]["equal"] == 1.0
    assert by["hf"]["prefill"]["equal"] < 1.0 and rep["environment"]["gpu"].startswith("none")
    assert "vllm" not in sys.modules
    other = tmp_path / "other"
    build_model(tiny_config("qwen2", "micro"), torch.bfloat16, seed=5).save_pretrained(other)
    capsys.readouterr()
    for argv, message in [
        (["--model", str(other)], "made from other weights (rla-weights/1:"),
        (["--model", ckpt, "--mode", "default"], "are from vllm 0.26.0 in eager mode; drop --mode"),
        (["--model", ckpt, "--responses", "2"], "--responses: sets up an engine run; --engine-outputs scores"),
        (["--model", ckpt, "--gdn-prefill-backend", "triton"], "--gdn-prefill-backend: sets up an engine run"),
        (["--model", ckpt, "--train-attention", "engine"], "vLLM is not installed"),
    ]:
        assert main(["verify", "--live", "--engine-outputs", run, "--out", str(tmp_path / "x"), *argv]) == 2, argv
        assert message in " ".join(capsys.readouterr().err.split()), argv
    assert main(["verify", "--live", "--engine-outputs", str(tmp_path), "--model", ckpt]) == 2
    assert "no engine.json" in capsys.readouterr().err
    assert main(["verify", "--engine-outputs", run, "--model", ckpt]) == 2
    assert "--engine-outputs: only used with --live" in capsys.readouterr().err


@pytest.mark.slow  # ~140 scorings, each a few small bf16 GEMMs: ~3 s on a quiet 2-core machine; 136-210 s when
# other processes load it (2-thread GEMMs wait for a descheduled thread: profiled, 13 ms per 64x256x640 linear)
def test_the_live_search_writes_the_row_that_made_the_engine(saved, tmp_path, capsys):
    """``rla calibrate --live`` on the saved run, from ``vllm-0.33``: back to the engine's row."""
    assert live_name("vllm", "0.26.0", "eager") == "vllm-0.26-eager" and live_name("vllm", "0.26.1", "default") == "vllm-0.26"
    out = tmp_path / "vllm-0.26-eager.json"
    argv = ["calibrate", "--live", "--engine-outputs", str(saved / "run"), "--model", str(saved / "ckpt"),
            "--start", "vllm-0.33", "--train-attention", "model", "--out", str(out)]
    assert main(argv) == 2  # rla ships a row of that name: a new one needs its own
    assert "a built-in row is named 'vllm-0.26-eager'" in capsys.readouterr().err and not out.exists()
    argv += ["--name", "vllm-0.26-eager-mine"]
    assert main(argv) == 0
    row = profiles.load(out)
    assert row.name == "vllm-0.26-eager-mine" and row.calibration.live["found"]["prefill_equal"] == 1.0
    truth = profiles.get(TRUTH)
    ev = row.calibration.points
    live = {p for p, e in ev.items() if e.evidence == "live"}
    assert {"rope_apply", "swiglu", "norm_residual", "residual_stream"} <= live
    assert all(getattr(row, p) == getattr(truth, p) for p in live)
    assert ev["qk_norm_out"].evidence != "live" and "kept from vllm-0.33" in ev["qk_norm_out"].note  # Qwen2: ties
    assert row.calibration.live["start"]["name"] == "vllm-0.33" and row.calibration.live["found"]["prefill_k3"] == 0.0
    assert row.calibration.live["start"]["prefill_equal"] < 1.0
    rep = json.loads(out.with_suffix(".report.json").read_text())
    assert rep["start"] == "vllm-0.33" and rep["engine"]["settings"]["train_attention"] == "model" and rep["tried"]
    # Qwen2 has no family kind: the values the search read are the row's own, none set in a variant
    assert rep["family_kind"] is None and rep["set_in_variant"] == {} and rep["best"] == rep["best_row_points"]
    capsys.readouterr()
    assert main(argv) == 2 and "exists; choose another --out or pass --overwrite" in capsys.readouterr().err
    # the live block is validated like the rest of a row
    bad = json.loads(out.read_text())
    bad["calibration"]["live"]["found"]["prefill_equal"] = 1.5
    with pytest.raises(ValueError, match=r"found 'prefill_equal' must be a fraction"):
        profiles.from_dict(bad, "bad")
    del bad["calibration"]["live"]
    with pytest.raises(ValueError, match="evidence 'live' but the calibration has no 'live' block"):
        profiles.from_dict(bad, "bad")


class _NoVllm:
    """A meta-path finder that hides vLLM (an import of it fails, so a check that came after one
    shows as an internal error) and records who looked for it."""

    def __init__(self):
        self.asked: list[str] = []

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "vllm":
            self.asked.append(name)
        return None


def test_every_refusal_comes_before_the_engine(tmp_path, monkeypatch, capsys):
    bundled = str(bundled_path())
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("")
    (tmp_path / "row.json").write_text("{}")
    import moe_models

    from glm4_moe_spec import tiny_glm4_moe

    deepseek, glm = str(tmp_path / "deepseek"), str(tmp_path / "glm")
    for model, path in ((moe_models.model("deepseek_v3"), deepseek), (tiny_glm4_moe(), glm)):
        model.config.max_position_embeddings = 8192  # room for the default prompts: the regions are what is refused
        model.save_pretrained(path)
    capsys.readouterr()
    cases = [
        # rla.align leaves GLM-4 MoE's router as is: refused before the engine, not after its run
        (["verify", "--live", "--model", glm, "--regions", "swiglu,router"], "supports the regions rope, swiglu, "
         "rmsnorm for glm4_moe, not router; pass --regions rope,swiglu,rmsnorm"),
        (["verify", "--live", "--model", bundled, "--regions", "swiglu,attention"], "--regions 'swiglu,attention': "
         "expected a comma-separated subset of rope, swiglu, rmsnorm, router"),
        (["verify", "--model", bundled, "--regions", "swiglu"], "--regions: only used with --live"),
        (["verify", "--live", "--model", bundled, "--mode", "native"], "runs vLLM's own modes, default"),
        (["verify", "--live", "--model", bundled, "--tokens", "8"], "--tokens: sets up the twin, not the live"),
        (["verify", "--model", bundled, "--responses", "2"], "--responses: only used with --live"),
        (["verify", "--model", bundled, "--out", "x"], "--out: only used with --live"),
        (["verify", "--live", "--model", bundled, "--out", str(tmp_path / "full")], "folder is not empty"),
        (["verify", "--live", "--model", str(tmp_path)], "not an HF checkpoint folder (no config.json)"),
        (["verify", "--live", "--model", bundled, "--prompt-tokens", "40000"], "pass its max_position_embeddings"),
        (["calibrate", "--live", "--model", bundled], "name the engine's mode"),
        (["calibrate", "--live", "--mode", "eager"], "--live needs --model"),
        (["calibrate", "--live", "--model", bundled, "--mode", "eager", "--scale", "small"],
         "--scale: sets up the op-level calibration"),
        (["calibrate", "--live", "--model", bundled, "--mode", "eager", "--out", str(tmp_path / "row.json")],
         "row.json exists; choose another --out or pass --overwrite"),
        (["calibrate", "--model", bundled], "--model: only used with --live"),
        (["calibrate", "--out", str(tmp_path / "row.json")], "row.json exists; choose another --out or pass --overwrite"),
        (["verify", "--model", bundled, "--train-attention", "engine"], "--train-attention: only used with --live"),
        (["calibrate", "--live", "--model", bundled, "--mode", "eager", "--attention-backend", "auto"],
         "--train-attention engine runs the kernel of the engine's TRITON_ATTN backend"),  # calibrate's default
        (["verify", "--live", "--model", bundled, "--attention-backend", "FLASH_ATTN", "--train-attention", "engine"],
         "use --attention-backend TRITON_ATTN or --train-attention model"),
        # everything above fine: vLLM is what is missing here, named before it is imported
        (["verify", "--live", "--model", bundled, "--out", str(tmp_path / "new")], "vLLM is not installed"),
        (["calibrate", "--live", "--model", bundled, "--mode", "default"], "pip install vllm==0.26.0"),
        # DeepSeek-V3 in every region (its MLA aligned), the router too: accepted
        (["verify", "--live", "--model", deepseek, "--regions", "rope,swiglu,rmsnorm,router", "--out",
          str(tmp_path / "new")], "vLLM is not installed"),
    ]
    if vllm_installed() is not None:
        cases = cases[:-3]
    guard = _NoVllm()
    monkeypatch.setattr(sys, "meta_path", [guard, *sys.meta_path])
    monkeypatch.chdir(tmp_path)
    for argv, message in cases:
        try:
            rc = main(argv)
        except SystemExit as e:  # argparse's own refusals
            rc = e.code
        err = " ".join(capsys.readouterr().err.split())
        assert rc == 2 and message in err, (argv, err)
        assert "Traceback" not in err
    assert not (tmp_path / "new").exists()
    assert set(guard.asked) <= {"vllm"} and "vllm" not in sys.modules  # looked up (metadata), never imported
    # an installed vLLM of another version, or no GPU, is refused by name (package metadata only)
    from rla.engines import vllm_live

    monkeypatch.setattr(vllm_live, "installed_version", lambda: "0.33.0")
    assert main(["calibrate", "--live", "--model", bundled, "--mode", "eager", "--out", str(tmp_path / "r.json")]) == 2
    assert "vLLM 0.33.0 is installed; rla's live adapter has been run against vLLM 0.26 only" in capsys.readouterr().err
    monkeypatch.setattr(vllm_live, "installed_version", lambda: "0.26.0")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(["verify", "--live", "--model", bundled, "--out", str(tmp_path / "v")]) == 2
    assert "runs on CUDA" in capsys.readouterr().err
    assert "vllm" not in sys.modules
    # a --profile row named as a row the report shows anyway (the shipped vllm-0.26 beside a live
    # calibration's output of the same name) is refused before the engine starts, not after its run
    import shutil
    from importlib import resources

    shutil.copy(resources.files("rla.profiles") / "data" / "vllm-0.26.json", tmp_path / "mine.json")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert main(["verify", "--live", "--model", bundled, "--profile", str(tmp_path / "mine.json"),
                 "--out", str(tmp_path / "v2")]) == 2
    assert "side 'vllm-0.26' is already in the report" in capsys.readouterr().err
    assert "vllm" not in sys.modules and not (tmp_path / "v2").exists()


@pytest.mark.gpu
def test_a_family_row_without_a_default_region_is_refused_naming_the_default(monkeypatch):
    """``--regions`` left out is rla.align's default (the three regions); a family row that supports only
    some of them is refused saying so, before the engine (no built-in row does now: DeepSeek-V3 did until
    its MLA was aligned)."""
    import dataclasses

    from rla.alignment import families
    from rla.commands.verify_live import _regions

    monkeypatch.setitem(families.FAMILIES, "glm4_moe", dataclasses.replace(families.FAMILIES["glm4_moe"],
                                                                          regions=("swiglu", "router")))
    with pytest.raises(ValueError, match=r"supports the regions swiglu, router for glm4_moe, not rope, rmsnorm "
                       r"\(the default\); pass --regions swiglu,router"):
        _regions(None, "glm4_moe", "m")
    assert _regions("swiglu,router", "glm4_moe", "m") == ("swiglu", "router")


def test_the_real_commands_on_a_gpu(tmp_path):
    """Both commands against the real vLLM on the bundled model (needs CUDA and vLLM 0.26)."""
    if not torch.cuda.is_available() or vllm_installed() is None:
        pytest.skip("needs CUDA and vLLM 0.26 installed")
    bundled = str(bundled_path())
    for mode in ("eager", "default"):
        out = tmp_path / f"verify-{mode}"
        rc = main(["verify", "--engine", "vllm", "--live", "--model", bundled, "--mode", mode, "--prompt-tokens",
                   "512,2048", "--responses", "4", "--max-new-tokens", "64", "--out", str(out)])
        assert rc == 0
        rep = json.loads((out / "report.json").read_text())
        assert rep["engine"]["mode"] == mode and rep["rows"][0]["side"] == "hf" and len(rep["rows"]) >= 3
        assert rep["rows"][0]["prefill"]["tokens"] == 511 + 2047 and rep["rows"][0]["decode"]["tokens"] == 4 * 64
    row_file = tmp_path / "live-eager.json"
    assert main(["calibrate", "--engine", "vllm", "--live", "--model", bundled, "--mode", "eager",
                 "--prompt-tokens", "512", "--responses", "2", "--max-new-tokens", "32", "--out", str(row_file)]) == 0
    row = profiles.load(row_file)
    assert row.name.endswith("-eager") and row.calibration.live["prefill_tokens"] == 511


def vllm_installed():
    from rla.engines.vllm_live import installed_version

    return installed_version()


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal of a machine without a GPU")
def test_the_engine_attention_needs_a_gpu_and_names_it(model):
    from rla.engines.vllm_attention import engine_attention

    with pytest.raises(ValueError, match="wired for .*TRITON_ATTN.*not 'FLASH_ATTN'"):
        with engine_attention(model, "FLASH_ATTN"):
            pass
    with pytest.raises(RuntimeError, match="on CUDA; this torch sees no GPU"):
        with engine_attention(model):
            pass
    assert model.config._attn_implementation == "sdpa"  # nothing changed
