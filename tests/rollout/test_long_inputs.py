"""Long inputs stay bounded (issue 18): chunked prefill, its bits, its memory, its progress.

A record longer than ``max_tokens`` runs as a chunked prefill (``rla.rollout.prefill``). The
diagnosis compares these logprobs with the engine's, so chunking must not change a bit: the tests
compare the chunked logprobs with the one-call forward's (``prefill_mode="never"``) with
``torch.equal``, show that the comparison would catch a chunking that changes bits (boundaries
off the attention kernel's key blocks; eager attention), and measure the allocator's peak with
the profiler's memory events while the sequence grows four-fold.

Whether a chunking is bit-identical is this CPU's kernels' business (eager attention chunks exactly
on an Intel AVX-512 Xeon and not on an AMD EPYC; a bf16 SDPA model can chunk exactly at 2,085
tokens and not at 2,048 on the Xeon): the tests measure it at run time, at the geometry a record
runs with (``prefill.check(model, rows=, length=, step=)``), and assert what follows from it.
"""

import copy
import dataclasses
import re
import warnings

import pytest
import torch

import rla
from rla.models import build_model, load_bundled_model, tiny_config
from rla.rollout import prefill
from rla.rollout.rollouts import RolloutRecord
from rla.rollout.train_logprobs import logprobs


def _record(g, vocab, prompt, response, temperature=1.0, top_k=-1, top_p=1.0):
    ids = torch.randint(3, vocab, (prompt + response,), generator=g).tolist()
    return RolloutRecord(ids[:prompt], ids[prompt:], [-1.0] * response, temperature, top_p, top_k, "test")


@pytest.fixture(scope="module")
def bundled():
    """The bundled model cut to its first two decoder layers. What is checked here is per layer and
    per shape (a chunk's queries against the KV cache of the chunks before it, each layer's cache
    filled from the layer below's chunked output); two layers keep a layer that reads a cache built
    from chunked hidden states, and cost a third of six."""
    model = load_bundled_model()
    model.model.layers = model.model.layers[:2]
    model.config.num_hidden_layers = 2
    model.config.layer_types = model.config.layer_types[:2]
    return model


@pytest.fixture(scope="module")
def long_records(bundled):
    g = torch.Generator().manual_seed(0)
    v = bundled.config.vocab_size
    # responses that cross prefill boundaries, a head piece (1024) that spans two prefill chunks,
    # top-k / top-p, a short record packed with others, a record whose response sits in its last chunk
    return [_record(g, v, 700, 1900), _record(g, v, 30, 2500, 0.7, 20, 0.9), _record(g, v, 100, 60),
            _record(g, v, 1200, 420), _record(g, v, 5, 40)]


def test_chunk_bounds_are_aligned_and_join_a_short_tail():
    assert prefill.chunk_bounds(2600, 1024) == [(0, 1024), (1024, 2048), (2048, 2600)]
    assert prefill.chunk_bounds(2100, 1024) == [(0, 1024), (1024, 2100)]  # a 52-token tail is joined
    assert prefill.chunk_bounds(300, 512) == [(0, 300)]
    assert prefill.chunk_bounds(1537, 512) == [(0, 512), (512, 1024), (1024, 1537)]  # a 1-token tail joined
    for n in (1, 511, 512, 513, 1023, 1024, 1025, 5000):
        b = prefill.chunk_bounds(n, 512)
        assert b[0][0] == 0 and b[-1][1] == n and all(x[1] == y[0] for x, y in zip(b, b[1:]))
        assert all(s % prefill.ALIGN == 0 for s, _ in b) and all(e - s >= min(n, prefill.ALIGN) for s, e in b)
    for bad in (0, 100, 700):
        with pytest.raises(ValueError, match="multiple of 512"):
            prefill.chunk_bounds(1000, bad)


@pytest.mark.parametrize("state, max_tokens", [("bf16", 1024), ("bf16 aligned to vllm", 512), ("fp32", 1536)])
def test_chunked_prefill_gives_the_one_call_bits(bundled, long_records, state, max_tokens):
    model = copy.deepcopy(bundled).float() if state == "fp32" else bundled
    ctx = rla.aligned(model, profile="vllm") if "aligned" in state else torch.no_grad()
    info = {}
    with ctx, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a geometry that does not chunk exactly on this CPU runs in one call
        one_call = logprobs(model, long_records, max_tokens=max_tokens, prefill_mode="never")
        chunked = logprobs(model, long_records, max_tokens=max_tokens, info=info)
        forced = logprobs(model, long_records, max_tokens=max_tokens, prefill_mode="always")
    for a, b in zip(one_call, chunked):
        assert torch.equal(a, b)
    checks = info["checks"]
    assert len(checks) >= 2 and all(c["chunks"] == [info["prefill_step"]] for c in checks)
    exact = [c["exact"] for c in checks]
    assert (info["records_one_call"] == 0) == all(exact) and (info["records_chunked"] >= 1) == any(exact)
    assert info["records_chunked"] + info["records_one_call"] >= 2
    # what the checks measured holds for the records: chunking them gives their bits where exact
    assert all(exact) == all(torch.equal(a, b) for a, b in zip(one_call, forced))


