"""One typed configuration that flows from a named profile to every stage.

A profile is a YAML file in ``ctrls/config/profiles/`` (``smoke``, ``demo``, ``paper``) read into the
:class:`Config` dataclass tree; ``key=value`` overrides use dotted keys (``pretrain.epochs=3``). It is
checked when it is made (:func:`load_config`, :func:`override`, :meth:`Config.for_pair`), before any
stage runs, and every problem is a :class:`ConfigError` naming the dotted key, the bad value and what is
allowed. The checks live in :mod:`ctrls.config.checks` and the rules in :mod:`ctrls.config.rules` (both
re-exported here); this module is the schema.

Adding a key: give it a rule with ``key(default, rule)`` beside its default (a ``bool`` or
``Literal[...]`` key may go without one); ``tests/config/test_schema.py`` fails for any other key. Under it,
a docstring says what it is, its unit and what it changes (``ctrls config --explain KEY`` prints it,
:mod:`ctrls.config.explain`); ``tests/config/test_explain.py`` fails for a key without one.
``backbone.hidden_layer`` and ``adapter.inject_at`` accept only their defaults today, and say why
(what is checked, in full: book/method.md, "ctrls/config/schema.py").
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import re
import typing
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import yaml

from ctrls.config.checks import (  # noqa: F401 (re-exported)
    CROSS_CHECKS,
    REMOVED,
    apply_mapping,
    builtin_sizes,
    check_type,
    refuse,
    type_hints,
    validate,
)
from ctrls.config.overrides import check_unique_keys, dump_yaml, load_yaml, parse_overrides, short
from ctrls.config.rules import (  # noqa: F401 (re-exported)
    DATASET,
    DTYPE,
    HIDDEN_LAYER_WHY,
    INJECT_AT_WHY,
    MAX_ALPHA,
    MAX_CONCENTRATION,
    MAX_LR,
    Rule,
    above,
    anything,
    at_least,
    between,
    in_range,
    key,
    only,
    path_part,
    text,
    token_temperature,
)
from ctrls.config.settings import parse_setting
from ctrls.errors import ConfigError

# ---- declared allowed values (the rules, the named ones among them, are in ctrls.config.rules) ----------


def _is_device(v: str) -> bool:
    import torch

    if v == "auto":
        return True
    try:
        torch.device(v)
    except (RuntimeError, ValueError):
        return False
    return True


def _few_shot_max() -> int:
    from ctrls.data.prompts import EXEMPLARS

    return len(EXEMPLARS)


def _is_rl_setting(v: str) -> bool:
    """One grammar: ``ctrls.config.settings.parse_setting``'s; its epsilon in [0, 1], its alpha in [0, MAX_ALPHA]."""
    try:
        s = parse_setting(v, Config())
    except ValueError:
        return False
    return math.isfinite(s.epsilon) and math.isfinite(s.alpha) and 0 <= s.epsilon <= 1 and 0 <= s.alpha <= MAX_ALPHA


RL_SETTING = Rule(f"none, epsilon, entropy, both, 'eps=X', 'H=Y' or 'eps=X,H=Y' with X in [0, 1], Y in [0, {MAX_ALPHA:g}]",
                  _is_rl_setting)


# ---- the configuration --------------------------------------------------------------------


@dataclass
class WordProblemsConfig:
    """The difficulty of the procedural ``word_problems`` dataset (ctrls.data.word_problems); the demo's
    default was chosen by measurement (studies/word_problems.py): Base pass@1 in 15-40%."""

    n_ops: int = key(1, between(1, 8))
    """operations per problem, one step each of the reference chain (after the start)"""
    max_value: int = key(10, between(2, 10_000))
    """operands are drawn from 1..max_value"""
    ops: list[Literal["add", "sub", "mul"]] = key(["add", "sub"], nonempty=True, unique=True)
    """the operations a problem draws from; mul only as the first (a product start), never a later step"""
    wordings: int = key(3, between(1, 3))
    """phrasings per operation that the stories draw from"""

    def difficulty(self):
        from ctrls.data.word_problems import (
            Difficulty,  # lazy: keeps the config import light
        )

        return Difficulty(self.n_ops, self.max_value, tuple(self.ops), self.wordings)


