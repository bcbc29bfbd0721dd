"""Alg. 2: on-policy REINFORCE of the transition policy (Eq. 14), adapter and backbone frozen.

For each question x_0, G trajectories are sampled with the epsilon-greedy policy pi~_theta at
temperature eta; each trajectory tau = (s_0, a_1, ..., a_T) earns R = 1{y = y*}. The objective is

    J(theta) = E_tau[ R(tau) + alpha * sum_t H(pi_theta(s_t)) ]                       (Eq. 13 and Eq. 14)

and the REINFORCE estimator (Eq. 14) weights sum_t grad log pi~_theta(a_t | s_t) by the return
R + alpha * sum_t H. H depends on theta directly too; ``rl.entropy_grad = "full"`` (default) adds
that pathwise term alpha * sum_t grad H, which makes the estimate the exact gradient of J;
``"eq14"`` uses Eq. 14's score-function term alone. The paper's plain estimator (no baseline) is
the default; ``rl.baseline = group_mean`` subtracts the mean return of the question's group.

Only L and c (the policy) receive gradients. Training is checkpointed every N steps with the log
so far; a resumed run continues from the last checkpoint with the same per-step seeds, so its
curve has no duplicated or missing steps.
"""
from __future__ import annotations

import logging
import math
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from ctrls.config import Config
from ctrls.policy import TransitionPolicy
from ctrls.runs import parquet_rows, read_parquet, safe_name, valid_part

log = logging.getLogger(__name__)


def _num(x: float) -> str:
    """0.0 -> "0.0", 0.1 -> "0.1", 0.01 -> "0.01": the paper's way of writing epsilon and H."""
    one = f"{x:.1f}"
    return one if float(one) == x else f"{x:g}"


def setting_label(epsilon: float, alpha: float) -> str:
    """The label of an RL policy in Tables 2 and 3, ours and the paper's alike: "ε=0.1, H=0.0"
    (H is the entropy weight alpha). The paper's Table 2 writes its rows "H=0.0" (epsilon 0) and
    "ε=0.1" (alpha 0); ``PAPER_TABLE2`` stores them by (epsilon, alpha) and labels them here."""
    return f"ε={_num(epsilon)}, H={_num(alpha)}"


@dataclass(frozen=True)
class Setting:
    """One RL configuration: epsilon-greedy weight and entropy coefficient alpha."""

    name: str
    epsilon: float
    alpha: float

    @property
    def label(self) -> str:
        return setting_label(self.epsilon, self.alpha)


def parse_setting(name: str, cfg: Config) -> Setting:
    """``none`` / ``epsilon`` / ``entropy`` / ``both`` (the paper's curves, using rl.epsilon and
    rl.entropy_coef), or explicit ``eps=0.3`` / ``H=0.01`` / ``eps=0.1,H=0.01``."""
    named = {"none": (0.0, 0.0), "epsilon": (cfg.rl.epsilon, 0.0), "entropy": (0.0, cfg.rl.entropy_coef),
             "both": (cfg.rl.epsilon, cfg.rl.entropy_coef)}
    if name in named:
        return Setting(name, *named[name])
    eps = alpha = 0.0
    for part in name.split(","):
        key, _, val = part.partition("=")
        try:
            if key.strip() in ("eps", "epsilon"):
                eps = float(val)
            elif key.strip() in ("H", "alpha"):
                alpha = float(val)
            else:
                raise ValueError
        except ValueError:
            raise ValueError(f"unknown RL setting {name!r}: use none, epsilon, entropy, both, 'eps=X', 'H=X' "
                             f"or 'eps=X,H=Y'") from None
    return Setting(name, eps, alpha)


@dataclass
class Trajectory:
    """What REINFORCE needs of one sampled chain: its states and its reward."""

    states: torch.Tensor  # (T+1, K): s_0, a_1, ..., a_T
    reward: float
    group: int  # index of its question in the step's batch
    log_actions: torch.Tensor | None = None  # (T, K): log a_1, ..., log a_T, exact (policy.sample_log)

    def __post_init__(self):
        if self.log_actions is not None and self.log_actions.shape != self.states[1:].shape:
            raise ValueError(f"log_actions {tuple(self.log_actions.shape)} do not match the actions "
                             f"{tuple(self.states[1:].shape)} of states")

    def logs(self) -> torch.Tensor:
        """log a_1..a_T: the exact log-actions when kept, else log of the stored actions (then
        every a_j must be > 0; an action that underflowed to 0 is an error, never clamped)."""
        if self.log_actions is not None:
            return self.log_actions
        a = self.states[1:]
        if bool((a <= 0).any()):
            raise ValueError("a trajectory's action has an entry <= 0 and no log_actions were kept: "
                             "sample with policy.sample_log and pass log_actions (a clamp would bias Eq. 14)")
        return a.log()


