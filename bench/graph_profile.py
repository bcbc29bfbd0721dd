"""Where the static path's captured step spends its GPU time, against the engine's eager body: the
torch profiler's top CUDA kernels for a short decode of a full-size random-weight backbone at the
paper's batch (8 prompts x 20 samples), static + ``reduce-overhead`` (after one compiling run) and
engine. Run with ``TORCH_LOGS=perf_hints`` to see whether inductor skipped the CUDA graphs.

    TORCH_LOGS=perf_hints python bench/graph_profile.py --new 32      # on a CUDA machine, ~2 min
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
for p in (HERE.parent, HERE):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

from graph_check import prompts_for, run  # noqa: E402
from gpuest.models import build_backbone, calibrate_newline_bias, load_tokenizer  # noqa: E402


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--backbone", default="Qwen/Qwen2.5-3B-Instruct")
    ap.add_argument("--new", type=int, default=32)
    ap.add_argument("--rows-per-prompt", type=int, default=20)
    ap.add_argument("--top", type=int, default=15)
    ap.add_argument("--tokenizer", default=str(HERE.parent / ".cache" / "smollm2-tokenizer"))
    args = ap.parse_args(argv)
    dev = torch.device("cuda")
    tok = load_tokenizer(args.tokenizer)
    bb = build_backbone(args.backbone, tok, dev, torch.bfloat16, False)
    prompts, starts = prompts_for(tok, 8)
    calibrate_newline_bias(bb, prompts, 30.0)
    n = args.rows_per_prompt
    run(bb, prompts, starts, n, args.new, None, "static", "reduce-overhead")  # compile and capture
    run(bb, prompts, starts, n, args.new, None, "engine", "none")  # warm
    for decode, comp in (("static", "reduce-overhead"), ("engine", "none")):
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            rec = run(bb, prompts, starts, n, args.new, None, decode, comp, parts=True)[0]
        print(f"\n== {decode} ({comp}): {1e3 * rec['s_per_iteration']:.1f} ms/iteration, inside "
              f"{1e3 * rec['inside_s'] / args.new:.1f} ms")
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=args.top, max_name_column_width=60))


if __name__ == "__main__":
    main()
