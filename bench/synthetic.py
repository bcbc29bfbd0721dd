"""The synthetic study's runs in worker processes (``ctrls.stages.synthetic``, one per core) against the
same runs one after another in this process, side by side in one run at the profile's sizes (the demo's:
72 runs x 200 steps): wall seconds of each, their ratio, whether the curves are equal, and the machine.

Usage (from the repository root): python bench/synthetic.py [--profile demo] [--out bench/results/synthetic.json]
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time

from common import machine, write_result

from ctrls.config.schema import load_config
from ctrls.stages import synthetic as stage


def timed(profile: str, run_dir: str, workers: int) -> tuple[float, object]:
    cfg = load_config(profile, [f"run_dir={run_dir}"])
    t0 = time.perf_counter()
    stage.run_study(cfg, force=True, progress=False, workers=workers)
    return time.perf_counter() - t0, stage.load_curves(cfg)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--profile", default="demo")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    workers = os.cpu_count() or 1
    with tempfile.TemporaryDirectory() as d:
        seq_s, a = timed(args.profile, f"{d}/one", 1)
        par_s, b = timed(args.profile, f"{d}/many", workers)
    cfg = load_config(args.profile)
    res = {"machine": machine(), "profile": args.profile, "runs": len(stage.study_runs(cfg)),
           "steps": cfg.synthetic.steps, "workers": workers, "one_process_s": round(seq_s, 1),
           "workers_s": round(par_s, 1), "speedup": round(seq_s / par_s, 2), "curves_equal": bool(a.equals(b))}
    write_result(res, args.out)
    return res


if __name__ == "__main__":
    main()