# A sampler draws trajectories: for each question index, the given sample indices of its group,
# seeded by the question's seed (see ``ctrls.sampling``): sampler(questions, sample_ids, epsilon, seeds).
Sampler = Callable[[Sequence[int], Sequence[Sequence[int]], float, Sequence[int]], list[Trajectory]]


def _identity(t: torch.Tensor) -> torch.Tensor:
    return t


def reinforce_loss(policy: TransitionPolicy, trajs: Sequence[Trajectory], epsilon: float, alpha: float,
                   baseline: str = "none", entropy_grad: str = "full", entropy_kind: str = "categorical",
                   all_sum: Callable[[torch.Tensor], torch.Tensor] = _identity, n_groups: int | None = None
                   ) -> tuple[torch.Tensor, dict]:
    """The negated Eq. 14 surrogate, averaged over trajectories, and diagnostics (batched over
    trajectories of different lengths with a mask).

    Data parallel: each rank passes its own trajectories and ``all_sum`` (a sum over ranks, see
    ``ctrls.distributed``); the loss is then this rank's share of the global mean, so summing the
    ranks' gradients gives the single-process gradient. Every rank makes the same ``all_sum``
    calls in the same order, whatever its trajectories."""
    if baseline not in ("none", "group_mean"):
        raise ValueError(f"unknown baseline {baseline!r}: none or group_mean")
    if entropy_grad not in ("full", "eq14"):
        raise ValueError(f"unknown entropy_grad {entropy_grad!r}: full or eq14")
    dev = policy.L.device
    used = [tr for tr in trajs if len(tr.states) > 1]
    K = policy.n_states
    T = max([len(tr.states) for tr in used], default=1) - 1
    S = torch.full((len(used), T + 1, K), 1.0 / K)
    LA = torch.full((len(used), T, K), -math.log(K))  # log-actions; padding is masked out
    mask = torch.zeros(len(used), T)
    for i, tr in enumerate(used):
        S[i, : len(tr.states)] = tr.states
        LA[i, : len(tr.states) - 1] = tr.logs()
        mask[i, : len(tr.states) - 1] = 1
    S, LA, mask = S.to(dev), LA.to(dev), mask.to(dev)
    prev, log_act = S[:, :-1].reshape(-1, K), LA.reshape(-1, K)
    logp = (policy.log_prob_log(log_act, prev, epsilon).view(len(used), T) * mask).sum(1)  # Eq. 14: sum_t log pi~(a_t | s_t)
    H = (policy.entropy(prev, kind=entropy_kind).view(len(used), T) * mask).sum(1)  # sum_t H(pi(s_t))
    ret = torch.tensor([tr.reward for tr in used], device=dev, dtype=logp.dtype) + alpha * H.detach()
    n_used = float(all_sum(torch.tensor(float(len(used)), device=dev)))
    if n_used == 0:
        raise ValueError("no trajectory has a state transition: nothing to learn from")
    adv = ret
    if baseline == "group_mean":
        g = torch.tensor([tr.group for tr in used], device=dev, dtype=torch.long)
        size = n_groups if n_groups is not None else int(g.max()) + 1 if len(g) else 0  # pass n_groups when sharded
        means = all_sum(torch.zeros(size, device=dev, dtype=ret.dtype).index_add(0, g, ret))
        counts = all_sum(torch.zeros(size, device=dev, dtype=ret.dtype).index_add(0, g, torch.ones_like(ret)))
        adv = ret - (means / counts.clamp(min=1))[g]
    surrogate = (adv * logp).sum() / n_used
    if entropy_grad == "full":
        surrogate = surrogate + alpha * H.sum() / n_used
    sums = all_sum(torch.tensor([sum(t.reward for t in trajs), float(len(trajs)), float(ret.sum()),
                                 float((H.detach() / mask.sum(1).clamp(min=1)).sum())], device=dev, dtype=torch.float64))
    info = {"reward": float(sums[0] / sums[1]), "return": float(sums[2]) / n_used, "policy_entropy": float(sums[3]) / n_used}
    return -surrogate, info


def _seed(*parts) -> int:
    return zlib.crc32(repr(parts).encode())


