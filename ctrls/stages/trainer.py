"""Alg. 2's training loop: REINFORCE (``ctrls.method.reinforce``) with Adam and gradient clipping,
checkpointed every N steps, data parallel, and several runs in one lockstep batch.

A resumed run continues from its last checkpoint with the same per-step seeds, so its curve has no
duplicated or missing steps.
"""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import pandas as pd
import torch

from ctrls.config.schema import Config
from ctrls.config.settings import Setting
from ctrls.method.policy import TransitionPolicy, check_finite
from ctrls.method.reinforce import Sampler, Trajectory, reinforce_loss
from ctrls.method.streams import seed_of
from ctrls.stages.common import save_parquet, save_torch
from ctrls.stages.progress import tqdm
from ctrls.stages.runs import UnsafeArtifactError, load_torch, parquet_rows

log = logging.getLogger(__name__)


def plain(x):
    """``x`` with numpy scalars and arrays made Python numbers and lists, recursively through dicts,
    lists and tuples: what ``torch.load(weights_only=True)`` reads back without any allowlist."""
    if isinstance(x, dict):
        return {k: plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return (list if isinstance(x, list) else tuple)(plain(v) for v in x)
    if isinstance(x, np.ndarray):
        return x.tolist()
    if isinstance(x, np.generic):
        return x.item()
    return x


class Trainer:
    """REINFORCE with Adam and gradient clipping, checkpointed to ``out`` every N steps.

    Data parallel (``ctrls.stages.distributed``): each rank samples its block of the step's Q x G
    trajectory slots, gradients are summed over ranks, and every rank takes the same Adam step;
    rank 0 writes the checkpoints."""

    def __init__(self, policy: TransitionPolicy, cfg: Config, setting: Setting, seed: int, out: Path,
                 sampler: Sampler | None, n_train: int, evaluate: Callable[[TransitionPolicy, int], dict] | None = None,
                 tensorboard: Path | None = None):
        from ctrls.stages.distributed import world

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
        # weights_only (ctrls.stages.runs.load_torch): a checkpoint that would need the full unpickler, which
        # could run code, is refused with UnsafeArtifactError naming it; nothing of it is loaded
        try:
            state = load_torch(self.ckpt, map_location=self.policy.L.device)
            step, history = int(state["step"]), list(state["log"])
            self.policy.load_state_dict(state["policy"])
            self.opt.load_state_dict(state["opt"])
            for name, p in self.policy.state_dict().items():
                check_finite(p, f"policy.{name}")
        except UnsafeArtifactError:
            raise  # refused, not overwritten: the user decides what to do with a file that is not ours
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
        save_parquet(pd.DataFrame(self.log).assign(setting=self.setting.name, epsilon=self.setting.epsilon,
                                                   alpha=self.setting.alpha, seed=self.seed), self.curve_file)

    def save(self) -> None:
        """Write the checkpoint, then the curve (each atomically, by rename)."""
        if not self.world.is_main:
            return
        for name, p in self.policy.state_dict().items():  # never save a non-finite policy
            check_finite(p, f"policy.{name} (not saved to {self.ckpt})")
        tmp = self.ckpt.with_suffix(".tmp")
        # tensors and plain containers only: it loads with weights_only=True (no unpickling of code)
        save_torch({"policy": self.policy.state_dict(), "opt": self.opt.state_dict(), "step": self.step,
                    "log": plain(self.log), "setting": plain(dict(self.setting.__dict__)), "seed": int(self.seed)}, tmp)
        tmp.replace(self.ckpt)
        self._write_curve()

    def step_plan(self, step: int) -> tuple[list[int], list[int]]:
        """The questions of ``step`` (drawn with replacement) and one sampling seed per question slot."""
        g = torch.Generator().manual_seed(seed_of(self.seed, self.setting.name, step))
        qs = torch.randint(self.n_train, (self.cfg.rl.questions_per_step,), generator=g).tolist()
        return qs, [seed_of(self.seed, self.setting.name, step, j) for j in range(len(qs))]

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
        """One Adam step of Eq. 16 on the trajectories sampled for ``plan``."""
        rl = self.cfg.rl
        slots, qs = plan.slots, range(plan.n_questions)
        for tr in trajs:  # the sampler numbers groups by position in its call; make them step-global
            tr.group = slots[tr.group]
        loss, info = reinforce_loss(self.policy, trajs, self.setting.epsilon, self.setting.alpha, rl.baseline,
                                    rl.entropy_grad, self.cfg.policy.entropy, all_sum=self.world.all_sum,
                                    n_groups=len(qs))
        check_finite(loss.detach(), f"RL loss at step {self.step + 1} of {self.out}")  # no step on a non-finite loss
        self.opt.zero_grad()
        loss.backward()
        self.world.sum_gradients(self.policy.parameters())
        for name, p in self.policy.named_parameters():  # the same summed gradient on every rank: all refuse together
            if p.grad is not None:
                check_finite(p.grad, f"gradient of policy.{name} at step {self.step + 1} of {self.out}")
        gnorm = float(torch.nn.utils.clip_grad_norm_(self.policy.parameters(), rl.grad_clip))
        self.opt.step()
        for name, p in self.policy.named_parameters():
            check_finite(p, f"policy.{name} after step {self.step + 1} of {self.out}")
        self.step += 1
        return {"step": self.step, "loss": float(self.world.all_sum(loss.detach())), "grad_norm": gnorm,
                "concentration": float(self.policy.log_c.detach().exp()), **info}

    def record(self, row: dict) -> None:
        """Append a row to the curve (and to TensorBoard when on). Its values are made plain Python
        (numbers, strings, lists): the checkpoint holds the log and loads with ``weights_only=True``."""
        row = plain(row)
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

    def eval_missing(self, steps: int) -> bool:
        """The current step is due an evaluation that the log does not hold: step 0 of a new run, or a
        checkpoint written before its step's evaluation (``run_lockstep`` with ``sample_and_evaluate``)."""
        return self.wants_eval(steps) and not any(r.get("kind") == "eval" and r.get("step") == self.step for r in self.log)

    def wants_save(self, steps: int) -> bool:
        return self.step % self.cfg.rl.checkpoint_every == 0 or self.step == steps

    def run(self, steps: int, progress: bool = True) -> pd.DataFrame:
        if self.eval_missing(steps):
            self.record({"step": self.step, "kind": "eval", **self.evaluate(self.policy, self.step)})
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
# in one shared batch; evaluate_many([(trainer, step), ...]) -> one metrics dict per pair;
# sample_and_evaluate(pairs, due) -> both at once, in one shared batch.
SampleMany = Callable[[list[tuple[Trainer, Plan]]], list[list[Trajectory]]]


EvaluateMany = Callable[[list[tuple[Trainer, int]]], list[dict]]


SampleAndEvaluate = Callable[[list[tuple[Trainer, Plan]], list[tuple[Trainer, int]]], tuple[list[list[Trajectory]], list[dict]]]


def run_lockstep(trainers: Sequence[Trainer], steps: int, sample_many: SampleMany | None = None,
                 evaluate_many: EvaluateMany | None = None, progress: bool = True,
                 sample_and_evaluate: SampleAndEvaluate | None = None) -> list[pd.DataFrame]:
    """Train every trainer to ``steps`` at once: at each step every unfinished run plans its own
    step (``Trainer.step_plan``: the same questions and seeds as alone), the trajectories of all
    runs are sampled together by ``sample_many``, and each run takes its own Adam step; the runs due
    for evaluation are evaluated together by ``evaluate_many``. Each run logs, evaluates and saves
    exactly as ``Trainer.run`` would, so the curves and checkpoints equal the sequential runs'.
    Runs resumed at different steps (a kill between two checkpoints) simply finish at different
    rounds. Defaults: each trainer's own ``sampler`` / ``evaluate`` (no shared batch).

    With ``sample_and_evaluate``, an evaluation due before more training (step 0, every
    ``rl.eval_every``) is drawn in the next step's batch: the policy it evaluates is the one that
    step samples with, so the small training batch carries the evaluation's rows instead of a
    decode of its own. A checkpoint due at that step is written before the evaluation; a run
    resumed from it finds the evaluation missing (``Trainer.eval_missing``) and draws it with the
    next step's samples again, in the batch the uninterrupted run drew them in."""
    if sample_many is None:
        def sample_many(pairs):
            return [t.sampler(p.questions, p.sample_ids, t.setting.epsilon, p.seeds) if p.slots else [] for t, p in pairs]
    if evaluate_many is None:
        def evaluate_many(pairs):
            return [t.evaluate(t.policy, step) for t, step in pairs]

    def evaluate_now(due: list[Trainer]) -> None:
        for t, metrics in zip(due, evaluate_many([(t, t.step) for t in due]) if due else []):
            t.record({"step": t.step, "kind": "eval", **metrics})

    def deferred(due: list[Trainer]) -> list[Trainer]:  # drawn with the next step's samples
        return [t for t in due if sample_and_evaluate is not None and t.step < steps]

    world = trainers[0].world if trainers else None
    missing = [t for t in trainers if t.eval_missing(steps)]
    pending = deferred(missing)
    evaluate_now([t for t in missing if t not in pending])
    bar = tqdm(total=steps * len(trainers), initial=sum(min(t.step, steps) for t in trainers), unit="run-step",
               desc=f"RL lockstep ({len(trainers)} runs)", disable=not (progress and world is not None and world.is_main))
    while True:
        active = [t for t in trainers if t.step < steps]
        if not active:
            break
        plans = [(t, t.plan()) for t in active]
        if pending:
            trajs, evals = sample_and_evaluate(plans, [(t, t.step) for t in pending])
            for t, metrics in zip(pending, evals):
                t.record({"step": t.step, "kind": "eval", **metrics})
        else:
            trajs = sample_many(plans)
        for (t, p), tr in zip(plans, trajs):
            t.record({"kind": "train", **t.update(p, tr)})
        due = [t for t in active if t.wants_eval(steps)]
        pending = deferred(due)
        evaluate_now([t for t in due if t not in pending])
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
