"""Algorithm 2: on-policy REINFORCE of the transition policy (Eq. 14), adapter and backbone frozen.

For each question x_0, G trajectories are sampled with the epsilon-greedy policy pi~_theta at
temperature eta; each trajectory tau = (s_0, a_1, ..., a_T) earns R = 1{y = y*}. The objective is

    J(theta) = E_tau[ R(tau) + alpha * sum_t H(pi_theta(s_t)) ]                       (Eq. 13/14)

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
from ctrls.runs import parquet_rows, read_parquet, safe_name

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Setting:
    """One RL configuration: epsilon-greedy weight and entropy coefficient alpha."""

    name: str
    epsilon: float
    alpha: float


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
    mask = torch.zeros(len(used), T)
    for i, tr in enumerate(used):
        S[i, : len(tr.states)] = tr.states
        mask[i, : len(tr.states) - 1] = 1
    S, mask = S.to(dev), mask.to(dev)
    prev, act = S[:, :-1].reshape(-1, K), S[:, 1:].reshape(-1, K)
    logp = (policy.log_prob(act, prev, epsilon).view(len(used), T) * mask).sum(1)  # sum_t log pi~(a_t | s_t)
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
                 sampler: Sampler, n_train: int, evaluate: Callable[[TransitionPolicy, int], dict] | None = None):
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

    def train_step(self) -> dict:
        rl = self.cfg.rl
        qs, seeds = self.step_plan(self.step)
        # this rank's block of the step's (question slot, sample index) pairs
        mine: dict[int, list[int]] = {}
        for j, m in self.world.shard([(j, m) for j in range(len(qs)) for m in range(rl.group_size)]):
            mine.setdefault(j, []).append(m)
        slots = sorted(mine)
        trajs = self.sampler([qs[j] for j in slots], [mine[j] for j in slots], self.setting.epsilon,
                             [seeds[j] for j in slots]) if slots else []
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

    def run(self, steps: int, progress: bool = True) -> pd.DataFrame:
        rl = self.cfg.rl
        if self.step == 0 and self.evaluate is not None and not self.log:
            self.log.append({"step": 0, "kind": "eval", **self.evaluate(self.policy, 0)})
        bar = tqdm(total=steps, initial=self.step, desc=f"RL {self.setting.name} seed {self.seed}", unit="step",
                   disable=not (progress and self.world.is_main))
        while self.step < steps:
            row = self.train_step()
            self.log.append({"kind": "train", **row})
            if self.evaluate is not None and (self.step % rl.eval_every == 0 or self.step == steps):
                self.log.append({"step": self.step, "kind": "eval", **self.evaluate(self.policy, self.step)})
            if self.step % rl.checkpoint_every == 0 or self.step == steps:
                self.save()
            bar.update(1)
            bar.set_postfix(reward=f"{row['reward']:.2f}", H=f"{row['policy_entropy']:.2f}")
        bar.close()
        self.world.barrier()  # the last checkpoint is on disk before any rank moves on
        return pd.DataFrame(self.log)


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


def run_rl(cfg: Config, force: bool = False, progress: bool = True) -> Path:
    """Train every (setting, seed) of ``rl.settings`` and ``rl.table2`` for every pair, then sample
    the test questions with each Table 2 policy. Returns ``runs/<profile>/rl``.

    Data parallel under a launcher (``ctrls.distributed``): trajectory slots, evaluation questions
    and Table 2 questions are sharded by rank and gathered; the result equals a single process's."""
    import copy

    from ctrls.answers import grade
    from ctrls.backbone import load_backbone
    from ctrls.data import problems_from_config
    from ctrls.distributed import world
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
    curve_settings = [parse_setting(s, cfg) for s in rl.settings]
    table_settings = [parse_setting(s, cfg) for s in rl.table2]
    for bname, ds in cfg.pairs():
        pc = cfg.for_pair(bname, ds)
        pair = pair_slug(bname, ds)
        bb = load_backbone(bname, w.device(pc.backbone.device), pc.backbone.dtype, pc.backbone.cache_dir)
        pretrained = load_pretrained(pc, bb)
        train = problems_from_config(pc, "train")
        test = problems_from_config(pc, "test")
        encoded: dict[tuple[str, int], tuple[list[int], int]] = {}

        def enc(split: str, i: int) -> tuple[list[int], int]:
            if (split, i) not in encoded:
                p = (train if split == "train" else test)[i]
                encoded[split, i] = encode_prompt(bb.tokenizer, p.question, pc.prompt.use_chat_template, pc.prompt.few_shot)
            return encoded[split, i]

        def generate(model, split, idx, sample_ids, eps, seeds):
            params = SampleParams(temperature=rl.temperature, top_k=pc.sampling.top_k,
                                  max_new_tokens=pc.sampling.max_new_tokens, max_steps=pc.prompt.max_steps,
                                  batch_size=pc.sampling.batch_size, epsilon=eps)
            gens = sample(bb, [enc(split, i)[0] for i in idx], params=params, model=model, seeds=seeds,
                          sample_ids=sample_ids, prompt_starts=[enc(split, i)[1] for i in idx])
            problems = train if split == "train" else test
            return [(problems[i], gs) for i, gs in zip(idx, gens)]

        # one run per (epsilon, alpha, seed): a Table 2 row equal to a curve setting reuses its run
        runs: dict[tuple[float, float, int], Setting] = {}
        for s in curve_settings:
            for seed in rl.seeds:
                runs.setdefault((s.epsilon, s.alpha, seed), s)
        for s in table_settings:
            runs.setdefault((s.epsilon, s.alpha, rl.seeds[0]), s)
        for (eps, alpha, seed), setting in runs.items():
            model = copy.deepcopy(pretrained)
            out = stage.dir / pair / f"{safe_name(setting.name)}__seed{seed}"

            def sampler(qs, sample_ids, eps, seeds, model=model):
                trajs = []
                for gi, (p, gs) in enumerate(generate(model, "train", qs, sample_ids, eps, seeds)):
                    for x in gs:
                        trajs.append(Trajectory(states=x.states, reward=float(grade(x.text, p.answer).correct), group=gi))
                return trajs

            def evaluate(policy, step, model=model, setting=setting, seed=seed):
                idx = w.shard(range(min(rl.eval_questions, len(test))))
                res = generate(model, "test", idx, [range(rl.eval_samples)] * len(idx), setting.epsilon,
                               [_seed(seed, "eval", step, test[i].id) for i in idx])
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

            trainer = Trainer(model.policy, pc, setting, seed, out, sampler, len(train), evaluate)
            trainer.run(rl.steps, progress=progress)
            for row in table_settings:
                if (row.epsilon, row.alpha, rl.seeds[0]) == (eps, alpha, seed):
                    _table2_samples(pc, stage.dir, row, model, test, generate, seed)
    w.barrier()
    if w.is_main:
        stage.finish(pairs=len(cfg.pairs()))
    w.barrier()
    return stage.dir


