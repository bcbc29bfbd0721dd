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
from ctrls.runs import safe_name

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


# A sampler draws G trajectories for each of the given question indices with the current policy.
Sampler = Callable[[Sequence[int], int, float, torch.Generator], list[Trajectory]]


def reinforce_loss(policy: TransitionPolicy, trajs: Sequence[Trajectory], epsilon: float, alpha: float,
                   baseline: str = "none", entropy_grad: str = "full", entropy_kind: str = "categorical"
                   ) -> tuple[torch.Tensor, dict]:
    """The negated Eq. 14 surrogate, averaged over trajectories, and diagnostics (batched over
    trajectories of different lengths with a mask)."""
    used = [tr for tr in trajs if len(tr.states) > 1]
    if not used:
        raise ValueError("no trajectory has a state transition: nothing to learn from")
    K = used[0].states.shape[-1]
    T = max(len(tr.states) for tr in used) - 1
    S = torch.full((len(used), T + 1, K), 1.0 / K)
    mask = torch.zeros(len(used), T)
    for i, tr in enumerate(used):
        S[i, : len(tr.states)] = tr.states
        mask[i, : len(tr.states) - 1] = 1
    S = S.to(policy.L.device)
    mask = mask.to(policy.L.device)
    prev, act = S[:, :-1].reshape(-1, K), S[:, 1:].reshape(-1, K)
    logp = (policy.log_prob(act, prev, epsilon).view(len(used), T) * mask).sum(1)  # sum_t log pi~(a_t | s_t)
    H = (policy.entropy(prev, kind=entropy_kind).view(len(used), T) * mask).sum(1)  # sum_t H(pi(s_t))
    ret = torch.tensor([tr.reward for tr in used], device=logp.device) + alpha * H.detach()
    if baseline == "group_mean":
        g = torch.tensor([tr.group for tr in used], device=logp.device)
        means = torch.zeros(int(g.max()) + 1, device=logp.device).index_add(0, g, ret)
        counts = torch.zeros_like(means).index_add(0, g, torch.ones_like(ret))
        adv = ret - (means / counts.clamp(min=1))[g]
    elif baseline == "none":
        adv = ret
    else:
        raise ValueError(f"unknown baseline {baseline!r}: none or group_mean")
    surrogate = (adv * logp).mean()
    if entropy_grad == "full":
        surrogate = surrogate + alpha * H.mean()
    elif entropy_grad != "eq14":
        raise ValueError(f"unknown entropy_grad {entropy_grad!r}: full or eq14")
    info = {"reward": float(np.mean([t.reward for t in trajs])), "return": float(ret.mean()),
            "policy_entropy": float((H.detach() / mask.sum(1)).mean())}
    return -surrogate, info


def _seed(*parts) -> int:
    return zlib.crc32(repr(parts).encode())


