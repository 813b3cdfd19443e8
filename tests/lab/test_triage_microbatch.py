"""lab/triage/microbatch_consistency.py: its comparisons on a tiny shape on CPU (the layouts are
scored as the script scores them), and the realistic shape's smoke run on a GPU."""

from __future__ import annotations

import json

import pytest
import torch

from lab.triage import microbatch_consistency as mc

TINY = dict(mc.QWEN25_15B, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=97)


def test_layouts_score_the_same_tokens_and_missing_position_ids_show():
    r = mc.run(TINY, records=4, min_len=6, max_len=12, response=4, device="cpu")
    rows = {(x["model"], x["layout"]): x for x in r["rows"]}
    assert len(rows) == 2 * (1 + len(mc.LAYOUTS))
    # bf16 against fp32 is rounding-sized but not zero; left padding without position ids (the
    # plumbing bug) moves the logprobs more than left padding with them
    assert 0 < rows["hf", "mb1 vs fp32 (rounding's size)"]["k3"] < 1e-2
    bad = rows["hf", "mb8_left_no_position_ids vs mb1"]
    good = rows["hf", "mb8_left vs mb1"]
    assert bad["k3"] > good["k3"] and bad["share_bitwise_equal"] < good["share_bitwise_equal"]


def test_the_fp32_reference_recomputes_inv_freq_rather_than_upcasting_the_rounded_buffer():
    hf = mc.build(TINY, "cpu")  # .to(bf16) rounds HF's inv_freq buffer
    d = TINY["hidden_size"] // TINY["num_attention_heads"]
    oracle = [1.0 / TINY["rope_theta"] ** (2 * i / d) for i in range(d // 2)]  # fp64, Python floats
    ref = mc.fp32_reference(hf)
    buf = ref.model.rotary_emb.inv_freq
    assert buf.dtype == torch.float32 and buf.tolist() == torch.tensor(oracle, dtype=torch.float32).tolist()
    assert not torch.equal(buf, hf.model.rotary_emb.inv_freq.float())  # the old reference's upcast
    assert mc.inv_freq_error(hf) > 1e-4 and mc.inv_freq_error(ref) == 0
    assert all(p.dtype == torch.float32 for p in ref.parameters())
    assert all(torch.equal(a.float(), b) for a, b in zip(hf.parameters(), ref.parameters()))
    hf.config.rope_parameters = dict(hf.config.rope_parameters, rope_type="yarn")
    with pytest.raises(ValueError, match="rope_type 'yarn'"):
        mc.fp32_reference(hf)


def test_the_bundled_checkpoint_runs():
    r = mc.run(None, records=2, min_len=6, max_len=8, response=2, device="cpu")
    assert r["shape"]["vocab_size"] == 64 and len(r["rows"]) == 2 * (1 + len(mc.LAYOUTS))
    assert r["hf_inv_freq_max_rel_error"] < 2 ** -23  # from_pretrained(dtype=bf16) keeps it fp32


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_the_realistic_shape_runs_on_the_gpu(tmp_path):
    out = tmp_path / "m.json"
    assert mc.main(["--out", str(out), "--records", "8", "--min-len", "64", "--max-len", "128", "--response", "16",
                    "--layers", "2"]) == 0
    data = json.loads(out.read_text())
    assert data["shape"]["hidden_size"] == 1536 and len(data["rows"]) == 2 * (1 + len(mc.LAYOUTS))