class Trainer:
    """REINFORCE with Adam and gradient clipping, checkpointed to ``out`` every N steps.

    Data parallel (``ctrls.distributed``): each rank samples its block of the step's Q x G
    trajectory slots, gradients are summed over ranks, and every rank takes the same Adam step;
    rank 0 writes the checkpoints."""

    def __init__(self, policy: TransitionPolicy, cfg: Config, setting: Setting, seed: int, out: Path,
                 sampler: Sampler | None, n_train: int, evaluate: Callable[[TransitionPolicy, int], dict] | None = None,
                 tensorboard: Path | None = None):
        from ctrls.distributed import world

        self.policy, self.cfg, self.setting, self.seed, self.out = policy, cfg, setting, seed, Path(out)
        self.sampler, self.n_train, self.evaluate = sampler, n_train, evaluate
        self.world = world()
        self.opt = torch.optim.Adam(policy.parameters(), lr=cfg.rl.lr)
        self.step = 0
        self.log: list[dict] = []
        if self.world.is_main:
            self.out.mkdir(parents=True, exist_ok=True)
        self._resume()
        self.tb = _tensorboard(tensorboard, self.step) if tensorboard is not None and self.world.is_main else None

    @property
    def ckpt(self) -> Path:
        return self.out / "checkpoint.pt"

    @property
    def curve_file(self) -> Path:
        return self.out / "curve.parquet"

    def _resume(self) -> None:
        """Continue from the checkpoint. One that cannot be read (truncated, corrupt, or not a
        checkpoint of this trainer) is logged by name and the run starts again from step 0."""
        if not self.ckpt.exists():
            return
        fresh = {k: v.detach().clone() for k, v in self.policy.state_dict().items()}
        try:
            state = torch.load(self.ckpt, weights_only=False, map_location=self.policy.L.device)
            step, history = int(state["step"]), list(state["log"])
            self.policy.load_state_dict(state["policy"])
            self.opt.load_state_dict(state["opt"])
        except Exception as e:
            log.warning("RL checkpoint %s is unusable (%s: %s): training this run again from step 0",
                        self.ckpt, type(e).__name__, e)
            self.policy.load_state_dict(fresh)
            self.opt = torch.optim.Adam(self.policy.parameters(), lr=self.cfg.rl.lr)
            return
        self.step, self.log = step, history
        log.info("resumed %s at step %d", self.out, self.step)
        # the curve is written after the checkpoint: a kill in between leaves it behind (or cut)
        if self.world.is_main and (not self.curve_file.exists() or parquet_rows(self.curve_file) != len(self.log)):
            log.warning("%s does not match checkpoint %s: rewriting it from the checkpoint's log", self.curve_file,
                        self.ckpt)
            self._write_curve()

    def _write_curve(self) -> None:
        tmp = self.curve_file.with_name(self.curve_file.name + ".tmp")
        pd.DataFrame(self.log).assign(setting=self.setting.name, epsilon=self.setting.epsilon, alpha=self.setting.alpha,
                                      seed=self.seed).to_parquet(tmp)
        tmp.replace(self.curve_file)

    def save(self) -> None:
        """Write the checkpoint, then the curve (each atomically, by rename)."""
        if not self.world.is_main:
            return
        tmp = self.ckpt.with_suffix(".tmp")
        torch.save({"policy": self.policy.state_dict(), "opt": self.opt.state_dict(), "step": self.step,
                    "log": self.log, "setting": self.setting.__dict__, "seed": self.seed}, tmp)
        tmp.replace(self.ckpt)
        self._write_curve()

    def step_plan(self, step: int) -> tuple[list[int], list[int]]:
        """The questions of ``step`` (drawn with replacement) and one sampling seed per question slot."""
        g = torch.Generator().manual_seed(_seed(self.seed, self.setting.name, step))
        qs = torch.randint(self.n_train, (self.cfg.rl.questions_per_step,), generator=g).tolist()
        return qs, [_seed(self.seed, self.setting.name, step, j) for j in range(len(qs))]

    def plan(self) -> "Plan":
        """This rank's block of the current step's (question slot, sample index) pairs: what to sample."""
        qs, seeds = self.step_plan(self.step)
        mine: dict[int, list[int]] = {}
        for j, m in self.world.shard([(j, m) for j in range(len(qs)) for m in range(self.cfg.rl.group_size)]):
            mine.setdefault(j, []).append(m)
        slots = sorted(mine)
        return Plan(slots, [qs[j] for j in slots], [mine[j] for j in slots], [seeds[j] for j in slots], len(qs))

    def train_step(self) -> dict:
        plan = self.plan()
        trajs = self.sampler(plan.questions, plan.sample_ids, self.setting.epsilon, plan.seeds) if plan.slots else []
        return self.update(plan, trajs)

    def update(self, plan: "Plan", trajs: list[Trajectory]) -> dict:
        """One Adam step of Eq. 14 on the trajectories sampled for ``plan``."""
        rl = self.cfg.rl
        slots, qs = plan.slots, range(plan.n_questions)
        for tr in trajs:  # the sampler numbers groups by position in its call; make them step-global
            tr.group = slots[tr.group]
        loss, info = reinforce_loss(self.policy, trajs, self.setting.epsilon, self.setting.alpha, rl.baseline,
                                    rl.entropy_grad, self.cfg.policy.entropy, all_sum=self.world.all_sum,
                                    n_groups=len(qs))
        self.opt.zero_grad()
        loss.backward()
        self.world.sum_gradients(self.policy.parameters())
        gnorm = float(torch.nn.utils.clip_grad_norm_(self.policy.parameters(), rl.grad_clip))
        self.opt.step()
        self.step += 1
        return {"step": self.step, "loss": float(self.world.all_sum(loss.detach())), "grad_norm": gnorm,
                "concentration": float(self.policy.log_c.detach().exp()), **info}

    def record(self, row: dict) -> None:
        """Append a row to the curve (and to TensorBoard when on)."""
        self.log.append(row)
        if self.tb is not None:
            kind = row.get("kind")
            keys = (("reward", "policy_entropy", "concentration", "loss") if kind == "train" else
                    ("accuracy", "pass@k", "succ", "policy_entropy", "state_usage_entropy"))
            for k in keys:
                if k in row and row[k] is not None and not (isinstance(row[k], float) and math.isnan(row[k])):
                    self.tb.add_scalar(f"{kind}/{k}", float(row[k]), int(row["step"]))
            self.tb.flush()

    def wants_eval(self, steps: int) -> bool:
        return self.evaluate is not None and (self.step % self.cfg.rl.eval_every == 0 or self.step == steps)

    def wants_save(self, steps: int) -> bool:
        return self.step % self.cfg.rl.checkpoint_every == 0 or self.step == steps

    def run(self, steps: int, progress: bool = True) -> pd.DataFrame:
        if self.step == 0 and self.evaluate is not None and not self.log:
            self.record({"step": 0, "kind": "eval", **self.evaluate(self.policy, 0)})
        bar = tqdm(total=steps, initial=self.step, desc=f"RL {self.setting.name} seed {self.seed}", unit="step",
                   disable=not (progress and self.world.is_main))
        while self.step < steps:
            row = self.train_step()
            self.record({"kind": "train", **row})
            if self.wants_eval(steps):
                self.record({"step": self.step, "kind": "eval", **self.evaluate(self.policy, self.step)})
            if self.wants_save(steps):
                self.save()
            bar.update(1)
            bar.set_postfix(reward=f"{row['reward']:.2f}", H=f"{row['policy_entropy']:.2f}")
        bar.close()
        self.world.barrier()  # the last checkpoint is on disk before any rank moves on
        return pd.DataFrame(self.log)