class Trainer:
    """REINFORCE with Adam and gradient clipping, checkpointed to ``out`` every N steps."""

    def __init__(self, policy: TransitionPolicy, cfg: Config, setting: Setting, seed: int, out: Path,
                 sampler: Sampler, n_train: int, evaluate: Callable[[TransitionPolicy, int], dict] | None = None):
        self.policy, self.cfg, self.setting, self.seed, self.out = policy, cfg, setting, seed, Path(out)
        self.sampler, self.n_train, self.evaluate = sampler, n_train, evaluate
        self.opt = torch.optim.Adam(policy.parameters(), lr=cfg.rl.lr)
        self.step = 0
        self.log: list[dict] = []
        self.out.mkdir(parents=True, exist_ok=True)
        self._resume()

    @property
    def ckpt(self) -> Path:
        return self.out / "checkpoint.pt"

    def _resume(self) -> None:
        if not self.ckpt.exists():
            return
        state = torch.load(self.ckpt, weights_only=False)
        self.policy.load_state_dict(state["policy"])
        self.opt.load_state_dict(state["opt"])
        self.step = state["step"]
        self.log = state["log"]
        log.info("resumed %s at step %d", self.out, self.step)

    def save(self) -> None:
        tmp = self.ckpt.with_suffix(".tmp")
        torch.save({"policy": self.policy.state_dict(), "opt": self.opt.state_dict(), "step": self.step,
                    "log": self.log, "setting": self.setting.__dict__, "seed": self.seed}, tmp)
        tmp.replace(self.ckpt)
        pd.DataFrame(self.log).assign(setting=self.setting.name, epsilon=self.setting.epsilon, alpha=self.setting.alpha,
                                      seed=self.seed).to_parquet(self.out / "curve.parquet")

    def train_step(self) -> dict:
        rl = self.cfg.rl
        g = torch.Generator().manual_seed(_seed(self.seed, self.setting.name, self.step))
        qs = torch.randint(self.n_train, (rl.questions_per_step,), generator=g).tolist()
        trajs = self.sampler(qs, rl.group_size, self.setting.epsilon, g)
        loss, info = reinforce_loss(self.policy, trajs, self.setting.epsilon, self.setting.alpha, rl.baseline,
                                    rl.entropy_grad, self.cfg.policy.entropy)
        self.opt.zero_grad()
        loss.backward()
        gnorm = float(torch.nn.utils.clip_grad_norm_(self.policy.parameters(), rl.grad_clip))
        self.opt.step()
        self.step += 1
        return {"step": self.step, "loss": float(loss.detach()), "grad_norm": gnorm,
                "concentration": float(self.policy.log_c.detach().exp()), **info}

    def run(self, steps: int, progress: bool = True) -> pd.DataFrame:
        rl = self.cfg.rl
        if self.step == 0 and self.evaluate is not None and not self.log:
            self.log.append({"step": 0, "kind": "eval", **self.evaluate(self.policy, 0)})
        bar = tqdm(total=steps, initial=self.step, desc=f"RL {self.setting.name} seed {self.seed}", unit="step",
                   disable=not progress)
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
    from ctrls.pretrain import _stages as pretrain_stages
    from ctrls.runs import Stage

    upstream = tuple(pretrain_stages(cfg.for_pair(b, d))["adapter"].key for b, d in cfg.pairs())
    return Stage(cfg, "rl", RL_KEYS, upstream=upstream)


