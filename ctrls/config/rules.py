"""Declared allowed values of config keys: a :class:`Rule` per key, given with :func:`key` beside the
key's default in ``ctrls.config.schema`` (see its module docstring). Kept apart so that the config module
holds the configuration, not the vocabulary of its checks."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ctrls.data.names import component_problem


@dataclass(frozen=True)
class Rule:
    """The values a key allows: ``ok(value)`` decides, ``allowed`` says it in words for the
    error message, and ``why`` (optional) tells why the other values are refused."""

    allowed: str
    ok: Callable[[Any], bool]
    why: str = ""


def at_least(lo: float) -> Rule:
    return Rule(f">= {lo:g}", lambda v: v >= lo)


def above(lo: float) -> Rule:
    return Rule(f"> {lo:g}", lambda v: v > lo)


def between(lo: float, hi: float) -> Rule:
    return Rule(f"in [{lo:g}, {hi:g}]", lambda v: lo <= v <= hi)


def only(*values: Any, why: str = "") -> Rule:
    return Rule("only " + " or ".join(repr(v) for v in values), lambda v: v in values, why)


def text(what: str = "a non-empty string") -> Rule:
    return Rule(what, lambda v: isinstance(v, str) and v.strip() != "")


def anything(what: str) -> Rule:
    """A key whose value is checked where it is used (a path, a URL's reachability)."""
    return Rule(what, lambda v: True)


def key(default: Any, rule: Rule | None = None, *, nonempty: bool = False, unique: bool = False) -> Any:
    """A dataclass field with its default and its allowed values (see the module docstring)."""
    meta = {"rule": rule, "nonempty": nonempty, "unique": unique}
    if isinstance(default, list):
        return field(default_factory=lambda d=tuple(default): list(d), metadata=meta)
    return field(default=default, metadata=meta)


def in_range(lo: float, hi: float, *, open_lo: bool = False) -> Rule:
    """``lo < v <= hi`` (``open_lo``) or ``lo <= v <= hi``."""
    if open_lo:
        return Rule(f"in ({lo:g}, {hi:g}]", lambda v: lo < v <= hi)
    return between(lo, hi)


def token_temperature(lo: float = 1e-2, hi: float = 10.0, greedy: bool = False) -> Rule:
    """A token temperature: logits are divided by it, so a tiny one overflows them."""
    if greedy:
        return Rule(f"0 (greedy) or in [{lo:g}, {hi:g}]", lambda v: v == 0 or lo <= v <= hi)
    return Rule(f"in [{lo:g}, {hi:g}]", lambda v: lo <= v <= hi)


def path_part(what: str = "a name that can be one directory name (no '/', '\\', '.' or '..')") -> Rule:
    """A value that becomes one component of a path under the run directory (``ctrls.data.names``)."""
    return Rule(what, lambda v: isinstance(v, str) and component_problem(v) is None)


# ---- the named rules and ranges of ctrls.config.schema's keys -------------------------------------

# Coefficient ranges: beyond them a finite value overflows a loss, a density or the logits.
MAX_ALPHA = 10.0  # entropy weights: alpha * sum_t H with H <= log K
MAX_LR = 10.0  # learning rates (Adam's step is about lr per entry)
MAX_CONCENTRATION = 1e4  # Dirichlet concentrations c (lgamma of c p stays exact in float32)


def _is_dataset(v: str) -> bool:
    from ctrls.data.problems import DATASETS  # lazy: keeps numpy and the data readers out of the config import

    if v in DATASETS:
        return True
    p = Path(v).expanduser()
    return (p / "train.jsonl").is_file() and (p / "test.jsonl").is_file()


DATASET = Rule("gsm8k, math, gsm_symbolic, word_problems, or a directory holding train.jsonl and test.jsonl", _is_dataset)
DTYPE = Rule("device (bfloat16 on CUDA, float32 elsewhere), auto (bfloat16 on CUDA; on a CPU bfloat16 only where "
             "a GEMM probe measures it >= 1.2x faster, else float32), float32, bfloat16 or float16",
             lambda v: v in ("device", "auto", "float32", "bfloat16", "float16"))
HIDDEN_LAYER_WHY = ("pretraining would fit the states and train the adapter on that layer's hidden states while "
                    "decoding (ctrls.generate.sampling) uses the last layer's; kept as a key for a future implementation "
                    "that uses the layer end to end")
INJECT_AT_WHY = ("pretraining and decoding apply the adapter to the last hidden state only; input_embeds exists in "
                 "ctrls.method.adapter.adapted_logits but no stage trains or decodes with it; kept as a key for a "
                 "future implementation")
