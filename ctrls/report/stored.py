"""One validating reader for every stored result the book reads: the mechanism studies
(``studies/results/*.json``) and the measured GPU-hours (``bench/results/gpu_estimate_measured_*.json``).

Each kind of file has one schema (:data:`SCHEMAS`); :func:`read` parses a file (nesting bounded,
``MAX_DEPTH``), checks it and returns it, and every problem is one :class:`StoredResultError` (a
ValueError) naming the file and the field (``points[1].follows_hi``). A schema checks only what the
readers use: types, finite numbers, ranges, intervals that contain their estimates (the list:
book/method.md, "ctrls/report/stored.py"). Files are read under ``root=``, else ``$CTRLS_RESULTS_DIR``
(laid out like the repository), else this repository. ``read``'s keywords check what a page claims of the runs
(their settings, profile, and the fields every seed must hold). The ``checked_*`` readers take one field of a
result already read (their refusals name the file and the field); :func:`reading` turns a missing field into one.
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import re
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parents[2]
ENV = "CTRLS_RESULTS_DIR"
MAX_DEPTH = 32  # the committed results nest at most 9 deep; a deeper file is refused before it is parsed
MAX_BYTES = 64 << 20  # the largest committed result is 0.6 MB
TOLERANCE = 1e-9  # an interval's end may miss its estimate by rounding only


class StoredResultError(ValueError):
    """A stored result that cannot be read as its kind: names the file and the field."""

    def __init__(self, path, what: str, field: str, problem: str):
        self.path, self.field, self.problem = Path(path), field, problem
        super().__init__(f"{path}: not a readable {what}: {field or '(the file)'}: {problem}")


class _Bad(Exception):
    def __init__(self, field: str, problem: str):
        super().__init__(field, problem)
        self.field, self.problem = field, problem


def results_root(root: str | os.PathLike | None = None) -> Path:
    """The directory stored results are read under: ``root``, else ``$CTRLS_RESULTS_DIR``, else the repository."""
    return Path(root if root is not None else os.environ.get(ENV) or REPO)


def result_path(rel: str, root: str | os.PathLike | None = None) -> Path:
    """Where the stored result ``rel`` (``studies/results/x.json``) is read (:func:`results_root`)."""
    return results_root(root) / rel


def stored_result(rel: str, root: str | os.PathLike | None = None) -> Path | None:
    """:func:`result_path` of ``rel`` when that file exists, else None (not run, or outside a checkout)."""
    p = result_path(rel, root)
    return p if p.is_file() else None


# ---- the readers of one field of a stored result (the mechanism and RL pages' results) ----------------

def read_result(path: Path) -> dict:
    """A stored result's JSON object (NaN and Infinity refused), or a ValueError naming the file."""
    try:
        d = json.loads(Path(path).read_text(), parse_constant=lambda c: (_ for _ in ()).throw(ValueError(c)))
    except (OSError, ValueError) as e:
        raise ValueError(f"{path}: unreadable stored result ({e})") from e
    if not isinstance(d, dict):
        raise ValueError(f"{path}: a stored result is a JSON object")
    return d


def checked_number(d: dict, key: str, path, lo: float = -math.inf, hi: float = math.inf) -> float:
    """``d[key]`` as a finite number in [lo, hi], or a ValueError naming the file and the field."""
    v = d.get(key)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not lo <= v <= hi:
        raise ValueError(f"{path}: field {key!r} must be a finite number in [{lo}, {hi}], got {v!r}")
    return float(v)


def checked_count(d: dict, key: str, path, lo: int = 1) -> int:
    """``d[key]`` as a whole number >= ``lo`` (not a boolean, not 2.5), or a ValueError naming the file and the field."""
    v = d.get(key)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v != int(v) or v < lo:
        raise ValueError(f"{path}: field {key!r} must be a whole number >= {lo}, got {v!r}")
    return int(v)


def checked_flag(d: dict, key: str, path) -> bool:
    """``d[key]`` as a JSON boolean (a string "false" is refused), or a ValueError naming the file and the field."""
    v = d.get(key)
    if not isinstance(v, bool):
        raise ValueError(f"{path}: field {key!r} must be true or false, got {v!r}")
    return v


