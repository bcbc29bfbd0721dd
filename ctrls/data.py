"""Benchmark problems: GSM8K, MATH (MATH-500 test / the other 4,500 as train), and gsm_symbolic.

Where the data comes from, in order:
1. a data directory: the ``data_dir`` argument (config ``data.data_dir``), else ``$CTRLS_DATA_DIR``,
   else ``../shared/data`` beside the repository when present. Layout: ``gsm8k/{train,test}.jsonl``,
   ``math/math500_test.jsonl``, ``math/math_test_full.jsonl``;
2. the Hugging Face hub through ``datasets`` when online (``openai/gsm8k``, ``HuggingFaceH4/MATH-500``
   and ``EleutherAI/hendrycks_math`` for the MATH train split);
3. otherwise a :class:`DataError` that names both ways.

``gsm_symbolic`` (from the ``reasoning-gym`` package) is generated offline, and only when asked
for by name. Subsets of n problems are seeded and nested: a larger n extends a smaller one.
Malformed rows are skipped with a logged count and reason; above ``max_bad_fraction`` they are an
error.
"""
from __future__ import annotations

import json
import logging
import os
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ctrls.answers import last_boxed

log = logging.getLogger(__name__)

DATASETS = ("gsm8k", "math", "gsm_symbolic")
_CALC = re.compile(r"<<[^>]*>>")


class DataError(RuntimeError):
    pass


@dataclass(frozen=True)
class Problem:
    id: str
    question: str
    answer: str  # gold final answer y*
    steps: tuple[str, ...]  # reference solution, one step per element
    source: str  # gsm8k | math | gsm_symbolic
    split: str  # train | test
    meta: dict = field(default_factory=dict, compare=False, hash=False)


# ---- locating the data ---------------------------------------------------------------------------


def resolve_data_dir(data_dir: str | os.PathLike | None = None) -> Path | None:
    """The data directory to read, or None (then the hub is tried)."""
    if data_dir:
        p = Path(data_dir).expanduser()
        if not p.is_dir():
            raise DataError(f"data directory {p} (data.data_dir) does not exist")
        return p
    env = os.environ.get("CTRLS_DATA_DIR")
    if env:
        p = Path(env).expanduser()
        if not p.is_dir():
            raise DataError(f"CTRLS_DATA_DIR={env} does not exist")
        return p
    for cand in (Path(__file__).resolve().parents[2] / "shared" / "data", Path.cwd().parent / "shared" / "data"):
        if cand.is_dir():
            return cand
    return None


def _read_jsonl(path: Path) -> list[dict | None]:
    rows: list[dict | None] = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                rows.append(None)
    return rows


def _hub(name: str, config: str | None, split: str) -> list[dict]:
    try:
        import datasets
    except ImportError as e:
        raise DataError(_missing_msg(f"{name} ({split})", "the `datasets` package is not installed")) from e
    try:
        return [dict(r) for r in datasets.load_dataset(name, config, split=split)]
    except Exception as e:  # offline, or the hub refused
        raise DataError(_missing_msg(f"{name} ({split})", f"loading from the hub failed: {e}")) from e


def _missing_msg(what: str, why: str) -> str:
    return (f"cannot load {what}: no data directory was found and {why}.\n"
            f"Either point CTRLS_DATA_DIR (or the config key data.data_dir) at a directory holding "
            f"gsm8k/{{train,test}}.jsonl and math/{{math500_test,math_test_full}}.jsonl, or run online "
            f"with `pip install datasets` so the data loads from the Hugging Face hub.")


# ---- parsing -------------------------------------------------------------------------------------


def gsm8k_solution(answer: str) -> tuple[str, tuple[str, ...]]:
    """(gold, steps) from a GSM8K answer field ``... #### N``; calculator annotations stripped."""
    if "####" not in answer:
        raise ValueError("no '####' final answer")
    body, gold = answer.rsplit("####", 1)
    gold = gold.strip().replace(",", "")
    if not gold:
        raise ValueError("empty answer after '####'")
    steps = tuple(s.strip() for s in _CALC.sub("", body).split("\n") if s.strip())
    return gold, steps


def math_steps(solution: str) -> tuple[str, ...]:
    """A MATH solution as steps: its lines, long lines split at sentence ends outside ``$...$``."""
    steps: list[str] = []
    for line in solution.split("\n"):
        line = line.strip()
        if not line:
            continue
        if len(line) <= 200:
            steps.append(line)
            continue
        buf, in_math = "", False
        for i, ch in enumerate(line):
            buf += ch
            if ch == "$":
                in_math = not in_math
            if ch == "." and not in_math and (i + 1 == len(line) or line[i + 1] == " "):
                steps.append(buf.strip())
                buf = ""
        if buf.strip():
            steps.append(buf.strip())
    return tuple(steps)


def _norm_text(s: str) -> str:
    return " ".join(s.split())


