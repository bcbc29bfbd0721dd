"""Benchmark problems (Sec. 6.1): GSM8K, MATH (MATH-500 test / the other 4,500 as train), gsm_symbolic,
the generated ``word_problems``, or a directory of your own with ``train.jsonl`` and ``test.jsonl``.

Each :class:`Problem` carries the question x_0, the gold answer y* of the reward 1{y = y*}, and the
reference solution as steps (the paper's x_1..x_T). The data comes from a data directory (the
``data_dir`` argument or config ``data.data_dir``, else ``$CTRLS_DATA_DIR``, else ``../shared/data``
beside the repository or the working directory; ``gsm8k/{train,test}.jsonl``,
``math/{math500_test,math_test_full}.jsonl``), else the Hugging Face hub through ``datasets``, else a
:class:`DataError` that names both ways. A subset of ``n`` is the first n of one seeded permutation
(deterministic and nested). Bad rows are skipped and counted; above ``max_bad_fraction`` they are an
error. Your own dataset's format, MATH's split and the bad rows: book/method.md, "Data".
"""
from __future__ import annotations

import json
import logging
import math
import os
import re
from collections import Counter
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy as np

from ctrls.data.answers import boxed_at, gold_problem, grade, last_boxed, math_verify_alone  # noqa: F401 (boxed_at: re-exported)
from ctrls.data.names import colliding, file_name

log = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parents[2]  # the checkout this package runs from (../shared/data beside it)
DATASETS = ("gsm8k", "math", "gsm_symbolic", "word_problems")
SPLITS = ("train", "test")
GSM_SYMBOLIC_SIZE = 1000  # problems generated per gsm_symbolic split when no n is given
GENERATED = ("gsm_symbolic", "word_problems")  # datasets generated on demand: their size is whatever n asks for
MAX_GENERATED = 100_000  # the most problems a generated split may have (they are held in memory)
MAX_STEP_CHARS = 200  # MATH solution lines longer than this are split into sentences

_CALC = re.compile(r"<<[^>]*>>")
_ASY = re.compile(r"\[asy\].*?\[/asy\]", re.DOTALL)
_FILES = {("gsm8k", "train"): "gsm8k/train.jsonl", ("gsm8k", "test"): "gsm8k/test.jsonl",
          "math500": "math/math500_test.jsonl", "math_full": "math/math_test_full.jsonl"}


class DataError(RuntimeError):
    """The benchmark data cannot be found, or too many of its rows are malformed."""


class TooFewProblems(DataError):
    """More problems asked for than the split holds; ``available`` is how many it does."""

    def __init__(self, message: str, available: int):
        super().__init__(message)
        self.available = available


@dataclass(frozen=True)
class Problem:
    id: str  # gsm8k-{split}-{row}, math-{unique_id or idx}, gsm_symbolic-{split}-s{seed}-{index}
    question: str  # x_0
    answer: str  # gold final answer y*
    steps: tuple[str, ...]  # reference solution steps, one per element
    source: str  # gsm8k | math | gsm_symbolic
    split: str  # train | test
    meta: dict = field(default_factory=dict, compare=False, hash=False)  # level, subject, raw "solution"


DUPLICATE = "duplicate of an earlier row"  # the skip reason of a row repeated verbatim
# ---- locating the data ---------------------------------------------------------------------------


def resolve_data_dir(data_dir: str | os.PathLike | None = None) -> Path | None:
    """The data directory to read, or None when there is none (then the hub is tried)."""
    if data_dir:
        p = Path(data_dir).expanduser()
        if not p.is_dir():
            raise DataError(f"data directory {p} (data_dir / config data.data_dir) does not exist")
        return p
    env = os.environ.get("CTRLS_DATA_DIR")
    if env:
        p = Path(env).expanduser()
        if not p.is_dir():
            raise DataError(f"CTRLS_DATA_DIR={env} does not exist")
        return p
    for cand in (REPO.parent / "shared" / "data", Path.cwd().parent / "shared" / "data"):
        if cand.is_dir():
            return cand
    return None