@dataclass
class DataConfig:
    dataset: str = key("gsm8k", DATASET)
    """the pair's dataset: gsm8k | math | gsm_symbolic | word_problems | a directory with train.jsonl and test.jsonl;
    set for each pair from grid.datasets (Config.for_pair)"""
    data_dir: str | None = key(None, anything("a directory (checked when the data is read)"))
    """where the datasets' files are read from; None: $CTRLS_DATA_DIR, else ../shared/data if present, else the hub"""
    n_train: int = key(40, at_least(1))
    """training questions (pretraining and RL), a seeded subset of the train split"""
    n_test: int = key(40, at_least(1))
    """test questions (exploration, Table 1, and Table 2 unless rl.n_test), a seeded subset of the test split"""
    seed: int = key(0, at_least(0))
    """the seed of the subsets: the same seed and n give the same questions, and a larger n a superset"""
    max_bad_fraction: float = key(0.01, between(0, 1))
    """malformed rows are skipped (logged); above this fraction of a split they are an error"""
    word_problems: WordProblemsConfig = field(default_factory=WordProblemsConfig)
    """the procedural dataset's difficulty (used when a dataset is word_problems)"""


@dataclass
class BackboneConfig:
    name: str = key("smollm2-135m-instruct", text())
    """the embedded default, a hub id, or a local path; set for each pair from grid.backbones (Config.for_pair)"""
    device: str = key("auto", Rule("auto, or a torch device (cpu, cuda, cuda:N, mps, ...)", _is_device))
    """the torch device the backbone runs on (the adapter and the policy with it); auto: CUDA when present, else the CPU"""
    dtype: str = key("device", DTYPE)
    """the backbone's dtype; device: bf16 on CUDA, fp32 elsewhere; auto: a CPU's GEMM probe decides (ctrls.method.backbone)"""
    hidden_layer: int = key(-1, only(-1, why=HIDDEN_LAYER_WHY))
    """which hidden_states entry is E_t (Eq. 5; -1: the last, after the final norm); only -1 (HIDDEN_LAYER_WHY)"""
    cache_dir: str | None = key(None, anything("a directory"))
    """where the embedded backbone's safetensors copy lives; None: $CTRLS_CACHE_DIR/models, else ~/.cache/ctrls/models"""


@dataclass
class PromptConfig:
    max_steps: int = key(12, at_least(1))
    """T, the cap on reasoning steps: decoding stops after T steps, and lines beyond T are merged into step T"""
    few_shot: int = key(4, Rule("an integer from 0 to the number of exemplars in ctrls.data.prompts.EXEMPLARS",
                                lambda v: 0 <= v <= _few_shot_max()))
    """worked exemplars before the question: chat turns under a chat template, else plain text"""
    use_chat_template: bool = True
    """wrap the prompt in the tokenizer's chat template where it has one; false: plain text for every model"""


@dataclass
class SpectralConfig:
    k: int = key(4, at_least(1))
    """k, the eigen-directions kept: e_t has k d entries (Eq. 5)"""
    normalize: bool = True
    """divide E_t by sqrt(n_t) before the SVD, so that long steps do not dominate the clustering"""


@dataclass
class StatesConfig:
    n_states: int = key(64, at_least(2))
    """K, the number of latent states (one state has no transitions to learn)"""
    minibatch_above: int = key(20000, at_least(0))
    """fit the centroids with MiniBatchKMeans above this many training steps (KMeans at or below)"""
    tau: float | None = key(None, between(1e-6, 1e6))
    """tau, the temperature of the soft assignment exp(-||e_t - gamma_j||^2 / tau); None: the median rule"""
    reduce_k: bool = True
    """fewer distinct steps than K: reduce K (recorded) instead of failing"""


