"""Does the state steer the step, and at what cost? Steering and harm against the number of training chains.

For each number of training questions N (reference chains, or the model's own correct chains, by
``--sources``), this runs pretraining and the exploration grid (Base, fixed s0, epsilon rows) on the
demo profile into a scratch run directory and records, from the exploration samples:
- steering: the epsilon row's fraction of steps whose read-back state equals the state they were drawn
  for ("follows"), against its coincidence reference (Base steps paired with chains drawn by the same
  policy), with 95% intervals (``ctrls.stages.sample_tables.controllability_table``);
- harm: pass@1 (per sample) of the fixed-s0 row, and of the epsilon row, minus Base's, with a paired
  95% bootstrap interval over questions (``harm``); each row's pass@1 with its Wilson interval at the
  question-clustered effective size (``pass1``).

Usage (from the repository root):
    .venv/bin/python studies/steering.py --chains 75 300 1200 --out studies/results/steering_scaling.json
    .venv/bin/python studies/steering.py --chains 300 -o adapter.fusion=mlp     # one variant
    .venv/bin/python studies/steering.py --chains 64 --sources samples,reference \
        -o states.n_states=4 data.n_test=40 adapter.fusion=mlp --out studies/results/steering_fusion.json  # F_u an MLP
    .venv/bin/python studies/steering.py --chains 64 --sources samples,reference --n-states 4 8 16 \
        -o data.n_test=40 --out studies/results/steering_states.json             # the K sweep (pretraining page)
``--append`` keeps the points already in ``--out`` and adds the new ones (a sweep run in parts).
Prints one JSON line per point and writes them all, with the machine and the commit, to ``--out`` (each
point also records its own commit and the adapter's fusion, ``adapter.fusion``).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))  # bench/common.py
from common import machine, write_result  # noqa: E402

from ctrls.config.schema import load_config  # noqa: E402
from ctrls.config.settings import ADAPTER  # noqa: E402
from ctrls.stages import sample_tables as tables  # noqa: E402
from ctrls.stages.exploration import explore, load_samples  # noqa: E402
from ctrls.stages.pretrain import pretrain  # noqa: E402
from ctrls.stats.metrics import rate_interval  # noqa: E402


def pass1(df, config: str) -> dict:
    """pass@1 (per sample) of one row, Wilson at the question-clustered effective size."""
    g = df[df.config == config]
    per_q = g.groupby("question_id").correct.agg(["sum", "count"])
    r = rate_interval(per_q["sum"].to_numpy(), per_q["count"].to_numpy())
    return {"rate": r["rate"], "lo": r["lo"], "hi": r["hi"], "questions": len(per_q), "samples": int(per_q["count"].sum())}


def harm(df, config: str, n_boot: int = 2000, seed: int = 0) -> dict:
    """pass@1 of ``config`` minus Base's, with a 95% percentile bootstrap interval over questions (paired)."""
    g = df[df.config.isin([config, "Base"])]
    m = g.groupby(["question_id", "config"]).correct.mean().unstack()
    d = (m[config] - m["Base"]).to_numpy()
    idx = np.random.default_rng(seed).integers(0, len(d), (n_boot, len(d)))
    boots = d[idx].mean(1)
    return {"diff": float(d.mean()), "lo": float(np.quantile(boots, 0.025)), "hi": float(np.quantile(boots, 0.975))}


def rows(df, ctl) -> dict:
    """Every row of the grid: pass@1 and Succ. (Wilson, question-clustered) and, for the rows that draw
    states, follows-its-state and its coincidence reference with 95% intervals. With
    ``-o "grid.epsilons=[0.0,0.1,1.0]"`` these are the generation controls: the prompt's state at every
    step (fixed s0), a prior draw (epsilon 0), the policy's row (0.1) and a uniformly random state
    (epsilon 1: every draw from Dir(1, ..., 1))."""
    out = {}
    for c in df.config.unique():
        g = df[df.config == c]
        per_q = g.groupby("question_id").valid.agg(["sum", "count"])
        v = rate_interval(per_q["sum"].to_numpy(), per_q["count"].to_numpy())
        r = {"pass1": pass1(df, c), "succ": {"rate": v["rate"], "lo": v["lo"], "hi": v["hi"]}}
        t = ctl[ctl.config == c]
        if len(t):
            t = t.iloc[0]
            r["follows"] = {"rate": t["follows"], "lo": t["follows lo"], "hi": t["follows hi"], "steps": int(t.steps)}
            r["coincidence"] = {"rate": t["Base, random states"], "lo": t["Base, random states lo"],
                                "hi": t["Base, random states hi"]}
        out[c] = r
    return out


COMMIT = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()


OWN_KEYS = ("run_dir", "data.n_train", "pretrain.sources", "grid.transfer_datasets", "grid.fixed_state")  # set per point


def point_overrides(n: int, sources: str, overrides: list[str], run_dir: str) -> list[str]:
    """The demo profile's overrides of one point: the adapter's conditioning (``ADAPTER``: the study is the
    adapter's), this study's own keys (``OWN_KEYS``), then the user's."""
    return [*ADAPTER, f"run_dir={run_dir}", f"data.n_train={n}", f"pretrain.sources=[{sources}]", "grid.transfer_datasets=[]",
            "grid.fixed_state=true"] + overrides