def checked_seeds(seeds, path, field: str = "seeds") -> list:
    """The list of per-seed records at ``field``, each data seed a whole number listed once (a seed counted twice
    would enter the pool and Holm twice)."""
    if not isinstance(seeds, list) or not all(isinstance(s, dict) for s in seeds):
        raise ValueError(f"{path}: field {field!r} must be a list of objects")
    got = [checked_count(s, "data_seed", path, 0) for s in seeds]
    twice = sorted({x for x in got if got.count(x) > 1})
    if twice:
        raise ValueError(f"{path}: field {field!r}: data seed {twice[0]} is listed twice")
    return seeds


@contextlib.contextmanager
def reading(path):
    """A field missing from a stored result, or of the wrong kind, is a ValueError naming the file and the field."""
    try:
        yield
    except KeyError as e:
        raise ValueError(f"{path}: field {e.args[0]!r} is missing") from None
    except (TypeError, AttributeError, IndexError) as e:
        raise ValueError(f"{path}: a field is malformed ({e})") from None


def checked_interval(d: dict, est: str, lo: str, hi: str, path, bound=(-1.0, 1.0)) -> tuple[float, float, float]:
    """(estimate, lo, hi) of ``d``, each within ``bound`` and the interval holding its estimate."""
    e, a, b = (checked_number(d, k, path, *bound) for k in (est, lo, hi))
    if not a <= e <= b:
        raise ValueError(f"{path}: the interval [{a}, {b}] of {est!r} does not contain its estimate {e}")
    return e, a, b


def checked_kappa(k: dict, path) -> dict:
    """A stored kappa record (``ctrls.stats.agreement.kappa_vs_null``'s), checked field by field."""
    kap, lo, hi = checked_interval(k, "kappa", "kappa lo", "kappa hi", path)
    return {"steps": checked_count(k, "steps", path), "questions": checked_count(k, "questions", path),
            "follows": checked_number(k, "follows", path, 0, 1), "null": checked_number(k, "null", path, 0, 1),
            "kappa": kap, "kappa lo": lo, "kappa hi": hi, "p": checked_number(k, "p_value", path, 0, 1)}


# ---- the schema language: each spec checks a value at a field, or raises _Bad ----------------------------

Spec = Callable[[Any, str], None]


def _at(where: str, key) -> str:
    if isinstance(key, int):
        return f"{where}[{key}]"
    return f"{where}.{key}" if re.fullmatch(r"[A-Za-z_]\w*", str(key)) else f"{where}[{key!r}]"


def _field(where: str) -> str:
    return where.lstrip(".")


def num(lo: float = -math.inf, hi: float = math.inf, *, integer: bool = False, open_lo: bool = False,
        open_hi: bool = False) -> Spec:
    """A finite number (an integer where ``integer``) in [lo, hi], either end open."""
    def check(v, where):
        if v is None:
            raise _Bad(_field(where), "null, not a number")
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise _Bad(_field(where), f"{str(v)[:60]!r} is not a number")
        if not math.isfinite(v):
            raise _Bad(_field(where), f"{v} is NaN/Inf, not a finite number")
        if integer and v != int(v):
            raise _Bad(_field(where), f"{v} is not an integer")
        if v < lo or v > hi or (open_lo and v == lo) or (open_hi and v == hi):
            raise _Bad(_field(where), f"{v} is outside {'(' if open_lo else '['}{lo:g}, {hi:g}{')' if open_hi else ']'}")
    return check


def text() -> Spec:
    def check(v, where):
        if not isinstance(v, str) or not v.strip():
            raise _Bad(_field(where), f"{str(v)[:60]!r} is not a non-empty string")
    return check


def listof(item: Spec, min_len: int = 0, length: int | None = None) -> Spec:
    def check(v, where):
        if not isinstance(v, list):
            raise _Bad(_field(where), f"a {type(v).__name__}, not a list")
        if len(v) < min_len or (length is not None and len(v) != length):
            raise _Bad(_field(where), f"{len(v)} entries; needs "
                       + (f"{length}" if length is not None else f"at least {min_len}"))
        for i, x in enumerate(v):
            item(x, _at(where, i))
    return check


