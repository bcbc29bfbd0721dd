"""The checks of :mod:`ctrls.config.schema`: each key's type as it is set (:func:`apply_mapping`), its
declared rule, and the few checks that involve two keys (:data:`CROSS_CHECKS`). The schema (the dataclasses,
each key's default and rule) is in :mod:`ctrls.config.schema`; this module reads it through the dataclass
fields, so a new key needs no change here. The checks stay importable from ``ctrls.config.schema``.
"""
from __future__ import annotations

import dataclasses
import json
import math
import re
import types
import typing
from typing import Any, Callable, Literal, Union, get_args, get_origin

from ctrls.config.overrides import short
from ctrls.config.rules import Rule
from ctrls.config.settings import parse_setting, row_label, setting_label
from ctrls.data.names import PAIR_NAME_ROOM, name_max, pair_slug, slug
from ctrls.errors import ConfigError

# ctrls.config.schema imports this module, so its Config is named, not imported, here
Config = Any
MAX_SEED = 2**63 - 1  # any key named seed or seeds: torch.manual_seed overflows at 2**64 (seed + epoch, + 7, + 10**9 stay below)


# ---- setting keys ------------------------------------------------------------------------------

# Keys that existed once: an old profile that sets one gets told what became of it.
REMOVED = {
    "sampling.temperature": "removed: no stage read it; the token temperatures are pretrain.temperature, "
                            "grid.temperatures and rl.temperature",
}


def set_key(obj: Any, path: list[str], value: Any, full_key: str) -> None:
    """Set the dotted key ``full_key`` (split into ``path``) of the dataclass tree ``obj`` to ``value``, its type
    checked (:func:`check_type`); a section takes a mapping, set key by key. An unknown key is a ConfigError."""
    name = path[0]
    if not dataclasses.is_dataclass(obj) or name not in {f.name for f in dataclasses.fields(obj)}:
        if full_key in REMOVED:
            raise ConfigError(f"config key {full_key!r} was {REMOVED[full_key]}")
        known = sorted(f.name for f in dataclasses.fields(obj)) if dataclasses.is_dataclass(obj) else []
        raise ConfigError(f"unknown config key {full_key!r} (known here: {', '.join(known)})")
    tp = type_hints(type(obj))[name]
    if len(path) == 1:
        if dataclasses.is_dataclass(tp):
            if not isinstance(value, dict):
                raise ConfigError(f"config key {full_key!r} is a section; give a mapping")
            for k, v in value.items():
                set_key(getattr(obj, name), [k], v, f"{full_key}.{k}")
            return
        setattr(obj, name, check_type(value, tp, full_key))
    else:
        set_key(getattr(obj, name), path[1:], value, full_key)


def apply_mapping(cfg: Config, mapping: dict[str, Any], prefix: str = "") -> None:
    """Set every (dotted) key of ``mapping`` on ``cfg`` in place (:func:`set_key`); the rules are checked later."""
    for k, v in mapping.items():
        if not isinstance(k, str):
            raise ConfigError(f"config key {short(k)} is not a string")
        set_key(cfg, (prefix + k).split("."), v, prefix + k)


# ---- checks across keys ----------------------------------------------------------------------


def builtin_sizes() -> dict[str, dict[str, int]]:
    """Problems per split of the built-in datasets (tests/config/test_schema.py checks them against the data)."""
    return {"gsm8k": {"train": 7473, "test": 1319}, "math": {"train": 4500, "test": 500}}


def _check_group_baseline(cfg: Config) -> None:
    if cfg.rl.baseline == "group_mean" and cfg.rl.group_size < 2:
        raise refuse("rl.group_size", cfg.rl.group_size, ">= 2 with rl.baseline=group_mean",
                      "the leave-one-out baseline needs another trajectory of the same question")


def _check_compile(cfg: Config) -> None:
    if cfg.sampling.compile != "none" and cfg.sampling.decode != "static":
        raise refuse("sampling.compile", cfg.sampling.compile, "none with sampling.decode=engine",
                      "the engine's shapes change every step; compile the static path (sampling.decode=static)")


def _check_position_mask(cfg: Config) -> None:
    if cfg.grid.position_floor > 0 and not cfg.state_prompt.use:
        raise refuse("grid.position_floor", cfg.grid.position_floor, "0 with state_prompt.use=false",
                      "the position mask is built for the state prompt's rows; the adapter's engine draws its states "
                      "unmasked")