@dataclass
class PolicyConfig:
    concentration: float = key(20.0, in_range(0, MAX_CONCENTRATION, open_lo=True))
    """the initial Dirichlet concentration c of the policy Dir(c p)"""
    fit: Literal["expected_kl", "mixture"] = "expected_kl"
    """how L is fitted (ctrls.method.policy.fit_transitions): expected_kl = Thm. 5.3's KL term, closed form (the
    row-normalised soft counts); mixture = the relaxed objective's mixture-prior KL, by gradient steps"""
    fit_steps: int = key(300, at_least(0))
    """gradient refinement steps after the soft-count start (policy.fit: mixture only)"""
    fit_lr: float = key(0.05, in_range(0, MAX_LR, open_lo=True))
    """Adam's learning rate of those refinement steps (policy.fit: mixture only)"""
    count_smoothing: float = key(0.1, in_range(0, 1e6, open_lo=True))
    """lambda, the pseudo-count added to the soft transition counts (0 would give log 0)"""
    fit_concentration: bool = False
    """fit c by maximum likelihood of the training posteriors under Dir(c p) (ctrls.method.policy.fit_concentration)
    instead of starting RL and sampling at ``concentration``"""
    entropy: Literal["categorical", "dirichlet"] = "categorical"
    """the entropy H(pi(s)) of the RL bonus and the curves: categorical, -sum_j p_j log p_j (Eq. 14, the paper's);
    dirichlet, the differential entropy of Dir(c p)"""


@dataclass
class AdapterConfig:
    rank: int = key(64, at_least(1))
    """r, the adapter's bottleneck rank (F_d: d -> r, W_z: D -> r); its parameters grow as r (d + D)"""
    inject_at: Literal["last_hidden", "input_embeds"] = key("last_hidden", only("last_hidden", why=INJECT_AT_WHY))
    """where z_t enters: only last_hidden (INJECT_AT_WHY); input_embeds stays in the type for a future implementation"""
    fusion: Literal["linear", "mlp"] = "linear"
    """F_u of Eq. 8: linear (the state adds one logit bias per state) or mlp (the state's effect depends on the token)"""


@dataclass
class StatePromptConfig:
    """The state prompt (ctrls.method.state_prompt): m learned input vectors per state, inserted at each
    step boundary, in place of the last-hidden adapter for the exploration grid's fixed-s0 and epsilon rows."""

    use: bool = False
    """fit the vectors after pretraining (stage ``state_prompt``) and decode the fixed-s0 and epsilon rows with
    them instead of the adapter, and RL's rollouts too (Base rows and the read-back are unchanged)"""
    vectors: int = key(2, between(1, 64))
    """m, vectors per state"""
    lr: float = key(0.01, in_range(0, MAX_LR, open_lo=True))
    """Adam's learning rate on the vectors"""
    epochs: int = key(8, at_least(1))
    """at most this many epochs over the pretraining chains"""
    patience: int = key(2, at_least(1))
    """stop after this many epochs without a better held-out log P per token; the best epoch is kept"""
    batch: int = key(2, at_least(1))
    """chains per Adam step (2: the studies' fits on data seeds 1-5)"""
    with_adapter: bool = False
    """apply the pretrained last-hidden adapter (Eq. 8, frozen) as well: the vectors are fitted through it and
    the rows decoded with both; false: the vectors alone"""


@dataclass
class SamplingConfig:
    """Decoding limits shared by every stage. Token temperatures are per stage:
    ``pretrain.temperature``, ``grid.temperatures`` and ``rl.temperature``."""

    top_k: int = key(50, at_least(0))
    """sample each token from the k most likely; 0: no top-k filter"""
    max_new_tokens: int = key(256, at_least(1))
    """the most tokens a chain of thought may take: decoding stops there (also at EOS, the answer line or T steps)"""
    batch_size: int = key(64, at_least(1))
    """sequences (prompts x samples) decoded together"""
    decode: Literal["engine", "static"] = "engine"
    """engine: dense batch, finished rows dropped (fastest eager on CPU, bench/sampling.py); static: fixed
    shapes, one graph per step (ctrls.generate.static_decode); the same samples either way"""
    compile: Literal["none", "default", "reduce-overhead"] = "none"
    """torch.compile mode of the static decoder's step (decode: static only); reduce-overhead: CUDA graphs"""