@dataclass
class Plan:
    """What one run samples at one step (this rank's share): question slots, their train-set
    indices, sample indices and seeds, out of ``n_questions`` slots of the step."""

    slots: list[int]
    questions: list[int]
    sample_ids: list[list[int]]
    seeds: list[int]
    n_questions: int


# Lockstep: sample_many([(trainer, plan), ...]) -> one trajectory list per pair, in order, all drawn
# in one shared batch; evaluate_many([(trainer, step), ...]) -> one metrics dict per pair.
SampleMany = Callable[[list[tuple[Trainer, Plan]]], list[list[Trajectory]]]
EvaluateMany = Callable[[list[tuple[Trainer, int]]], list[dict]]


def run_lockstep(trainers: Sequence[Trainer], steps: int, sample_many: SampleMany | None = None,
                 evaluate_many: EvaluateMany | None = None, progress: bool = True) -> list[pd.DataFrame]:
    """Train every trainer to ``steps`` at once: at each step every unfinished run plans its own
    step (``Trainer.step_plan``: the same questions and seeds as alone), the trajectories of all
    runs are sampled together by ``sample_many``, and each run takes its own Adam step; the runs due
    for evaluation are evaluated together by ``evaluate_many``. Each run logs, evaluates and saves
    exactly as ``Trainer.run`` would, so the curves and checkpoints equal the sequential runs'.
    Runs resumed at different steps (a kill between two checkpoints) simply finish at different
    rounds. Defaults: each trainer's own ``sampler`` / ``evaluate`` (no shared batch)."""
    if sample_many is None:
        def sample_many(pairs):
            return [t.sampler(p.questions, p.sample_ids, t.setting.epsilon, p.seeds) if p.slots else [] for t, p in pairs]
    if evaluate_many is None:
        def evaluate_many(pairs):
            return [t.evaluate(t.policy, step) for t, step in pairs]
    world = trainers[0].world if trainers else None
    first = [t for t in trainers if t.step == 0 and t.evaluate is not None and not t.log]
    for t, metrics in zip(first, evaluate_many([(t, 0) for t in first]) if first else []):
        t.record({"step": 0, "kind": "eval", **metrics})
    bar = tqdm(total=steps * len(trainers), initial=sum(min(t.step, steps) for t in trainers), unit="run-step",
               desc=f"RL lockstep ({len(trainers)} runs)", disable=not (progress and world is not None and world.is_main))
    while True:
        active = [t for t in trainers if t.step < steps]
        if not active:
            break
        plans = [(t, t.plan()) for t in active]
        trajs = sample_many(plans)
        for (t, p), tr in zip(plans, trajs):
            t.record({"kind": "train", **t.update(p, tr)})
        due = [t for t in active if t.wants_eval(steps)]
        for t, metrics in zip(due, evaluate_many([(t, t.step) for t in due]) if due else []):
            t.record({"step": t.step, "kind": "eval", **metrics})
        for t in active:
            if t.wants_save(steps):
                t.save()
        bar.update(len(active))
    bar.close()
    if world is not None:
        world.barrier()
    return [pd.DataFrame(t.log) for t in trainers]


