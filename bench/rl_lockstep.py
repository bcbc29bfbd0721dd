"""The RL stage of S fresh training runs in lockstep (``ctrls.stages.rl.run_rl_lockstep``: every run's decodes
in one batch over the frozen backbone's passes) against the same S stages one after another (``run_rl``), side
by side in one run.

Each run is a seed of the seeds study (``studies/seeds_study.py run`` makes them under ``runs/seeds/<seed>``):
its own pretraining (Q_phi, policy, state-prompt vectors, position mask), copied into a scratch run directory
for each mode so that both start from the same files. The study's RL (the demo's two Table 2 settings, one RL
seed, 24 test questions x 4 samples for Table 2) with ``rl.steps`` cut to ``--steps`` (a reduced grid: the
per-step work is the study's). Reported per S: seconds per run in each mode, the ratio, and whether both
modes wrote the same curves and Table 2 samples (rows equal at rtol 1e-4). The modes alternate which runs
first, after an untimed warm-up
(one seed's RL at one step); the machine's 128 x 576 x 1536 fp32 GEMM rate is measured at the start.
Usage: python bench/rl_lockstep.py [--from runs/seeds] [--seeds 100 101 102 103] [--runs 4 1] [--steps 2]
       [--out bench/results/rl_lockstep.json]
"""
from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
from common import machine, write_result

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "studies"))


def configs(src: Path, seeds: list[int], root: Path, steps: int) -> list:
    """The seeds' study configs with their RL cut to ``steps``, each in a run directory under ``root`` holding a
    copy of the seed's pretraining."""
    from seeds_study import PROFILE, config

    from ctrls.config.schema import override

    out = []
    for s in seeds:
        shutil.copytree(src / str(s) / PROFILE / "pretrain", root / str(s) / PROFILE / "pretrain")
        out.append(override(config(s, root), {"rl.steps": steps}))
    return out


def same_results(a: Path, b: Path) -> bool:
    files = sorted(a.rglob("*.parquet"))
    try:
        for f in files:
            pd.testing.assert_frame_equal(pd.read_parquet(f), pd.read_parquet(b / f.relative_to(a)),
                                          check_exact=False, rtol=1e-4, atol=1e-6)
    except AssertionError:
        return False
    return bool(files)


def main():
    from ctrls.config.schema import override
    from ctrls.method.backbone import gemm_gflops
    from ctrls.stages.rl import run_rl, run_rl_lockstep

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--from", dest="src", default="runs/seeds")
    ap.add_argument("--seeds", type=int, nargs="+", default=[100, 101, 102, 103])
    ap.add_argument("--runs", type=int, nargs="+", default=[4, 1])
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    src = Path(args.src)
    missing = [s for s in args.seeds[:max(args.runs)] if not (src / str(s)).is_dir()]
    if missing:
        raise SystemExit(f"no pretrained seed {missing[0]} under {src}: run studies/seeds_study.py run first")
    gemm = gemm_gflops()
    with tempfile.TemporaryDirectory() as tmp:  # warm-up, untimed: the backbone's files, threads, the allocator
        run_rl(override(configs(src, args.seeds[:1], Path(tmp), 1)[0], {"rl.n_test": 2}), progress=False)
    rows = []
    for i, n in enumerate(args.runs):
        seeds = args.seeds[:n]
        timed, dirs = {}, {}
        with tempfile.TemporaryDirectory() as tmp:
            for mode in (("sequential", "lockstep") if i % 2 == 0 else ("lockstep", "sequential")):
                root = Path(tmp) / mode
                cfgs = configs(src, seeds, root, args.steps)
                t = time.perf_counter()
                if mode == "lockstep":
                    run_rl_lockstep(cfgs, progress=False)
                else:
                    for c in cfgs:
                        run_rl(c, progress=False)
                timed[mode], dirs[mode] = time.perf_counter() - t, root
            same = all(same_results(dirs["sequential"] / str(s), dirs["lockstep"] / str(s)) for s in seeds)
        seq, lock = timed["sequential"], timed["lockstep"]
        rows.append({"runs": n, "seeds": seeds, "sequential_seconds": round(seq, 1), "lockstep_seconds": round(lock, 1),
                     "sequential_seconds_per_run": round(seq / n, 1), "lockstep_seconds_per_run": round(lock / n, 1),
                     "speedup": round(seq / lock, 2), "same_results": same})
        print(f"S={n}: sequential {seq:.0f} s, lockstep {lock:.0f} s ({seq / lock:.2f}x), same results: {same}", flush=True)
        # written after every S: a stopped run keeps what it measured
        write_result({"results": rows, "rl_steps": args.steps, "gemm_gflops": gemm, "machine": machine(),
                      "command": f"python bench/rl_lockstep.py --runs {' '.join(map(str, args.runs))} --steps {args.steps} "
                                 "--out bench/results/rl_lockstep.json"}, args.out)


if __name__ == "__main__":
    main()