@dataclass
class PretrainConfig:
    sources: list[Literal["samples", "reference"]] = key(["samples", "reference"], nonempty=True, unique=True)
    """the training chains: samples, the backbone's own correct CoTs (App. F); reference, the dataset's solutions"""
    samples_per_question: int = key(4, at_least(1))
    """CoTs sampled per training question (kept when correct)"""
    temperature: float = key(0.7, token_temperature())
    """eta, the token temperature of the sampled CoTs (greedy would repeat one CoT)"""
    epochs: int = key(5, at_least(0))
    """at most this many epochs of adapter training (0: the fresh adapter, which leaves the backbone unchanged)"""
    patience: int = key(2, at_least(0))
    """stop after this many epochs without a better held-out bound (0: run every epoch); the best epoch's adapter is kept"""
    lr: float = key(1e-3, in_range(0, MAX_LR, open_lo=True))
    """Adam's learning rate on the adapter's parameters (the backbone stays frozen)"""
    batch_steps: int = key(32, at_least(1))
    """steps per adapter-training batch: one Adam step each (the bound is evaluated in batches of 256)"""
    max_tokens_per_step: int = key(64, at_least(1))
    """longer steps are truncated in training (the relaxed objective); never in the bound"""
    heldout_fraction: float = key(0.1, Rule("in [0, 1)", lambda v: 0 <= v < 1))
    """share of the questions whose CoTs are held out of the fits (d)-(f), to report Thm. 5.3's bound on"""
    bound_samples: int = key(0, Rule("0 (exact over the K states) or >= 2 (Monte Carlo draws per step)",
                                     lambda v: v == 0 or v >= 2))
    """Thm. 5.3's reconstruction term: 0, exact over the K states; n >= 2, n Monte Carlo draws of z_t per step"""
    bound_every: int = key(1, at_least(1))
    """training-split bound every n epochs, at 0, the last and the kept (held-out: every epoch)"""


@dataclass
class GridConfig:
    """What every stage loops over: backbone x dataset pairs, and the exploration grid."""

    backbones: list[str] = key(["smollm2-135m-instruct"], text(), nonempty=True, unique=True)
    """the backbones of the pairs (each: the embedded default, a hub id, or a local path)"""
    datasets: list[str] = key(["gsm8k"], DATASET, nonempty=True, unique=True)
    """the datasets of the pairs (as data.dataset)"""
    temperatures: list[float] = key([0.5, 0.7], token_temperature(greedy=True), nonempty=True, unique=True)
    """eta, the token temperatures of the exploration grid (Table 1; 0: greedy); rl.temperature must be one"""
    epsilons: list[float] = key([0.1, 0.3, 0.5], between(0, 1), unique=True)
    """epsilon of each CTRLS row of the grid (the epsilon-greedy policy); empty: the Base rows only"""
    n_samples: int = key(20, at_least(1))
    """samples per question and row (pass@n)"""
    transfer_datasets: list[str] = key([], DATASET, unique=True)
    """Base vs CTRLS(first epsilon) of the pair's model on a few questions of these datasets"""
    transfer_questions: int = key(8, between(1, 1000))
    """test questions per transfer dataset (at rl.temperature)"""
    fixed_state: bool = True
    """add the "fixed s0" row: the trained adapter with the prompt's s_0 at every step, no transitions (ablation)"""
    position_floor: float = key(0.0, between(0, 1))
    """> 0: a state can occur at a step index only where >= this share of the pretraining chains' steps are in it
    (ctrls.method.positions); 0: no mask"""
    position_buckets: int = key(3, between(1, 64))
    """B, the mask's step positions: 0, 1, ..., B-2 and >= B-1"""
    hold_state: bool = False
    """add the "hold s0" row: the trained conditioning with the prompt's s_0 at every step, no transitions and,
    unlike "fixed s0" under a position mask, no substitution where the mask forbids s_0"""
    constant_states: bool = False
    """add one row per state j = 1..K ("state j"): every step of every question under state j (no transitions,
    no mask): what each state does to accuracy, and the constant-state policies the RL policy class contains"""