def _tensorboard(path: Path, step: int):
    """A TensorBoard writer under ``path``; events after ``step`` (a resumed run) are purged."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as e:
        raise ImportError("rl.tensorboard=true needs the tensorboard package (pip install tensorboard); "
                          "or set rl.tensorboard=false") from e
    return SummaryWriter(log_dir=str(path), purge_step=step if step else None)


def state_usage_entropy(hard_states: Sequence[int], K: int) -> float:
    """Entropy (nats) of the empirical distribution of the states visited."""
    if len(hard_states) == 0:
        return math.nan
    p = np.bincount(np.asarray(hard_states), minlength=K) / len(hard_states)
    p = p[p > 0]
    return float(-(p * np.log(p)).sum())


# ---- the RL stage on a real backbone -------------------------------------------------------------

RL_KEYS = ("seed", "data", "prompt", "sampling", "rl", "grid.n_samples")


def _rl_stage(cfg: Config):
    from ctrls.pretrain import pretrain_stages
    from ctrls.runs import Stage

    adapters = tuple(pretrain_stages(cfg.for_pair(b, d))["adapter"] for b, d in cfg.pairs())
    return Stage(cfg, "rl", RL_KEYS, upstream=tuple(a.key for a in adapters), inputs=adapters)


def table_rows(cfg: Config, backbone: str, dataset: str) -> list[Setting]:
    """The RL policies whose test samples a pair needs: the rows of Table 2 (``rl.table2``) and, for
    the judge's pair only (``judge.pair``), the rows of Table 3 (``judge.settings``); one per
    (epsilon, alpha), in that order."""
    from ctrls.judge import judge_pair

    names = list(cfg.rl.table2) + (list(cfg.judge.settings) if (backbone, dataset) == judge_pair(cfg) else [])
    rows: dict[tuple[float, float], Setting] = {}
    for name in names:
        s = parse_setting(name, cfg)
        rows.setdefault((s.epsilon, s.alpha), s)
    return list(rows.values())


def rl_runs(cfg: Config, backbone: str, dataset: str) -> dict[tuple[float, float, int], Setting]:
    """Every RL run a pair needs, each once: the curves (``rl.settings``) with every seed, and each
    table row (``table_rows``) with the first seed; a row equal to a curve setting reuses its run."""
    runs: dict[tuple[float, float, int], Setting] = {}
    for s in (parse_setting(n, cfg) for n in cfg.rl.settings):
        for seed in cfg.rl.seeds:
            runs.setdefault((s.epsilon, s.alpha, seed), s)
    for s in table_rows(cfg, backbone, dataset):
        runs.setdefault((s.epsilon, s.alpha, cfg.rl.seeds[0]), s)
    return runs


def run_rl(cfg: Config, force: bool = False, progress: bool = True) -> Path:
    """Train every RL run of every pair (``rl_runs``), then sample the test questions with each
    table policy (``table_rows``). Returns ``runs/<profile>/rl``.

    Lockstep (``rl.lockstep``, default): all runs of a pair train together, every step's
    trajectories of all runs decoded in one batch, each row with its own policy and epsilon (the
    backbone and adapter are shared and frozen); evaluations and table samples are batched the
    same way. Every sample draws from its own counter-based stream, so the result equals the
    sequential runs (``rl.lockstep=false``).

    Sizes: the curves evaluate on the first ``rl.eval_questions`` and Table 2 samples the first
    ``rl.n_test`` (default ``data.n_test``) test questions of one seeded pool (the paper: 500
    each, while Table 1 uses ``data.n_test`` = 40). With ``rl.n_test`` set, Base is sampled here
    on the same questions; otherwise Table 2's Base is the exploration stage's.

    Data parallel under a launcher (``ctrls.distributed``): trajectory slots, evaluation questions
    and table questions are sharded by rank and gathered; the result equals a single process's."""
    # Alg. 2: sample trajectories with pi~ (ctrls.sampling), reward, Eq. 14 update per run
    import copy

    from ctrls.answers import grade
    from ctrls.backbone import load_backbone
    from ctrls.config import override
    from ctrls.data import problems_from_config
    from ctrls.distributed import world
    from ctrls.exploration import BASE
    from ctrls.pretrain import load_pretrained
    from ctrls.prompts import encode_prompt
    from ctrls.runs import pair_slug
    from ctrls.sampling import SampleParams, sample

    w = world()
    stage = _rl_stage(cfg)
    if stage.is_done() and not force:
        return stage.dir
    if w.is_main:
        stage.begin(force=force)
    w.barrier()
    rl = cfg.rl
    for bname, ds in cfg.pairs():
        pc = cfg.for_pair(bname, ds)
        pair = pair_slug(bname, ds)
        bb = load_backbone(bname, w.device(pc.backbone.device), pc.backbone.dtype, pc.backbone.cache_dir)
        pretrained = load_pretrained(pc, bb)
        train = problems_from_config(pc, "train")
        n_table = rl.n_test if rl.n_test is not None else pc.data.n_test
        test = problems_from_config(override(pc, {"data.n_test": max(n_table, rl.eval_questions)}), "test")
        n_table, n_eval = min(n_table, len(test)), min(rl.eval_questions, len(test))
        encoded: dict[tuple[str, int], tuple[list[int], int]] = {}

        def enc(split: str, i: int) -> tuple[list[int], int]:
            if (split, i) not in encoded:
                p = (train if split == "train" else test)[i]
                encoded[split, i] = encode_prompt(bb.tokenizer, p.question, pc.prompt.use_chat_template, pc.prompt.few_shot)
            return encoded[split, i]

        def params(eps: float) -> SampleParams:
            return SampleParams(temperature=rl.temperature, top_k=pc.sampling.top_k, max_new_tokens=pc.sampling.max_new_tokens,
                                max_steps=pc.prompt.max_steps, batch_size=pc.sampling.batch_size, epsilon=eps)

        def generate(split, reqs, lockstep):
            """reqs: [(model or None for Base, question indices, sample ids, epsilon, seeds)]; returns one
            list of (problem, generations) per request. Lockstep: the CTRLS requests in one call, each
            prompt with its request's policy and epsilon and the shared adapter (``pretrained``)."""
            problems = train if split == "train" else test
            together = [j for j, r in enumerate(reqs) if lockstep and r[0] is not None]
            chunks = ([together] if together else []) + [[j] for j in range(len(reqs)) if j not in together]
            out: list = [None] * len(reqs)
            for chunk in chunks:
                flat = [(j, i, ids, seed) for j in chunk for i, ids, seed in zip(reqs[j][1], reqs[j][2], reqs[j][4])]
                if len(chunk) > 1 or (lockstep and reqs[chunk[0]][0] is not None):
                    gens = sample(bb, [enc(split, i)[0] for _, i, _, _ in flat], params=params(0.0), model=pretrained,
                                  seeds=[s for *_, s in flat], sample_ids=[ids for _, _, ids, _ in flat],
                                  prompt_starts=[enc(split, i)[1] for _, i, _, _ in flat],
                                  policies=[reqs[j][0].policy for j, *_ in flat], epsilons=[reqs[j][3] for j, *_ in flat])
                else:
                    m, _, _, eps, _ = reqs[chunk[0]]
                    gens = sample(bb, [enc(split, i)[0] for _, i, _, _ in flat], params=params(eps), model=m,
                                  seeds=[s for *_, s in flat], sample_ids=[ids for _, _, ids, _ in flat],
                                  prompt_starts=[enc(split, i)[1] for _, i, _, _ in flat])
                for j in chunk:
                    out[j] = []
                for (j, i, _, _), gs in zip(flat, gens):
                    out[j].append((problems[i], gs))
            return out

        def trajectories(res) -> list[Trajectory]:
            return [Trajectory(states=x.states, reward=float(grade(x.text, p.answer).correct), group=gi,
                               log_actions=x.log_actions) for gi, (p, gs) in enumerate(res) for x in gs]

        def eval_request(t: Trainer, step: int):
            idx = w.shard(range(n_eval))
            return (t.model, idx, [range(rl.eval_samples)] * len(idx), t.setting.epsilon,
                    [_seed(t.seed, "eval", step, test[i].id) for i in idx])

        def metrics(policy: TransitionPolicy, res) -> dict:
            correct = [[grade(x.text, p.answer).correct for x in gs] for p, gs in res]
            valid = [[grade(x.text, p.answer).valid for x in gs] for p, gs in res]
            states = [x.states for _, gs in res for x in gs if x.states is not None and len(x.states) > 1]
            with torch.no_grad():
                H = [float(policy.entropy(s[:-1].to(policy.L.device), kind=cfg.policy.entropy).mean()) for s in states]
            hard = [int(k) for s in states for k in s[1:].argmax(-1)]
            correct, valid = np.array(w.gather_list(correct)), np.array(w.gather_list(valid))
            H, hard = w.gather_list(H), w.gather_list(hard)
            return {"accuracy": float(correct.mean()), "pass@k": float(correct.any(1).mean()),
                    "succ": float(valid.mean()), "policy_entropy": float(np.mean(H)) if H else math.nan,
                    "state_usage_entropy": state_usage_entropy(hard, policy.L.shape[0])}

        trainers: dict[tuple[float, float, int], Trainer] = {}
        for key, setting in rl_runs(cfg, bname, ds).items():
            seed = key[2]
            model = copy.deepcopy(pretrained)
            out = stage.dir / pair / f"{safe_name(setting.name)}__seed{seed}"
            tb = stage.dir / "tensorboard" / pair / out.name if rl.tensorboard else None
            t = Trainer(model.policy, pc, setting, seed, out, None, len(train), None, tensorboard=tb)
            t.model = model
            t.sampler = lambda qs, ids, eps, seeds, m=model: trajectories(generate("train", [(m, qs, ids, eps, seeds)], False)[0])
            t.evaluate = lambda policy, step, t=t: metrics(policy, generate("test", [eval_request(t, step)], False)[0])
            trainers[key] = t
        if rl.lockstep:
            run_lockstep(list(trainers.values()), rl.steps, progress=progress,
                         sample_many=lambda plans: [trajectories(r) for r in generate(
                             "train", [(t.model, p.questions, p.sample_ids, t.setting.epsilon, p.seeds) for t, p in plans], True)],
                         evaluate_many=lambda due: [metrics(t.policy, r) for (t, _), r in zip(
                             due, generate("test", [eval_request(t, step) for t, step in due], True))])
        else:
            for t in trainers.values():
                t.run(rl.steps, progress=progress)

        # the table samples: every test question grid.n_samples times with each table policy (Tables 2, 3)
        parts = stage.dir / "table2.parquet"
        idx = w.shard(range(n_table))
        todo = []
        if rl.n_test is not None:  # Base on the same questions (the exploration stage has data.n_test of them)
            todo.append((None, BASE, math.nan, math.nan, cfg.seed))
        for row in table_rows(cfg, bname, ds):
            t = trainers[row.epsilon, row.alpha, rl.seeds[0]]
            todo.append((t.model, row.label, row.epsilon, row.alpha, t.seed))
        def part(label, eps, alpha):  # an ASCII file name per table row
            return parts / f"{pair}__{'Base' if label == BASE else safe_name(f'eps{_num(eps)}_H{_num(alpha)}')}.parquet"

        todo = [x for x in todo if not valid_part(part(*x[1:4]), n_table * pc.grid.n_samples)]  # a truncated part is redone
        reqs = [(m, idx, [range(pc.grid.n_samples)] * len(idx), 0.0 if m is None else eps,
                 [_seed(seed, "table2", label, test[i].id) for i in idx]) for m, label, eps, _, seed in todo]
        for (m, label, eps, alpha, seed), res in zip(todo, generate("test", reqs, rl.lockstep)):
            _write_table_part(pc, part(label, eps, alpha), res,
                              {"config": label, "epsilon": eps, "alpha": alpha, "seed": seed})
    w.barrier()
    if w.is_main:
        stage.finish(pairs=len(cfg.pairs()))
    w.barrier()
    return stage.dir