def _missing_msg(what: str, why: str) -> str:
    return (f"cannot load {what}: no data directory was found and {why}.\n"
            f"Either set CTRLS_DATA_DIR (or the config key data.data_dir) to a directory holding "
            f"gsm8k/{{train,test}}.jsonl and math/{{math500_test,math_test_full}}.jsonl, or go online "
            f"with `pip install datasets` so that the data loads from the Hugging Face hub.")


def _read_jsonl(d: Path, key: Any) -> list[dict | None]:
    """Rows of one data file of the data directory ``d``."""
    path = d / _FILES[key]
    if not path.is_file():
        raise DataError(f"{path} not found in the data directory {d} "
                        f"(expected {', '.join(sorted(set(_FILES.values())))})")
    return _read_jsonl_file(path)


class BadRow(dict):
    """A line that could not be read as a row (empty, so falsy), with the reason it is counted under."""

    def __init__(self, reason: str):
        super().__init__()
        self.reason = reason


def _read_jsonl_file(path: Path) -> list[dict | None]:
    """Rows of a JSONL file (UTF-8, a byte-order mark allowed); a line that is not a JSON object
    becomes None, and a line that is not valid UTF-8 a :class:`BadRow` (both counted as malformed;
    the first bad line of each kind is logged with the file and line number)."""
    rows: list[dict | None] = []
    bad_utf8 = 0
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            if lineno == 1 and raw.startswith(b"\xef\xbb\xbf"):
                raw = raw[3:]
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                if not bad_utf8:
                    log.warning("%s, line %d: not valid UTF-8 (%s): a malformed row", path, lineno, e.reason)
                bad_utf8 += 1
                rows.append(BadRow("not valid UTF-8"))
                continue
            if not line.strip():
                continue
            try:
                r = json.loads(line)
            except json.JSONDecodeError:
                r = None
            rows.append(r if isinstance(r, dict) else None)
    return rows


def _hub(name: str, config: str | None, split: str) -> list[dict]:
    try:
        import datasets  # lazily: only this fallback needs it
    except ImportError as e:
        raise DataError(_missing_msg(f"{name} ({split})", "the `datasets` package is not installed")) from e
    try:
        return [dict(r) for r in datasets.load_dataset(name, config, split=split)]
    except Exception as e:  # offline, or the hub refused
        raise DataError(_missing_msg(f"{name} ({split})", f"loading it from the hub failed: {e}")) from e


def _hub_math_full() -> list[dict]:
    subjects = ["algebra", "counting_and_probability", "geometry", "intermediate_algebra", "number_theory",
                "prealgebra", "precalculus"]
    return [r for s in subjects for r in _hub("EleutherAI/hendrycks_math", s, "test")]


# ---- parsing -------------------------------------------------------------------------------------


def gsm8k_solution(answer: str) -> tuple[str, tuple[str, ...]]:
    """(gold, steps) from a GSM8K answer ``... #### N``.

    Gold is the text after the last ``####`` without thousands commas; the steps are the non-empty
    lines before it with the ``<<...>>`` calculator annotations removed.
    """
    if "####" not in answer:
        raise ValueError("no '####' final answer")
    body, gold = answer.rsplit("####", 1)
    gold = gold.strip().replace(",", "")
    if not gold:
        raise ValueError("empty answer after '####'")
    steps = tuple(s.strip() for s in _CALC.sub("", body).split("\n") if s.strip())
    return gold, steps


_OPEN = re.compile(r"(?<!\\)\\\[|\\begin\{")  # \[ (not the \\[2pt] of a line break), \begin{
_CLOSE = re.compile(r"(?<!\\)\\\]|\\end\{")


# what _sentences looks at: escapes, math delimiters, environments, braces, and sentence-ending periods
_TOKENS = re.compile(r"\\[\\${}]|\$\$|\$|\\[(\[]|\\begin\{[^}]*\}|\{|\\[)\]]|\\end\{[^}]*\}|\}|\.(?=\s|$)")


