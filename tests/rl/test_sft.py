"""rla.rl.sft on CPU: batches mask the prompt, the loss falls, runs repeat, errors are clear."""

import random

import pytest
import torch

from rla.models import build_model, tiny_config
from rla.rl.sft import encode_batch, evaluate, generate_responses, sft_train
from rla.rl.tasks import AdditionTask
from rla.rl.tokenizer import build_tokenizer


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


def micro():
    return build_model(tiny_config("qwen2", "micro"), seed=0)


def test_encode_batch_masks_prompt_and_padding(tok):
    task = AdditionTask(difficulty=3)
    probs = [task.make(123, 456), task.make(7, 8)]  # different lengths: the second is padded
    ids, labels = encode_batch(tok, probs)
    for i, p in enumerate(probs):
        n_prompt, n_resp = len(p.prompt) + 1, len(p.solution) + 1  # + <bos>, + <eos>
        row, lab = ids[i].tolist(), labels[i].tolist()
        assert row[0] == tok.bos_token_id
        assert tok.decode(row[1:n_prompt]) == p.prompt
        assert lab[:n_prompt] == [-100] * n_prompt
        assert lab[n_prompt : n_prompt + n_resp] == row[n_prompt : n_prompt + n_resp]
        assert tok.decode(lab[n_prompt : n_prompt + n_resp - 1]) == p.solution
        assert lab[n_prompt + n_resp - 1] == tok.eos_token_id
        assert all(x == -100 for x in lab[n_prompt + n_resp :])
        assert all(x == tok.pad_token_id for x in row[n_prompt + n_resp :])
    assert ids.shape[1] == len(probs[0].prompt) + len(probs[0].solution) + 2


def test_encode_batch_fast_path_equals_tokenizer(tok):
    from rla.rl.tasks import Problem, SortingTask

    probs = SortingTask(5).sample(0, 3) + [Problem("add:1+é=", "x", "?>x")]  # unknown chars: <unk>
    fast = encode_batch(tok, probs)
    tok._rla_char_table = None  # force the tokenizer's own call
    try:
        slow = encode_batch(tok, probs)
    finally:
        del tok._rla_char_table
    assert torch.equal(fast[0], slow[0]) and torch.equal(fast[1], slow[1])
    assert (fast[0] == tok.unk_token_id).sum() == 2


def test_sft_lowers_loss(tok):
    torch.manual_seed(0)
    model = micro()
    hist = sft_train(model, tok, AdditionTask(difficulty=2), steps=30, batch_size=16, lr=3e-3,
                     log_every=5, eval_size=4, log=None)
    losses = [r["loss"] for r in hist.train]
    assert len(losses) == 6 and hist.steps_done == 30
    # a random model starts near ln(64) = 4.2 nats; 30 steps learn the step format's fixed chars
    assert losses[0] > 2.5 and losses[-1] < 0.75 * losses[0], losses
    ev = hist.final_eval
    assert set(ev) >= {"greedy_acc", "sample_acc", "mean_len"} and 0 <= ev["greedy_acc"] <= 1
    assert not model.training


def test_sft_is_reproducible(tok):
    task = AdditionTask(difficulty=2)
    runs = [sft_train(micro(), tok, task, steps=4, batch_size=8, log_every=1, eval_size=0, log=None)
            for _ in range(2)]
    assert [r["loss"] for r in runs[0].train] == [r["loss"] for r in runs[1].train]
    other = sft_train(micro(), tok, task, steps=4, batch_size=8, log_every=1, eval_size=0, seed=1, log=None)
    assert [r["loss"] for r in other.train] != [r["loss"] for r in runs[0].train]


def test_time_limit_stops_early(tok):
    hist = sft_train(micro(), tok, AdditionTask(difficulty=2), steps=1000, batch_size=4,
                     time_limit_s=0.0, eval_size=0, log=None)
    assert hist.stopped_early and hist.steps_done == 1 and len(hist.train) == 1


def test_stop_at_sampled_stops_at_the_first_evaluation_that_reaches_it(tok, monkeypatch):
    import rla.rl.sft as sft

    seen = []

    def fake_evaluate(model, tokenizer, task, problems, seed, precision):  # accuracy = step / 100
        step = len(seen) * 5 + 5
        seen.append(step)
        return {"greedy_acc": 1.0, "sample_acc": step / 100, "mean_len": 1.0, "example": ""}

    monkeypatch.setattr(sft, "evaluate", fake_evaluate)
    hist = sft_train(micro(), tok, AdditionTask(difficulty=2), steps=100, batch_size=4, eval_every=5,
                     eval_size=2, stop_at_sampled=0.2, log=None)
    assert seen == [5, 10, 15, 20] and hist.steps_done == 20 and hist.stopped_early
    assert hist.final_eval["sample_acc"] == 0.2
    with pytest.raises(ValueError, match="stop_at_sampled"):
        sft_train(micro(), tok, AdditionTask(difficulty=2), steps=10, stop_at_sampled=0.5, log=None)


def test_generate_and_evaluate(tok):
    model = micro()
    prompts = ["add:12+34=", "add:5+6="]
    greedy = generate_responses(model, tok, prompts, max_new_tokens=12)
    assert len(greedy) == 2 and greedy == generate_responses(model, tok, prompts, max_new_tokens=12)
    assert all(0 < len(r) <= 12 for r in greedy)
    sampled = [generate_responses(model, tok, prompts, 12, temperature=1.0, seed=s) for s in (0, 0, 1)]
    assert sampled[0] == sampled[1] != sampled[2]
    task = AdditionTask(difficulty=2)
    res = evaluate(model, tok, task, task.sample(random.Random(0), 4), temperatures=(0.0, 1.0, 0.5))
    assert set(res) == {"greedy_acc", "sample_acc", "acc_t0.5", "mean_len", "example"}


def test_errors(tok):
    task = AdditionTask(difficulty=2)
    with pytest.raises(ValueError, match="precision"):
        sft_train(micro(), tok, task, steps=1, precision="fp8", log=None)
    with pytest.raises(ValueError, match="fp32 master"):
        sft_train(micro().to(torch.bfloat16), tok, task, steps=1, log=None)
    with pytest.raises(ValueError, match="steps"):
        sft_train(micro(), tok, task, steps=0, log=None)