def _write_table_part(cfg: Config, part: Path, res, meta: dict) -> None:
    """Gather one table policy's samples over ranks; rank 0 writes them."""
    from ctrls.distributed import world
    from ctrls.exploration import generation_rows, write_part

    w = world()
    meta = {"backbone": cfg.backbone.name, "dataset": cfg.data.dataset, "temperature": cfg.rl.temperature, **meta}
    rows = w.gather_list([r for p, gs in res for r in generation_rows(gs, p, meta)])
    if w.is_main:
        part.parent.mkdir(parents=True, exist_ok=True)
        write_part(pd.DataFrame(rows), part)
    w.barrier()


def load_curves(cfg: Config) -> pd.DataFrame:
    """Every run's logged curve, with its pair, setting and seed."""
    root = cfg.stage_dir("rl")
    frames = []
    for f in sorted(root.glob("*/*/curve.parquet")):
        frames.append(read_parquet(f).assign(pair=f.parent.parent.name))
    if not frames:
        raise FileNotFoundError(f"no RL curves under {root}; run the RL stage first")
    return pd.concat(frames, ignore_index=True)


def load_table2_samples(cfg: Config) -> pd.DataFrame:
    files = sorted((cfg.stage_dir("rl") / "table2.parquet").glob("*.parquet"))
    if not files:
        raise FileNotFoundError("no Table 2 samples; run the RL stage first")
    return pd.concat([read_parquet(f) for f in files], ignore_index=True)