def _sentences(line: str) -> list[str]:
    """Split a line at sentence ends (``.`` then a space or the end) outside math and braces."""
    out, start = [], 0
    inline = display = False  # inside $...$ / $$...$$
    depth = 0  # \( \[ \begin{} nesting, and braces
    for m in _TOKENS.finditer(line):
        tok = m.group()
        if tok == "$$":
            display = not display
        elif tok == "$":
            inline = not inline
        elif tok in ("{", "\\(", "\\[") or tok.startswith("\\begin"):
            depth += 1
        elif tok in ("}", "\\)", "\\]") or tok.startswith("\\end"):
            depth = max(0, depth - 1)
        elif tok == "." and not (inline or display or depth):
            out.append(line[start:m.end()].strip())
            start = m.end()
    out.append(line[start:].strip())
    return [s for s in out if s]


def math_steps(solution: str) -> tuple[str, ...]:
    """A MATH solution as steps.

    Asymptote figures (``[asy]...[/asy]``) are dropped; lines are joined while a display-math
    environment (``$$``, ``\\[``, ``\\begin{...}``) is open, so that no step holds half an
    equation; a resulting line longer than ``MAX_STEP_CHARS`` is split at its sentence ends
    outside math. No step contains a newline.
    """
    lines: list[str] = []
    buf, in_dollars, depth = "", False, 0
    for raw in _ASY.sub("", solution).split("\n"):
        raw = raw.strip()
        if not raw:
            continue
        buf = f"{buf} {raw}" if buf else raw
        in_dollars ^= raw.count("$$") % 2 == 1
        depth += len(_OPEN.findall(raw)) - len(_CLOSE.findall(raw))
        if not in_dollars and depth <= 0:
            lines.append(buf)
            buf, depth = "", 0
    if buf:
        lines.append(buf)
    steps: list[str] = []
    for line in lines:
        steps.extend(_sentences(line) if len(line) > MAX_STEP_CHARS else [line])
    return tuple(steps)


def _norm_text(s: str) -> str:
    return " ".join(s.split())


def _parse_local_row(source: str, split: str, i: int, r: dict, id_prefix: str) -> Problem:
    """A row of your own dataset (book/method.md, "Data"): question, answer, and optional steps/solution/id."""
    q, a = r.get("question"), r.get("answer")
    if not isinstance(q, str) or not q.strip():
        raise ValueError("missing or empty question")
    if isinstance(a, bool) or not isinstance(a, (str, int, float)) or not str(a).strip():
        raise ValueError("missing or empty answer (a string or a number)")
    steps, sol = r.get("steps"), r.get("solution")
    if steps is not None:
        if not isinstance(steps, list) or not all(isinstance(x, str) for x in steps):
            raise ValueError("steps is not a list of strings")
        if any("\n" in x.strip() for x in steps):
            raise ValueError("a step contains a newline (one step per list element)")
        steps = tuple(x.strip() for x in steps if x.strip())
    elif sol is not None:
        if not isinstance(sol, str):
            raise ValueError("solution is not a string")
        steps = tuple(x.strip() for x in sol.split("\n") if x.strip())
    else:
        steps = ()
    rid = r.get("id", i)
    if isinstance(rid, bool) or not isinstance(rid, (str, int)) or not str(rid).strip():
        raise ValueError("id is not a non-empty string or an integer")
    return Problem(f"{id_prefix}{rid}", q.strip(), canonical_gold(a), steps, source, split,
                   {"solution": sol} if isinstance(sol, str) else {})