def _parse(dataset: str, split: str, rows: list[dict | None]) -> tuple[list[Problem], Counter, dict]:
    probs, bad, example = [], Counter(), {}
    for i, r in enumerate(rows):
        try:
            if r is None:
                raise ValueError("not valid JSON")
            if dataset == "gsm8k":
                q, a = r.get("question"), r.get("answer")
                if not q or not a:
                    raise ValueError("missing question or answer")
                gold, steps = gsm8k_solution(a)
                probs.append(Problem(f"gsm8k-{split}-{i}", q.strip(), gold, steps, "gsm8k", split))
            else:
                q, sol = r.get("problem"), r.get("solution")
                if not q or not sol:
                    raise ValueError("missing problem or solution")
                gold = r.get("answer") or last_boxed(sol)
                if not gold:
                    raise ValueError("no \\boxed{} answer in the solution")
                pid = r.get("unique_id") or f"idx{r.get('idx', i)}"
                meta = {k: r[k] for k in ("level", "subject", "type") if k in r}
                probs.append(Problem(f"math-{pid}", q.strip(), gold.strip(), math_steps(sol), "math", split, meta))
        except (ValueError, AttributeError, TypeError) as e:
            bad[str(e)] += 1
            example.setdefault(str(e), i)
    return probs, bad, example


def _check_bad(name: str, total: int, bad: Counter, example: dict, max_bad_fraction: float) -> None:
    n_bad = sum(bad.values())
    if not n_bad:
        return
    for reason, count in bad.items():
        log.warning("%s: skipped %d malformed row(s): %s (first at row %d)", name, count, reason, example[reason])
    if n_bad > max_bad_fraction * total:
        raise DataError(f"{name}: {n_bad} of {total} rows are malformed (more than {max_bad_fraction:.1%}): "
                        + "; ".join(f"{c} x {r} (e.g. row {example[r]})" for r, c in bad.items()))


def _load_all(dataset: str, split: str, data_dir, max_bad_fraction: float) -> list[Problem]:
    if split not in ("train", "test"):
        raise DataError(f"unknown split {split!r}: train or test")
    if dataset == "gsm_symbolic":
        return _gsm_symbolic(split)
    if dataset not in DATASETS:
        raise DataError(f"unknown dataset {dataset!r}; known: {', '.join(DATASETS)}")
    d = resolve_data_dir(data_dir)
    if dataset == "gsm8k":
        rows = _read_jsonl(d / "gsm8k" / f"{split}.jsonl") if d else _hub("openai/gsm8k", "main", split)
        probs, bad, ex = _parse("gsm8k", split, rows)
        _check_bad(f"gsm8k/{split}", len(rows), bad, ex, max_bad_fraction)
        return probs
    # MATH: MATH-500 is the test split; the rest of the MATH test set is the train split
    m500 = _read_jsonl(d / "math" / "math500_test.jsonl") if d else _hub("HuggingFaceH4/MATH-500", None, "test")
    if split == "test":
        probs, bad, ex = _parse("math", "test", m500)
        _check_bad("math/test (MATH-500)", len(m500), bad, ex, max_bad_fraction)
        return probs
    full = _read_jsonl(d / "math" / "math_test_full.jsonl") if d else _hub_math_full()
    in500 = {_norm_text(r["problem"]) for r in m500 if r and r.get("problem")}
    rest = [r for r in full if r is None or _norm_text(r.get("problem", "")) not in in500]
    probs, bad, ex = _parse("math", "train", rest)
    _check_bad("math/train (MATH test minus MATH-500)", len(rest), bad, ex, max_bad_fraction)
    return probs


def _hub_math_full() -> list[dict]:
    subjects = ["algebra", "counting_and_probability", "geometry", "intermediate_algebra", "number_theory",
                "prealgebra", "precalculus"]
    return [r for s in subjects for r in _hub("EleutherAI/hendrycks_math", s, "test")]


def _gsm_symbolic(split: str, size: int = 1000) -> list[Problem]:
    import reasoning_gym

    seed = {"train": 1, "test": 2}[split]
    probs = []
    for i, entry in enumerate(reasoning_gym.create_dataset("gsm_symbolic", size=size, seed=seed)):
        cot = entry.get("metadata", {}).get("answer_cot", "")
        try:
            _, steps = gsm8k_solution(cot)
        except ValueError:
            steps = ()
        probs.append(Problem(f"gsm_symbolic-{split}-{i}", entry["question"], str(entry["answer"]).strip(),
                             steps, "gsm_symbolic", split))
    return probs


# ---- public API ----------------------------------------------------------------------------------


def load_problems(dataset: str, split: str, n: int | None = None, seed: int = 0, data_dir: str | None = None,
                  max_bad_fraction: float = 0.01) -> list[Problem]:
    """All problems of a split, or a seeded subset of ``n`` (the first n of one fixed permutation)."""
    probs = _load_all(dataset, split, data_dir, max_bad_fraction)
    if n is None:
        return probs
    if n > len(probs):
        raise DataError(f"asked for {n} {dataset}/{split} problems, only {len(probs)} exist")
    order = np.random.default_rng(seed).permutation(len(probs))
    return [probs[i] for i in order[:n]]


def problems_from_config(cfg, split: str) -> list[Problem]:
    d = cfg.data
    return load_problems(d.dataset, split, n=d.n_train if split == "train" else d.n_test, seed=d.seed,
                         data_dir=d.data_dir, max_bad_fraction=d.max_bad_fraction)


def raw_solutions(dataset: str, split: str, data_dir: str | None = None) -> dict[str, str]:
    """Problem id -> the dataset's own solution text (for checking the answer checker)."""
    d = resolve_data_dir(data_dir)
    if d is None:
        raise DataError(_missing_msg(f"{dataset} solutions", "this check reads the data directory"))
    if dataset == "gsm8k":
        rows = _read_jsonl(d / "gsm8k" / f"{split}.jsonl")
        return {f"gsm8k-{split}-{i}": r["answer"] for i, r in enumerate(rows) if r}
    return {p.id: "\n".join(p.steps) for p in load_problems(dataset, split, data_dir=data_dir)}