@dataclass
class RLConfig:
    steps: int = key(100, at_least(0))
    """policy updates (Adam steps) per RL run"""
    questions_per_step: int = key(1, at_least(1))
    """Q, training questions per step, drawn with replacement"""
    group_size: int = key(8, at_least(1))
    """G trajectories per question (>= 2 with baseline group_mean)"""
    lr: float = key(1e-2, in_range(0, MAX_LR, open_lo=True))
    """Adam's learning rate on the policy's parameters, L and log c (the backbone and adapter stay frozen)"""
    grad_clip: float = key(1.0, above(0))
    """the largest global L2 norm of the policy's gradient: larger ones are scaled down to it before each step"""
    baseline: Literal["none", "group_mean"] = "none"
    """group_mean: subtract the leave-one-out mean of the group's other returns from each return; none: no baseline"""
    entropy_grad: Literal["full", "eq16"] = "full"
    """full: exact gradient of J; eq16: score-function term only"""
    epsilon: float = key(0.1, between(0, 1))
    """epsilon of the named settings epsilon and both: the weight of the uniform Dir(1) in the policy's mixture"""
    entropy_coef: float = key(0.01, between(0, MAX_ALPHA))
    """alpha, the entropy weight of the named settings entropy and both: J adds alpha sum_t H(pi(s_t))"""
    temperature: float = key(0.7, token_temperature())
    """eta; one of grid.temperatures (Base rows of Table 2 and the judge)"""
    eval_every: int = key(20, at_least(1))
    """evaluate the held-out curves at step 0, every this many steps and at the last"""
    eval_questions: int = key(20, at_least(1))
    """held-out test questions of the curves (the first of the RL test pool); the paper: 500"""
    eval_samples: int = key(4, at_least(1))
    """samples per evaluation question, under the run's own epsilon (accuracy and pass@k with k = eval_samples)"""
    checkpoint_every: int = key(10, at_least(1))
    """write a run's checkpoint and curve every this many steps and at the last (a rerun resumes from it)"""
    seeds: list[int] = key([0, 1], at_least(0), nonempty=True, unique=True)
    """the seeds of each curve setting's runs; the first seed's runs also give the Table 2 and Table 3 rows"""
    settings: list[str] = key(["none", "epsilon", "entropy", "both"], RL_SETTING, unique=True)
    """the settings of the curves, each trained once per seed (may be empty)"""
    table2: list[str] = key(["H=0", "H=0.01", "eps=0.1", "eps=0.3"], RL_SETTING, unique=True)
    """Table 2 rows"""
    n_test: int | None = key(None, at_least(1))
    """Table 2's test questions per dataset (None: data.n_test, Base from exploration); the paper: 500"""
    lockstep: bool = True
    """train all RL runs of a pair in one shared decode batch (equal to sequential runs)"""
    tensorboard: bool = False
    """also log curves live to TensorBoard under the RL stage dir (parquet stays the source)"""