def _parse_row(dataset: str, split: str, i: int, r: dict, id_prefix: str) -> Problem:
    """One row of a built-in dataset as a Problem, or ValueError naming what is malformed."""
    if dataset in ("gsm8k", "gsm_symbolic"):
        q, a = r.get("question"), r.get("answer")
        if not isinstance(q, str) or not q.strip() or not isinstance(a, str) or not a.strip():
            raise ValueError("missing or empty question/answer")
        gold, steps = gsm8k_solution(a)
        # gsm_symbolic: the entry's own answer is the gold ('#### 36.0' in the CoT can mean '36')
        gold = canonical_gold(r.get("gold", gold)) or gold
        return Problem(f"{id_prefix}{i}", q.strip(), gold, steps, dataset, split, {"solution": a})
    q, sol = r.get("problem"), r.get("solution")
    if not isinstance(q, str) or not q.strip() or not isinstance(sol, str) or not sol.strip():
        raise ValueError("missing or empty problem/solution")
    gold = r.get("answer") if split == "test" else last_boxed(sol)  # MATH-500 has an answer field
    if not isinstance(gold, str) or not gold.strip():
        raise ValueError("no answer field" if split == "test" else "no \\boxed{} answer in the solution")
    meta = {k: r[k] for k in ("level", "subject", "type") if k in r} | {"solution": sol}
    return Problem(f"{id_prefix}{r.get('unique_id') or r.get('idx', i)}", q.strip(), gold.strip(),
                   math_steps(sol), "math", split, meta)


def canonical_gold(a: str | int | float) -> str:
    """A gold answer as text: a JSON number without exponent (``1e-05`` -> ``0.00001``, ``1e16`` ->
    ``10000000000000000``: the way a model writes it), a string stripped."""
    if isinstance(a, float) and math.isfinite(a):
        out = format(Decimal(repr(a)), "f")
        return out.rstrip("0").rstrip(".") if "." in out else out
    return str(a).strip()


def _check_gold(gold: str) -> None:
    """ValueError unless ``gold`` is a usable gold answer: not empty, not a NaN or infinite number,
    and gradable (``ctrls.data.answers.gold_problem``: "$" or "%" alone is not)."""
    if not gold.strip():
        raise ValueError("empty gold answer")
    try:
        x = float(gold)
    except ValueError:
        x = 0.0
    if not math.isfinite(x):
        raise ValueError("gold answer is NaN or infinite")
    why = gold_problem(gold)
    if why:
        raise ValueError(why)


def _parse_rows(name: str, dataset: str, split: str, rows: list[tuple[int, dict | None]],
                max_bad_fraction: float, id_prefix: str, parse=_parse_row) -> list[Problem]:
    """Parse (index, row) pairs with ``parse``; skip malformed rows and rows repeated verbatim, log
    them per reason, raise above the threshold. Problem ids must be unique: runs resume and join by them."""
    probs: list[Problem] = []
    bad: Counter[str] = Counter()
    example: dict[str, int] = {}
    seen: set[str] = set()
    for i, r in rows:
        try:
            if isinstance(r, BadRow):
                raise ValueError(r.reason)
            if r is None:
                raise ValueError("not a JSON object")
            key = json.dumps(r, sort_keys=True, default=str)
            if key in seen:
                raise ValueError(DUPLICATE)
            seen.add(key)
            p = parse(dataset, split, i, r, id_prefix)
            _check_gold(p.answer)
            probs.append(p)
        except ValueError as e:
            bad[str(e)] += 1
            example.setdefault(str(e), i)
    if not rows:
        raise DataError(f"{name}: the data holds no rows")
    n_bad = sum(bad.values())
    for reason, count in bad.items():
        kind = "repeated" if reason == DUPLICATE else "malformed"
        log.warning("%s: skipped %d %s row(s): %s (first at row %d)", name, count, kind, reason, example[reason])
    if n_bad > max_bad_fraction * len(rows):
        raise DataError(f"{name}: {n_bad} of {len(rows)} rows are malformed or repeated (more than max_bad_fraction="
                        f"{max_bad_fraction:g}): " + "; ".join(f"{c} x {r} (e.g. row {example[r]})" for r, c in bad.items()))
    dup = sorted(k for k, c in Counter(p.id for p in probs).items() if c > 1)
    if dup:
        raise DataError(f"{name}: {len(dup)} problem id(s) occur more than once, e.g. {dup[:3]}; ids must be unique")
    clash = colliding(p.id for p in probs)
    if clash:  # run files are named by id (ctrls.data.names.file_name): two ids must never share one
        raise DataError(f"{name}: the problem ids {clash[0][0]!r} and {clash[0][1]!r} would share one run file name "
                        f"({file_name(clash[0][0])!r}); rename one")
    return probs


