"""The demo's mechanism numbers on fresh data seeds: for each finished run (pretraining and exploration at
one ``data.seed``: new training and test questions, nothing else changed), the epsilon row's kappa
against the independent-chain null, the fixed-s0 row's pass@1 harm against Base (non-inferiority at
``--margin`` points, judged on the interval's lower bound) and epsilon - Base pass@n; then kappa pooled
over the seeds (questions of different seeds are different clusters). Where a run's RL stage has finished
too, each Table 2 policy's pass@1 minus Base and minus the pretrained policy's epsilon row (``rl_table2``).

No choice was made on these seeds: K, the fusion, the injection point, spectral.k and the data mix were
chosen earlier on data seed 0's questions, so these are test numbers.

With ``--against`` (runs of another variant on the same data seeds, made with ``--against-override``):
each seed's paired difference, this variant minus that one, in kappa (``kappa_difference``: a paired
question bootstrap and a per-question permutation test) and in the epsilon row's pass@1, Holm over the seeds.

Usage (from the repository root, after `ctrls stage pretrain exploration -o data.seed=S --run-dir DIR_S`):
    .venv/bin/python studies/seeds.py --runs 1:/tmp/runs1 2:/tmp/runs2 3:/tmp/runs3 -o "grid.transfer_datasets=[]" \
        --out studies/results/seeds.json
"""
from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))  # bench/common.py
from common import machine, write_result  # noqa: E402

from ctrls.config.overrides import parse_overrides  # noqa: E402
from ctrls.config.schema import load_config  # noqa: E402
from ctrls.config.settings import BASE, FIXED, row_label  # noqa: E402
from ctrls.errors import ConfigError  # noqa: E402
from ctrls.stages.exploration import load_samples, stage_summary  # noqa: E402
from ctrls.stages.sample_tables import table1  # noqa: E402
from ctrls.stats.agreement import kappa_difference, kappa_vs_null, null_steps  # noqa: E402
from ctrls.stats.metrics import holm  # noqa: E402
from ctrls.stats.paired import paired_pass  # noqa: E402


def paired_pass1(a, b, seed: int = 0) -> dict:
    """pass@1 of row a minus row b, paired by question, with a question-bootstrap 95% interval
    (``ctrls.stats.paired.paired_pass`` at k = 1)."""
    return paired_pass(a, b, 1, seed=seed)


def one_seed(cfg, margin: float, seed: int = 0) -> tuple[dict, tuple]:
    df = load_samples(cfg)
    df = df[df.dataset == cfg.data.dataset]
    eps = cfg.grid.epsilons[0]
    base, row, fixed = df[df.config == BASE], df[df.config == row_label(eps)], df[df.config == FIXED]
    trip = null_steps(row, base, eps)
    k = kappa_vs_null(*trip, seed=seed)
    harm = paired_pass1(fixed, base, seed=seed)
    harm["non_inferior"] = bool(harm["lo"] > -margin / 100)
    t1 = table1(df)
    r = t1[t1.config == row_label(eps)].iloc[0]
    out = {"data_seed": cfg.data.seed, "questions": int(df.question_id.nunique()),
           "samples_per_question": int(cfg.grid.n_samples), "epsilon": eps, "kappa": k, "harm_fixed_minus_base_pass1": harm,
           "eps_minus_base_pass_n": {"diff": float(r["Δ pass@n vs Base"]), "lo": float(r["Δ lo"]), "hi": float(r["Δ hi"]),
                                     "p": float(r["p"])},
           "eps_minus_fixed_pass1": paired_pass1(row, fixed, seed=seed),
           # the exploration claim in the book's own metric (pass@n, n = the samples per question), paired by question
           "eps_minus_fixed_pass_n": paired_pass(row, fixed, int(cfg.grid.n_samples), seed=seed),
           "pass1": {"Base": float(base.correct.mean()), "fixed s0": float(fixed.correct.mean()),
                     row_label(eps): float(row.correct.mean())},
           # why a row loses: how often it gives an answer at all, and how often it runs all T steps unanswered
           "max_steps": int(cfg.prompt.max_steps),
           # with grid.position_floor > 0: each pair's mask of the states that can occur at each step (the stage's record)
           **({"position_masks": m} if (m := stage_summary(cfg).get("position_masks")) else {}),
           "valid": {lab: float(x.valid.mean()) for lab, x in (("Base", base), ("fixed s0", fixed), (row_label(eps), row))},
           "ran_all_steps": {lab: float((x.finish == "max_steps").mean())
                             for lab, x in (("Base", base), ("fixed s0", fixed), (row_label(eps), row))}}
    if (rl := rl_rows(cfg, base, row, seed)) is not None:  # the RL stage ran on this seed too: Table 2's policies
        out["rl_table2"] = rl
    out["stage_seconds"] = stage_seconds(cfg)
    f, n, q = trip
    return out, (f, n, [f"{cfg.data.seed}:{x}" for x in q])