def _check_state_prompt_adapter(cfg: Config) -> None:
    if cfg.state_prompt.with_adapter and not cfg.state_prompt.use:
        raise refuse("state_prompt.with_adapter", True, "false with state_prompt.use=false",
                      "it says how the state prompt's rows are decoded; without the state prompt they use the adapter alone")


def _check_rl_temperature(cfg: Config) -> None:
    if cfg.rl.temperature not in cfg.grid.temperatures:
        raise refuse("rl.temperature", cfg.rl.temperature, f"one of grid.temperatures {cfg.grid.temperatures}",
                      "Table 2's Base row and the judge's rows are the exploration samples at eta = rl.temperature")


def _check_subset_sizes(cfg: Config) -> None:
    sizes = builtin_sizes()
    for ds in dict.fromkeys([cfg.data.dataset, *cfg.grid.datasets]):
        for split, k in (("train", "data.n_train"), ("test", "data.n_test")):
            n = getattr(cfg.data, k.split(".")[1])
            if ds in sizes and n > sizes[ds][split]:
                raise refuse(k, n, f"1 to {sizes[ds][split]} for dataset {ds!r}", f"the size of its {split} split")
        if cfg.rl.n_test is not None and ds in sizes and cfg.rl.n_test > sizes[ds]["test"]:
            raise refuse("rl.n_test", cfg.rl.n_test, f"1 to {sizes[ds]['test']} for dataset {ds!r}",
                          "the size of its test split")


def _check_judge_pair(cfg: Config) -> None:
    pair = cfg.judge.pair
    if pair is not None and (len(pair) != 2 or tuple(pair) not in cfg.pairs()):
        raise refuse("judge.pair", pair, f"one of the grid's [backbone, dataset] pairs {[list(p) for p in cfg.pairs()]}",
                      "Table 3 scores one pair")


def _check_generated_sizes(cfg: Config) -> None:
    from ctrls.data.problems import (  # lazy: ctrls.data.problems imports this module's names
        GENERATED,
        MAX_GENERATED,
    )

    for ds in dict.fromkeys([cfg.data.dataset, *cfg.grid.datasets]):
        for k in ("data.n_train", "data.n_test", "rl.n_test"):
            n = getattr(cfg.rl if k == "rl.n_test" else cfg.data, k.split(".")[1])
            if ds in GENERATED and n is not None and n > MAX_GENERATED:
                raise refuse(k, n, f"1 to {MAX_GENERATED} for the generated dataset {ds!r}",
                              "its problems are generated and held in memory")


def _check_pair_dirs(cfg: Config) -> None:
    """Every (backbone, dataset) pair gets its own directory ``<backbone>__<dataset>``: names that
    map to the same directory (``d`` and ``d/``, two ``.../checkpoint-500``) are refused."""
    for k, names in (("grid.backbones", cfg.grid.backbones), ("grid.datasets", cfg.grid.datasets),
                     ("grid.transfer_datasets", cfg.grid.transfer_datasets),
                     ("backbone.name", [cfg.backbone.name]), ("data.dataset", [cfg.data.dataset])):
        for i, n in enumerate(names):
            s = slug(n)
            if not s.strip("._") or s in (".", ".."):
                raise refuse(k if len(names) == 1 and not k.startswith("grid") else f"{k}[{i}]", n,
                              "a name whose directory name is not empty, '.' or '..'")
        seen: dict[str, str] = {}
        for i, n in enumerate(names):
            s = slug(n).casefold()
            if s in seen:
                raise refuse(f"{k}[{i}]", n, f"a name whose directory differs from {seen[s]!r}'s",
                              f"both would write to runs/<profile>/<stage>/{slug(n)}")
            seen[s] = n
    g, dirs = cfg.grid, {}  # whole pair directories: "m" with "x__y" and "m__x" with "y" are both m__x__y
    named = [(pair_slug(b, d), f"grid.datasets[{j}]", d) for b in g.backbones for j, d in enumerate(g.datasets)]
    named += [(pair_slug(b, f"{t}-from-{d}"), f"grid.transfer_datasets[{k}]", t)
              for b in g.backbones for d in g.datasets for k, t in enumerate(g.transfer_datasets)]
    for s, k, n in named:
        if s.casefold() in dirs and dirs[s.casefold()] != (k, n):
            raise refuse(k, n, f"a name whose pair directory differs from {dirs[s.casefold()][1]!r}'s",
                         f"both would write to runs/<profile>/<stage>/{s}")
        dirs.setdefault(s.casefold(), (k, n))