def local_dataset_dir(dataset: str) -> Path | None:
    """The directory of your own dataset when ``dataset`` names one (not a built-in name), else None."""
    if dataset in DATASETS:
        return None
    p = Path(dataset).expanduser()
    return p if p.is_dir() else None


def _load_local(d: Path, split: str, max_bad_fraction: float) -> list[Problem]:
    path = d / f"{split}.jsonl"
    if not path.is_file():
        raise DataError(f"{path} not found: a dataset directory holds train.jsonl and test.jsonl, one JSON object "
                        f"per line with 'question' and 'answer' (and optionally 'steps', 'solution', 'id')")
    name = d.resolve().name
    return _parse_rows(f"{name}/{split}", name, split, list(enumerate(_read_jsonl_file(path))), max_bad_fraction,
                       f"{name}-{split}-", parse=_parse_local_row)


def _load_all(dataset: str, split: str, data_dir: str | os.PathLike | None, max_bad_fraction: float) -> list[Problem]:
    if dataset == "gsm8k":
        d = resolve_data_dir(data_dir)
        rows = _read_jsonl(d, ("gsm8k", split)) if d else _hub("openai/gsm8k", "main", split)
        return _parse_rows(f"gsm8k/{split}", "gsm8k", split, list(enumerate(rows)), max_bad_fraction, f"gsm8k-{split}-")
    # MATH: MATH-500 is the test split; the rest of the MATH test split is the train split
    d = resolve_data_dir(data_dir)
    m500 = _read_jsonl(d, "math500") if d else _hub("HuggingFaceH4/MATH-500", None, "test")
    if split == "test":
        return _parse_rows("math/test (MATH-500)", "math", "test", list(enumerate(m500)), max_bad_fraction, "math-")
    full = _read_jsonl(d, "math_full") if d else _hub_math_full()
    in500 = {_norm_text(r["problem"]) for r in m500 if r and isinstance(r.get("problem"), str)}
    rest = [(i, r) for i, r in enumerate(full)
            if not (r and isinstance(r.get("problem"), str) and _norm_text(r["problem"]) in in500)]
    return _parse_rows("math/train (MATH test minus MATH-500)", "math", "train", rest, max_bad_fraction, "math-")


def _gsm_symbolic(split: str, n: int, seed: int, max_bad_fraction: float) -> list[Problem]:
    """n generated problems; item i depends only on (split, seed, i), so larger n extends smaller."""
    if n == 0:
        return []
    import reasoning_gym  # lazily: slow to import

    split_seed = seed + (0 if split == "test" else 1_000_000_000)  # reasoning-gym seeds item i with seed + i
    gen = reasoning_gym.create_dataset("gsm_symbolic", size=n, seed=split_seed)
    rows = [(i, {"question": e.get("question"), "answer": e.get("metadata", {}).get("answer_cot"),
                 "gold": e.get("answer", "")}) for i, e in enumerate(gen[i] for i in range(n))]
    return _parse_rows(f"gsm_symbolic/{split}", "gsm_symbolic", split, rows, max_bad_fraction,
                       f"gsm_symbolic-{split}-s{seed}-")


def _word_problems(split: str, n: int, seed: int, difficulty, max_bad_fraction: float) -> list[Problem]:
    """n generated word problems (``ctrls.data.word_problems``); item i depends only on (split, seed, difficulty, i)."""
    from ctrls.data.word_problems import Difficulty, generate

    try:
        rows = generate(split, n, seed, difficulty or Difficulty())
    except ValueError as e:
        raise DataError(f"word_problems/{split}: {e}") from e
    if n == 0:
        return []
    return _parse_rows(f"word_problems/{split}", "word_problems", split, list(enumerate(rows)), max_bad_fraction,
                       f"word_problems-{split}-s{seed}-", parse=_parse_local_row)


# ---- public API ----------------------------------------------------------------------------------


