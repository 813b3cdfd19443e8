"""``--overwrite`` deletes nothing rla did not write, an ``--out`` holding an input is refused, an
unwritable ``--out`` fails before the run, and a file changed mid-run is an error (issue 38, items 2, 5)."""

import json
import shutil
from pathlib import Path

import pytest

from rla.cli import main
from rla.diagnosis.output import MANIFEST, OutputFolderError, check_out_dir, foreign_entries, staged
from rla.models import bundled_path


def _no_work(monkeypatch):
    import rla.demo
    import rla.hf

    def boom(*a, **k):
        raise AssertionError("work started before the arguments were checked")

    monkeypatch.setattr(rla.demo, "run_demo", boom)
    monkeypatch.setattr(rla.hf, "load_model", boom)


@pytest.fixture(scope="module")
def rollouts_file(tmp_path_factory):
    import torch

    from rla.rl.bundled import bundled_task, load_bundled
    from rla.rollout import rollouts
    from rla.rollout.sampler import Sampler, SamplingParams

    torch.manual_seed(0)
    model, tok = load_bundled()
    prompts = [[tok.bos_token_id] + tok(p.prompt, add_special_tokens=False)["input_ids"]
               for p in bundled_task().sample(0, 2)]
    recs = Sampler(model, "vllm").generate(prompts, SamplingParams(max_new_tokens=6, seed=0))
    path = tmp_path_factory.mktemp("r") / "rollouts.jsonl"
    rollouts.save(path, recs)
    return path


def test_overwrite_of_the_current_folder_is_refused_and_deletes_nothing(tmp_path, monkeypatch, capsys):
    _no_work(monkeypatch)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "thesis.tex").write_text("years of work")
    for out in (".", str(tmp_path), str(tmp_path.parent)):
        assert main(["demo", "--out", out, "--overwrite"]) == 2
        assert "current folder or a folder above it" in capsys.readouterr().err
    assert (tmp_path / "thesis.tex").read_text() == "years of work"


def test_overwrite_refuses_a_folder_with_files_rla_did_not_write(tmp_path, monkeypatch, capsys):
    _no_work(monkeypatch)
    out = tmp_path / "rep"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    assert main(["demo", "--out", str(out), "--overwrite"]) == 2
    err = capsys.readouterr().err
    assert "rla did not write" in err and "notes.txt" in err and "Nothing was deleted" in err
    assert (out / "notes.txt").read_text() == "mine"


def test_overwrite_replaces_what_rla_wrote_but_not_a_file_added_or_changed_since(tmp_path):
    out = tmp_path / "rep"
    with staged(out) as t:
        (t / "report.json").write_text("{}")
        (t / "plots").mkdir()
        (t / "plots" / "a.png").write_bytes(b"png")
    assert json.loads((out / MANIFEST).read_text())["files"].keys() == {"report.json", "plots/a.png"}
    assert foreign_entries(out) == []
    with staged(out, overwrite=True) as t:  # rla's own folder: replaced
        (t / "report.json").write_text('{"new": 1}')
    assert sorted(p.name for p in out.iterdir()) == [MANIFEST, "report.json"]
    (out / "report.json").write_text("edited by hand")
    (out / "extra").mkdir()
    (out / "extra" / "data.csv").write_text("1,2")
    with pytest.raises(OutputFolderError, match=r"2 entries in it rla did not write \(extra/, report.json \(changed"):
        check_out_dir(out, overwrite=True)
    assert (out / "extra" / "data.csv").read_text() == "1,2"
    (out / MANIFEST).unlink()  # no manifest: nothing in it is known to be rla's
    assert foreign_entries(out) == ["extra/", "report.json"]


def test_a_file_put_into_the_folder_while_rla_works_is_not_deleted(tmp_path):
    out = tmp_path / "rep"
    with staged(out) as t:
        (t / "a").write_text("1")
    with pytest.raises(OutputFolderError, match="rla did not write .*The new output is in") as e:
        with staged(out, overwrite=True) as t:
            (t / "a").write_text("2")
            (out / "late.txt").write_text("written meanwhile")
    assert (out / "late.txt").read_text() == "written meanwhile" and (out / "a").read_text() == "1"
    kept = Path(str(e.value).rsplit("The new output is in ", 1)[1].rstrip("."))
    assert (kept / "a").read_text() == "2"  # the new output is kept, not lost


def test_out_holding_an_input_is_refused_with_or_without_overwrite(tmp_path, rollouts_file, monkeypatch, capsys):
    _no_work(monkeypatch)
    rep = tmp_path / "rep"
    with staged(rep) as t:  # a folder rla wrote, then used as the input folder of the next run
        shutil.copy(rollouts_file, t / "rollouts.jsonl")
    model = tmp_path / "model"
    shutil.copytree(bundled_path(), model)
    cases = [
        (["--rollouts", str(rep / "rollouts.jsonl"), "--model", str(model), "--out", str(rep)], "holds an input"),
        (["--rollouts", str(rollouts_file), "--model", str(model), "--out", str(model)], "is an input"),
        (["--rollouts", str(rollouts_file), "--model", str(model), "--out", str(tmp_path)], "holds an input"),
    ]
    for args, message in cases:
        for extra in ([], ["--overwrite"]):
            assert main(["diagnose", *args, *extra]) == 2
            assert message in capsys.readouterr().err
    assert (rep / "rollouts.jsonl").read_bytes() == rollouts_file.read_bytes()
    with pytest.raises(OutputFolderError, match="holds an input"):
        check_out_dir(tmp_path, overwrite=True, inputs=[model / "config.json"])


@pytest.mark.parametrize("out", ["/proc/rla-x", "/proc/self/rla-x/y", "/sys/rla-x"])
def test_out_where_nothing_can_be_written_fails_before_the_run(out, monkeypatch, capsys):
    _no_work(monkeypatch)
    assert main(["demo", "--out", out]) == 2
    assert "cannot write there" in capsys.readouterr().err
    assert not Path(out).exists()


@pytest.mark.parametrize("which", ["rollouts", "weights"])
def test_an_input_changed_mid_run_is_an_error_naming_it(which, tmp_path, rollouts_file, monkeypatch, capsys):
    import rla.diagnosis.core as core

    model = tmp_path / "model"
    shutil.copytree(bundled_path(), model)
    roll = tmp_path / "rollouts.jsonl"
    shutil.copy(rollouts_file, roll)
    real = core.diagnose

    def diagnose_then_change(*a, **k):
        d = real(*a, **{**k, "regions": ("rope",), "detect": False})  # one region: fast, same code path
        if which == "rollouts":
            roll.write_text(roll.read_text().splitlines()[0] + "\n")  # one record where two were read
        else:
            with open(next(model.glob("*.safetensors")), "r+b") as f:
                f.seek(-1, 2)
                b = f.read(1)
                f.seek(-1, 2)
                f.write(bytes([b[0] ^ 1]))
        return d

    monkeypatch.setattr(core, "diagnose", diagnose_then_change)
    out = tmp_path / "rep"
    rc = main(["diagnose", "--model", str(model), "--rollouts", str(roll), "--profile", "vllm", "--out", str(out)])
    err = capsys.readouterr().err
    assert rc == 2 and "changed while rla read it" in err
    assert (str(roll) if which == "rollouts" else f"the weights in {model}") in err.replace("\n", "")
    assert not out.exists()  # no report naming bytes that were not diagnosed