def _check_name_lengths(cfg: Config) -> None:
    """Each pair's files ``<backbone>__<dataset>...`` (a transfer dataset's too) must fit the file
    system's limit on a file name (``PC_NAME_MAX`` under ``run_dir``, usually 255 bytes), with
    :data:`ctrls.data.names.PAIR_NAME_ROOM` bytes left for what a stage adds; else no stage could write them."""
    limit = name_max(cfg.profile_dir)
    g = cfg.grid
    named = [(b, d, f"grid.backbones[{i}]", f"grid.datasets[{j}]") for i, b in enumerate(g.backbones)
             for j, d in enumerate(g.datasets)]
    named += [(b, f"{t}-from-{d}", f"grid.backbones[{i}]", f"grid.transfer_datasets[{k}]")
              for i, b in enumerate(g.backbones) for d in g.datasets for k, t in enumerate(g.transfer_datasets)]
    for b, d, kb, kd in named:
        n = len(pair_slug(b, d).encode("utf-8", "surrogatepass"))
        if n + PAIR_NAME_ROOM > limit:
            k, v = (kb, b) if len(slug(b)) >= len(slug(d)) else (kd, d)
            raise refuse(k, v, f"a shorter name: the pair's directory name is {n} bytes and its files add up to "
                               f"{PAIR_NAME_ROOM}, beyond the file system's limit of {limit} bytes on a file name")


def _check_labels(cfg: Config) -> None:
    """Rows and RL runs are found by their labels and file names: two settings that would share one
    are refused (e.g. epsilons equal to 6 digits share the label eps=0.123457)."""
    rows = [row_label(e + 0.0) for e in cfg.grid.epsilons]  # + 0.0: -0.0 and 0.0 are one row ("eps=-0" was another)
    if len(set(rows)) < len(rows):
        raise refuse("grid.epsilons", cfg.grid.epsilons, "epsilons with distinct row labels",
                      f"{next(r for r in rows if rows.count(r) > 1)} twice")
    etas = [f"{t:g}" for t in cfg.grid.temperatures]  # the tables print eta so (0.7 and 0.7000000000000001: "0.7")
    if len(set(etas)) < len(etas):
        raise refuse("grid.temperatures", cfg.grid.temperatures, "temperatures that differ when printed",
                      f"eta={next(e for e in etas if etas.count(e) > 1)} twice")
    for k in ("rl.table2", "judge.settings"):
        labels: dict[str, str] = {}
        for name in getattr(cfg.rl if k == "rl.table2" else cfg.judge, k.split(".")[1]):
            st = parse_setting(name, cfg)
            lab = setting_label(st.epsilon + 0.0, st.alpha + 0.0)  # eps=-0 and eps=0 are one row
            if lab in labels:
                raise refuse(k, name, f"a setting other than {labels[lab]!r}", f"both are the row {lab!r}")
            labels[lab] = name


def _check_transfer(cfg: Config) -> None:
    t = cfg.grid.transfer_datasets
    if t and (len(cfg.grid.datasets) > 1 or set(t) & set(cfg.grid.datasets)):
        raise refuse("grid.transfer_datasets", t, "datasets other than the grid's, with one dataset in grid.datasets",
                      "a transfer dataset's rows are keyed by backbone and dataset: two trained models, or the "
                      "pair's own rows, would share them")


def _check_word_problems(cfg: Config) -> None:
    """The difficulty, and every size asked of its splits: one its split cannot give is refused here, at
    load, not when a stage draws it (``ctrls.data.word_problems.check_size``: counted, not drawn)."""
    from ctrls.data.word_problems import check_size

    try:
        d = cfg.data.word_problems.difficulty()
    except ValueError as e:
        raise ConfigError(f"config key 'data.word_problems': {e}") from e
    asked = []
    if "word_problems" in (cfg.data.dataset, *cfg.grid.datasets):
        asked += [("data.n_train", "train", cfg.data.n_train), ("data.n_test", "test", cfg.data.n_test),
                  ("rl.n_test", "test", cfg.rl.n_test)]
    if "word_problems" in cfg.grid.transfer_datasets:
        asked.append(("grid.transfer_questions", "test", cfg.grid.transfer_questions))
    for k, split, n in asked:
        try:
            if n is not None:
                check_size(d, split, n)
        except ValueError as e:
            raise refuse(k, n, f"a size the word_problems {split} split holds ({e})") from None