def run_rl(cfg: Config, force: bool = False, progress: bool = True) -> Path:
    """Train every (setting, seed) of ``rl.settings`` and ``rl.table2`` for every pair, then sample
    the test questions with each Table 2 policy. Returns ``runs/<profile>/rl``."""
    import copy

    from ctrls.answers import grade
    from ctrls.backbone import load_backbone
    from ctrls.data import problems_from_config
    from ctrls.pretrain import load_pretrained
    from ctrls.prompts import encode_prompt
    from ctrls.runs import pair_slug
    from ctrls.sampling import SampleParams, sample, seeded

    stage = _rl_stage(cfg)
    if stage.is_done() and not force:
        return stage.dir
    stage.begin(force=force)
    rl = cfg.rl
    curve_settings = [parse_setting(s, cfg) for s in rl.settings]
    table_settings = [parse_setting(s, cfg) for s in rl.table2]
    for bname, ds in cfg.pairs():
        pc = cfg.for_pair(bname, ds)
        pair = pair_slug(bname, ds)
        bb = load_backbone(bname, pc.backbone.device, pc.backbone.dtype, pc.backbone.cache_dir)
        pretrained = load_pretrained(pc, bb)
        train = problems_from_config(pc, "train")
        test = problems_from_config(pc, "test")
        enc_train = [encode_prompt(bb.tokenizer, p.question, pc.prompt.use_chat_template, pc.prompt.few_shot) for p in train]
        enc_test = [encode_prompt(bb.tokenizer, p.question, pc.prompt.use_chat_template, pc.prompt.few_shot) for p in test]

        def params(eps: float) -> SampleParams:
            return SampleParams(temperature=rl.temperature, top_k=pc.sampling.top_k,
                                max_new_tokens=pc.sampling.max_new_tokens, max_steps=pc.prompt.max_steps,
                                batch_size=pc.sampling.batch_size, epsilon=eps)

        def generate(model, problems, enc, idx, n, eps, gen):
            gens = sample(bb, [enc[i][0] for i in idx], n, params(eps), model=model, generator=gen,
                          prompt_starts=[enc[i][1] for i in idx])
            return [(problems[i], gs) for i, gs in zip(idx, gens)]

        def device_gen(g: torch.Generator) -> torch.Generator:
            return seeded(int(torch.randint(2**31 - 1, (1,), generator=g)), bb.device)

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

            def sampler(qs, G, eps, g, model=model):
                trajs = []
                for gi, (p, gs) in enumerate(generate(model, train, enc_train, qs, G, eps, device_gen(g))):
                    for x in gs:
                        trajs.append(Trajectory(states=x.states, reward=float(grade(x.text, p.answer).correct), group=gi))
                return trajs

            def evaluate(policy, step, model=model, setting=setting, seed=seed):
                g = seeded(_seed(seed, "eval", step), bb.device)
                idx = list(range(min(rl.eval_questions, len(test))))
                res = generate(model, test, enc_test, idx, rl.eval_samples, setting.epsilon, g)
                correct = np.array([[grade(x.text, p.answer).correct for x in gs] for p, gs in res])
                valid = np.array([[grade(x.text, p.answer).valid for x in gs] for p, gs in res])
                states = [x.states for _, gs in res for x in gs if x.states is not None and len(x.states) > 1]
                with torch.no_grad():
                    H = [float(policy.entropy(s[:-1].to(policy.L.device), kind=cfg.policy.entropy).mean()) for s in states]
                hard = [int(k) for s in states for k in s[1:].argmax(-1)]
                return {"accuracy": float(correct.mean()), "pass@k": float(correct.any(1).mean()),
                        "succ": float(valid.mean()), "policy_entropy": float(np.mean(H)) if H else math.nan,
                        "state_usage_entropy": state_usage_entropy(hard, policy.L.shape[0])}

            trainer = Trainer(model.policy, pc, setting, seed, out, sampler, len(train), evaluate)
            trainer.run(rl.steps, progress=progress)
            for row in table_settings:
                if (row.epsilon, row.alpha, rl.seeds[0]) == (eps, alpha, seed):
                    _table2_samples(pc, stage.dir, row, model, test, enc_test, generate, seed)
    stage.finish(pairs=len(cfg.pairs()))
    return stage.dir


def _table2_samples(cfg: Config, root: Path, setting: Setting, model, test, enc_test, generate, seed: int) -> None:
    """Sample every test question ``grid.n_samples`` times with the trained policy (Table 2)."""
    from ctrls.exploration import _write_part, generation_rows
    from ctrls.runs import pair_slug
    from ctrls.sampling import seeded

    out = root / "table2.parquet"
    out.mkdir(parents=True, exist_ok=True)
    part = out / f"{pair_slug(cfg.backbone.name, cfg.data.dataset)}__{safe_name(setting.name)}.parquet"
    if part.exists():
        return
    res = generate(model, test, enc_test, list(range(len(test))), cfg.grid.n_samples, setting.epsilon,
                   seeded(_seed(seed, "table2", setting.name), model.centroids.device))
    meta = {"backbone": cfg.backbone.name, "dataset": cfg.data.dataset, "temperature": cfg.rl.temperature,
            "config": setting.name, "epsilon": setting.epsilon, "alpha": setting.alpha, "seed": seed}
    rows = [r for p, gs in res for r in generation_rows(gs, p, meta)]
    _write_part(pd.DataFrame(rows), part)


def load_curves(cfg: Config) -> pd.DataFrame:
    """Every run's logged curve, with its pair, setting and seed."""
    root = cfg.stage_dir("rl")
    frames = []
    for f in sorted(root.glob("*/*/curve.parquet")):
        frames.append(pd.read_parquet(f).assign(pair=f.parent.parent.name))
    if not frames:
        raise FileNotFoundError(f"no RL curves under {root}; run the RL stage first")
    return pd.concat(frames, ignore_index=True)


def load_table2_samples(cfg: Config) -> pd.DataFrame:
    files = sorted((cfg.stage_dir("rl") / "table2.parquet").glob("*.parquet"))
    if not files:
        raise FileNotFoundError("no Table 2 samples; run the RL stage first")
    return pd.concat([pd.read_parquet(f) for f in files], ignore_index=True)


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