def test_chunk_boundaries_off_the_key_blocks_change_bits(bundled):
    """The control: the comparison above would see a chunking that changes bits. Boundaries that
    are not multiples of 512 split the CPU flash-attention kernel's key blocks."""
    decoder = bundled.get_decoder()
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, 64, (1, 1500), generator=g)
    pos = torch.arange(1500)[None]
    with torch.inference_mode():
        whole = next(prefill.forward_chunks(decoder, bundled.config, ids, pos, [(0, 1500)]))[2]
        aligned = torch.cat([h for *_, h in prefill.forward_chunks(decoder, bundled.config, ids, pos,
                                                                  prefill.chunk_bounds(1500, 512))], dim=1)
        off = torch.cat([h for *_, h in prefill.forward_chunks(decoder, bundled.config, ids, pos,
                                                              [(0, 333), (333, 666), (666, 999), (999, 1500)])], dim=1)
    assert torch.equal(aligned, whole) == prefill.check(bundled, length=1500, step=512).exact
    assert not torch.equal(off, whole)


def test_eager_attention_is_chunked_only_where_its_check_is_exact(bundled):
    model = copy.deepcopy(bundled)
    model.config._attn_implementation = "eager"
    g = torch.Generator().manual_seed(4)
    long_records = [_record(g, 64, 600, 1000), _record(g, 64, 30, 1600, 0.7, 20, 0.9), _record(g, 64, 50, 50)]
    info = {}
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        auto = logprobs(model, long_records, max_tokens=1024, info=info)
    exact = [c["exact"] for c in info["checks"]]
    assert len(exact) == 2 and all(c["attention"] == "eager" and c["tokens"] in (1600, 1630) for c in info["checks"])
    warned = [str(w.message) for w in seen if issubclass(w.category, RuntimeWarning)]
    assert any(re.search("run in one forward.*chunked prefill changes bits", m) for m in warned) == (not all(exact))
    assert info["records_chunked"] == sum(exact) and info["records_one_call"] == 2 - sum(exact)
    one_call = logprobs(model, long_records, max_tokens=1024, prefill_mode="never")
    assert all(torch.equal(a, b) for a, b in zip(auto, one_call))
    forced = logprobs(model, long_records, max_tokens=1024, prefill_mode="always")
    same = [torch.equal(a, b) for a, b in zip(forced, one_call)]
    assert same[:2] == [c["exact"] for c in sorted(info["checks"], key=lambda c: c["tokens"])] and same[2]
    diff = max(float((a - b)[torch.isfinite(a)].abs().max()) for a, b in zip(forced, one_call))
    assert diff < 0.5 and (diff > 0) == (not all(exact))  # bounded memory, at most a rounding-sized difference


def test_a_one_call_forward_that_cannot_fit_is_refused_before_any_record_runs(bundled, long_records, monkeypatch):
    model = copy.deepcopy(bundled)
    monkeypatch.setattr(prefill, "available_bytes", lambda device: 1 << 20)
    steps = []
    with pytest.raises(MemoryError, match=r"bit-identical to its one-call forward.*estimated .* available.*"
                                          r"cannot be checked.*prefill_mode='always'"):
        logprobs(model, long_records, max_tokens=1024, progress=lambda done, total: steps.append(done))
    assert steps == []  # not a forward: the check of the first geometry would not fit either


def test_the_probe_is_cached_per_state(bundled):
    first = prefill.check(bundled)
    assert prefill.check(bundled) is first and prefill.cached_check(bundled) is first
    with rla.aligned(bundled, profile="sglang"):
        assert prefill.cached_check(bundled) is None or prefill.cached_check(bundled) is not first
        assert prefill.check(bundled).exact
    assert "bit-identical" in first.describe()


def test_bad_sizes_are_refused(bundled, long_records):
    for kw, match in ((dict(memory_budget=0), "memory_budget"), (dict(chunk=0), "chunk"),
                      (dict(max_tokens=-5), "max_tokens"), (dict(prefill_mode="sometimes"), "prefill_mode")):
        with pytest.raises(ValueError, match=match):
            logprobs(bundled, long_records[:1], **kw)


