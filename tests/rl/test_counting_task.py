"""The counting task (``rla.rl.tasks.CountingTask``): the long-response task of the dose experiment."""

from __future__ import annotations

import random
import re

import pytest

from rla.rl.tasks import CountingTask, get_task
from rla.rl.tokenizer import build_tokenizer, check_text


def test_worked_steps_count_up_with_a_countdown_and_wrap():
    p = CountingTask(difficulty=3, digits=5).make(99998)
    assert p.prompt == "count:99998+3="
    assert p.solution == "2:99999;1:00000;0:00001;>00001" and p.answer == "00001"
    p = CountingTask(difficulty=12, digits=4).make(37)
    steps = p.solution.split(">")[0].rstrip(";").split(";")
    assert len(steps) == 12
    for k, step in enumerate(steps, start=1):
        counter, value = step.split(":")
        assert counter == f"{12 - k:02d}" and value == f"{37 + k:04d}"
    assert p.answer == "0049"


@pytest.mark.parametrize("n,digits,tokens", [(12, 5, 115), (102, 5, 1027), (1, 1, 7)])
def test_every_response_has_the_stated_length_in_tokens(n, digits, tokens):
    task = CountingTask(difficulty=n, digits=digits)
    tok = build_tokenizer()
    for prob in task.sample(random.Random(0), 20):
        check_text(prob.prompt + prob.solution)
        ids = tok(prob.solution)["input_ids"][1:]  # without <bos>
        assert len(ids) + 1 == tokens == task.max_length() == task.expected_length()  # + <eos>


def test_reward_is_exact_match_of_the_last_value():
    task = get_task("counting", difficulty=5, digits=3)
    prob = task.make(120)
    assert task.reward(prob, prob.solution) == 1.0
    assert task.reward(prob, prob.solution + "<eos>junk") == 1.0
    assert task.reward(prob, prob.solution[:-1] + "6") == 0.0
    assert task.reward(prob, re.sub(">.*", "", prob.solution)) == 0.0  # no answer
    assert task.reward(prob, ">125") == 1.0  # only the answer is graded, as in every task


def test_deterministic_from_the_seed_and_rebuilt_from_its_spec():
    task = get_task("counting", difficulty=7, digits=4)
    assert task.sample(3, 5) == task.sample(random.Random(3), 5) != task.sample(4, 5)
    again = get_task(**task.spec())
    assert again.spec() == {"name": "counting", "difficulty": 7, "digits": 4}
    assert again.sample(1, 4) == task.sample(1, 4)
    with pytest.raises(ValueError, match="start"):
        task.make(10_000)
    with pytest.raises(ValueError, match="difficulty"):
        CountingTask(difficulty=0)