def _table2_samples(cfg: Config, root: Path, setting: Setting, model, test, generate, seed: int) -> None:
    """Sample every test question ``grid.n_samples`` times with the trained policy (Table 2);
    sharded by rank, written by rank 0."""
    from ctrls.distributed import world
    from ctrls.exploration import generation_rows, write_part
    from ctrls.runs import pair_slug, valid_part

    w = world()
    out = root / "table2.parquet"
    part = out / f"{pair_slug(cfg.backbone.name, cfg.data.dataset)}__{safe_name(setting.name)}.parquet"
    if valid_part(part, len(test) * cfg.grid.n_samples):
        return
    idx = w.shard(range(len(test)))
    res = generate(model, "test", idx, [range(cfg.grid.n_samples)] * len(idx), setting.epsilon,
                   [_seed(seed, "table2", setting.name, test[i].id) for i in idx])
    meta = {"backbone": cfg.backbone.name, "dataset": cfg.data.dataset, "temperature": cfg.rl.temperature,
            "config": setting.name, "epsilon": setting.epsilon, "alpha": setting.alpha, "seed": seed}
    rows = w.gather_list([r for p, gs in res for r in generation_rows(gs, p, meta)])
    if w.is_main:
        out.mkdir(parents=True, exist_ok=True)
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


# Table 2 of the paper (pass@20, Succ. in %), after RL.
PAPER_TABLE2 = {
    "Llama-3.2-3B-Instruct": {"gsm8k": {"Base": (55.6, 80.0), "H=0": (57.6, 80.8), "H=0.01": (56.8, 79.6),
                                        "eps=0.1": (57.4, 80.4), "eps=0.3": (55.8, 79.4)},
                              "math": {"Base": (41.0, 71.8), "H=0": (42.8, 72.2), "H=0.01": (42.6, 74.0),
                                       "eps=0.1": (43.0, 73.4), "eps=0.3": (42.0, 71.2)}},
    "Qwen2.5-3B-Instruct": {"gsm8k": {"Base": (64.2, 91.8), "H=0": (65.8, 89.6), "H=0.01": (66.4, 90.2),
                                      "eps=0.1": (66.2, 89.8), "eps=0.3": (66.0, 90.2)},
                            "math": {"Base": (22.6, 33.8), "H=0": (22.8, 33.4), "H=0.01": (23.6, 34.6),
                                     "eps=0.1": (22.2, 32.2), "eps=0.3": (23.4, 34.2)}},
}


def paper_table2() -> pd.DataFrame:
    return pd.DataFrame([{"backbone": b, "dataset": d, "config": c, "paper pass@20": v[0], "paper Succ.": v[1]}
                         for b, by_d in PAPER_TABLE2.items() for d, rows in by_d.items() for c, v in rows.items()])


def table2(cfg: Config) -> pd.DataFrame:
    """Table 2 in long form: Base (the exploration stage's samples at eta = rl.temperature) and
    each RL policy of ``rl.table2``, with pass@n and Succ. and their CIs (see exploration.table1)."""
    from ctrls.exploration import BASE, load_samples, table1

    rl_samples = load_table2_samples(cfg)
    try:
        base = load_samples(cfg)
        base = base[(base.config == BASE) & (base.temperature == cfg.rl.temperature)]
    except FileNotFoundError:
        base = rl_samples.iloc[:0]
    both = pd.concat([base, rl_samples], ignore_index=True)
    order = {BASE: 0, **{s: i + 1 for i, s in enumerate(cfg.rl.table2)}}
    t = table1(both, seed=cfg.seed)
    return t.sort_values(["backbone", "dataset"], kind="stable").sort_values(
        "config", key=lambda c: c.map(order), kind="stable").reset_index(drop=True)