def mapof(value: Spec, min_len: int = 0, keys: str | None = None, required: tuple[str, ...] = ()) -> Spec:
    """An object with any keys (matching the regex ``keys``), each value a ``value``; ``required`` keys present."""
    def check(v, where):
        if not isinstance(v, dict):
            raise _Bad(_field(where), f"a {type(v).__name__}, not an object")
        if len(v) < min_len:
            raise _Bad(_field(where), f"{len(v)} entries; needs at least {min_len}")
        for k in required:
            if k not in v:
                raise _Bad(_field(_at(where, k)), "missing")
        for k, x in v.items():
            if keys is not None and not re.fullmatch(keys, k):
                raise _Bad(_field(_at(where, k)), f"the key {k!r} is not of the form {keys}")
            value(x, _at(where, k))
    return check


def obj(fields: dict[str, Spec], optional: tuple[str, ...] = (), contains: tuple[tuple[str, str, str], ...] = (),
        ordered: tuple[tuple[str, str], ...] = ()) -> Spec:
    """An object with ``fields`` (those of ``optional`` may be absent or null), each (estimate, lo, hi) of
    ``contains`` an interval that holds its estimate, each (a, b) of ``ordered`` with a <= b."""
    def check(v, where):
        if not isinstance(v, dict):
            raise _Bad(_field(where), f"a {type(v).__name__}, not an object")
        for k, spec in fields.items():
            if v.get(k) is None and k in optional:
                continue
            if k not in v:
                raise _Bad(_field(_at(where, k)), "missing")
            spec(v[k], _at(where, k))
        for est, lo, hi in contains:
            if all(v.get(k) is not None for k in (est, lo, hi)) and not v[lo] - TOLERANCE <= v[est] <= v[hi] + TOLERANCE:
                raise _Bad(_field(_at(where, est)), f"{v[est]:g} is outside its interval [{v[lo]:g}, {v[hi]:g}] "
                                                    f"({lo}, {hi})")
        for a, b in ordered:
            if v.get(a) is not None and v.get(b) is not None and v[a] > v[b]:
                raise _Bad(_field(_at(where, a)), f"{v[a]:g} is above {b} {v[b]:g}")
    return check


def both(*specs: Spec) -> Spec:
    def check(v, where):
        for s in specs:
            s(v, where)
    return check


def keys_in(of: str, *others: str) -> Spec:
    """Every key of the field ``of`` is also a key of each field of ``others`` (rows named in one, read in the other)."""
    def check(v, where):
        for o in others:
            gone = [k for k in v[of] if k not in v[o]]
            if gone:
                raise _Bad(_field(_at(_at(where, o), gone[0])), f"missing (a row of {of})")
    return check


# ---- the schemas, one per kind of stored file ----------------------------------------------------------

RATE = num(0, 1)
DIFF = num(-1, 1)  # a difference of two rates
COUNT, POSITIVE = num(0, integer=True), num(1, integer=True)
K = num(2, integer=True)  # one state has no transitions; printed "K = 2" for 2.5 before
COINCIDENCE = num(0, 1, open_lo=True, open_hi=True)  # kappa = (f - c) / (1 - c), the ratio f / c: neither 0 nor 1
MACHINE = obj({"cpu": text()}, optional=("cpu",))
RATE_CI = obj({"rate": RATE, "lo": RATE, "hi": RATE}, contains=(("rate", "lo", "hi"),))
DIFF_CI = obj({"diff": DIFF, "lo": DIFF, "hi": DIFF}, contains=(("diff", "lo", "hi"),))
PASS1 = obj({"rate": RATE, "lo": RATE, "hi": RATE, "questions": POSITIVE, "samples": POSITIVE},
            optional=("lo", "hi", "questions", "samples"), contains=(("rate", "lo", "hi"),))
PROVENANCE = {"commit": text(), "machine": MACHINE}

STEERING_POINT = obj({
    "chains": POSITIVE, "train_questions": POSITIVE, "sources": text(), "K": K, "fusion": text(), "overrides": listof(text()),
    "follows": RATE, "follows_lo": RATE, "follows_hi": RATE,
    "coincidence": COINCIDENCE, "coincidence_lo": RATE, "coincidence_hi": RATE,
    "harm_fixed_s0": DIFF_CI, "harm_eps": DIFF_CI, "pass1": mapof(PASS1, required=("Base",))},
    optional=("K", "fusion", "overrides"),
    contains=(("follows", "follows_lo", "follows_hi"), ("coincidence", "coincidence_lo", "coincidence_hi")))
