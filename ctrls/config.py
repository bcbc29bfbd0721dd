"""One typed configuration that flows from a named profile to every stage.

A profile is a YAML file in ``ctrls/profiles/`` (``smoke``, ``demo``, ``paper``). It is read
into the :class:`Config` dataclass tree; ``key=value`` overrides (from the CLI or papermill
parameters) use dotted keys, e.g. ``pretrain.epochs=3`` or ``grid.epsilons=[0.1,0.3]``.
Unknown keys and values of the wrong type raise :class:`ConfigError` naming the key.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import types
import typing
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

import yaml


class ConfigError(ValueError):
    """A configuration key is unknown or its value has the wrong type."""


@dataclass
class DataConfig:
    dataset: str = "gsm8k"  # gsm8k | math | gsm_symbolic | a directory with train.jsonl, test.jsonl (ctrls.data)
    data_dir: str | None = None  # else $CTRLS_DATA_DIR, else ../shared/data if present, else the hub
    n_train: int = 40  # training questions (pretraining / RL), seeded subset
    n_test: int = 40  # test questions (exploration / evaluation), seeded subset
    seed: int = 0
    max_bad_fraction: float = 0.01  # malformed rows above this fraction are an error


@dataclass
class BackboneConfig:
    name: str = "smollm2-135m-instruct"  # embedded default, a hub id, or a local path
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    dtype: str = "auto"  # auto | float32 | bfloat16 | float16
    hidden_layer: int = -1  # which hidden_states entry is E_t (-1: last, after the final norm)
    cache_dir: str | None = None  # where the embedded backbone's safetensors copy lives


@dataclass
class PromptConfig:
    max_steps: int = 12  # cap T on reasoning steps
    few_shot: int = 4  # CoT exemplars for models without a chat template
    use_chat_template: bool = True


@dataclass
class SpectralConfig:
    k: int = 4  # eigen-directions kept (Eq. 5)
    normalize: bool = True  # divide E_t by sqrt(n_t) before the SVD


@dataclass
class StatesConfig:
    n_states: int = 64  # K
    minibatch_above: int = 20000  # MiniBatchKMeans above this many steps
    tau: float | None = None  # soft-assignment temperature; None: median rule
    reduce_k: bool = True  # fewer distinct steps than K: reduce K (recorded) instead of failing


@dataclass
class PolicyConfig:
    concentration: float = 20.0  # initial Dirichlet concentration c
    fit_steps: int = 300  # gradient refinement steps of L after the soft-count start
    fit_lr: float = 0.05
    count_smoothing: float = 0.1  # pseudo-count added to the soft transition counts
    entropy: Literal["categorical", "dirichlet"] = "categorical"


@dataclass
class AdapterConfig:
    rank: int = 64
    inject_at: Literal["last_hidden", "input_embeds"] = "last_hidden"


@dataclass
class SamplingConfig:
    temperature: float = 0.7
    top_k: int = 50
    max_new_tokens: int = 256
    batch_size: int = 64  # sequences decoded together


@dataclass
class PretrainConfig:
    sources: list[str] = field(default_factory=lambda: ["samples", "reference"])
    samples_per_question: int = 4  # CoTs sampled per training question (kept when correct)
    temperature: float = 0.7
    epochs: int = 5
    lr: float = 1e-3
    batch_steps: int = 256  # steps per adapter-training batch
    max_tokens_per_step: int = 64  # longer steps are truncated for the ELBO


@dataclass
class GridConfig:
    """What every stage loops over: backbone x dataset pairs, and the exploration grid."""

    backbones: list[str] = field(default_factory=lambda: ["smollm2-135m-instruct"])
    datasets: list[str] = field(default_factory=lambda: ["gsm8k"])
    temperatures: list[float] = field(default_factory=lambda: [0.5, 0.7])
    epsilons: list[float] = field(default_factory=lambda: [0.1, 0.3, 0.5])
    n_samples: int = 20  # samples per question (pass@n)
    fixed_state: bool = True  # add the "fixed s0" row: the trained adapter with the prompt's s_0 at every step, no transitions (ablation)


@dataclass
class RLConfig:
    steps: int = 100
    questions_per_step: int = 1
    group_size: int = 8  # G trajectories per question
    lr: float = 1e-2
    grad_clip: float = 1.0
    baseline: Literal["none", "group_mean"] = "none"
    entropy_grad: Literal["full", "eq14"] = "full"  # full: exact gradient of J; eq14: score-function term only
    epsilon: float = 0.1
    entropy_coef: float = 0.01  # alpha
    temperature: float = 0.7
    eval_every: int = 20
    eval_questions: int = 20
    eval_samples: int = 4
    checkpoint_every: int = 10
    seeds: list[int] = field(default_factory=lambda: [0, 1])
    settings: list[str] = field(default_factory=lambda: ["none", "epsilon", "entropy", "both"])  # the curves
    table2: list[str] = field(default_factory=lambda: ["H=0", "H=0.01", "eps=0.1", "eps=0.3"])  # Table 2 rows


@dataclass
class JudgeConfig:
    backend: Literal["auto", "openai", "local"] = "auto"
    model: str = "gpt-4"  # model name for the openai backend
    base_url: str | None = None  # any OpenAI-compatible server; None: api.openai.com
    local_model: str = "smollm2-135m-instruct"
    local_max_new_tokens: int = 120  # reply length of the local backend
    samples_per_config: int = 100
    temperature: float = 0.1
    max_retries: int = 4
    timeout_s: float = 60.0


@dataclass
class Config:
    profile: str = "demo"
    run_dir: str = "runs"  # runs/<profile>/<stage>/...
    seed: int = 0
    data: DataConfig = field(default_factory=DataConfig)
    backbone: BackboneConfig = field(default_factory=BackboneConfig)
    prompt: PromptConfig = field(default_factory=PromptConfig)
    spectral: SpectralConfig = field(default_factory=SpectralConfig)
    states: StatesConfig = field(default_factory=StatesConfig)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    adapter: AdapterConfig = field(default_factory=AdapterConfig)
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    pretrain: PretrainConfig = field(default_factory=PretrainConfig)
    grid: GridConfig = field(default_factory=GridConfig)
    rl: RLConfig = field(default_factory=RLConfig)
    judge: JudgeConfig = field(default_factory=JudgeConfig)

    # ---- derived helpers -------------------------------------------------------------
    @property
    def profile_dir(self) -> Path:
        return Path(self.run_dir) / self.profile

    def stage_dir(self, stage: str, *parts: str) -> Path:
        """``runs/<profile>/<stage>/<parts...>``."""
        return self.profile_dir.joinpath(stage, *parts)

    def pairs(self) -> list[tuple[str, str]]:
        """The (backbone, dataset) pairs every stage loops over."""
        return [(b, d) for b in self.grid.backbones for d in self.grid.datasets]

    def for_pair(self, backbone: str, dataset: str) -> "Config":
        """A copy of this config with ``backbone.name`` and ``data.dataset`` set."""
        return override(self, {"backbone.name": backbone, "data.dataset": dataset})

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def fingerprint(self, *keys: str) -> str:
        """A short hash of the named sections or dotted fields (all if none), for stage caching."""
        d = self.to_dict()
        if keys:
            picked = {}
            for key in keys:
                v: Any = d
                for part in key.split("."):
                    v = v[part]
                picked[key] = v
            d = picked
        return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:16]


# ---- type checking ----------------------------------------------------------------------


def _check(value: Any, tp: Any, key: str) -> Any:
    """Return ``value`` coerced to ``tp`` (int -> float only), or raise ConfigError naming key."""
    origin = get_origin(tp)
    if tp is Any:
        return value
    if origin in (Union, types.UnionType):
        errors = []
        for arg in get_args(tp):
            try:
                return _check(value, arg, key)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(f"config key {key!r}: {value!r} is not of type {_tname(tp)}")
    if tp is type(None):
        if value is None:
            return None
        raise ConfigError(f"config key {key!r}: expected None, got {value!r}")
    if origin is Literal:
        if value in get_args(tp):
            return value
        raise ConfigError(f"config key {key!r}: {value!r} is not one of {list(get_args(tp))}")
    if origin is list:
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"config key {key!r}: expected a list, got {value!r}")
        (inner,) = get_args(tp) or (Any,)
        return [_check(v, inner, f"{key}[{i}]") for i, v in enumerate(value)]
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"config key {key!r}: expected a float, got {value!r}")
        return float(value)
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"config key {key!r}: expected an int, got {value!r}")
        return value
    if tp in (str, bool):
        if not isinstance(value, tp):
            raise ConfigError(f"config key {key!r}: expected {tp.__name__}, got {value!r}")
        return value
    raise ConfigError(f"config key {key!r}: unsupported type {tp}")


def _tname(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _set(obj: Any, path: list[str], value: Any, full_key: str) -> None:
    name = path[0]
    if not dataclasses.is_dataclass(obj) or name not in {f.name for f in dataclasses.fields(obj)}:
        known = sorted(f.name for f in dataclasses.fields(obj)) if dataclasses.is_dataclass(obj) else []
        raise ConfigError(f"unknown config key {full_key!r} (known here: {', '.join(known)})")
    tp = _hints(type(obj))[name]
    if len(path) == 1:
        if dataclasses.is_dataclass(tp):
            if not isinstance(value, dict):
                raise ConfigError(f"config key {full_key!r} is a section; give a mapping")
            for k, v in value.items():
                _set(getattr(obj, name), [k], v, f"{full_key}.{k}")
            return
        setattr(obj, name, _check(value, tp, full_key))
    else:
        _set(getattr(obj, name), path[1:], value, full_key)


def _apply_mapping(cfg: Config, mapping: dict[str, Any], prefix: str = "") -> None:
    for k, v in mapping.items():
        _set(cfg, (prefix + k).split("."), v, prefix + k)


def parse_overrides(items: typing.Iterable[str] | dict[str, Any] | None) -> dict[str, Any]:
    """``["a.b=1", "c=[1,2]"]`` -> ``{"a.b": 1, "c": [1, 2]}`` (values parsed as YAML)."""
    if not items:
        return {}
    if isinstance(items, dict):
        return dict(items)
    out: dict[str, Any] = {}
    for item in items:
        if "=" not in item:
            raise ConfigError(f"override {item!r} is not of the form key=value")
        k, v = item.split("=", 1)
        out[k.strip()] = yaml.safe_load(v) if v.strip() else None
    return out


def override(cfg: Config, overrides: typing.Iterable[str] | dict[str, Any] | None) -> Config:
    """A deep copy of ``cfg`` with dotted-key overrides applied (validated)."""
    new = _from_dict(cfg.to_dict())
    _apply_mapping(new, parse_overrides(overrides))
    return new


def _from_dict(d: dict[str, Any]) -> Config:
    cfg = Config()
    _apply_mapping(cfg, {k: v for k, v in d.items()})
    return cfg


def available_profiles() -> list[str]:
    return sorted(p.name[:-5] for p in resources.files("ctrls.profiles").iterdir() if p.name.endswith(".yaml"))


def load_config(profile: str = "demo", overrides: typing.Iterable[str] | dict[str, Any] | None = None) -> Config:
    """Read a named profile (or a path to a YAML file) and apply ``key=value`` overrides."""
    path = Path(profile)
    if path.suffix in (".yaml", ".yml") and path.exists():
        text, name = path.read_text(), path.stem
    else:
        f = resources.files("ctrls.profiles") / f"{profile}.yaml"
        if not f.is_file():
            raise ConfigError(f"unknown profile {profile!r}; available: {', '.join(available_profiles())}")
        text, name = f.read_text(), profile
    raw = yaml.safe_load(text) or {}
    if not isinstance(raw, dict):
        raise ConfigError(f"profile {profile!r} must be a mapping")
    cfg = Config(profile=name)
    _apply_mapping(cfg, raw)
    _apply_mapping(cfg, parse_overrides(overrides))
    return cfg


def save_config(cfg: Config, path: str | Path) -> None:
    Path(path).write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False))