@dataclass
class JudgeConfig:
    backend: Literal["auto", "openai", "local"] = "auto"
    """auto: openai when OPENAI_API_KEY or judge.base_url is set, else local; openai: an OpenAI-compatible server;
    local: judge.local_model, offline"""
    model: str = key("gpt-4", text())
    """model name for the openai backend"""
    base_url: str | None = key(None, Rule("an http(s) URL", lambda v: re.match(r"https?://\S+$", v) is not None))
    """any OpenAI-compatible server; None: api.openai.com"""
    local_model: str = key("smollm2-135m-instruct", text())
    """the local backend's chat model: the embedded default, a hub id, or a local path"""
    local_max_new_tokens: int = key(120, at_least(1))
    """reply length of the local backend"""
    samples_per_config: int = key(100, at_least(1))
    """outputs scored per Table 3 row (Base and each RL setting), a seeded subsample"""
    pair: list[str] | None = key(None, text())
    """[backbone, dataset] whose outputs Table 3 scores; None: the profile's only pair"""
    settings: list[str] = key(["eps=0.0,H=0.0", "eps=0.1,H=0.0", "eps=0.1,H=0.01", "eps=0.3,H=0.0", "eps=0.3,H=0.01"],
                              RL_SETTING, unique=True)
    """Table 3's RL rows (besides Base)"""
    temperature: float = key(0.1, between(0, 2))
    """the judge's sampling temperature; 0: greedy (the OpenAI API allows 0..2)"""
    max_retries: int = key(4, at_least(0))
    """retries of a failed openai request (HTTP 408/429/5xx, a timeout), with exponential backoff"""
    timeout_s: float = key(60.0, in_range(0, 3600, open_lo=True))
    """wall-clock seconds per openai request"""


@dataclass
class SyntheticConfig:
    """The controlled latent-chain study (ctrls.synthetic.chain): the MDP, its prior, and the RL budget."""

    n_states: int = key(8, at_least(3))
    """K latent states (>= 2 * horizon + 1, checked by ctrls.synthetic.chain)"""
    horizon: int = key(3, at_least(1))
    """T steps: the correct chain and the easy path have T states each"""
    easy_reward: float = key(0.5, Rule("in [0, 1)", lambda v: 0 <= v < 1))
    """the easy answer's reward; the correct one earns 1"""
    p_rare: float = key(0.15, between(0, 1))
    """prior: P(start -> first state of the correct chain)"""
    p_follow: float = key(0.95, between(0, 1))
    """prior: P(stay on the correct chain) at each later step"""
    noise: float = key(0.02, Rule("in (0, 1]", lambda v: 0 < v <= 1))
    """uniform mass mixed into every prior row"""
    concentration: float = key(5.0, in_range(0, MAX_CONCENTRATION, open_lo=True))
    """the initial Dirichlet concentration c"""
    steps: int = key(200, at_least(1))
    """RL steps per run"""
    group_size: int = key(16, at_least(2))
    """chains per step"""
    lr: float = key(0.05, in_range(0, MAX_LR, open_lo=True))
    """Adam's learning rate on L and log c in the study's runs (its rl.lr)"""
    seeds: list[int] = key([0, 1, 2], at_least(0), nonempty=True, unique=True)
    """the seeds of every setting's runs and of the L-recovery experiment"""
    epsilons: list[float] = key([0.0, 0.1, 0.3], between(0, 1), nonempty=True, unique=True)
    """epsilon of the sweep grid (epsilons x alphas), besides the four settings"""
    alphas: list[float] = key([0.0, 0.01, 0.1], between(0, MAX_ALPHA), nonempty=True, unique=True)
    """alpha, the entropy weight of the sweep grid (epsilons x alphas)"""
    eval_every: int = key(20, at_least(1))
    """evaluate each run at step 0, every this many steps and at the last"""
    eval_samples: int = key(512, at_least(1))
    """chains per evaluation (Monte Carlo), drawn by the Dirichlet policy itself (epsilon = 0)"""
    recovery_chains: list[int] = key([10, 30, 100, 300, 1000, 3000], at_least(1), nonempty=True, unique=True)
    """chain counts n of the L-recovery experiment: L fitted on n chains sampled from the prior, error against n"""