STEERING = obj({"points": listof(STEERING_POINT, min_len=1), **PROVENANCE}, optional=tuple(PROVENANCE))

GENERATION_ROW = obj({"pass1": obj({"rate": RATE, "lo": RATE, "hi": RATE, "questions": POSITIVE, "samples": POSITIVE},
                                   contains=(("rate", "lo", "hi"),)),
                      "succ": RATE_CI, "follows": both(RATE_CI, obj({"steps": COUNT}, optional=("steps",))),
                      "coincidence": RATE_CI},
                     optional=("follows", "coincidence"))  # Base and fixed s0 draw no state
GENERATION = obj({"points": listof(obj({"rows": mapof(GENERATION_ROW, min_len=1), "overrides": listof(text()),
                                        "sources": text(), "chains": POSITIVE},
                                       optional=("overrides", "sources", "chains")), min_len=1), **PROVENANCE},
                 optional=tuple(PROVENANCE))

FINITE = num()  # log P per token over the backbone alone: either sign
INJECTION_ROW = obj({
    "fit": obj({"kept_epoch": COUNT, "optimizer_steps": COUNT}, optional=("kept_epoch", "optimizer_steps")),
    "controls": obj({"gain_over_backbone": obj({"posterior": FINITE, "shuffled states": FINITE, "random state": FINITE})}),
    "steering": obj({"follows": both(RATE_CI, obj({"steps": COUNT})),
                     "coincidence": obj({"rate": COINCIDENCE, "lo": RATE, "hi": RATE}, contains=(("rate", "lo", "hi"),)),
                     "pass1": RATE, "succ": RATE, "samples": POSITIVE})})
INJECTION = obj({"base": obj({"pass1": RATE, "succ": RATE}), "rows": mapof(INJECTION_ROW, min_len=1, keys=r"last|\d+"),
                 "n_layers": POSITIVE, "n_states": K, "questions": POSITIVE, "samples_per_question": POSITIVE,
                 "epsilon": RATE, "train_chains": COUNT, **PROVENANCE},
                optional=("n_layers", "n_states", "questions", "samples_per_question", "epsilon", "train_chains",
                          *PROVENANCE))

_B = "Base, random states"
CONCENTRATION_POINT = both(obj({
    "c": num(0, open_lo=True),
    "controllability": mapof(obj({"follows": RATE, "follows lo": RATE, "follows hi": RATE, _B: RATE, f"{_B} lo": RATE,
                                  f"{_B} hi": RATE, "steps": COUNT},
                                 contains=(("follows", "follows lo", "follows hi"), (_B, f"{_B} lo", f"{_B} hi"))), min_len=1),
    "pass@1": mapof(RATE, required=("Base",)), "samples": mapof(POSITIVE)}), keys_in("controllability", "pass@1", "samples"))
CONCENTRATION = obj({"fitted_c": num(0, open_lo=True), "points": listof(CONCENTRATION_POINT, min_len=1), **PROVENANCE},
                    optional=tuple(PROVENANCE))


def _ci_holds(est: str, ci: str) -> Spec:
    def check(v, where):
        lo, hi = v[ci]
        if not lo - TOLERANCE <= v[est] <= hi + TOLERANCE:
            raise _Bad(_field(_at(where, est)), f"{v[est]:g} is outside its interval [{lo:g}, {hi:g}] ({ci})")
    return check


PILOT_LEVEL = both(obj({"difficulty": text(), "questions": POSITIVE, "samples": POSITIVE, "pass@1": RATE,
                        "pass@1 95% CI": listof(RATE, length=2), "succ": RATE, "icc": num(-1, 1),
                        "icc (succ)": num(-1, 1), "rho": num(-1, 1)}, optional=("icc (succ)", "rho")),
                   _ci_holds("pass@1", "pass@1 95% CI"))
PILOT = obj({"levels": listof(PILOT_LEVEL, min_len=1)})