def _peak_bytes(fn):
    """The CPU allocator's peak above the start while ``fn`` runs: the profiler's memory events."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        out = fn()
    events = sorted((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events()
                    if e.name() == "[memory]")
    now = top = 0
    for _, b in events:
        now += b
        top = max(top, now)
    return top, out


def test_memory_stays_bounded_as_the_sequence_grows():
    # a model whose activations dominate (wide MLP) and whose full logits would not fit the budget
    vocab, budget = 4096, 64 << 20
    # one decoder layer: a layer's activations are transient, so the peaks are one layer's and the
    # cache's whatever the depth
    model = build_model(tiny_config("qwen2", "micro", vocab_size=vocab, intermediate_size=4096, num_hidden_layers=1),
                        dtype=torch.bfloat16, seed=0).eval()
    g = torch.Generator().manual_seed(0)
    peaks, one_call = {}, {}
    for n in (2048, 8192):
        rec = _record(g, vocab, 16, n - 16, 0.8, 50, 0.9)
        info, auto_info = {}, {}
        # the chunked path's memory (prefill_mode="auto" chunks only where the check below is exact,
        # and the check itself is a one-call forward of the record's size)
        peaks[n], a = _peak_bytes(lambda: logprobs(model, [rec], memory_budget=budget, prefill_mode="always",
                                                   info=info))
        assert info["records_chunked"] == 1 and info["max_tokens"] == 512 and info["chunk"] == budget // (48 * vocab)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            one_call[n], b = _peak_bytes(lambda: logprobs(model, [rec], memory_budget=budget, prefill_mode="never"))
            auto = logprobs(model, [rec], memory_budget=budget, info=auto_info)
        c = prefill.cached_check(model, length=n, step=512)
        assert c is not None and auto_info["check"] == c.to_dict()
        assert torch.equal(auto[0], b[0]) and auto_info["records_chunked"] == int(c.exact)
        assert torch.equal(a[0], b[0]) == c.exact
        # the budget, plus the KV cache (the state that must grow with the length)
        assert peaks[n] <= budget + prefill.kv_cache_bytes(model.config, n, torch.bfloat16), (n, peaks[n])
    assert 8192 * vocab * 4 > budget  # the sequence's fp32 logits alone would not fit
    # measured (one layer): 40.5 -> 41.3 MiB chunked, 49 -> 196 MiB in one call
    assert peaks[8192] - peaks[2048] < 0.1 * (one_call[8192] - one_call[2048])
    assert one_call[8192] > budget + prefill.kv_cache_bytes(model.config, 8192, torch.bfloat16)  # the control


def test_progress_after_every_forward_step(bundled):
    g = torch.Generator().manual_seed(2)
    rec = _record(g, 64, 10, 4000)
    calls = []
    model = copy.deepcopy(bundled)  # a fresh probe: its forwards are reported too
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # where this CPU does not chunk 4,010 tokens exactly: one forward
        logprobs(model, [rec], max_tokens=1024, progress=lambda done, total: calls.append((done, total)))
    exact = prefill.cached_check(model, length=4010, step=1024).exact
    # the check (a one-call forward and its chunked prefill), then 4 chunks of 1024 or one forward
    assert [d for d, _ in calls] == list(range(1, 2 + (4 if exact else 1) + 1))
    assert calls[-1][0] == calls[-1][1] and all(d < t for d, t in calls[:-1])


def test_the_diagnosis_says_what_it_did_with_long_records(bundled):
    from rla.diagnosis.core import diagnose
    from rla.diagnosis.report import to_markdown

    g = torch.Generator().manual_seed(3)
    rec = _record(g, 64, 200, 1400)
    with rla.aligned(bundled, profile="vllm"):  # rollouts as a vllm engine would score them
        mu = logprobs(bundled, [rec], prefill_mode="never")[0]
    rec = dataclasses.replace(rec, logprobs=[float(x) for x in mu])
    chunked = diagnose(bundled, [rec], "vllm", regions=("rope",), detect=False, max_tokens=1024)
    whole = diagnose(bundled, [rec], "vllm", regions=("rope",), detect=False)
    assert whole.long_inputs is None
    li = chunked.long_inputs
    exact = [c["exact"] for c in li["checks"].values()]
    assert li["records_chunked"] == int(any(exact)) and li["records_one_call"] == int(not all(exact))
    assert "fp32 reference" in li["checks"]  # the fp32 copy is checked on its own
    assert all(c["tokens"] == 1600 and c["chunks"] == [1024] for c in li["checks"].values())  # the record's sizes
    assert chunked.metrics == whole.metrics and chunked.scale.k3 == whole.scale.k3  # one record: no padding
    md = to_markdown(chunked)
    assert "## Long records" in md and ("did not change the logprobs" in md) == any(exact)
    assert ("chunked prefill changes bits here" in md) == (not all(exact))
    assert chunked.to_dict()["long_inputs"] == li


def test_the_cli_takes_a_memory_budget(tmp_path, monkeypatch, capsys):
    from rla.cli import main
    from rla.diagnosis import core
    from rla.models import bundled_path
    from rla.rollout import rollouts

    for bad in ("0", "-1", "nan", "lots"):
        with pytest.raises(SystemExit) as e:
            main(["diagnose", "--model", "m", "--rollouts", "r", "--memory-budget", bad])
        assert e.value.code == 2 and "--memory-budget" in capsys.readouterr().err
    g = torch.Generator().manual_seed(5)
    rollouts.save(tmp_path / "r.jsonl", [_record(g, 64, 10, 20)])
    seen = {}

    class Stop(Exception):
        pass

    def fake(model, records, profile, **kw):
        seen.update(kw)
        raise Stop

    monkeypatch.setattr(core, "diagnose", fake)
    with pytest.raises(Stop):
        main(["diagnose", "--model", str(bundled_path()), "--rollouts", str(tmp_path / "r.jsonl"), "--out",
              str(tmp_path / "rep"), "--memory-budget", "0.5"])
    assert seen["memory_budget"] == 2**29 and seen["max_tokens"] is None


def _compare_in_one_step(t_logits, side_logits, seed):
    """verify.compare's numbers as computed before it was chunked: every position at once."""
    g = torch.Generator().manual_seed(seed)
    probs = torch.softmax(t_logits.float(), dim=-1)
    tokens = torch.multinomial(probs.reshape(-1, probs.shape[-1]), 1, generator=g).view(probs.shape[:-1])
    t_lp, lp = torch.log_softmax(t_logits.float(), -1), torch.log_softmax(side_logits.float(), -1)
    pick = lambda x: x.gather(-1, tokens[..., None])[..., 0]  # noqa: E731
    kl = float((t_lp.exp() * (t_lp - lp)).sum(-1).mean())
    return tokens, pick(lp), pick(t_lp), float((side_logits == t_logits).double().mean()), kl