@dataclass
class Config:
    """The whole configuration: one section per part of the method, read from a profile (``load_config``)."""

    profile: str = key("demo", path_part())
    """the profile's name: runs/<profile>/ (one directory name)"""
    run_dir: str = key("runs", text())
    """where the stages write: runs/<profile>/<stage>/..."""
    seed: int = key(0, at_least(0))
    """the seed of the stages' draws: sampling, the held-out split, k-means, the judge's subsample (RL runs: rl.seeds)"""
    data: DataConfig = field(default_factory=DataConfig)
    """the questions: which dataset, how many of each split, how the subsets are drawn (ctrls.data.problems)"""
    backbone: BackboneConfig = field(default_factory=BackboneConfig)
    """the frozen language model mu: which one, where it runs, in which dtype (ctrls.method.backbone)"""
    prompt: PromptConfig = field(default_factory=PromptConfig)
    """the prompt x_0 and the steps, each one non-blank line of the chain of thought (ctrls.data.prompts)"""
    spectral: SpectralConfig = field(default_factory=SpectralConfig)
    """the spectral embedding e_t of a step's hidden states (Eq. 5, ctrls.method.spectral)"""
    states: StatesConfig = field(default_factory=StatesConfig)
    """the K latent states: k-means centroids and the soft assignment Q_phi (ctrls.method.states)"""
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    """the transition logits L and the Dirichlet policy Dir(c p), and how they are fitted (ctrls.method.policy)"""
    adapter: AdapterConfig = field(default_factory=AdapterConfig)
    """the state-aware U-Net adapter that injects z_t into the backbone (Eq. 8, ctrls.method.adapter)"""
    state_prompt: StatePromptConfig = field(default_factory=StatePromptConfig)
    """the state prompt, our alternative to the adapter (ctrls.method.state_prompt)"""
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    """the decoding limits every stage shares (ctrls.generate)"""
    pretrain: PretrainConfig = field(default_factory=PretrainConfig)
    """pretraining (Alg. 1, ctrls.stages.pretrain): the CoTs collected, the adapter trained on the relaxed objective"""
    grid: GridConfig = field(default_factory=GridConfig)
    """the backbone x dataset pairs and the exploration grid (Table 1, ctrls.stages.exploration)"""
    rl: RLConfig = field(default_factory=RLConfig)
    """on-policy RL of L and c (Alg. 2, Eq. 16; ctrls.stages.rl): the runs, their optimiser, their evaluation"""
    judge: JudgeConfig = field(default_factory=JudgeConfig)
    """the LLM judge of Table 3 (ctrls.generate.judge): its backend and the outputs it scores"""
    synthetic: SyntheticConfig = field(default_factory=SyntheticConfig)
    """the controlled latent-chain study: the MDP, its prior and the RL budget (ctrls.synthetic.chain)"""

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

    def validate(self) -> "Config":
        """Check every key's type and allowed values, then :data:`CROSS_CHECKS`; raise ConfigError."""
        validate(self)
        return self

    def fingerprint(self, *keys: str) -> str:
        """A short hash of the named sections or dotted fields (all if none), for stage caching."""
        d = self.to_dict()
        d["rl"]["tensorboard"] = False  # logging changes no result: turning it on keeps the RL stage's key
        if not keys or {"backbone", "backbone.dtype"} & set(keys):
            d["backbone"]["dtype"] = self._dtype_for_key()
        if keys:
            picked = {}
            for k in keys:
                v: Any = d
                for part in k.split("."):
                    if not isinstance(v, dict) or part not in v:
                        raise ConfigError(f"fingerprint: unknown config key {k!r}")
                    v = v[part]
                picked[k] = v
            d = picked
        return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:16]

    def _dtype_for_key(self) -> str:
        """backbone.dtype as stage keys hash it: ``device`` as ``auto`` (that rule's name before auto
        measured: the keys of earlier runs stay), ``auto`` with the dtype it resolves to here."""
        if self.backbone.dtype == "device":
            return "auto"
        return f"auto:{self.dtype_choice().dtype}" if self.backbone.dtype == "auto" else self.backbone.dtype

    def dtype_choice(self):
        """``ctrls.method.backbone.DtypeChoice``: how backbone.dtype resolves on this machine (auto: the GEMM probe)."""
        from ctrls.method.backbone import (  # lazy: keeps torch out of the config import
            pick_device,
            resolve_dtype,
        )

        return resolve_dtype(self.backbone.dtype, pick_device(self.backbone.device))