# Table 2 of the paper (pass@20, Succ. in %), after RL, by (epsilon, alpha): the paper's rows
# "H=0.0" and "H=0.01" have epsilon 0, its rows "ε=0.1" and "ε=0.3" have alpha 0.
PAPER_TABLE2 = {
    "Llama-3.2-3B-Instruct": {"gsm8k": {"Base": (55.6, 80.0), (0.0, 0.0): (57.6, 80.8), (0.0, 0.01): (56.8, 79.6),
                                        (0.1, 0.0): (57.4, 80.4), (0.3, 0.0): (55.8, 79.4)},
                              "math": {"Base": (41.0, 71.8), (0.0, 0.0): (42.8, 72.2), (0.0, 0.01): (42.6, 74.0),
                                       (0.1, 0.0): (43.0, 73.4), (0.3, 0.0): (42.0, 71.2)}},
    "Qwen2.5-3B-Instruct": {"gsm8k": {"Base": (64.2, 91.8), (0.0, 0.0): (65.8, 89.6), (0.0, 0.01): (66.4, 90.2),
                                      (0.1, 0.0): (66.2, 89.8), (0.3, 0.0): (66.0, 90.2)},
                            "math": {"Base": (22.6, 33.8), (0.0, 0.0): (22.8, 33.4), (0.0, 0.01): (23.6, 34.6),
                                     (0.1, 0.0): (22.2, 32.2), (0.3, 0.0): (23.4, 34.2)}},
}


