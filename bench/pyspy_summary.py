"""Where a stage's time goes, from a py-spy sampling profile: the share of samples under each frame
(inclusive, each frame counted once per stack), the top ``--top``, written as JSON beside the command
that recorded it.

Record, then summarise (from the repository root, while the stage runs in another shell):
    py-spy record -p PID -d 90 -r 20 -f raw -o /tmp/stage.txt
    python bench/pyspy_summary.py /tmp/stage.txt --what "RL training decode, demo profile" \
        --out bench/results/rl_profile_demo.json
"""
from __future__ import annotations

import argparse
import os
import re
from collections import Counter

from common import machine, write_result

FRAME = re.compile(r"^(.*) \((.*?):(\d+)\)$")  # py-spy's "function (path:line)"


def frame_name(f: str) -> str:
    """``function file.py:line`` of a py-spy frame (the path's last part)."""
    m = FRAME.match(f)
    return f"{m[1]} {os.path.basename(m[2])}:{m[3]}" if m else f


def shares(lines, top: int = 40) -> tuple[int, list[tuple[str, float]]]:
    """(samples, [(frame, inclusive share)]) of py-spy's raw format: ``frame;frame;... count`` per line."""
    total, incl = 0, Counter()
    for line in lines:
        line = line.strip()
        if not line:
            continue
        stack, _, n = line.rpartition(" ")
        if n.isdigit() and not stack:  # a sample with no Python frame (a native thread)
            stack = "(no Python frame)"
        if not stack or not n.isdigit():
            raise ValueError(f"not a py-spy raw line: {line[:80]!r}")
        total += int(n)
        for frame in dict.fromkeys(frame_name(f) for f in stack.split(";")):
            incl[frame] += int(n)
    if not total:
        raise ValueError("no samples")
    return total, [(f, round(c / total, 4)) for f, c in incl.most_common(top)]


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("raw", help="py-spy record -f raw output")
    ap.add_argument("--what", required=True, help="what was profiled (stage, profile, phase)")
    ap.add_argument("--threads", type=int, required=True, help="the profiled process's torch threads")
    ap.add_argument("--top", type=int, default=40)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    with open(args.raw) as f:
        total, top = shares(f, args.top)
    res = {"what": args.what, "samples": total, "profiled_torch_threads": args.threads, "inclusive_share": dict(top),
           "machine": {k: v for k, v in machine().items() if k != "threads"}}
    write_result(res, args.out)
    return res


if __name__ == "__main__":
    main()