def rl_rows(cfg, base, pre, seed: int = 0) -> dict | None:
    """Where the run's RL stage has finished: each Table 2 policy's pass@1 minus Base (``base``) and minus the
    pretrained policy's epsilon row (``pre``; both the exploration stage's samples of the same test questions),
    paired by question, Holm over the policies within each comparison; None when the RL stage has not run."""
    from ctrls.stages.common import NotRunError
    from ctrls.stages.rl import load_table2_samples

    try:
        t2 = load_table2_samples(cfg)
    except (NotRunError, FileNotFoundError):
        return None
    t2 = t2[(t2.dataset == cfg.data.dataset) & (t2.config != BASE)]
    out = {str(c): {"pass1": float(x.correct.mean()), "samples": int(len(x)),
                    "minus_base": paired_pass1(x, base, seed=seed), "minus_pretrained_eps": paired_pass1(x, pre, seed=seed)}
           for c, x in t2.groupby("config", sort=True)}
    for key in ("minus_base", "minus_pretrained_eps"):
        for r, h in zip(out.values(), holm([r[key]["p"] for r in out.values()])):
            r[key]["p_holm"] = float(h)
    return out


def stage_seconds(cfg) -> dict:
    """Each finished stage's wall seconds from its ``done`` record (the state prompt's fit where it ran)."""
    from ctrls.stages.pretrain import pretrain_stages
    from ctrls.stages.rl import stage_summary as rl_summary

    fit = pretrain_stages(cfg.for_pair(*cfg.pairs()[0])).get("state_prompt")
    return {k: v for k, v in {"state_prompt_fit": fit.summary().get("wall_s") if fit is not None else None,
                              "exploration": stage_summary(cfg).get("wall_s"),
                              "rl": rl_summary(cfg).get("wall_s")}.items() if v is not None}


def variant(cfg) -> dict:
    """The settings that say which variant runs were made with, whatever the profile's defaults were at the
    time (``ctrls.report.mechanism.stored_setting`` reads them before the overrides)."""
    return {"state_prompt.use": cfg.state_prompt.use, "state_prompt.with_adapter": cfg.state_prompt.with_adapter,
            "grid.position_floor": cfg.grid.position_floor}


def eps_row(cfg):
    """The epsilon row's samples of a finished run on its own dataset."""
    df = load_samples(cfg)
    return df[(df.dataset == cfg.data.dataset) & (df.config == row_label(cfg.grid.epsilons[0]))]


def against(cfgs, others, trips, seed: int = 0) -> list[dict]:
    """Per data seed, this variant (``cfgs``, its (follows, null, question) ``trips``) minus the other
    (``others``, the same seeds and questions): kappa and the epsilon row's pass@1, Holm over the seeds."""
    out = []
    for cfg, other, trip in zip(cfgs, others, trips):
        r, t = one_seed(other, 5.0, seed)
        out.append({"data_seed": cfg.data.seed, "kappa_other": r["kappa"], "pass1_other": r["pass1"],
                    "kappa_diff": kappa_difference(trip, t, seed=seed),
                    "eps_pass1_diff": paired_pass1(eps_row(cfg), eps_row(other), seed=seed)})
    for key, p in (("kappa_diff", "p_value"), ("eps_pass1_diff", "p")):
        for o, h in zip(out, holm([o[key][p] for o in out])):
            o[key]["p_holm"] = float(h)
    return out


