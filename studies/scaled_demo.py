"""The demo's task at a larger size, on a fresh data seed: pretraining and exploration at ``--scale`` times
the demo's training and test questions, ``--samples`` samples per test question, then the test numbers of
``ctrls.stages.sample_tables.run_numbers`` (kappa against the independent-chain null, the fixed-s0 harm, and the
exploration claim with the adapter held fixed: epsilon - fixed s0 in the unbiased pass@k from the m samples,
paired by question, with a question-bootstrap interval and the sign-flip test, the design the summary
page's power table sizes; epsilon - Base beside it). The first page shows the stored result beside the
book's own run.

Meant for a GPU (the demo's CPU book runs 60 questions x 4 samples); everything is the demo profile but
the sizes, the seed, ``sampling.batch_size`` and the transfer rows (none: the word problems need no data
directory). Writes ``--out`` (the result, with the device, versions, commit and each stage's seconds) and
``--samples-out`` (every graded sample of the run, one zstd parquet file: the numbers can be recomputed
from it with ``studies/scaled_demo.py --summarise-only``).

Stored: ``studies/results/scaled_demo_h200.json`` and its samples (one H200, data seed 4, 640 training and
600 test questions x 8 samples: pretraining 99 s, exploration 176 s).

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

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))  # bench/common.py
from common import machine, write_result  # noqa: E402

from ctrls.config.overrides import parse_overrides  # noqa: E402
from ctrls.config.schema import load_config  # noqa: E402
from ctrls.config.settings import ADAPTER  # noqa: E402
from ctrls.errors import ConfigError  # noqa: E402
from ctrls.stages.sample_tables import run_numbers  # noqa: E402


def summarise(cfg, k: int, margin: float) -> dict:
    """``ctrls.stages.sample_tables.run_numbers`` of this run's samples (the dataset's own questions)."""
    from ctrls.stages.exploration import load_samples

    df = load_samples(cfg)
    return run_numbers(df[df.dataset == cfg.data.dataset], cfg.grid.epsilons[0], k, margin)


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
        cfg = load_config("demo", {**parse_overrides(ADAPTER), **sizes, **parse_overrides(args.override),
                                   "run_dir": str(Path(args.run_dir).resolve())})
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
        tmp = Path(args.samples_out).with_name(f".{Path(args.samples_out).name}.tmp")
        df.to_parquet(tmp, compression="zstd", index=False)
        tmp.replace(args.samples_out)  # whole or not at all, as the JSON beside it
        res["samples_file"] = Path(args.samples_out).name
        res["samples_rows"] = len(df)
    write_result(res, args.out)
    return res


def _commit() -> str:
    from ctrls.method.backbone import git_commit

    c = git_commit()
    return c if c and c != "unknown" else "?"


if __name__ == "__main__":
    main()
