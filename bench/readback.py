"""The exploration stage with each step's state read back from the sampler's own pass, against the old
path that re-encodes every generated step in a second forward pass, side by side in one run.

A reduced demo grid: the demo profile (SmolLM2-135M-Instruct, word problems, its pretrained CTRLS
model, 80 tokens, batch 128, rows Base / fixed s0 / eps=0.1 at eta = 0.7, 4 samples per question)
on ``--n-test`` test questions and ``--transfer`` GSM8K transfer questions (default 16 and 4; the demo
has 40 and 8). Pretraining runs once (not timed); then the exploration stage runs from scratch in its
own run directory, read-back and re-encode alternating, ``--rounds`` times each; the faster run of
each is kept. ``stage_speedup`` = re-encode seconds / read-back seconds. The two runs draw the same
samples (every sample is seeded by its question); ``states_equal_fraction`` is the fraction of steps,
over samples with equal text in both runs, whose state read back equals the re-encoded one (also s_0
and Base's state chains, which start from s_0). The last line printed is a JSON object; ``--out``
writes it too, with the machine.
Usage: python bench/readback.py [--out bench/results/readback.json] [--n-test 16] [--rounds 2] [--pretrained runs/demo]
"""
from __future__ import annotations

import argparse
import shlex
import shutil
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
from common import machine, write_result

from ctrls.config.schema import load_config
from ctrls.config.settings import ADAPTER
from ctrls.stages.exploration import explore, load_samples, stage_summary
from ctrls.stages.pretrain import pretrain

KEY = ["dataset", "temperature", "config", "question_id", "sample_index"]


def run(cfg_of, base: Path, name: str, readback: bool) -> tuple[float, pd.DataFrame, dict]:
    """Seconds of one from-scratch exploration stage (run directory ``name``, a copy of the pretrained ``base``)."""
    d = base.parent / name
    shutil.copytree(base, d)
    cfg = cfg_of(d)
    t = time.perf_counter()
    explore(cfg, progress=False, readback=readback)
    s = time.perf_counter() - t
    df = load_samples(cfg).sort_values(KEY).reset_index(drop=True)
    return s, df, stage_summary(cfg)


def compare(new: pd.DataFrame, old: pd.DataFrame) -> dict:
    """Agreement of the two runs: samples with equal text, then their steps' states, s_0 and chains."""
    assert (new[KEY].values == old[KEY].values).all(), "the two runs hold different samples"
    same_text = new.text.values == old.text.values
    eq = tot = 0
    for a, b in zip(new.encoded[same_text], old.encoded[same_text]):
        a, b = list(a), list(b)
        assert len(a) == len(b)
        eq += int(sum(x == y for x, y in zip(a, b)))  # a plain int: numpy's int64 is not JSON
        tot += len(a)
    base = new.config == "Base"
    pick = base & same_text
    chains = [(list(map(list, a)), list(map(list, b))) for a, b in zip(new.chains[pick], old.chains[pick])]
    return {"samples": len(new), "text_equal_fraction": float(same_text.mean()), "steps_compared": tot,
            "states_equal_fraction": eq / max(tot, 1), "steps_differing": tot - eq,
            "s0_equal_fraction": float((new.s0.values == old.s0.values).mean()),
            "base_chains_equal_fraction": sum(a == b for a, b in chains) / max(len(chains), 1)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None)
    ap.add_argument("--n-test", type=int, default=16)
    ap.add_argument("--transfer", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--pretrained", default=None,
                    help="a demo-profile directory holding pretrain/ (e.g. runs/demo) to reuse: its stages whose keys "
                         "match this bench's overrides (the adapter's) are reused, the others rerun")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="readback_"))
    overrides = [*ADAPTER, f"data.n_test={args.n_test}", f"grid.transfer_questions={args.transfer}"]

    def cfg_of(d: Path):
        return load_config("demo", [*overrides, f"run_dir={d}"])

    base = tmp / "pretrained"
    cfg = cfg_of(base)
    if args.pretrained:  # reused: the stage finds its artifacts done and does not rerun
        shutil.copytree(Path(args.pretrained) / "pretrain", cfg.profile_dir / "pretrain")
    t = time.perf_counter()
    for b, ds in cfg.pairs():
        pretrain(cfg.for_pair(b, ds), progress=False)
    print(f"pretrained in {time.perf_counter() - t:.0f} s", flush=True)
    times: dict[str, list[float]] = {"readback": [], "reencode": []}
    frames, summaries = {}, {}
    for r in range(args.rounds):
        for mode in ("reencode", "readback") if r % 2 == 0 else ("readback", "reencode"):
            s, frames[mode], summaries[mode] = run(cfg_of, base, f"{mode}_{r}", mode == "readback")
            times[mode].append(s)
            print(f"round {r} {mode}: {s:.1f} s (controllability columns besides sampling: "
                  f"{summaries[mode].get('reencode_s', float('nan')):.1f} s)", flush=True)
    new, old = min(times["readback"]), min(times["reencode"])
    res = {"stage_speedup": old / new, **compare(frames["readback"], frames["reencode"]),
           "readback_seconds": new, "reencode_seconds": old, "runs_seconds": times,
           "controllability_seconds": {m: summaries[m].get("reencode_s") for m in summaries},
           "grid": {"profile": "demo", "overrides": overrides, "rows": sorted(frames["readback"].config.unique())},
           "command": shlex.join(["python", "bench/readback.py", *sys.argv[1:]]), "machine": machine()}
    shutil.rmtree(tmp, ignore_errors=True)
    write_result(res, args.out)


if __name__ == "__main__":
    main()