def test_verify_compares_in_bounded_steps_with_the_same_numbers():
    from rla.engines import twin_compare as verify
    from rla.metrics import mismatch

    g = torch.Generator().manual_seed(6)
    t_logits = (torch.randn(2, 37, 64, generator=g) * 3).bfloat16()
    side = t_logits.clone()
    side[0, 5:9] += 0.125  # a few positions off
    streams = [torch.randn(2, 37, 8, generator=g).bfloat16() for _ in range(3)]
    tokens, pi, mu, equal, kl = _compare_in_one_step(t_logits, side, seed=3)
    want = mismatch(pi, mu, torch.ones_like(pi, dtype=torch.bool))
    assert torch.equal(verify.sample_tokens(t_logits, 3, rows=5), tokens)
    for rows in (None, 1, 5, 74):
        r = verify.compare((t_logits, streams), {"s": lambda ids, pos: (side, streams)}, None, None, seed=3,
                           rows=rows).sides[0]
        assert (r.k3, r.k1, r.logits_equal) == (want["mismatch/k3"], want["mismatch/k1"], equal)
        assert r.kl == pytest.approx(kl, rel=1e-5) and r.kl > 0
    with pytest.raises(ValueError, match="rows must be positive"):
        verify.compare((t_logits, streams), {"s": lambda ids, pos: (side, streams)}, None, None, rows=0)


def test_verify_refuses_a_run_that_cannot_fit_before_the_twin_runs(vllm_wheel, monkeypatch, capsys):
    from rla.cli import main
    from rla.engines import vllm_twin_families as twin
    from rla.models import bundled_path
    from rla.rollout import prefill as pf

    def no_twin(*a, **k):
        raise AssertionError("the twin was built before the memory check")

    monkeypatch.setattr(twin, "build_twin", no_twin)
    monkeypatch.setattr(pf, "available_bytes", lambda device: 100 << 20)
    assert main(["verify", "--model", str(bundled_path()), "--wheel", vllm_wheel, "--device", "cpu",
                 "--tokens", "30000", "--batch", "2"]) == 2
    err = capsys.readouterr().err.replace("\n", " ")
    assert "--tokens 30000 x --batch 2 needs about" in err and "lower --tokens or --batch" in err