def point(n: int, sources: str, overrides: list[str], run_dir: str) -> dict:
    ov = point_overrides(n, sources, overrides, run_dir)
    cfg = load_config("demo", ov)
    t = time.perf_counter()
    run = pretrain(cfg, progress=False)
    t_pre = time.perf_counter() - t
    explore(cfg, progress=False)
    t_exp = time.perf_counter() - t - t_pre
    df = load_samples(cfg)
    df = df[df.dataset == cfg.data.dataset]
    ctl = tables.controllability_table(df)
    cand = ctl[ctl.config != tables.FIXED]  # the epsilon row nearest rl.epsilon (the demo's one row: 0.1)
    eps = cand.loc[(cand.config.str.extract(r"eps=([0-9.]+)")[0].astype(float) - cfg.rl.epsilon).abs().idxmin()]
    fixed = ctl[ctl.config == tables.FIXED].iloc[0]
    a = run.summaries["adapter"]
    return {"train_questions": n, "sources": sources, "overrides": overrides,
            "chains": run.summaries["collect"]["kept"], "steps": run.summaries["states"]["train_steps"],
            "K": int(eps.K), "fusion": cfg.adapter.fusion, "commit": COMMIT,
            "adapter": {k: a.get(k) for k in ("epochs_run", "kept_epoch", "optimizer_steps")},
            "eps_row": eps.config, "follows": eps["follows"], "follows_lo": eps["follows lo"], "follows_hi": eps["follows hi"],
            "coincidence": eps["Base, random states"], "coincidence_lo": eps["Base, random states lo"],
            "coincidence_hi": eps["Base, random states hi"],
            "fixed_follows": fixed["follows"], "fixed_coincidence": fixed["Base, random states"],
            "pass1": {c: pass1(df, c) for c in df.config.unique()},
            "harm_fixed_s0": harm(df, tables.FIXED), "harm_eps": harm(df, eps.config),
            "rows": rows(df, ctl),
            "seconds": {"pretrain": round(t_pre, 1), "exploration": round(t_exp, 1)}}


def check_args(a) -> None:
    """Every argument and every point's config, or SystemExit with one line naming the first bad one: all
    before the first point runs (a bad second point was found after the first had run for minutes; a bad
    override was a ConfigError traceback)."""
    def refuse(msg):
        raise SystemExit(f"steering.py: {msg}")

    for flag, vals, low in (("--chains", a.chains, 1), ("--n-states", a.n_states or [], 2)):
        if any(v < low for v in vals) or len(set(vals)) < len(vals):
            refuse(f"{flag} {' '.join(map(str, vals))}: give distinct integers >= {low}")
    src = [x.strip() for x in a.sources.split(",")]
    if not a.sources.strip() or any(x not in ("samples", "reference") for x in src) or len(set(src)) < len(src):
        refuse(f"--sources {a.sources!r}: give reference, samples or samples,reference")
    own = [*OWN_KEYS, *(["states.n_states"] if a.n_states else [])]
    for item in a.override:
        if item.split("=", 1)[0].strip() in own:
            refuse(f"-o {item}: this study sets {item.split('=', 1)[0].strip()} itself for every point "
                   f"(--chains, --sources, --n-states, --run-dir)")
    if a.append and not a.out:
        refuse("--append needs --out (the result to add points to)")
    if a.append and Path(a.out).exists():
        try:
            if not isinstance(json.loads(Path(a.out).read_text())["points"], list):
                raise TypeError("points is not a list")
        except (OSError, ValueError, KeyError, TypeError) as e:
            refuse(f"--append: {a.out} is not a readable result with a list of points ({type(e).__name__}: {e})")
    for n, K, ov, rd in points_of(a, a.run_dir or tempfile.gettempdir()):  # the scratch directory is made after
        try:
            load_config("demo", point_overrides(n, a.sources, ov, rd))
        except ValueError as e:  # ConfigError: every point's, before the first runs
            refuse(f"the point of {n} chains{'' if K is None else f' at K = {K}'}: {e}")


def points_of(a, run_dir: str) -> list[tuple[int, int | None, list[str], str]]:
    """(chains, K, overrides, run directory) of every point: each K in its own directory."""
    return [(n, K, *((a.override, run_dir) if K is None else ([*a.override, f"states.n_states={K}"], f"{run_dir}/K{K}")))
            for n in a.chains for K in a.n_states or [None]]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--chains", type=int, nargs="+", default=[75, 300, 1200], help="training questions per point")
    ap.add_argument("--sources", default="reference", help="pretrain.sources: reference, samples or samples,reference")
    ap.add_argument("-o", "--override", nargs="*", default=[], help="more config overrides (demo profile)")
    ap.add_argument("--n-states", type=int, nargs="+", default=None,
                    help="K per point (states.n_states; each K in its own run directory); default: the profile's")
    ap.add_argument("--run-dir", default=None, help="scratch run directory (default: a temporary one)")
    ap.add_argument("--out", default=None)
    ap.add_argument("--append", action="store_true", help="keep the points already in --out")
    a = ap.parse_args(argv)
    check_args(a)  # every argument and every point's config, before any work
    run_dir = a.run_dir or tempfile.mkdtemp(prefix="ctrls-steering-")
    points = []
    if a.append and a.out and Path(a.out).exists():
        points = json.loads(Path(a.out).read_text())["points"]
    for n, _, ov, rd in points_of(a, run_dir):
        p = point(n, a.sources, ov, rd)
        print(json.dumps(p), flush=True)
        points.append(p)
        # written after every point, so a long sweep that is stopped keeps the points it finished
        write_result({"bench": "steering", "profile": "demo", "commit": COMMIT, "machine": machine(),
                      "sources": a.sources, "points": points}, a.out)


if __name__ == "__main__":
    main()
