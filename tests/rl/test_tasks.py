"""rla.rl.tasks and rla.rl.tokenizer: rewards, determinism, lengths, worked steps, round trips."""

import random
import re

import pytest

from rla.rl import tasks as T
from rla.rl.tokenizer import CHARACTERS, SPECIAL_TOKENS, build_tokenizer, check_text, load_tokenizer

ALL_TASKS = [T.get_task("addition", difficulty=7), T.get_task("sorting", difficulty=9, digits=3)]


# ------------------------------------------------------------------------------- tokenizer


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


def test_tokenizer_one_token_per_character(tok):
    text = "".join(CHARACTERS)
    ids = tok(text)["input_ids"]
    assert ids[0] == tok.bos_token_id
    assert len(ids) == len(text) + 1
    assert len(set(ids[1:])) == len(CHARACTERS)  # each character its own id
    assert tok.decode(ids, skip_special_tokens=True) == text
    assert tok.decode(tok(" 12 + 3\n")["input_ids"], skip_special_tokens=True) == " 12 + 3\n"


def test_tokenizer_ids_and_size(tok):
    assert [tok.pad_token_id, tok.bos_token_id, tok.eos_token_id, tok.unk_token_id] == [0, 1, 2, 3]
    assert len(tok) == len(SPECIAL_TOKENS) + len(CHARACTERS) < 64
    assert tok("A?")["input_ids"] == [1, 3, 3]  # unknown characters map to <unk>
    with pytest.raises(ValueError, match="outside"):
        check_text("add:1?")


def test_tokenizer_save_load(tok, tmp_path):
    from transformers import AutoTokenizer

    tok.save_pretrained(tmp_path)
    text = "sort:03,01=>01,03"
    for loaded in (load_tokenizer(tmp_path), AutoTokenizer.from_pretrained(tmp_path, local_files_only=True)):
        assert loaded(text)["input_ids"] == tok(text)["input_ids"]
        assert loaded.padding_side == "left" and loaded.eos_token_id == 2
        batch = loaded(["1+1=", "12+34="], padding=True)["input_ids"]
        assert batch[0][:2] == [0, 0] and batch[1][0] == 1  # left padding


# ------------------------------------------------------------------------------- tasks


def test_registry_and_errors():
    assert set(T.TASKS) >= {"addition", "sorting"}
    for name in T.TASKS:
        assert isinstance(T.get_task(name), T.Task)
    with pytest.raises(ValueError, match="known tasks: addition, counting, sorting"):
        T.get_task("countdwon")
    with pytest.raises(ValueError, match="sorting"):
        T.get_task("sorting", digitz=2)
    with pytest.raises(ValueError, match="difficulty"):
        T.get_task("addition", difficulty=0)
    with pytest.raises(TypeError, match="random.Random"):
        ALL_TASKS[0].sample("seed", 2)


@pytest.mark.parametrize("task", ALL_TASKS, ids=lambda t: t.name)
def test_rewards(task):
    probs = task.sample(random.Random(0), 20)
    for p in probs:
        check_text(p.prompt + p.solution)
        assert p.solution.endswith(T.ANSWER_MARK + p.answer)
        assert task.reward(p, p.solution) == 1.0
        assert task.reward(p, T.ANSWER_MARK + p.answer) == 1.0  # only the final answer counts
        assert task.reward(p, p.solution + "<eos><pad>") == 1.0
        assert task.reward(p, p.solution + " \n") == 1.0
        wrong = p.answer[:-1] + str((int(p.answer[-1]) + 1) % 10)
        assert task.reward(p, T.ANSWER_MARK + wrong) == 0.0
        assert task.reward(p, p.solution + "0") == 0.0  # a longer answer is wrong
        assert task.reward(p, p.answer) == 0.0  # no answer mark: malformed
        assert task.reward(p, p.solution[: p.solution.rindex(T.ANSWER_MARK) + 1]) == 0.0  # empty
        assert task.reward(p, T.ANSWER_MARK + p.answer + "+x") == 0.0  # stray characters
        assert task.reward(p, "") == 0.0


@pytest.mark.parametrize("task", ALL_TASKS, ids=lambda t: t.name)
def test_determinism(task):
    a = task.sample(random.Random(7), 10)
    assert a == task.sample(random.Random(7), 10) == task.sample(7, 10)
    assert a != task.sample(random.Random(8), 10)
    assert len({p.prompt for p in a}) == 10  # not a constant stream
    rng = random.Random(7)
    assert task.sample(rng, 5) + task.sample(rng, 5) == a  # a stream, cut anywhere


def test_addition_worked_steps_are_right():
    task = T.AdditionTask(difficulty=12)
    for p in task.sample(random.Random(1), 50):
        a, b = map(int, re.fullmatch(r"add:(\d+)\+(\d+)=", p.prompt).groups())
        assert len(str(a)) == len(str(b)) == 12
        assert int(p.answer) == a + b
        steps = p.solution.split(T.ANSWER_MARK)[0].split(";")[:-1]
        assert len(steps) == 12
        carry, digits = 0, []
        for i, step in enumerate(steps):
            x, y, c, s = re.fullmatch(r"(\d)\+(\d)\+(\d)=(\d\d)", step).groups()
            assert (x, y) == (str(a)[-1 - i], str(b)[-1 - i]) and int(c) == carry
            assert int(s) == int(x) + int(y) + int(c)
            carry, digits = int(s[0]), [s[1]] + digits
        assert ("1" if carry else "") + "".join(digits) == p.answer
    assert T.AdditionTask(4).make(4821, 3937).solution == "1+7+0=08;2+3+0=05;8+9+0=17;4+3+1=08;>8758"


def test_sorting_answer():
    task = T.SortingTask(difficulty=40, digits=2)
    for p in task.sample(random.Random(2), 20):
        items = p.prompt[len("sort:") : -1].split(",")
        assert len(items) == 40 and all(len(x) == 2 for x in items)
        assert p.answer.split(",") == sorted(items, key=int)
    with pytest.raises(ValueError, match="equal-width"):
        task.make(["1", "22"])


@pytest.mark.parametrize(
    "name, difficulties, kw",
    [("addition", [1, 4, 15, 100, 300], {}), ("sorting", [2, 10, 50, 300, 1000], {"digits": 2})],
)
def test_length_grows_with_difficulty(name, difficulties, kw):
    lengths = []
    for d in difficulties:
        task = T.get_task(name, difficulty=d, **kw)
        probs = task.sample(random.Random(3), 16)
        actual = [len(p.solution) + 1 for p in probs]  # + <eos>; one token per character
        assert max(actual) <= task.max_length()
        assert min(actual) <= task.expected_length() <= max(actual)
        lengths.append(task.expected_length())
    assert lengths == sorted(lengths) and len(set(lengths)) == len(lengths)
    assert lengths[-1] > 2500  # the top of the knob reaches thousands of tokens


def test_bundled_range_lengths():
    # the bundled model's task answers in the 100-200 token range the CPU demo needs
    assert 100 <= T.AdditionTask(difficulty=12).expected_length() <= 200


def test_extract_answer():
    assert T.extract_answer("1+2+0=03;>3") == "3"
    assert T.extract_answer(">1>2") == "2"
    assert T.extract_answer("no mark") is None
    assert T.extract_answer("x> ") is None
    assert T.extract_answer(">5<eos>>6") == "5"