HOURS = obj({"mean": num(0), "cap": num(0)}, ordered=(("mean", "cap"),))  # 'mean' decodes fewer tokens than 'cap'
PAIRS = r".+ / .+"  # "<backbone> / <dataset>"
GPU = obj({"environment": obj({"gpu": text()}),
           "estimate": obj({"stages_hours": mapof(HOURS, min_len=1), "total_hours": HOURS}),  # the eager engine's
           "estimate_graph": obj({"pairs_hours": mapof(HOURS, min_len=1, keys=PAIRS), "total_hours": HOURS,
                                  "stages_hours": mapof(HOURS, min_len=1)}, optional=("total_hours", "stages_hours")),
           "estimate_graph_8gpu": obj({"world_size": POSITIVE, "pairs_hours": mapof(HOURS, keys=PAIRS)},
                                      optional=("world_size",))},
          optional=("estimate", "estimate_graph_8gpu"))

def unique(field: str) -> Spec:
    """The list at ``field`` holds no value twice (a seed listed twice would be counted twice)."""
    def check(v, where):
        seen = set()
        for i, x in enumerate(v[field]):
            if x in seen:
                raise _Bad(_field(_at(_at(where, field), i)), f"{x!r} is listed twice")
            seen.add(x)
    return check


SEED = num(0, integer=True)
POOLED_CLAIM = obj({"estimate": num(), "lo": num(), "hi": num(), "se": num(0), "tau": num(0), "i2": num(0, 1), "q": num(0),
                    "n_seeds": num(2, integer=True), "pred_lo": num(), "pred_hi": num(), "unit": text(),
                    "per_seed": listof(obj({"data_seed": SEED, "estimate": num(), "se": num(0),
                                            "questions": num(1, integer=True)}), min_len=2)},
                   optional=("pred_lo", "pred_hi"), contains=(("estimate", "lo", "hi"), ("estimate", "pred_lo", "pred_hi")))
POOLED_CLAIMS = ("eps_minus_base_pass_n", "eps_minus_hold_s0_pass1", "eps_minus_hold_s0_pass_n", "hold_s0_minus_base_pass1",
                 "rl_minus_pretrained_pass1", "rl_minus_best_constant_pass1", "kappa")
SEEDS_POOLED = both(obj({"seeds": listof(SEED, min_len=2), "claims": mapof(POOLED_CLAIM, required=POOLED_CLAIMS),
                         "states": listof(obj({"data_seed": SEED, "best_constant": num(1, integer=True),
                                               "constant_pass1": mapof(RATE, min_len=1), "s0_share": mapof(RATE, min_len=1),
                                               "pass1": mapof(RATE, min_len=1)}), min_len=2),
                         "rl_power": obj({"delta": num(), "tau": num(0), "n_seeds": num(2, integer=True), "power": RATE},
                                         )}),
                    unique("seeds"))

# ---- studies/seeds.py and studies/state_prompt.py: the mechanism, stage-option, mask, adapter and RL pages' results --

def flag() -> Spec:
    def check(v, where):
        if not isinstance(v, bool):
            raise _Bad(_field(where), f"{str(v)[:60]!r} is not true or false")
    return check


def unique_by(field: str, key: str) -> Spec:
    """No two records of the list at ``field`` share ``key`` (a data seed listed twice enters the pool and Holm twice)."""
    def check(v, where):
        seen = set()
        for i, x in enumerate(v.get(field) or []):
            if x[key] in seen:
                raise _Bad(_field(_at(_at(_at(where, field), i), key)), f"data seed {x[key]!r} is listed twice")
            seen.add(x[key])
    return check


def _verdicts_follow(v, where):
    """Each seed's non-inferiority verdict is what its harm's interval says at the stored margin (lower bound above
    -margin points): a 'yes' under a lower bound of -20 points is refused."""
    if v.get("margin_points") is None:
        return  # a page that shows verdicts reads the margin, and refuses its absence
    margin = v["margin_points"] / 100
    for field in ("seeds", "development"):
        for i, s in enumerate(v.get(field) or []):
            h = s.get("harm_fixed_minus_base_pass1")
            if h is None:
                continue  # a page that shows the harm names it in seed_fields
            if h["non_inferior"] != (h["lo"] > -margin):
                raise _Bad(_field(_at(_at(_at(_at(where, field), i), "harm_fixed_minus_base_pass1"), "non_inferior")),
                           f"{str(h['non_inferior']).lower()}, but the lower bound {100 * h['lo']:+.1f} points is "
                           f"{'not ' if h['non_inferior'] else ''}above -{v['margin_points']:g}")


def _zero_one(v, where):
    if not isinstance(v, bool):  # a mask's entry is stored as 0/1 or as a boolean
        num(0, 1, integer=True)(v, where)


