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
from ctrls.stages.common import current_outputs, save_parquet
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


def run_study(cfg: Config, force: bool = False, progress: bool = True, workers: int | None = None) -> Path:
    """Train every run of ``study_runs`` and the L-recovery experiment; returns ``runs/<profile>/synthetic``
    with ``curves.parquet`` and ``recovery.parquet``. Reused when ``KEYS`` are unchanged.

    ``workers``: processes for the runs (None: one per core when the study is large enough to repay a
    worker's start, ``PARALLEL_RUN_STEPS``). Every run draws from its own seeded generators on one thread,
    so the curves are the same bit for bit whatever the number of workers (tested)."""
    stage = Stage(cfg, "synthetic", KEYS)
    if stage.is_done() and not force:
        return stage.dir
    with stage.begin(force=force):  # gives the lock back if the study fails or is interrupted
        _study(cfg, stage, progress, workers)
    return stage.dir


# A worker process costs ~5 s to start (it imports torch and the trainer), about 700 run-steps of the
# study on one core: below this many run-steps the runs stay in this process.
PARALLEL_RUN_STEPS = 2_000


def _one_run(cfg: Config, setting: Setting, seed: int, out: Path) -> pd.DataFrame:
    """One RL run of the study on the chain MDP (in this process or a worker's), on one thread."""
    torch.set_num_threads(1)  # K x K tensors: threads only add overhead
    mdp, P = study_mdp(cfg)
    policy = TransitionPolicy(mdp.n_states, concentration=cfg.synthetic.concentration)
    with torch.no_grad():
        policy.L.copy_(P.log())
    trainer = Trainer(policy, trainer_config(cfg), setting, seed, out, make_sampler(policy, mdp), 1,
                      make_evaluator(mdp, cfg.synthetic.eval_samples, seed))
    return trainer.run(cfg.synthetic.steps, progress=False).assign(
        setting=setting.name, epsilon=setting.epsilon, alpha=setting.alpha, seed=seed)


def _study(cfg: Config, stage: Stage, progress: bool, workers: int | None = None) -> None:
    """The body of :func:`run_study`, between the stage's begin and finish."""
    from concurrent.futures import ProcessPoolExecutor, as_completed
    from multiprocessing import get_context

    from ctrls.stages.progress import tqdm

    runs = study_runs(cfg)
    if workers is None:
        workers = (os.cpu_count() or 1) if len(runs) * cfg.synthetic.steps >= PARALLEL_RUN_STEPS else 1
    workers = max(1, min(workers, len(runs)))
    jobs = [(cfg, setting, seed, stage.dir / f"{file_name(setting.name)}__seed{seed}") for setting, seed in runs]
    bar = tqdm(total=len(jobs), desc="synthetic RL runs", disable=not progress)
    threads = torch.get_num_threads()
    try:
        if workers == 1:
            frames = []
            for job in jobs:
                frames.append(_one_run(*job))
                bar.update()
        else:  # spawn: a fresh interpreter (fork would copy this process's threads' locks)
            with ProcessPoolExecutor(workers, mp_context=get_context("spawn")) as pool:
                futures = {pool.submit(_one_run, *job): i for i, job in enumerate(jobs)}
                frames = [None] * len(jobs)
                for f in as_completed(futures):
                    frames[futures[f]] = f.result()
                    bar.update()
        torch.set_num_threads(1)
        _, P = study_mdp(cfg)
        recovery = recovery_study(cfg, P)
    finally:
        bar.close()
        torch.set_num_threads(threads)
    save_parquet(pd.concat(frames, ignore_index=True), stage.dir / "curves.parquet")  # in study_runs' order
    save_parquet(recovery, stage.dir / "recovery.parquet")
    stage.finish(runs=len(runs), workers=workers)


def _current(cfg: Config, name: str, what: str) -> Path:
    """The stage's file ``name``, when this config's finished stage recorded it (else ``NotRunError``)."""
    stage = Stage(cfg, "synthetic", KEYS)
    f = stage.dir / name
    allowed = current_outputs(stage, what)
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
