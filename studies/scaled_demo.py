"""The demo's task at a larger size, on a fresh data seed: pretraining and exploration at ``--scale`` times
the demo's training and test questions, ``--samples`` samples per test question, then the same test numbers
as ``studies/seeds.py`` (kappa against the independent-chain null, the fixed-s0 harm, epsilon - Base) plus
the exploration claim with the adapter held fixed: epsilon - fixed s0 in the unbiased pass@k from the m
samples (Chen et al. 2021), paired by question, with a question-bootstrap interval and the within-question
permutation (sign-flip) test, the design the summary page's power table sizes.

Meant for a GPU (the demo's CPU book runs 60 questions x 4 samples); everything is the demo profile but
the sizes, the seed, ``sampling.batch_size`` and the transfer rows (none: the word problems need no data
directory). Writes ``--out`` (the result, with the device, versions, commit and each stage's seconds) and
``--samples-out`` (every graded sample of the run, one zstd parquet file: the numbers can be recomputed
from it with ``studies/scaled_demo.py --summarise-only``).

Usage (from the repository root):
    python studies/scaled_demo.py --run-dir /tmp/scaled --data-seed 4 --scale 10 --samples 8 \
        --out studies/results/scaled_demo.json --samples-out studies/results/scaled_demo_samples.parquet
"""
from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))  # bench/common.py
sys.path.insert(0, str(Path(__file__).resolve().parent))  # studies/seeds.py
from common import machine, write_result  # noqa: E402
from seeds import one_seed  # noqa: E402

from ctrls.config.overrides import parse_overrides  # noqa: E402
from ctrls.config.schema import load_config  # noqa: E402
from ctrls.config.settings import BASE, FIXED, row_label  # noqa: E402
from ctrls.errors import ConfigError  # noqa: E402
from ctrls.stats.sizing import unbiased_pass_k  # noqa: E402


def paired_pass_k(a, b, k: int, n_boot: int = 4000, n_perm: int = 20000, seed: int = 0) -> dict:
    """Unbiased pass@k of row a minus row b on the same questions (each with m >= k samples): the mean
    per-question difference, a question-bootstrap 95% interval and the sign-flip permutation p (under
    H0 the two arms of a question are exchangeable, so its difference is as likely negative)."""
    ca, cb = a.groupby("question_id").correct.agg(["sum", "size"]), b.groupby("question_id").correct.agg(["sum", "size"])
    cb = cb.reindex(ca.index)
    if cb.isna().any().any() or len(ca) != len(cb):
        raise ValueError("the two rows do not cover the same questions")
    m = int(ca["size"].min())
    if m != int(ca["size"].max()) or (cb["size"] != m).any() or m < k:
        raise ValueError(f"paired pass@{k} needs the same m >= {k} samples per question in both rows")
    pa, pb = unbiased_pass_k(ca["sum"].to_numpy(), m, k), unbiased_pass_k(cb["sum"].to_numpy(), m, k)
    d = pa - pb
    rng = np.random.default_rng(seed)
    boot = d[rng.integers(0, len(d), size=(n_boot, len(d)))].mean(1)
    lo, hi = np.percentile(boot, [2.5, 97.5])
    signs = np.where(rng.random((n_perm, len(d))) < 0.5, -1.0, 1.0)
    p = (1 + (np.abs(signs @ d) >= abs(d.sum()) - 1e-9).sum()) / (1 + n_perm)
    return {"k": k, "samples_per_question": m, "questions": len(d), "a": float(pa.mean()), "b": float(pb.mean()),
            "diff": float(d.mean()), "lo": float(lo), "hi": float(hi), "p": float(p)}


def summarise(cfg, k: int, margin: float) -> dict:
    """The seeds study's numbers for this run, and the unbiased pass@k comparisons (epsilon - fixed s0, the
    claim; epsilon - Base beside it)."""
    from ctrls.stages.exploration import load_samples

    r, _ = one_seed(cfg, margin)
    df = load_samples(cfg)
    df = df[df.dataset == cfg.data.dataset]
    eps = row_label(cfg.grid.epsilons[0])
    row, fixed, base = df[df.config == eps], df[df.config == FIXED], df[df.config == BASE]
    r[f"eps_minus_fixed_pass{k}"] = paired_pass_k(row, fixed, k)
    r[f"eps_minus_base_pass{k}"] = paired_pass_k(row, base, k)
    return r