_builtin_sizes = builtin_sizes  # its old name (tests/config/test_schema.py)

def override(cfg: Config, overrides: str | typing.Iterable[str] | dict[str, Any] | None) -> Config:
    """A deep copy of ``cfg`` with dotted-key overrides applied (validated)."""
    new = _from_dict(cfg.to_dict())
    apply_mapping(new, parse_overrides(overrides))
    return validate(new)


def _from_dict(d: dict[str, Any]) -> Config:
    cfg = Config()
    apply_mapping(cfg, {k: v for k, v in d.items()})
    return cfg


def available_profiles() -> list[str]:
    return sorted(p.name[:-5] for p in resources.files("ctrls.config.profiles").iterdir() if p.name.endswith(".yaml"))


def load_config(profile: str = "demo", overrides: str | typing.Iterable[str] | dict[str, Any] | None = None) -> Config:
    """Read a named profile (or a path to a YAML file), apply ``key=value`` overrides, and check
    the result (:func:`validate`) before anything runs."""
    path = Path(profile)
    if path.suffix in (".yaml", ".yml") and path.exists():
        text, name = path.read_text(), path.stem
    else:
        f = resources.files("ctrls.config.profiles") / f"{profile}.yaml"
        if not f.is_file():
            raise ConfigError(f"unknown profile {profile!r}; available: {', '.join(available_profiles())}")
        text, name = f.read_text(), profile
    try:
        raw = load_yaml(text, f"profile {profile!r}") or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"profile {profile!r} is not valid YAML: {short(' '.join(str(e).split()), 300)}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"profile {profile!r} must be a mapping")
    check_unique_keys(raw, f"profile {profile!r}")  # "data.n_test" beside data: {n_test}: one key twice
    cfg = Config(profile=name)
    apply_mapping(cfg, raw)
    given = parse_overrides(overrides)
    apply_mapping(cfg, given)
    _follow_grid(cfg, given)
    return validate(cfg)


# one key names the pairs: grid.backbones (grid.datasets) given without backbone.name (data.dataset) sets it too
_FOLLOWS = (("grid", "backbones", "backbone", "name"), ("grid", "datasets", "data", "dataset"))


def _given(mapping: dict[str, Any], section: str, field_name: str) -> bool:
    """Whether ``section.field_name`` is set in ``mapping``, dotted or nested."""
    inner = mapping.get(section)
    return f"{section}.{field_name}" in mapping or (isinstance(inner, dict) and field_name in inner)


def _follow_grid(cfg: Config, given: dict[str, Any]) -> None:
    """``backbone.name`` (``data.dataset``) is the first of ``grid.backbones`` (``grid.datasets``) when the overrides
    set the grid's list and not the single key, and the single key is not in the list: ``pretrain(cfg)`` and the
    other single-pair calls then run on the model and data the overrides name."""
    for sec, many, one_sec, one in _FOLLOWS:
        names = getattr(getattr(cfg, sec), many)
        single = getattr(cfg, one_sec)
        if _given(given, sec, many) and not _given(given, one_sec, one) and names and getattr(single, one) not in names:
            setattr(single, one, names[0])


def save_config(cfg: Config, path: str | Path) -> None:
    """The config as YAML; with ``backbone.dtype: auto``, a closing comment records what it resolved to."""
    note = f"# backbone.{cfg.dtype_choice().describe()}\n" if cfg.backbone.dtype == "auto" else ""
    Path(path).write_text(dump_yaml(cfg.to_dict()) + note)