# Each takes the whole config and raises ConfigError naming the key it refuses.
CROSS_CHECKS: list[Callable[[Config], None]] = [_check_group_baseline, _check_rl_temperature, _check_subset_sizes,
                                                _check_judge_pair, _check_generated_sizes, _check_pair_dirs, _check_name_lengths,
                                                _check_labels, _check_word_problems, _check_transfer, _check_compile,
                                                _check_position_mask, _check_state_prompt_adapter]


def validate(cfg: Config) -> Config:
    """Check every key of ``cfg`` against its type and declared rule, then :data:`CROSS_CHECKS`."""
    _validate_section(cfg, "")
    for check in CROSS_CHECKS:
        check(cfg)
    return cfg


def refuse(k: str, value: Any, allowed: str, why: str = "") -> ConfigError:
    return ConfigError(f"config key {k!r}: {short(value)} is not allowed; allowed: {allowed}" + (f" ({why})" if why else ""))


def _validate_section(obj: Any, prefix: str) -> None:
    hints = type_hints(type(obj))
    for f in dataclasses.fields(obj):
        k, tp, v = prefix + f.name, hints[f.name], getattr(obj, f.name)
        if dataclasses.is_dataclass(tp):
            _validate_section(v, k + ".")
            continue
        check_type(v, tp, k)  # also catches attributes set in code, and a Config() built by hand
        rule: Rule | None = f.metadata.get("rule")
        if isinstance(v, list):
            if f.metadata.get("nonempty") and not v:
                raise refuse(k, v, "a non-empty list")
            if f.metadata.get("unique") and len({json.dumps(x + 0.0 if isinstance(x, float) else x) for x in v}) < len(v):
                raise refuse(k, v, "a list without repeated entries")
            items = [(f"{k}[{i}]", x) for i, x in enumerate(v)]
        else:
            items = [(k, v)] if v is not None else []  # None, where the type allows it, means "the default rule"
        for name, x in items:
            if f.name in ("seed", "seeds") and isinstance(x, int) and x > MAX_SEED:  # every seed key (each is >= 0 by its rule)
                raise refuse(name, x, "an integer in [0, 2**63 - 1]", "torch.manual_seed takes less than 2**64, and the "
                                                                        "stages add small offsets to a seed")
            if rule is not None and not rule.ok(x):
                optional = type(None) in get_args(tp)
                raise refuse(name, x, rule.allowed + (", or null" if optional else ""), rule.why)


# ---- type checking ----------------------------------------------------------------------

_FLOAT_TEXT = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")


def check_type(value: Any, tp: Any, key: str) -> Any:
    """Return ``value`` coerced to ``tp`` (int -> float only), or raise ConfigError naming key."""
    origin = get_origin(tp)
    if tp is Any:
        return value
    if origin in (Union, types.UnionType):
        if float in get_args(tp) and isinstance(value, float) and not math.isfinite(value):
            return check_type(value, float, key)  # says "a finite number", not "not of type float | None"
        for arg in get_args(tp):
            try:
                return check_type(value, arg, key)
            except ConfigError:
                pass
        raise ConfigError(f"config key {key!r}: {short(value)} is not of type {_tname(tp)}")
    if tp is type(None):
        if value is None:
            return None
        raise ConfigError(f"config key {key!r}: expected None, got {short(value)}")
    if origin is Literal:
        if value in get_args(tp):
            return value
        raise ConfigError(f"config key {key!r}: {short(value)} is not one of {list(get_args(tp))}")
    if origin is list:
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"config key {key!r}: expected a list, got {short(value)}")
        (inner,) = get_args(tp) or (Any,)
        return [check_type(v, inner, f"{key}[{i}]") for i, v in enumerate(value)]
    if tp is float:
        if isinstance(value, str) and _FLOAT_TEXT.fullmatch(value.strip()):
            value = float(value)  # YAML 1.1 reads 1e-3 (no dot) as a string
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"config key {key!r}: expected a float, got {short(value)}")
        if not math.isfinite(value):
            raise ConfigError(f"config key {key!r}: {short(value)} is not allowed; allowed: a finite number")
        return float(value)
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"config key {key!r}: expected an int, got {short(value)}")
        return value
    if tp in (str, bool):
        if not isinstance(value, tp):
            raise ConfigError(f"config key {key!r}: expected {tp.__name__}, got {short(value)}")
        return value
    raise ConfigError(f"config key {key!r}: unsupported type {tp}")


def _tname(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def type_hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)