def _mask(v, where):
    """A stored position mask: ``counts`` (whole numbers >= 0) and ``allowed`` (0 or 1) of one shape, positions x
    states, each position allowing a state (a draw restricted to no state has no distribution)."""
    obj({"counts": listof(listof(COUNT), min_len=1), "allowed": listof(listof(_zero_one), min_len=1)})(v, where)
    c, a = v["counts"], v["allowed"]
    if len(c) != len(a) or any(len(x) != len(y) or not x for x, y in zip(c, a)) or len({len(x) for x in c}) != 1:
        raise _Bad(_field(_at(where, "allowed")), "not of the shape of 'counts' (positions x states)")
    for b, row in enumerate(a):
        if not any(row):
            raise _Bad(_field(_at(_at(where, "allowed"), b)), f"position bucket {b} allows no state")


SECONDS = mapof(lambda v, where: None if v is None else num(0)(v, where))
KAPPA_CI = num(-1, 1)
KAPPA_REC = obj({"follows": RATE, "null": RATE, "kappa": KAPPA_CI, "kappa lo": KAPPA_CI, "kappa hi": KAPPA_CI,
                 "p_value": RATE, "steps": POSITIVE, "questions": POSITIVE}, contains=(("kappa", "kappa lo", "kappa hi"),))
PAIRED = obj({"diff": DIFF, "lo": DIFF, "hi": DIFF, "questions": POSITIVE, "p": RATE, "p_holm": RATE, "b": RATE},
             optional=("questions", "p", "p_holm", "b"), contains=(("diff", "lo", "hi"),))
HOLM = obj({"p_holm": RATE, "questions": POSITIVE, "b": RATE}, optional=("questions", "b"))  # what the RL and adapter pages read
RL_BASE = obj({"p_holm": RATE, "questions": POSITIVE, "b": RATE})  # one paired set: its n and Base's pass@1
RL_POLICY = obj({"pass1": RATE, "samples": POSITIVE, "minus_base": both(PAIRED, RL_BASE),
                 "minus_pretrained_eps": both(PAIRED, obj({"p_holm": RATE, "b": RATE}))})
SEED_RUN = obj({
    "data_seed": SEED, "questions": POSITIVE, "samples_per_question": POSITIVE, "epsilon": RATE, "kappa": KAPPA_REC,
    "harm_fixed_minus_base_pass1": both(PAIRED, obj({"non_inferior": flag()})), "eps_minus_base_pass_n": PAIRED,
    "eps_minus_fixed_pass1": PAIRED, "pass1": mapof(RATE, min_len=1), "max_steps": POSITIVE,
    "valid": mapof(RATE, required=("Base", "fixed s0")), "ran_all_steps": mapof(RATE, required=("fixed s0",)),
    "position_masks": mapof(_mask, min_len=1), "rl_table2": mapof(RL_POLICY, min_len=1), "stage_seconds": SECONDS},
    optional=("questions", "samples_per_question", "epsilon", "kappa", "harm_fixed_minus_base_pass1", "eps_minus_base_pass_n",
              "pass1", "eps_minus_fixed_pass1", "max_steps", "valid", "ran_all_steps", "position_masks", "rl_table2",
              "stage_seconds"))
VARIANT = {"profile": text(), "overrides": listof(text()), "settings": mapof(lambda v, where: None)}
AGAINST_SEED = obj({"data_seed": SEED, "kappa_other": KAPPA_REC, "pass1_other": mapof(RATE, min_len=1),
                    "kappa_diff": both(obj({"diff": num(-2, 2), "lo": num(-2, 2), "hi": num(-2, 2)},
                                           contains=(("diff", "lo", "hi"),)), HOLM),
                    "eps_pass1_diff": both(PAIRED, HOLM)})
SEEDS_RUNS = both(obj({"margin_points": num(0, 100), "seeds": listof(SEED_RUN, min_len=1), "development": listof(SEED_RUN),
                       "pooled_kappa": KAPPA_REC, **VARIANT, **PROVENANCE,
                       "against": both(obj({"seeds": listof(AGAINST_SEED), **VARIANT}, optional=tuple(VARIANT)),
                                       unique_by("seeds", "data_seed"))},
                      optional=("margin_points", "development", "pooled_kappa", *VARIANT, *PROVENANCE, "against")),
                  unique_by("seeds", "data_seed"), unique_by("development", "data_seed"), _verdicts_follow)