def device() -> dict:
    """The machine, with the GPU where there is one (bench/common.py's record plus the accelerator)."""
    import torch
    import transformers

    m = machine()
    if torch.cuda.is_available():
        m["gpu"] = torch.cuda.get_device_name(0)
        m["cuda"] = torch.version.cuda
    m["transformers"] = transformers.__version__
    m["python"] = platform.python_version()
    return m


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--run-dir", required=True)
    ap.add_argument("--data-seed", type=int, default=4, help="a seed no choice was made on (the choices: seed 0)")
    ap.add_argument("--scale", type=int, default=10, help="times the demo's training and test questions")
    ap.add_argument("--samples", type=int, default=8, help="samples per test question (grid.n_samples)")
    ap.add_argument("--k", type=int, default=4, help="the k of the unbiased pass@k compared")
    ap.add_argument("--batch-size", type=int, default=1024, help="sampling.batch_size (rows decoded at once)")
    ap.add_argument("--margin", type=float, default=5.0, help="non-inferiority margin for the harm, in points")
    ap.add_argument("--commit", default=None, help="the commit (where the copy has no .git)")
    ap.add_argument("-o", "--override", action="append", default=[], help="more config overrides")
    ap.add_argument("--summarise-only", action="store_true", help="read the finished run; run no stage")
    ap.add_argument("--out", default=None)
    ap.add_argument("--samples-out", default=None)
    args = ap.parse_args(argv)
    if args.scale < 1 or args.samples < 1 or not 1 <= args.k <= args.samples or args.batch_size < 1:
        ap.error(f"need --scale >= 1, --samples >= 1, 1 <= --k <= --samples and --batch-size >= 1, got "
                 f"{args.scale}, {args.samples}, {args.k}, {args.batch_size}")
    if not 0 < args.margin < 100:
        ap.error(f"--margin must lie in (0, 100) points, got {args.margin}")
    demo = load_config("demo")
    sizes = {"data.seed": args.data_seed, "data.n_train": demo.data.n_train * args.scale,
             "data.n_test": demo.data.n_test * args.scale, "grid.n_samples": args.samples,
             "grid.transfer_datasets": [], "sampling.batch_size": args.batch_size}
    try:
        cfg = load_config("demo", {**sizes, **parse_overrides(args.override), "run_dir": str(Path(args.run_dir).resolve())})
    except ConfigError as e:
        ap.error(str(e))
    seconds = {}
    if not args.summarise_only:
        from ctrls.stages.exploration import explore
        from ctrls.stages.pretrain import pretrain

        t0 = time.time()
        for b, d in cfg.pairs():
            pretrain(cfg.for_pair(b, d), progress=True)
        seconds["pretrain"] = round(time.time() - t0, 1)
        t0 = time.time()
        explore(cfg, progress=True)
        seconds["exploration"] = round(time.time() - t0, 1)
        print(f"stages: {seconds}", flush=True)
    res = {"machine": device(), "commit": args.commit or _commit(), "profile": "demo",
           "overrides": {**sizes, **parse_overrides(args.override)}, "margin_points": args.margin,
           "seconds": seconds, "result": summarise(cfg, args.k, args.margin)}
    if args.samples_out:
        from ctrls.stages.exploration import load_samples

        df = load_samples(cfg)
        Path(args.samples_out).parent.mkdir(parents=True, exist_ok=True)
        df.to_parquet(args.samples_out, compression="zstd", index=False)
        res["samples_file"] = Path(args.samples_out).name
        res["samples_rows"] = len(df)
    write_result(res, args.out)
    return res


def _commit() -> str:
    from ctrls.report.provenance import git_commit

    c = git_commit()
    return c if c and c != "unknown" else "?"


if __name__ == "__main__":
    main()