def load_problems(dataset: str, split: str, n: int | None = None, seed: int = 0,
                  data_dir: str | os.PathLike | None = None, max_bad_fraction: float = 0.01,
                  difficulty=None) -> list[Problem]:
    """All problems of a split, or a seeded subset of ``n``: the first n of one fixed permutation.

    ``dataset`` is a built-in name (``DATASETS``) or the directory of your own dataset (module
    docstring). The same (seed, n) always gives the same problems in the same order, and a larger n
    with the same seed is a superset. ``gsm_symbolic`` generates ``n`` problems (default 1000) instead,
    less those skipped as malformed or repeated (logged; at seed 0 reasoning-gym repeats 1 of the first
    1000 test items and 2 of the first 1000 train items). ``word_problems`` generates ``n`` problems
    (default 1000) at ``difficulty`` (a ``ctrls.data.word_problems.Difficulty``; default its defaults).
    """
    local = local_dataset_dir(dataset)
    if dataset not in DATASETS and local is None:
        raise DataError(f"unknown dataset {dataset!r}: neither a built-in one ({', '.join(DATASETS)}) nor a directory "
                        f"holding train.jsonl and test.jsonl")
    if split not in SPLITS:
        raise DataError(f"unknown split {split!r}; known: {', '.join(SPLITS)}")
    if n is not None and (isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0):
        raise DataError(f"asked for n={n!r} problems; n must be an integer >= 0")
    if dataset in GENERATED and n is not None and n > MAX_GENERATED:
        raise DataError(f"asked for n={n} {dataset}/{split} problems; a generated dataset holds at most "
                        f"{MAX_GENERATED} (MAX_GENERATED)")
    if isinstance(max_bad_fraction, bool) or not isinstance(max_bad_fraction, (int, float)) \
            or not 0 <= max_bad_fraction <= 1:  # NaN fails this too: every comparison with it is False
        raise DataError(f"max_bad_fraction must be a number in [0, 1], got {max_bad_fraction!r}")
    if dataset == "word_problems":
        return _word_problems(split, GSM_SYMBOLIC_SIZE if n is None else n, seed, difficulty, max_bad_fraction)
    if dataset == "gsm_symbolic":
        return _gsm_symbolic(split, GSM_SYMBOLIC_SIZE if n is None else n, seed, max_bad_fraction)
    probs = (_load_local(local, split, max_bad_fraction) if local is not None
             else _load_all(dataset, split, data_dir, max_bad_fraction))
    if n is None:
        return probs
    if n > len(probs):
        raise TooFewProblems(f"asked for {n} {dataset}/{split} problems, only {len(probs)} exist", len(probs))
    order = np.random.default_rng(seed).permutation(len(probs))
    return [probs[i] for i in order[:n]]


def reference_verify_report(dataset: str, split: str = "test", data_dir: str | None = None,
                            cross_check: bool = False) -> dict:
    """Grade every reference solution of a split against its own gold answer.

    A check of the data loader and of the answer checker together: GSM8K solutions end in
    ``#### N``, MATH solutions in ``\\boxed{}``. Returns ``{dataset, split, n, rate, failures}``
    with one ``{id, gold, extracted}`` per failure. ``cross_check``: each solution graded by math-verify
    alone as well (``answers.math_verify_alone``), adding ``math_verify`` (how many it verifies) and
    ``only_math_verify`` (the solutions it verifies and this checker does not, each ``{id, gold, extracted}``).
    """
    problems = load_problems(dataset, split, data_dir=data_dir)
    failures, alone, only_mv = [], 0, []
    for p in problems:
        text = p.meta.get("solution") or "\n".join(p.steps)  # word_problems: its steps
        g = grade(text, p.answer)
        if not g.correct:
            failures.append({"id": p.id, "gold": p.answer, "extracted": g.pred})
        if cross_check and math_verify_alone(text, p.answer):
            alone += 1
            if not g.correct:
                only_mv.append(failures[-1])
    n = len(problems)
    rep = {"dataset": dataset, "split": split, "n": n, "rate": (n - len(failures)) / n, "failures": failures}
    return {**rep, "math_verify": alone, "only_math_verify": only_mv} if cross_check else rep