BY_STEP = obj({"kappa": KAPPA_CI, "kappa lo": KAPPA_CI, "kappa hi": KAPPA_CI}, optional=("kappa lo", "kappa hi"),
              contains=(("kappa", "kappa lo", "kappa hi"),))
STATE_PROMPT = obj({"data_seed": SEED, "vectors_per_state": POSITIVE, "questions": POSITIVE,
                    "state_prompt": both(KAPPA_REC, obj({"pass1": RATE, "by_step": mapof(BY_STEP)}, optional=("by_step",))),
                    "adapter": both(KAPPA_REC, obj({"pass1": RATE})),
                    "state_prompt_minus_adapter": obj({"diff": num(-2, 2), "lo": num(-2, 2), "hi": num(-2, 2), "p_value": RATE},
                                                      contains=(("diff", "lo", "hi"),)), **VARIANT, **PROVENANCE},
                   optional=("questions", *VARIANT, *PROVENANCE))


def _scaled_claims(v, where):
    """The scaled run's pass@k differences at k = min(4, m), the ones its page prints."""
    r, k = v["result"], min(4, v["result"]["samples_per_question"])
    for key in (f"eps_minus_fixed_pass{k}", f"eps_minus_base_pass{k}"):
        both(PAIRED, obj({"p": RATE}))(r.get(key), _at(_at(where, "result"), key))


SCALED = both(obj({"machine": obj({"gpu": text()}, optional=("gpu",)), "margin_points": num(0, 100),
                   "seconds": SECONDS, "profile": text(), "commit": text(), "overrides": mapof(lambda v, where: None),
                   "result": obj({"questions": POSITIVE, "samples_per_question": POSITIVE, "kappa": KAPPA_REC,
                                  "harm_fixed_minus_base_pass1": PAIRED, "eps_minus_fixed_pass1": PAIRED,
                                  "pass1": mapof(RATE, min_len=3, required=("Base", "fixed s0")), "data_seed": SEED},
                                 optional=("data_seed",))},
                  optional=("margin_points", "seconds", "profile", "commit", "overrides")),
              _scaled_claims)

SCHEMAS: dict[str, tuple[Spec, str]] = {  # kind -> (schema, what the file is, for errors)
    "seeds_pooled": (SEEDS_POOLED, "studies/seeds_study.py pooled result"),
    "seeds": (SEEDS_RUNS, "studies/seeds.py result"),
    "state_prompt": (STATE_PROMPT, "studies/state_prompt.py result"),
    "scaled": (SCALED, "studies/scaled_demo.py result"),
    "steering": (STEERING, "studies/steering.py result"),
    "generation": (GENERATION, "studies/steering.py result with rows"),
    "injection": (INJECTION, "studies/injection.py result"),
    "concentration": (CONCENTRATION, "studies/concentration.py result"),
    "pilot": (PILOT, "studies/word_problems.py pilot"),
    "gpu": (GPU, "bench/gpu/gpu_estimate.py measurement"),
}

# The committed results the library reads, each with its kind (generation_controls.json is also a steering result)
COMMITTED = {
    "studies/results/steering_scaling.json": "steering", "studies/results/steering_scaling_k4.json": "steering",
    "studies/results/steering_states.json": "steering", "studies/results/steering_fusion.json": "steering",
    "studies/results/generation_controls.json": "generation", "studies/results/injection.json": "injection",
    "studies/results/injection_k4.json": "injection", "studies/results/word_problems_difficulty.json": "pilot",
    "bench/results/gpu_estimate_measured_nvidia_h200_qwen.json": "gpu",
    "studies/results/seeds_pooled.json": "seeds_pooled", "studies/results/seeds.json": "seeds",
    "studies/results/state_prompt_stage.json": "seeds", "studies/results/state_prompt_positions.json": "seeds",
    "studies/results/state_prompt_default_seed10.json": "seeds", "studies/results/state_prompt_adapter.json": "seeds",
    "studies/results/state_prompt_rl.json": "seeds", "studies/results/state_prompt_rl_seed6.json": "seeds",
    **{f"studies/results/state_prompt_seed{i}.json": "state_prompt" for i in (1, 2, 3, 5)},
    "studies/results/scaled_demo_h200.json": "scaled",
}

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')


