"""What ``backbone.dtype: auto`` measures and what it changes on this CPU.

1. The GEMM probe that ``auto`` runs (``ctrls.method.backbone.probe_gemm``, measured afresh here, not read
   from the probe file): GFLOP/s of square products in float32 and bfloat16, and the dtype ``auto``
   picks from them (bfloat16 only where it is at least ``BF16_MARGIN`` times faster).
2. The decode tokens/s of the embedded SmolLM2-135M in float32 and in bfloat16, side by side in this
   run: the engine's Base sampling at a forced length (``bench/sampling.py``'s ``ours``), after one
   warm-up per dtype, the dtypes alternating over ``--rounds`` rounds, the best round of each.

Other jobs on the machine slow both: the JSON records the load average before and after.
Usage: python bench/dtype.py [--threads N] [--batch 32] [--new 16] [--rounds 2] [--out bench/results/dtype.json]
"""
import argparse
import os
import time

import torch
from common import QUESTIONS, machine, write_result
from sampling import ours

from ctrls.method.backbone import BF16_MARGIN, load_backbone, probe_gemm

DTYPES = ("float32", "bfloat16")


def bf16_flags() -> list[str]:
    """The CPU's bfloat16 instruction flags (/proc/cpuinfo): avx512_bf16, amx_bf16, ... (empty: none)."""
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("flags"):
                return sorted(f for f in line.split(":", 1)[1].split() if "bf16" in f)
    except OSError:
        pass
    return []


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, help="torch threads (default: torch's)")
    ap.add_argument("--batch", type=int, default=32, help="rows decoded together")
    ap.add_argument("--new", type=int, default=16, help="forced new tokens per row")
    ap.add_argument("--rounds", type=int, default=2, help="timed decodes per dtype (alternating); the best is kept")
    ap.add_argument("--out", help="also write the JSON object here")
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    res = {"machine": {**machine(), "cpu_bf16_flags": bf16_flags()}}
    probe = probe_gemm()
    res["probe"] = {"fp32_gflops": probe.fp32_gflops, "bf16_gflops": probe.bf16_gflops, "fp32_n": probe.fp32_n,
                    "bf16_n": probe.bf16_n, "seconds": probe.seconds, "margin": BF16_MARGIN,
                    "bf16_over_fp32": round(probe.bf16_gflops / probe.fp32_gflops, 3),
                    "auto_picks": "bfloat16" if probe.picks_bf16() else "float32"}
    bbs = {dt: load_backbone("smollm2-135m-instruct", device="cpu", dtype=dt) for dt in DTYPES}
    tok = bbs["float32"].tokenizer
    short = [tok(q)["input_ids"] for q in QUESTIONS[:4]]
    prompts = [short[i % len(short)] for i in range(a.batch)]
    for bb in bbs.values():
        ours(bb, prompts[:4], 4)  # warm-up
    rates = {dt: [] for dt in DTYPES}
    t0 = time.perf_counter()
    for _ in range(a.rounds):
        for dt in DTYPES:
            rates[dt].append(ours(bbs[dt], prompts, a.new))
    best = {dt: max(r) for dt, r in rates.items()}
    res["decode"] = {"model": "smollm2-135m-instruct", "rows": a.batch, "new_tokens": a.new, "rounds": a.rounds,
                     "float32_tok_s": round(best["float32"], 1), "bfloat16_tok_s": round(best["bfloat16"], 1),
                     "bf16_over_fp32": round(best["bfloat16"] / best["float32"], 3),
                     "all_rounds_tok_s": {dt: [round(x, 1) for x in r] for dt, r in rates.items()},
                     "seconds": round(time.perf_counter() - t0, 1)}
    res["load_average_end"] = list(os.getloadavg())
    print(f"GEMM probe ({torch.get_num_threads()} threads): fp32 {probe.fp32_gflops:.1f} GFLOP/s (n={probe.fp32_n}), "
          f"bf16 {probe.bf16_gflops:.1f} GFLOP/s (n={probe.bf16_n}) -> auto picks {res['probe']['auto_picks']}")
    print(f"decode, SmolLM2-135M, {a.batch} rows x {a.new} tokens: fp32 {best['float32']:.1f} tok/s, "
          f"bf16 {best['bfloat16']:.1f} tok/s ({res['decode']['bf16_over_fp32']:.2f}x)")
    write_result(res, a.out)


if __name__ == "__main__":
    main()