def paper_table2() -> pd.DataFrame:
    """The paper's Table 2 in long form, its rows labelled by ``setting_label`` like ours."""
    return pd.DataFrame([{"backbone": b, "dataset": d, "config": c if c == "Base" else setting_label(*c),
                          "paper pass@20": v[0], "paper Succ.": v[1]}
                         for b, by_d in PAPER_TABLE2.items() for d, rows in by_d.items() for c, v in rows.items()])


def table2(cfg: Config) -> pd.DataFrame:
    """Table 2 in long form: Base and each RL policy of ``rl.table2`` (labelled by
    ``setting_label``), with pass@n and Succ. and their CIs (see exploration.table1). Base is the
    RL stage's own Base samples when ``rl.n_test`` is set (the same questions), else the
    exploration stage's at eta = rl.temperature. Table 3's extra rows are left out."""
    # Table 2: pass@n and Succ. after RL, Base and each RL policy
    from ctrls.exploration import BASE, load_samples, table1

    rl_samples = load_table2_samples(cfg)
    labels = [BASE] + list(dict.fromkeys(parse_setting(s, cfg).label for s in cfg.rl.table2))
    if cfg.rl.n_test is None:
        try:
            base = load_samples(cfg)
            base = base[(base.config == BASE) & (base.temperature == cfg.rl.temperature)]
        except FileNotFoundError:
            base = rl_samples.iloc[:0]
        rl_samples = pd.concat([base, rl_samples[rl_samples.config != BASE]], ignore_index=True)
    both = rl_samples[rl_samples.config.isin(labels)]
    order = {c: i for i, c in enumerate(labels)}
    t = table1(both, seed=cfg.seed)
    return t.sort_values(["backbone", "dataset"], kind="stable").sort_values(
        "config", key=lambda c: c.map(order), kind="stable").reset_index(drop=True)


def reward_rate(cfg: Config, curves: pd.DataFrame) -> pd.DataFrame:
    """The training reward rate of each pair, from the runs' logs: correct trajectories / sampled
    trajectories over every training step of every run (each step samples
    ``rl.questions_per_step x rl.group_size`` trajectories), with a 95% Wilson interval."""
    per_step = cfg.rl.questions_per_step * cfg.rl.group_size
    rows = []
    for pair, g in curves[curves.kind == "train"].groupby("pair", sort=False):
        n = len(g) * per_step
        k = int(round(float((g.reward * per_step).sum())))
        lo, hi = wilson(k, n)
        rows.append({"pair": pair, "runs": int(g.groupby(["setting", "seed"]).ngroups), "trajectories": n,
                     "correct": k, "reward rate": k / n if n else math.nan, "95% CI": (lo, hi)})
    return pd.DataFrame(rows)


def wilson(k: int, n: int, z: float = 1.959963984540054) -> tuple[float, float]:
    """The 95% Wilson score interval of a proportion k/n (sound at k = 0, unlike the Wald one)."""
    if n == 0:
        return math.nan, math.nan
    p = k / n
    mid, half = (p + z * z / (2 * n)), z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return (mid - half) / (1 + z * z / n), (mid + half) / (1 + z * z / n)


SYNTHETIC_PAGE = "07_synthetic.ipynb"  # the book's page "A controlled study on a synthetic latent chain"


def reward_note(cfg: Config, rates: pd.DataFrame, low: float = 0.05) -> str:
    """What the measured reward rate (``reward_rate``) means for the curves, in words built from the numbers."""
    parts = []
    for _, r in rates.iterrows():
        lo, hi = r["95% CI"]
        parts.append(f"**{r.pair}**: {r.correct} of {r.trajectories} training trajectories were rewarded "
                     f"({r['reward rate']:.1%}, 95% CI {lo:.1%}–{hi:.1%}; {r.runs} runs × {cfg.rl.steps} steps)")
    text = "Measured reward rate on the real backbone: " + "; ".join(parts) + "."
    if len(rates) and (rates["reward rate"] < low).all():
        text += (f" With under {low:.0%} of trajectories rewarded, almost every return is 0 (plus the entropy term "
                 "α·ΣH), so the REINFORCE gradient carries almost no information about correctness: flat accuracy "
                 "curves are what this size is expected to give, not a finding about CTRLS. How the policy learns, "
                 "explores and collapses is studied where the reward is informative and the optimum known: "
                 f"[A controlled study on a synthetic latent chain]({SYNTHETIC_PAGE}).")
    else:
        text += (" For the learning dynamics against a known optimum, see "
                 f"[A controlled study on a synthetic latent chain]({SYNTHETIC_PAGE}).")
    return text
