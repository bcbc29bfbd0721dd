"""A procedural word-problem dataset within a small backbone's reach (the demo's task).

GSM8K is out of reach of the embedded SmolLM2-135M (0 of 96 correct), so nothing on a page that
samples it can show a gain or a loss. This dataset keeps GSM8K's form -- a short story about one
quantity, a question, a chain of thought one step per line ending in "The answer is X." -- and
exposes a difficulty knob, so that the demo runs where the backbone's Base pass@1 is in 15-40%
(chosen by measurement: ``bench/word_problems.py``, ``bench/results/word_problems_difficulty.json``).

A problem is a person and a kind of object; a start count, then ``n_ops`` changes, each an
operation of ``ops``:

- ``add``: "Then Ana gets 6 more cards."   (x + b)
- ``sub``: "Then Ana gives away 3 cards."  (x - b, never below 1)
- ``mul``: the start is "Ana has 3 bags with 4 cards in each bag." (a * b); it counts as one of
  the ``n_ops`` operations and is drawn for the start with probability 1/len(ops).

Operands are drawn uniformly from 1..``max_value``. ``wordings`` (1-3) is how many phrasings of
each operation are used (1: always the first). The reference chain of thought states the start,
then one line per operation with its arithmetic ("4 + 6 = 10, so Ana has 10 cards."), then
"The answer is 10." -- the prompt's format (``ctrls.prompts``), so every reference chain grades
correct (``tests/test_word_problems.py`` checks this with the project's grader).

Determinism and splits: item i of a split is a function of (seed, split, difficulty, i) alone,
so a larger n extends a smaller one. A question belongs to the test split when the first byte of
its SHA-256 is even and to the train split when it is odd, so the splits never share a question;
each split's candidates come from their own counter-based stream, and repeats within a split are
skipped (they are rare: the space has more than 10^5 questions at the default difficulty).
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

OPS = ("add", "sub", "mul")
MAX_PROBLEMS = 100_000  # per split and call: a bound on generated sizes (ctrls.data.MAX_GENERATED)
NAMES = ("Ana", "Ben", "Carla", "David", "Emma", "Farid", "Grace", "Hugo", "Ines", "Jack", "Kofi", "Lena", "Maya",
         "Noah", "Olga", "Pedro", "Quinn", "Rosa", "Sam", "Tara", "Umar", "Vera", "Will", "Yuki")
OBJECTS = ("cards", "apples", "marbles", "stickers", "books", "pencils", "coins", "shells", "stamps", "cookies",
           "balloons", "toy cars", "flowers", "stones", "buttons", "candies")
ADD = ("Then {n} gets {k} more {o}.", "Then {n} finds {k} more {o}.", "Then a friend gives {n} {k} more {o}.")
SUB = ("Then {n} gives away {b}.", "Then {n} loses {b}.", "Then {n} gives {b} to a friend.")
ADD_STEP = "{x} + {b0} = {y0}, so {n} has {y}."
SUB_STEP = "{x} - {b0} = {y0}, so {n} has {y}."


def _noun(k: int, objects: str) -> str:
    """"cards" for k != 1, "card" (and "candy") for 1."""
    if k != 1:
        return objects
    return objects[:-3] + "y" if objects.endswith("ies") else objects[:-1]


def _count(k: int, objects: str) -> str:
    """"1 card", "3 cards"."""
    return f"{k} {_noun(k, objects)}"


@dataclass(frozen=True)
class Difficulty:
    """The knob: operations per problem, operand range, which operations, phrasings per operation."""

    n_ops: int = 1
    max_value: int = 10
    ops: tuple[str, ...] = ("add", "sub")
    wordings: int = 3

    def __post_init__(self):
        if not isinstance(self.n_ops, int) or not 1 <= self.n_ops <= 8:
            raise ValueError(f"n_ops must be an integer in 1..8, got {self.n_ops!r}")
        if not isinstance(self.max_value, int) or not 2 <= self.max_value <= 10_000:
            raise ValueError(f"max_value must be an integer in 2..10000, got {self.max_value!r}")
        if not self.ops or any(o not in OPS for o in self.ops) or len(set(self.ops)) < len(self.ops):
            raise ValueError(f"ops must be a non-empty list of distinct operations from {OPS}, got {list(self.ops)!r}")
        if self.ops == ("mul",) and self.n_ops > 1:
            raise ValueError("ops=['mul'] allows n_ops=1 only: a product is the start of a problem, never a later step")
        if not isinstance(self.wordings, int) or not 1 <= self.wordings <= len(ADD):
            raise ValueError(f"wordings must be an integer in 1..{len(ADD)}, got {self.wordings!r}")

    def tag(self) -> str:
        """A short name of the difficulty, e.g. ``ops1-max10-add+sub-w3``."""
        return f"ops{self.n_ops}-max{self.max_value}-{'+'.join(self.ops)}-w{self.wordings}"


def _item(rng: np.random.Generator, d: Difficulty) -> dict:
    """One problem: question, gold answer, reference steps."""
    n, o = NAMES[rng.integers(len(NAMES))], OBJECTS[rng.integers(len(OBJECTS))]
    draw = lambda lo=1: int(rng.integers(lo, d.max_value + 1))  # noqa: E731
    later = [op for op in d.ops if op != "mul"]
    if "mul" in d.ops and (not later or rng.integers(len(d.ops)) == 0):
        a, b = draw(2), draw(2)
        x, ops_left = a * b, d.n_ops - 1
        sentences = [f"{n} has {a} bags with {_count(b, o)} in each bag."]
        steps = [f"{n} has {a} * {b} = {_count(x, o)}."]
    else:
        x, ops_left = draw(), d.n_ops
        sentences, steps = [f"{n} has {_count(x, o)}."], [f"{n} starts with {_count(x, o)}."]
    for _ in range(ops_left):
        op = later[rng.integers(len(later))]
        if op == "sub" and x <= 1:
            op = "add" if "add" in later else "sub"
        if op == "sub" and x <= 1:  # ops=['sub', 'mul'] from 1: nothing can be taken away, so add instead
            op = "add"
        w = int(rng.integers(d.wordings))
        if op == "add":
            b = draw()
            y = x + b
            sentences.append(ADD[w].format(n=n, k=b, o=_noun(b, o)))
            steps.append(ADD_STEP.format(x=x, b0=b, y0=y, n=n, y=_count(y, o)))
        else:
            b = draw() if x > d.max_value else int(rng.integers(1, x))
            y = x - b
            sentences.append(SUB[w].format(n=n, b=_count(b, o)))
            steps.append(SUB_STEP.format(x=x, b0=b, y0=y, n=n, y=_count(y, o)))
        x = y
    question = " ".join(sentences) + f" How many {o} does {n} have now?"
    return {"question": question, "answer": str(x), "steps": [*steps, f"The answer is {x}."]}


def _split_bit(question: str) -> int:
    return hashlib.sha256(question.encode()).digest()[0] % 2  # 0: test, 1: train


def generate(split: str, n: int, seed: int = 0, difficulty: Difficulty | None = None) -> list[dict]:
    """The first ``n`` problems of ``split`` ('train' or 'test'): dicts with ``id``, ``question``,
    ``answer`` (the gold, an integer as text) and ``steps`` (the reference chain, one step each)."""
    if split not in ("train", "test"):
        raise ValueError(f"unknown split {split!r}; known: train, test")
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or not 0 <= n <= MAX_PROBLEMS:
        raise ValueError(f"asked for n={n!r} generated problems; n must be an integer in 0..{MAX_PROBLEMS}")
    d = difficulty or Difficulty()
    want = 0 if split == "test" else 1
    tag = int.from_bytes(hashlib.sha256(d.tag().encode()).digest()[:4], "little")
    out: list[dict] = []
    seen: set[str] = set()
    j = 0
    while len(out) < n:
        if j > 20 * n + 1000:  # a difficulty whose space is nearly exhausted: never loop for ever
            raise ValueError(f"difficulty {d.tag()} has fewer than {n} distinct {split} problems "
                             f"(found {len(out)} in {j} draws); raise max_value or n_ops")
        item = _item(np.random.default_rng([seed, want, tag, j]), d)
        j += 1
        q = item["question"]
        if _split_bit(q) != want or q in seen:
            continue
        seen.add(q)
        out.append({"id": str(len(out)), **item})
    return out
