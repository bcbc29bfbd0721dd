"""The judge stage (Table 3, Appendix E): subsample the Base and RL outputs of the judged pair,
score them with the rubric judge (``ctrls.generate.judge``) and cache every reply under ``runs/<profile>/judge``.
"""
from __future__ import annotations

import pandas as pd

from ctrls.config.settings import BASE, judge_pair, parse_setting
from ctrls.generate.judge import judge_samples, make_backend, subsample
from ctrls.stages.common import save_parquet
from ctrls.stages.exploration import load_samples
from ctrls.stages.rl import load_table2_samples
from ctrls.stages.runs import Stage


def table3_labels(cfg) -> list[str]:
    """Table 3's rows: Base, then each policy of ``judge.settings`` labelled like the paper's."""
    return ["Base"] + list(dict.fromkeys(parse_setting(s, cfg).label for s in cfg.judge.settings))


def judged_configs(cfg) -> pd.DataFrame:
    """The outputs Table 3 scores, of the judge's pair only (``judge_pair``): Base and each RL
    policy of ``judge.settings``, labelled by ``rl.setting_label`` (the paper's "ε=…, H=…"), at eta =
    rl.temperature. Base is the RL stage's own Base samples when it has them (``rl.n_test``), else
    the exploration stage's."""
    backbone, dataset = judge_pair(cfg)
    labels = table3_labels(cfg)

    def mine(df):
        return df[(df.backbone == backbone) & (df.dataset == dataset) & (df.temperature == cfg.rl.temperature)]

    ex = mine(load_samples(cfg))
    try:
        rl = mine(load_table2_samples(cfg))
    except FileNotFoundError:  # no RL stage: judge the exploration rows instead
        base = ex[ex.config == BASE].assign(setting="Base")
        ctrls_rows = ex[ex.config != BASE]
        out = pd.concat([base, ctrls_rows.assign(setting=[f"ε={e:.1f}, H=0 (no RL)" for e in ctrls_rows.epsilon])],
                        ignore_index=True)
        return out.assign(config=out.setting)
    base = rl[rl.config == BASE] if (rl.config == BASE).any() else ex[ex.config == BASE]
    policies = rl[rl.config.isin(labels[1:])]
    missing = sorted(set(labels[1:]) - set(policies.config))
    if missing:
        raise ValueError(f"no RL samples for Table 3 rows {missing} of {backbone} x {dataset}: re-run the RL stage "
                         f"(it trains judge.settings for judge.pair)")
    out = pd.concat([base.assign(config="Base"), policies], ignore_index=True)
    return out.assign(setting=out.config)


def run_judge(cfg, force: bool = False, progress: bool = True) -> pd.DataFrame:
    """Subsample, judge (cached) and return the judged rows; written to runs/<profile>/judge/."""
    backend = make_backend(cfg.judge)
    stage = Stage(cfg, "judge", ("judge", "seed", "grid", "rl", "data"), upstream=(backend.name, backend.model))
    out = stage.dir / "judged.parquet"
    if stage.is_done() and not force and out.exists():
        return pd.read_parquet(out)
    with stage.begin(keep=True):  # never cleared: the reply cache lives here; the lock is given back on failure
        picked = subsample(judged_configs(cfg), cfg.judge.samples_per_config, seed=cfg.seed)
        judged = judge_samples(picked, backend, stage.dir / "cache", cfg.judge.temperature, progress)
        save_parquet(judged, out)
        stage.finish(rows=len(judged), backend=backend.name, model=backend.model,
                     fallbacks=int((judged.parse != "json").sum()))
    return judged
