"""A procedural word-problem dataset within a small backbone's reach (the demo's task).

GSM8K's form (a short story about one quantity, a question, one step per line ending in "The answer
is X.") with a difficulty knob (:class:`Difficulty`: ``n_ops`` operations of ``ops``, operands up to
``max_value``, ``wordings``), set so that the demo's Base pass@1 is in 15-40% (``studies/word_problems.py``).
Every reference chain grades correct with the project's grader.

Item i of a split is a function of (seed, split, difficulty, i) alone, so a larger n extends a smaller
one; the splits never share a question (the parity of its SHA-256's first byte). :func:`capacity`,
:func:`split_size` and :func:`producible` say how many questions a difficulty holds, and asking for more
fails at once (:func:`check_size`). The rules in full: book/method.md, "ctrls/data/word_problems.py".
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

OPS = ("add", "sub", "mul")
MAX_PROBLEMS = 100_000  # per split and call: a bound on generated sizes (ctrls.data.problems.MAX_GENERATED)
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
        def integer(x) -> bool:  # a bool is not an integer here (True would be 1)
            return isinstance(x, int) and not isinstance(x, bool)

        if not integer(self.n_ops) or not 1 <= self.n_ops <= 8:
            raise ValueError(f"n_ops must be an integer in 1..8, got {self.n_ops!r}")
        if not integer(self.max_value) or not 2 <= self.max_value <= 10_000:
            raise ValueError(f"max_value must be an integer in 2..10000, got {self.max_value!r}")
        if isinstance(self.ops, str) or not isinstance(self.ops, (tuple, list)):
            raise ValueError(f"ops must be a list of operations from {OPS}, got {self.ops!r}")
        object.__setattr__(self, "ops", tuple(self.ops))  # a list from a config: hashable, compared as a tuple
        if not self.ops or any(o not in OPS for o in self.ops) or len(set(self.ops)) < len(self.ops):
            raise ValueError(f"ops must be a non-empty list of distinct operations from {OPS}, got {list(self.ops)!r}")
        if self.ops == ("mul",) and self.n_ops > 1:
            raise ValueError("ops=['mul'] allows n_ops=1 only: a product is the start of a problem, never a later step")
        if not integer(self.wordings) or not 1 <= self.wordings <= len(ADD):
            raise ValueError(f"wordings must be an integer in 1..{len(ADD)}, got {self.wordings!r}")
        if self.subtract_only and self.max_value < self.n_ops + 1:
            raise ValueError(f"ops={list(self.ops)!r} without 'add' and n_ops={self.n_ops} need max_value >= "
                             f"{self.n_ops + 1} (a start that leaves at least 1 after {self.n_ops} subtractions), "
                             f"got {self.max_value}")

    @property
    def subtract_only(self) -> bool:
        """Changes after the start are subtractions only (``ops`` has ``sub`` but not ``add``)."""
        return "sub" in self.ops and "add" not in self.ops

    def tag(self) -> str:
        """A short name of the difficulty, e.g. ``ops1-max10-add+sub-w3``."""
        return f"ops{self.n_ops}-max{self.max_value}-{'+'.join(self.ops)}-w{self.wordings}"


def _start_sentence(n: str, o: str, start: tuple[int, ...]) -> str:
    """The first sentence: ``(x,)`` a count, ``(a, b)`` a product of bags."""
    return f"{n} has {start[0]} bags with {_count(start[1], o)} in each bag." if len(start) == 2 else \
        f"{n} has {_count(start[0], o)}."


def _change_sentence(n: str, o: str, op: str, w: int, b: int) -> str:
    return ADD[w].format(n=n, k=b, o=_noun(b, o)) if op == "add" else SUB[w].format(n=n, b=_count(b, o))


def _question(n: str, o: str, sentences: list[str]) -> str:
    return " ".join(sentences) + f" How many {o} does {n} have now?"


def _sub_most(d: Difficulty, x: int, after: int) -> int:
    """The most a subtraction from ``x`` may take away: at most ``max_value`` when ``x`` exceeds it,
    else ``x - 1``; with subtractions only, also leaving 1 for each of the ``after`` later ones."""
    most = d.max_value if x > d.max_value else x - 1
    return min(most, x - 1 - after) if d.subtract_only else most


def _item(rng: np.random.Generator, d: Difficulty) -> dict:
    """One problem: question, gold answer, reference steps. (With ``add`` among the operations the
    draws are those of every earlier version: the problems of a seed do not change.)"""
    n, o = NAMES[rng.integers(len(NAMES))], OBJECTS[rng.integers(len(OBJECTS))]
    draw = lambda lo=1: int(rng.integers(lo, d.max_value + 1))  # noqa: E731
    later = [op for op in d.ops if op != "mul"]
    if "mul" in d.ops and (not later or rng.integers(len(d.ops)) == 0):
        a, b = draw(2), draw(2)
        while d.subtract_only and a * b < d.n_ops:  # room for the n_ops - 1 subtractions that follow
            a, b = draw(2), draw(2)
        x, ops_left = a * b, d.n_ops - 1
        sentences = [_start_sentence(n, o, (a, b))]
        steps = [f"{n} has {a} * {b} = {_count(x, o)}."]
    else:
        x, ops_left = draw(d.n_ops + 1 if d.subtract_only else 1), d.n_ops
        sentences, steps = [_start_sentence(n, o, (x,))], [f"{n} starts with {_count(x, o)}."]
    for i in range(ops_left):
        op = later[rng.integers(len(later))]
        if op == "sub" and x <= 1 and "add" in later:  # nothing can be taken away: add instead
            op = "add"
        w = int(rng.integers(d.wordings))
        if op == "add":
            b = draw()
            y = x + b
            steps.append(ADD_STEP.format(x=x, b0=b, y0=y, n=n, y=_count(y, o)))
        else:
            most = _sub_most(d, x, ops_left - 1 - i)
            b = draw() if most == d.max_value and x > d.max_value else int(rng.integers(1, most + 1))
            y = x - b
            steps.append(SUB_STEP.format(x=x, b0=b, y0=y, n=n, y=_count(y, o)))
        sentences.append(_change_sentence(n, o, op, w, b))
        x = y
    return {"question": _question(n, o, sentences), "answer": str(x), "steps": [*steps, f"The answer is {x}."]}


CAPACITY_BOUND = 4 * MAX_PROBLEMS  # capacity() counts exactly up to this many questions


def _names_objects() -> int:
    return len(NAMES) * len(OBJECTS)


def _starts(d: Difficulty) -> list[tuple[tuple[int, ...], int]]:
    """Every start the generator can draw, with the changes that follow it: ((x,) or (a, b), ops_left)."""
    later = [op for op in d.ops if op != "mul"]
    out: list[tuple[tuple[int, ...], int]] = []
    if "mul" in d.ops:
        out += [((a, b), d.n_ops - 1) for a in range(2, d.max_value + 1) for b in range(2, d.max_value + 1)
                if not d.subtract_only or a * b >= d.n_ops]
    if later:
        out += [((x,), d.n_ops) for x in range(d.n_ops + 1 if d.subtract_only else 1, d.max_value + 1)]
    return out


def _changes(d: Difficulty, x: int, after: int) -> list[tuple[str, int, int]]:
    """The (op, b, y) changes a step can make from ``x`` (``after`` steps follow), each with
    ``wordings`` phrasings."""
    out = []
    if "add" in d.ops:
        out += [("add", b, x + b) for b in range(1, d.max_value + 1)]
    if "sub" in d.ops and x > 1:
        out += [("sub", b, x - b) for b in range(1, _sub_most(d, x, after) + 1)]
    return out


@lru_cache(maxsize=64)
def capacity(d: Difficulty) -> int | None:
    """How many distinct questions ``d`` can produce, train and test together (a question is
    determined by its person, object, start and changes, each phrased one of ``wordings`` ways);
    None when there are more than ``CAPACITY_BOUND``. Counted, not drawn: fast at any size."""
    bound = -(-CAPACITY_BOUND // _names_objects())  # sequences (start and changes) per person and object
    # every start leads to at least one whole problem (an addition is always possible, and with
    # subtractions only the start leaves room for all of them): more starts than the bound, done
    m = d.max_value - 1
    n_starts = (m * m if "mul" in d.ops else 0) + (d.max_value if d.ops != ("mul",) else 0)
    if n_starts > bound + 64:  # (+64: the few products too small to start a subtraction-only problem)
        return None
    states: dict[tuple[int, int], int] = {}  # (x, changes left) -> distinct sequences so far
    for start, left in _starts(d):
        x = start[0] * start[1] if len(start) == 2 else start[0]
        states[x, left] = states.get((x, left), 0) + 1
    if sum(states.values()) > bound:
        return None
    done = 0
    while states:
        nxt: dict[tuple[int, int], int] = {}
        total = done
        for (x, left), k in states.items():
            if left == 0:
                done += k
                total += k
                continue
            for _, _, y in _changes(d, x, left - 1):
                nxt[y, left - 1] = nxt.get((y, left - 1), 0) + k * d.wordings
                total += k * d.wordings
                if total > bound:
                    return None
        states = nxt
    return done * _names_objects()


@lru_cache(maxsize=8)
def _split_counts(d: Difficulty) -> tuple[int, int]:
    """(test, train) question counts of a difficulty whose capacity is known: every question
    written out and assigned to its split (at most ``CAPACITY_BOUND`` of them)."""
    counts = [0, 0]

    def walk(n: str, o: str, sentences: list[str], x: int, left: int) -> None:
        if left == 0:
            counts[_split_bit(_question(n, o, sentences))] += 1
            return
        for op, b, y in _changes(d, x, left - 1):
            for w in range(d.wordings):
                walk(n, o, [*sentences, _change_sentence(n, o, op, w, b)], y, left - 1)

    for n in NAMES:
        for o in OBJECTS:
            for start, left in _starts(d):
                x = start[0] * start[1] if len(start) == 2 else start[0]
                walk(n, o, [_start_sentence(n, o, start)], x, left)
    return counts[0], counts[1]


def split_size(d: Difficulty, split: str) -> int | None:
    """How many distinct questions of ``split`` the difficulty can produce; None when its capacity
    exceeds ``CAPACITY_BOUND`` (then each split holds far more than ``MAX_PROBLEMS``)."""
    if capacity(d) is None:
        return None
    return _split_counts(d)[0 if split == "test" else 1]


def draw_budget(n: int) -> int:
    """The draws :func:`generate` makes for ``n`` problems before it gives up (the rarest are drawn seldom)."""
    return 20 * n + 1000


@lru_cache(maxsize=64)
def _sequence_probs(d: Difficulty) -> tuple[np.ndarray, np.ndarray]:
    """(p, m): per draw of :func:`_item`, the probability p of each sequence of start and changes with
    one phrasing of each, and m how many phrasings share it, for one person and object (each of the
    ``_names_objects()`` pairs is drawn uniformly). Only for a difficulty whose capacity is known (small)."""
    later = [op for op in d.ops if op != "mul"]
    starts = _starts(d)
    mul, plain = [s for s in starts if len(s[0]) == 2], [s for s in starts if len(s[0]) == 1]
    p_mul = (1 / len(d.ops) if later else 1.0) if "mul" in d.ops else 0.0  # _item's draw of a product start
    ps, ms = [], []

    def walk(x: int, left: int, p: float, m: int) -> None:
        if left == 0:
            ps.append(p), ms.append(m)
            return
        moves = _changes(d, x, left - 1)
        per_op = {op: sum(o == op for o, _, _ in moves) for op in ("add", "sub")}
        forced = "add" in later and x <= 1  # a subtraction drawn at 1 becomes an addition
        for op, _, y in moves:  # the op uniform over ``later``, then its operand uniform, then a phrasing
            p_op = float(op == "add") if forced else 1 / len(later)
            walk(y, left - 1, p * p_op / per_op[op] / d.wordings, m * d.wordings)

    for (a, b), left in mul:
        walk(a * b, left, p_mul / len(mul), 1)
    for (x,), left in plain:
        walk(x, left, (1 - p_mul) / len(plain), 1)
    return np.asarray(ps), np.asarray(ms)


def _reached(d: Difficulty, n: int, share: float) -> bool:
    """Whether :func:`generate` finds ``n`` distinct problems of a split holding ``share`` of the questions
    within ``draw_budget(n)`` draws, but for 4 standard deviations of the number it expects to find."""
    p, m = _sequence_probs(d)
    p = p / _names_objects()  # one question: a sequence with one person and object
    hit = -np.expm1(draw_budget(n) * np.log1p(-p))  # P(found at least once) = 1 - (1 - p)^draws
    found = share * _names_objects() * float((m * hit).sum())
    sd = (share * _names_objects() * float((m * hit * (1 - hit)).sum())) ** 0.5
    return n <= found - 4 * sd


def producible(d: Difficulty, split: str) -> int | None:
    """The most distinct ``split`` problems :func:`generate` can be relied on to find within its draw
    budget (at most :func:`split_size`: a subtraction-only split's rarest problems are drawn so seldom
    that even half of it can be out of reach); None when the capacity is not counted (far more than
    ``MAX_PROBLEMS``: only that bounds a size). Computed from the draw probabilities, not drawn."""
    total = capacity(d)
    if total is None:
        return None
    have = split_size(d, split)
    lo, hi = 0, have  # the largest n with _reached: the expected finds are concave in n
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if _reached(d, mid, have / total) else (lo, mid - 1)
    return lo


def check_size(d: Difficulty, split: str, n: int) -> None:
    """ValueError, at once, when ``split`` of ``d`` holds fewer than ``n`` distinct problems, or more than
    its draws reach (:func:`producible`): names the size it holds. (For a config check: cheap, unless
    ``n`` is near what a small capacity gives.)"""
    total = capacity(d)
    if total is None or n <= 0:
        return
    if n > total:
        raise ValueError(f"difficulty {d.tag()} can produce only {total} distinct problems (train and test "
                         f"together, about half each); {n} {split} problems asked: raise max_value, n_ops or wordings")
    if 4 * n > total:  # near the capacity: count the split exactly
        have = split_size(d, split)
        if n > have:
            raise ValueError(f"difficulty {d.tag()} holds {have} distinct {split} problems (of {total} in all); "
                             f"{n} asked: raise max_value, n_ops or wordings")
    if not _reached(d, n, 0.45):  # well within reach of a split of 45% or more: no exact count needed
        most = producible(d, split)
        if n > most:
            raise ValueError(f"difficulty {d.tag()}: its rarest {split} problems are drawn so seldom that {n} distinct "
                             f"ones are not found within {draw_budget(n)} draws (of the {split_size(d, split)} it holds); "
                             f"ask for at most {most}, or raise max_value, n_ops or wordings")


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
    check_size(d, split, n)  # more than the difficulty holds: at once, not after millions of draws
    want = 0 if split == "test" else 1
    tag = int.from_bytes(hashlib.sha256(d.tag().encode()).digest()[:4], "little")
    out: list[dict] = []
    seen: set[str] = set()
    j = 0
    while len(out) < n:
        if j > draw_budget(n):  # the split holds n, but its rarest ones are rarely drawn: never loop for ever
            size = split_size(d, split)
            raise ValueError(f"difficulty {d.tag()}: drawing {n} distinct {split} problems took more than {j} draws "
                             f"(found {len(out)}" + (f" of the {size} it holds" if size is not None else "") +
                             "); ask for fewer, or raise max_value, n_ops or wordings")
        item = _item(np.random.default_rng([seed, want, tag, j]), d)
        j += 1
        q = item["question"]
        if _split_bit(q) != want or q in seen:
            continue
        seen.add(q)
        out.append({"id": str(len(out)), **item})
    return out
