"""Synthetic verifiable tasks: exact-match rewards and a difficulty knob that sets response length.

Why synthetic: rollout/training mismatch grows with sequence length (RoPE phase drift, a per-token
log-ratio summed over the sequence), so the experiments need responses whose length is a knob,
from tens to thousands of tokens, and a reward that is exact (no judge, no partial credit), so
that a change in the reward curve is the mismatch and not noise in the grader.

Every task writes its response as ``<worked steps>>ANSWER``: the text after the last ``>`` is the
final answer, compared exactly to the reference; a response without ``>`` or with an empty answer
is malformed and gets 0. Prompts and responses use only the characters of
``rla.rl.tokenizer.CHARACTERS``, so with that tokenizer one character is one token and the lengths
a task states are token counts (``+ 1`` for ``<eos>``, which the lengths below include).

Tasks:

- ``addition``: two ``difficulty``-digit numbers, added column by column from the least
  significant digit, one step ``x+y+c=cs;`` per column (digits, carry in, then the two-digit
  column sum: carry out and result digit). About ``10 * difficulty`` tokens: difficulty 15 gives
  ~150, 100 gives ~1,000, 300 gives ~3,000.
- ``sorting``: ``difficulty`` numbers of ``digits`` digits (zero padded), answered in ascending
  order; ``difficulty * (digits + 1) + 1`` tokens.
- ``counting``: count up ``difficulty`` times from a ``digits``-digit number, one step
  ``counter:value;`` per count, the counter running down to 0: a long response made of short,
  local steps (each step is the step before it, changed by one), so that a small model learns it
  at any length. ``difficulty = 102`` gives 1,027 tokens (``digits = 5``), 12 gives 115.

Everything is deterministic from the ``random.Random`` (or int seed) given to ``sample``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

__all__ = [
    "ANSWER_MARK",
    "Problem",
    "Task",
    "AdditionTask",
    "SortingTask",
    "CountingTask",
    "TASKS",
    "get_task",
    "extract_answer",
]

ANSWER_MARK = ">"


@dataclass(frozen=True)
class Problem:
    """One problem: the ``prompt`` the model sees, the reference ``answer``, and the worked
    ``solution`` (the response SFT trains on; it ends with ``ANSWER_MARK + answer``)."""

    prompt: str
    answer: str
    solution: str


@runtime_checkable
class Task(Protocol):
    """What every task provides. ``difficulty`` is the knob that sets the response length."""

    name: str
    difficulty: int

    def sample(self, rng: random.Random | int, n: int) -> list[Problem]:
        """``n`` problems, deterministic from ``rng`` (a ``random.Random`` or an int seed)."""
        ...

    def reward(self, problem: Problem, response: str) -> float:
        """1.0 if the final answer of ``response`` equals ``problem.answer`` exactly, else 0.0."""
        ...

    def max_length(self) -> int:
        """Most tokens a correct response takes (``<eos>`` included): a ``max_new_tokens``."""
        ...

    def expected_length(self) -> float:
        """Mean tokens of a correct response (``<eos>`` included)."""
        ...

    def spec(self) -> dict:
        """Keyword arguments that rebuild this task with ``get_task(**spec)``."""
        ...


def extract_answer(response: str) -> str | None:
    """The text after the last ``ANSWER_MARK``, stripped; None if there is none or it is empty.

    ``response`` is decoded text; anything from a literal ``<eos>`` on is cut first, so text
    decoded without ``skip_special_tokens`` works too.
    """
    response = response.split("<eos>", 1)[0]
    if ANSWER_MARK not in response:
        return None
    answer = response.rsplit(ANSWER_MARK, 1)[1].strip()
    return answer or None


def _as_rng(rng: random.Random | int) -> random.Random:
    if isinstance(rng, random.Random):
        return rng
    if isinstance(rng, int) and not isinstance(rng, bool):
        return random.Random(rng)
    raise TypeError(f"rng must be a random.Random or an int seed, got {type(rng).__name__}")


def _check_int(name: str, value, low: int, high: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise ValueError(f"{name} must be an int in [{low}, {high}], got {value!r}")
    return value


class _TaskBase:
    name = ""
    difficulty = 0
    _answer_chars = frozenset()

    def sample(self, rng, n):
        if not isinstance(n, int) or n < 0:
            raise ValueError(f"n must be a non-negative int, got {n!r}")
        rng = _as_rng(rng)
        return [self._one(rng) for _ in range(n)]

    def reward(self, problem: Problem, response: str) -> float:
        answer = extract_answer(response)
        if answer is None or not set(answer) <= self._answer_chars:
            return 0.0
        return float(answer == problem.answer)

    def expected_length(self) -> float:
        # mean over a fixed sample: exact enough, and the same for every caller
        probs = self.sample(random.Random(0), 256)
        return sum(len(p.solution) + 1 for p in probs) / len(probs)

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.spec().items() if k != "name")
        return f"{type(self).__name__}({args})"


class AdditionTask(_TaskBase):
    """Add two ``difficulty``-digit numbers with worked steps, least significant column first.

    ``add:4821+3937=`` -> ``1+7+0=08;2+3+0=05;8+9+0=17;4+3+1=08;>8758``. Each step copies the
    two column digits and the carry of the step before, then writes the column sum as two digits
    (carry out, result digit); the answer reads the result digits back in reverse. Both operands
    have exactly ``difficulty`` digits (no leading zero), so every step is at a fixed place.
    Length: ``9 * difficulty`` for the steps, ``1 + difficulty (+1)`` for the answer, ``+ 1``
    ``<eos>``.
    """

    name = "addition"
    _answer_chars = frozenset("0123456789")

    def __init__(self, difficulty: int = 8):
        self.difficulty = _check_int("difficulty (digits per operand)", difficulty, 1, 10_000)

    def _one(self, rng: random.Random) -> Problem:
        d = self.difficulty
        lo = 10 ** (d - 1) if d > 1 else 0
        a, b = rng.randrange(lo, 10**d), rng.randrange(lo, 10**d)
        return self.make(a, b)

    def make(self, a: int, b: int) -> Problem:
        """The problem for ``a + b`` (operands written as given, padded to the longer one)."""
        sa, sb = str(a), str(b)
        width = max(len(sa), len(sb))
        sa, sb = sa.zfill(width), sb.zfill(width)
        steps, carry = [], 0
        for x, y in zip(reversed(sa), reversed(sb)):
            s = int(x) + int(y) + carry
            steps.append(f"{x}+{y}+{carry}={s:02d};")
            carry = s // 10
        answer = str(a + b)
        return Problem(f"add:{sa}+{sb}=", answer, "".join(steps) + ANSWER_MARK + answer)

    def max_length(self) -> int:
        return 10 * self.difficulty + 3

    def spec(self) -> dict:
        return {"name": self.name, "difficulty": self.difficulty}


class SortingTask(_TaskBase):
    """Sort ``difficulty`` numbers of ``digits`` digits (zero padded) in ascending order.

    ``sort:31,07,52,07=`` -> ``>07,07,31,52``. No worked steps: the answer is the long part, and
    its length is ``difficulty * (digits + 1)`` tokens (``+ 1`` ``<eos>``). Fixed-width numbers
    make text order equal numeric order; duplicates are kept.
    """

    name = "sorting"
    _answer_chars = frozenset("0123456789,")

    def __init__(self, difficulty: int = 16, digits: int = 2):
        self.difficulty = _check_int("difficulty (list size)", difficulty, 1, 100_000)
        self.digits = _check_int("digits", digits, 1, 18)

    def _one(self, rng: random.Random) -> Problem:
        items = [str(rng.randrange(10**self.digits)).zfill(self.digits) for _ in range(self.difficulty)]
        return self.make(items)

    def make(self, items: list[str]) -> Problem:
        """The problem for a list of equal-width digit strings."""
        if not items or any(len(x) != len(items[0]) or not x.isdigit() for x in items):
            raise ValueError("items must be a non-empty list of equal-width digit strings")
        answer = ",".join(sorted(items))
        return Problem(f"sort:{','.join(items)}=", answer, ANSWER_MARK + answer)

    def max_length(self) -> int:
        return self.difficulty * (self.digits + 1) + 1

    def spec(self) -> dict:
        return {"name": self.name, "difficulty": self.difficulty, "digits": self.digits}


class CountingTask(_TaskBase):
    """Count up ``difficulty`` times from a ``digits``-digit number, with a countdown.

    ``count:04998+3=`` -> ``2:04999;1:05000;0:05001;>05001``. Step k (k = 1..n) writes the
    counter n - k and the value (x + k) mod 10^digits, both zero padded to fixed widths (the counter
    to the width of n), so step k is step k - 1 with one number decremented and one incremented:
    every token depends on the few before it at a fixed distance, at any length. The answer is the
    last value. Length: ``n * (width(n) + digits + 2)`` for the steps, ``1 + digits`` for the answer,
    ``+ 1`` ``<eos>``: n = 12 gives 115 tokens, n = 102 gives 1,027 (``digits = 5``).
    """

    name = "counting"
    _answer_chars = frozenset("0123456789")

    def __init__(self, difficulty: int = 12, digits: int = 5):
        self.difficulty = _check_int("difficulty (counts)", difficulty, 1, 100_000)
        self.digits = _check_int("digits", digits, 1, 18)

    def _one(self, rng: random.Random) -> Problem:
        return self.make(rng.randrange(10**self.digits))

    def make(self, start: int) -> Problem:
        """The problem that counts ``difficulty`` times from ``start`` (0 <= start < 10^digits)."""
        if not 0 <= start < 10**self.digits:
            raise ValueError(f"start must be in [0, 10^{self.digits}), got {start}")
        n, d = self.difficulty, self.digits
        w = len(str(n))
        steps = [f"{n - k:0{w}d}:{(start + k) % 10**d:0{d}d};" for k in range(1, n + 1)]
        answer = f"{(start + n) % 10**d:0{d}d}"
        return Problem(f"count:{start:0{d}d}+{n:0{w}d}=", answer, "".join(steps) + ANSWER_MARK + answer)

    def max_length(self) -> int:
        return self.difficulty * (len(str(self.difficulty)) + self.digits + 2) + self.digits + 2

    def spec(self) -> dict:
        return {"name": self.name, "difficulty": self.difficulty, "digits": self.digits}


TASKS: dict[str, type] = {"addition": AdditionTask, "sorting": SortingTask, "counting": CountingTask}


def get_task(name: str, **kwargs) -> Task:
    """Build a task by name (``TASKS`` key) with its keyword arguments (``difficulty=`` etc.)."""
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; known tasks: {', '.join(sorted(TASKS))}")
    try:
        return TASKS[name](**kwargs)
    except TypeError as e:  # an unknown keyword: say which task and what it takes
        raise ValueError(f"task {name!r}: {e}") from None
