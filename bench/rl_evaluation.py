"""The RL stage's evaluations drawn with the next step's training samples (``run_lockstep``'s
``sample_and_evaluate``, the default in lockstep) against decoded apart (the previous way), side by
side in one process: the RL stage at the profile's sizes except ``--steps`` and ``--eval-every`` (so that
some evaluations fall before more training), on a run directory whose pretraining and exploration
are done (``ctrls stage pretrain exploration --run-dir DIR``). Prints wall seconds and phase times of
both, their ratio, whether the curves and Table 2 samples are equal, and the machine.

Usage: python bench/rl_evaluation.py --run-dir DIR [--profile demo] [--steps 4] [--eval-every 2] [--out F]
"""
from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

import pandas as pd
from common import machine, write_result

import ctrls.stages.rl as R
from ctrls.config.overrides import parse_overrides
from ctrls.config.schema import load_config
from ctrls.config.settings import ADAPTER


def timed(cfg, merged: bool) -> tuple[float, dict]:
    real = R.run_lockstep

    def apart(*a, sample_and_evaluate=None, **k):  # the previous way: every evaluation its own decode
        return real(*a, **k)

    R.run_lockstep = real if merged else apart
    try:
        t0 = time.perf_counter()
        out = R.run_rl(cfg, force=True, progress=False)
        wall = time.perf_counter() - t0
    finally:
        R.run_lockstep = real
    return wall, R.rl_stage(cfg).summary()["profile_s"] | {"_dir": str(out)}


def frames(d: Path) -> dict[str, pd.DataFrame]:
    # table2.parquet/ is a folder
    return {str(f.relative_to(d)): pd.read_parquet(f) for f in sorted(d.rglob("*.parquet")) if f.is_file()}


def same(a: pd.DataFrame, b: pd.DataFrame) -> bool:
    """Equal frames, floats to 1e-4 (a batch of other rows may round a GEMM differently in the last bits)."""
    try:
        pd.testing.assert_frame_equal(a, b, check_exact=False, rtol=1e-4, atol=1e-6)
    except AssertionError:
        return False
    return True


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--run-dir", required=True, help="a run directory with pretraining and exploration done")
    ap.add_argument("--profile", default="demo")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--eval-every", type=int, default=2)
    ap.add_argument("-o", "--override", action="append", default=[])
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    src = Path(args.run_dir) / args.profile
    if not (src / "pretrain").is_dir() or not (src / "exploration").is_dir():
        ap.error(f"--run-dir {args.run_dir}: no finished pretraining and exploration under {src}")
    res = {}
    with tempfile.TemporaryDirectory() as tmp:
        out = {}
        for name, merged in (("apart", False), ("merged", True)):
            d = Path(tmp) / name
            for stage in ("pretrain", "exploration"):
                shutil.copytree(src / stage, d / args.profile / stage, symlinks=True)
            # the adapter's RL, unless overridden
            cfg = load_config(args.profile, {**parse_overrides(ADAPTER), **parse_overrides([
                *args.override, f"rl.steps={args.steps}", f"rl.eval_every={args.eval_every}", f"run_dir={d}"])})
            wall, prof = timed(cfg, merged)
            out[name] = frames(Path(prof.pop("_dir")))
            res[f"{name}_s"], res[f"{name}_phases_s"] = round(wall, 1), prof
    res.update(speedup=round(res["apart_s"] / res["merged_s"], 3),
               equal=(out["apart"].keys() == out["merged"].keys()
                      and all(same(v, out["merged"][k]) for k, v in out["apart"].items())),
               profile=args.profile, steps=args.steps, eval_every=args.eval_every, overrides=args.override,
               machine=machine())
    write_result(res, args.out)
    return res


if __name__ == "__main__":
    main()
