"""Where the static path's captured step spends its GPU time, against the engine's eager body: the
torch profiler's top CUDA kernels for a short decode of a full-size random-weight backbone at the
paper's batch (8 prompts x 20 samples), static + ``reduce-overhead`` (after one compiling run) and
engine. Run with ``TORCH_LOGS=perf_hints`` to see whether inductor skipped the CUDA graphs.

    TORCH_LOGS=perf_hints python bench/gpu/graph_profile.py --new 32 > prof.log   # on a CUDA machine, ~2 min
    python bench/gpu/graph_profile.py --from-log prof.log --new 32 --out bench/results/graph_profile.json

``--from-log`` reads such a log back (``parse_log``): per path its milliseconds per iteration, the part
inside the body or step, and each listed kernel's self CUDA time per decode step.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
for p in (HERE.parents[1], HERE.parent, HERE):  # ctrls, bench/ (common), bench/gpu/ (gpuest)
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

HEAD = re.compile(r"^== (\w+) \(([\w-]+)\): ([\d.]+) ms/iteration, inside ([\d.]+)")


def _ms(x: str) -> float:
    return float(x[:-2]) if x.endswith("ms") else float(x[:-2]) / 1e3 if x.endswith("us") else float(x[:-1]) * 1e3


def parse_log(text: str, new: int) -> dict:
    """The numbers of a ``graph_profile`` log: per path (``static``, ``engine``) ms per iteration, ms inside
    (body or step), and each listed row's self CUDA ms per decode step (``new - 1`` steps; the table's
    ``Self CUDA`` column over the steps) with its call count."""
    out, cur = {}, None
    for line in text.splitlines():
        m = HEAD.match(line)
        if m:
            cur = out[m.group(1)] = {"compile": m.group(2), "ms_per_iteration": float(m.group(3)),
                                     "inside_ms_per_iteration": float(m.group(4)), "rows": []}
            continue
        f = re.split(r"\s{2,}", line.strip())
        if cur is not None and len(f) == 11 and f[-1].isdigit():
            cur["rows"].append({"name": f[0], "self_cuda_ms_per_step": _ms(f[6]) / (new - 1), "calls": int(f[-1])})
        elif cur is not None and line.startswith("Self CUDA time total:"):
            cur["self_cuda_ms_per_step"] = _ms(line.split(":")[1].strip()) / (new - 1)
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--backbone", default="Qwen/Qwen2.5-3B-Instruct")
    ap.add_argument("--new", type=int, default=32)
    ap.add_argument("--rows-per-prompt", type=int, default=20)
    ap.add_argument("--top", type=int, default=15)
    ap.add_argument("--tokenizer", default=str(HERE.parents[1] / ".cache" / "smollm2-tokenizer"))
    ap.add_argument("--from-log", nargs="+", help="parse these logs (one each) instead of profiling")
    ap.add_argument("--labels", nargs="+", help="a label for each log (default: the file names)")
    ap.add_argument("--commits", nargs="+", help="the commit each log was made at (a log does not name it)")
    ap.add_argument("--out", help="JSON of the parsed logs")
    args = ap.parse_args(argv)
    if args.from_log:
        labels = args.labels or [Path(f).stem for f in args.from_log]
        res = {"new_tokens": args.new, "backbone": args.backbone,
               "runs": {lab: parse_log(Path(f).read_text(), args.new) for lab, f in zip(labels, args.from_log)},
               "commits": dict(zip(labels, args.commits or []))}
        if args.out:
            from common import write_json

            write_json(args.out, res)  # whole, and a NaN (a log's 'nan ms') refused naming its field
        else:
            print(json.dumps(res, indent=1, allow_nan=False))
        return
    import torch
    from gpuest.models import build_backbone, calibrate_newline_bias, load_tokenizer
    from graph_check import prompts_for, run
    from torch.profiler import ProfilerActivity, profile

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
