"""Diagnostic (not a speed benchmark): does a sharper Dirichlet policy make steps follow their state?

The demo samples each step's state a ~ Dir(c p) (Sec. 5.4), c = ``policy.concentration`` (20). The
posteriors the adapter was trained on are sharper than those draws at c = 20, so one candidate reason
why steps do not follow their drawn state is that the adapter is conditioned, at generation, on
mixtures it never saw. This script takes one finished demo pretraining (``--pretrained``, e.g.
``runs/demo`` after ``make book``; else it pretrains the demo once), and runs the exploration stage
(Base and CTRLS at epsilon 0 and 0.1, no transfer rows) once per concentration, the policy's c set
before sampling; everything else is the same model, questions and seeds. It also reports the c that
``policy.fit_concentration`` would fit (maximum likelihood of the training posteriors).

Per c: the controllability table's "follows" (steps whose read-back state is the drawn one) and its
coincidence reference (Base steps against chains drawn from the same policy), each with its 95%
interval, and pass@1 per row. The last line printed is a JSON object; ``--out`` writes it too.
Usage: python studies/concentration.py [--pretrained runs/demo] [--c 1 5 20] [--out studies/results/concentration.json]
"""
from __future__ import annotations

import argparse
import math
import shutil
import subprocess
import sys  # noqa: E402
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))  # bench/common.py
from common import machine, write_result

from ctrls.config.schema import load_config
from ctrls.config.settings import ADAPTER
from ctrls.method.policy import fit_concentration
from ctrls.stages import exploration as ex
from ctrls.stages import sample_tables as tables
from ctrls.stages.pretrain import pretrain, transition_pairs


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pretrained", default=None, help="a demo run directory whose pretrain/ to reuse")
    ap.add_argument("--c", type=float, nargs="+", default=[1.0, 5.0, 20.0])
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="concentration_"))
    over = [*ADAPTER, "grid.transfer_datasets=[]", "grid.epsilons=[0.0,0.1]", "grid.fixed_state=false"]
    base = tmp / "pretrained"
    if args.pretrained:
        shutil.copytree(Path(args.pretrained) / "pretrain", base / "demo" / "pretrain")
    cfg = load_config("demo", [*over, f"run_dir={base}"])
    pair = cfg.for_pair(*cfg.pairs()[0])
    run = pretrain(pair, progress=False)  # reused when --pretrained holds a finished run of this config
    st, L = run.states(), torch.load(run.dir("transitions") / "transitions.pt", weights_only=True)["L"]
    prev, nxt = transition_pairs(st)
    c_fit, fit_info = fit_concentration(prev[~st["heldout"]], nxt[~st["heldout"]], L)
    points = []
    for c in args.c:
        d = tmp / f"c{c:g}"
        shutil.copytree(base, d)
        cfg_c = load_config("demo", [*over, f"run_dir={d}"])
        orig = ex.load_pretrained

        def with_c(pc, bb=None, _c=c):
            m = orig(pc, bb)
            m.policy.log_c.data.fill_(math.log(_c))  # the one thing that differs between the runs
            return m

        ex.load_pretrained = with_c
        t = time.perf_counter()
        try:
            ex.explore(cfg_c, progress=False)
        finally:
            ex.load_pretrained = orig
        df = ex.load_samples(cfg_c)
        ctl = tables.controllability_table(df)
        rows = {}
        for _, r in ctl.iterrows():
            rows[r.config] = {k: float(r[k]) for k in ("follows", "follows lo", "follows hi", "Base, random states",
                                                       "Base, random states lo", "Base, random states hi")}
            rows[r.config]["steps"] = int(r.steps)
        acc = df.groupby("config").correct.agg(["mean", "size"])
        points.append({"c": c, "seconds": time.perf_counter() - t, "controllability": rows,
                       "pass@1": {k: float(v) for k, v in acc["mean"].items()},
                       "samples": {k: int(v) for k, v in acc["size"].items()}})
        print(f"c = {c:g}: " + "; ".join(f"{k}: follows {v['follows']:.3f} vs {v['Base, random states']:.3f}"
                                         for k, v in rows.items()), flush=True)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    res = {"commit": commit, "fitted_c": c_fit, "fit": fit_info, "points": points, "grid": {"profile": "demo", "overrides": over},
           "pretrained": args.pretrained, "command": "python studies/concentration.py --pretrained runs/demo "
           "--out studies/results/concentration.json", "machine": machine()}
    shutil.rmtree(tmp, ignore_errors=True)
    write_result(res, args.out)


if __name__ == "__main__":
    main()
