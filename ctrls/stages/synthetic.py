"""The synthetic study's stage: every (epsilon, alpha, seed) RL run on the chain MDP of
``ctrls.synthetic.chain`` and the L-recovery study, written under ``runs/<profile>/synthetic``.
"""
from __future__ import annotations

import os
from pathlib import Path

import pandas as pd
import torch

from ctrls.config.schema import Config, override
from ctrls.config.settings import Setting, parse_setting
from ctrls.method.policy import TransitionPolicy
from ctrls.stages.common import current_outputs
from ctrls.stages.runs import Stage, file_name
from ctrls.stages.trainer import Trainer
from ctrls.synthetic.chain import (
    SETTINGS,
    make_evaluator,
    make_sampler,
    recovery_study,
    study_mdp,
)


def trainer_config(cfg: Config) -> Config:
    """The tiny Config the Trainer runs with: ``cfg`` with the rl keys of the study set from
    ``synthetic`` (steps, one question per step, group size, lr, evaluation, one checkpoint at the
    end). Baseline, entropy gradient, gradient clip, eps, alpha and policy.entropy are the LLM path's."""
    sy = cfg.synthetic
    return override(cfg, {"rl.steps": sy.steps, "rl.questions_per_step": 1, "rl.group_size": sy.group_size,
                          "rl.lr": sy.lr, "rl.eval_every": sy.eval_every, "rl.checkpoint_every": sy.steps,
                          "rl.seeds": list(sy.seeds)})


def study_runs(cfg: Config) -> list[tuple[Setting, int]]:
    """One (setting, seed) per distinct (eps, alpha, seed) of the four settings and the sweep grid;
    a sweep cell equal to one of the four settings reuses its run."""
    tc = trainer_config(cfg)
    settings = [parse_setting(s, tc) for s in SETTINGS]
    settings += [Setting(f"eps={e:g},H={a:g}", e, a) for e in cfg.synthetic.epsilons for a in cfg.synthetic.alphas]
    runs: dict[tuple[float, float, int], Setting] = {}
    for s in settings:
        for seed in cfg.synthetic.seeds:
            runs.setdefault((s.epsilon, s.alpha, seed), s)
    return [(s, seed) for (_, _, seed), s in runs.items()]


KEYS = ("seed", "synthetic", "rl.baseline", "rl.entropy_grad", "rl.grad_clip", "rl.epsilon", "rl.entropy_coef", "policy")


def run_study(cfg: Config, force: bool = False, progress: bool = True) -> Path:
    """Train every run of ``study_runs`` and the L-recovery experiment; returns ``runs/<profile>/synthetic``
    with ``curves.parquet`` and ``recovery.parquet``. Reused when ``KEYS`` are unchanged."""
    stage = Stage(cfg, "synthetic", KEYS)
    if stage.is_done() and not force:
        return stage.dir
    with stage.begin(force=force):  # gives the lock back if the study fails or is interrupted
        _study(cfg, stage, progress)
    return stage.dir


def _study(cfg: Config, stage: Stage, progress: bool) -> None:
    """The body of :func:`run_study`, between the stage's begin and finish."""
    from tqdm.auto import tqdm

    tc = trainer_config(cfg)
    mdp, P = study_mdp(cfg)
    runs = study_runs(cfg)
    frames = []
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # K x K tensors: threads only add overhead
    try:
        for setting, seed in tqdm(runs, desc="synthetic RL runs", disable=not progress):
            policy = TransitionPolicy(mdp.n_states, concentration=cfg.synthetic.concentration)
            with torch.no_grad():
                policy.L.copy_(P.log())
            out = stage.dir / f"{file_name(setting.name)}__seed{seed}"
            trainer = Trainer(policy, tc, setting, seed, out, make_sampler(policy, mdp), 1,
                              make_evaluator(mdp, cfg.synthetic.eval_samples, seed))
            frames.append(trainer.run(cfg.synthetic.steps, progress=False).assign(
                setting=setting.name, epsilon=setting.epsilon, alpha=setting.alpha, seed=seed))
        recovery = recovery_study(cfg, P)
    finally:
        torch.set_num_threads(threads)
    pd.concat(frames, ignore_index=True).to_parquet(stage.dir / "curves.parquet")
    recovery.to_parquet(stage.dir / "recovery.parquet")
    stage.finish(runs=len(runs))


def _current(cfg: Config, name: str, what: str) -> Path:
    """The stage's file ``name``, when this config's finished stage recorded it (else ``NotRunError``)."""
    f = cfg.stage_dir("synthetic") / name
    allowed = current_outputs(Stage(cfg, "synthetic", KEYS), what)
    if Path(os.path.normpath(f)) not in allowed:
        raise FileNotFoundError(f"no {what} at {f}; run ctrls.stages.synthetic.run_study first")
    return f


def load_curves(cfg: Config) -> pd.DataFrame:
    f = _current(cfg, "curves.parquet", "synthetic curves")
    if not f.exists():
        raise FileNotFoundError(f"no synthetic curves at {f}; run ctrls.stages.synthetic.run_study first")
    return pd.read_parquet(f)


def load_recovery(cfg: Config) -> pd.DataFrame:
    f = _current(cfg, "recovery.parquet", "L-recovery results")
    if not f.exists():
        raise FileNotFoundError(f"no L-recovery results at {f}; run ctrls.stages.synthetic.run_study first")
    return pd.read_parquet(f)