def _depth(text: str) -> int:
    """How deep the JSON text's brackets nest (strings aside), without parsing it."""
    depth = most = 0
    for c in re.findall(r"[\[\]{}]", _STRING.sub("", text)):
        depth += 1 if c in "[{" else -1
        most = max(most, depth)
    return most


def read(path: str | os.PathLike, kind: str, *, settings: dict[str, str | Callable[[str | None], bool]] | None = None,
         profile: str | None = None, seed_fields: tuple[str, ...] = ()) -> dict:
    """The stored result at ``path``, checked against the schema of ``kind`` (:data:`SCHEMAS`) and against what the
    page claims of its runs: each key of ``settings`` (``against.<key>`` in the runs compared with) at its value,
    or passing its test (:func:`stored_setting`'s text, None where the record has none); ``profile``; each seed holding
    ``seed_fields``. A :class:`StoredResultError` naming the file and the field when it is not one."""
    schema, what = SCHEMAS[kind]
    path = Path(path)
    try:
        if path.stat().st_size > MAX_BYTES:
            raise StoredResultError(path, what, "", f"larger than {MAX_BYTES >> 20} MB")
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise StoredResultError(path, what, "", f"cannot be read ({type(e).__name__}: {e})") from None
    if _depth(text) > MAX_DEPTH:
        raise StoredResultError(path, what, "", f"nested deeper than {MAX_DEPTH} levels")
    try:
        data = json.loads(text)  # a NaN parses: the schema refuses it naming its field
    except (ValueError, RecursionError) as e:
        raise StoredResultError(path, what, "", f"not JSON ({type(e).__name__}: {e})") from None
    try:
        schema(data, "")
        _claims(data, settings or {}, profile, seed_fields)
    except _Bad as b:
        raise StoredResultError(path, what, b.field, b.problem) from None
    return data


def _claims(d: dict, settings: dict, profile: str | None, seed_fields: tuple[str, ...]) -> None:
    for key, want in settings.items():
        r, name = (d.get("against"), key[len("against."):]) if key.startswith("against.") else (d, key)
        if not isinstance(r, dict):
            raise _Bad("against", "missing: the page compares these runs with others")
        got = stored_setting(r, name)
        if not (want(got) if callable(want) else got is not None and got.lower() == want.lower()):
            where = ("against." if r is not d else "") + ("settings" if name in (r.get("settings") or {}) else "overrides")
            raise _Bad(where, f"not runs with {want.__doc__ if callable(want) else f'{name}={want}'}, as the page says: "
                              f"{name} is {got if got is not None else 'not recorded'} there")
    if profile is not None and d.get("profile") != profile:
        raise _Bad("profile", f"{d.get('profile')!r}, not the {profile!r} the page says")
    for i, s in enumerate(d.get("seeds") or []):
        for f in seed_fields:
            if not s.get(f):
                raise _Bad(f"seeds[{i}].{f}", "missing (the page shows it)")


def stored_setting(d: dict, key: str) -> str | None:
    """The value ``key`` had in a stored result's runs: its ``settings`` (``studies/seeds.py`` records them since
    the demo's defaults changed), else the last of its ``overrides`` that sets it, else None. Booleans as
    "true"/"false", as an override writes them."""
    settings = d.get("settings") if isinstance(d.get("settings"), dict) else {}
    if key in settings:
        v = settings[key]
        return str(v).lower() if isinstance(v, bool) else str(v)
    over = d.get("overrides") if isinstance(d.get("overrides"), list) else []
    hit = [str(o).split("=", 1)[1].strip() for o in over if str(o).split("=", 1)[0].strip() == key]
    return hit[-1] if hit else None


def position_floor(v: str | None) -> bool:
    """the position mask (grid.position_floor in (0, 1])"""
    try:
        return v is not None and 0 < float(v) <= 1
    except ValueError:
        return False


__all__ = ["COMMITTED", "ENV", "SCHEMAS", "StoredResultError", "checked_count", "checked_flag", "checked_interval",
           "checked_kappa", "checked_number", "checked_seeds", "position_floor", "read", "read_result", "reading",
           "result_path", "results_root", "stored_result", "stored_setting"]