def study(args, cfgs: list, dev: list, others: list) -> dict:
    """The stored result of :func:`main`'s runs: each seed's numbers, the pooled kappa, the development seed and
    the ``--against`` differences."""
    per, pooled, trips = [], ([], [], []), []
    for cfg in cfgs:
        r, (f, n, q) = one_seed(cfg, args.margin)
        per.append(r)
        trips.append((f, n, q))
        pooled[0].extend(f), pooled[1].extend(n), pooled[2].extend(q)
        print({"data_seed": r["data_seed"], "kappa": round(float(r["kappa"]["kappa"]), 3),
               "harm": round(r["harm_fixed_minus_base_pass1"]["diff"], 3)}, flush=True)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    res = {"machine": machine(), "commit": commit or "?", "profile": args.profile, "overrides": args.override,
           "settings": variant(cfgs[0]),
           "margin_points": args.margin, "seeds": per, "pooled_kappa": kappa_vs_null(*pooled),
           "development": [one_seed(cfg, args.margin)[0] for cfg in dev]}
    if others:
        res["against"] = {"overrides": args.against_override, "settings": variant(others[0]), "profile": args.profile,
                          "seeds": against(cfgs, others, trips)}
    return res


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", nargs="+", required=True, metavar="SEED:RUN_DIR")
    ap.add_argument("--dev", default=None, metavar="SEED:RUN_DIR",
                    help="the development run (the seed every choice was made on, the profile's own settings): "
                         "reported beside, outside the pooled kappa")
    ap.add_argument("--dev-override", action="append", default=[], metavar="KEY=VALUE",
                    help="the development run's config overrides (its own, not --override's)")
    ap.add_argument("--profile", default="demo")
    ap.add_argument("-o", "--override", action="append", default=[])
    ap.add_argument("--margin", type=float, default=5.0, help="non-inferiority margin for the harm, in points")
    ap.add_argument("--against", nargs="+", default=None, metavar="SEED:RUN_DIR",
                    help="runs of another variant on the same seeds as --runs, in the same order")
    ap.add_argument("--against-override", action="append", default=[], help="the other variant's overrides (-o)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    runs = []
    for item in [*args.runs, *([args.dev] if args.dev else []), *(args.against or [])]:  # every argument checked before any work
        seed, sep, d = item.partition(":")
        if not sep or not seed.isdigit() or not Path(d).is_dir():
            ap.error(f"--runs and --dev take SEED:RUN_DIR with an existing directory, got {item!r}")
        runs.append((int(seed), d))
    if not 0 < args.margin < 100:
        ap.error(f"--margin must lie in (0, 100) points, got {args.margin}")
    n_runs, n_dev = len(args.runs), int(bool(args.dev))
    given = [s for s, _ in runs[:n_runs + n_dev]]
    twice = sorted({s for s in given if given.count(s) > 1})
    if twice:  # its questions would be counted twice in the pooled kappa and in Holm
        ap.error(f"data seed {twice[0]} is given twice in --runs and --dev; give each seed's run once")
    if args.against and [s for s, _ in runs[n_runs + n_dev:]] != [s for s, _ in runs[:n_runs]]:
        ap.error("--against takes runs of the same data seeds as --runs, in the same order")
    try:
        cfgs = [load_config(args.profile, {**parse_overrides(args.override), "data.seed": s, "run_dir": d})
                for s, d in runs[:n_runs]]
        dev = [load_config(args.profile, {**parse_overrides(args.dev_override), "data.seed": s, "run_dir": d})
               for s, d in runs[n_runs:n_runs + n_dev]]
        others = [load_config(args.profile, {**parse_overrides(args.against_override), "data.seed": s, "run_dir": d})
                  for s, d in runs[n_runs + n_dev:]]
    except ConfigError as e:
        ap.error(str(e))
    from ctrls.stages.common import NotRunError

    try:
        res = study(args, cfgs, dev, others)
    except NotRunError as e:  # a run whose exploration has not finished under these overrides: one line
        ap.exit(1, f"{ap.prog}: error: {' '.join(str(e).split())}\n")
    if args.out:
        write_result(res, args.out)
    return res


if __name__ == "__main__":
    main()
