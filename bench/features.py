"""Pretraining stage (b), ``ctrls.stages.collect.cache_features`` (the prompts' shared template once, each
prompt once for all of its trajectories), against one pass over prompt and trajectory per trajectory
(batched per question: the stage's code before), side by side in one run, on a demo run's collected
trajectories (``pretrain/<pair>/collect``, e.g. ``runs/demo`` after ``make book``). Both write the
stage's shards; ``hidden_equal_fraction`` is the share of cached float16 values that are equal in the two,
``max_abs_difference`` the largest difference. ``--rounds`` alternating rounds, the faster of each kept.
Usage: python bench/features.py --run runs/demo [--out bench/results/features.json] [--rounds 2]
"""
from __future__ import annotations

import argparse
import shlex
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch
from common import machine, write_result

from ctrls.config.schema import load_config
from ctrls.data.prompts import encode_prompt
from ctrls.stages.collect import cache_features, kept_trajectories, shard_file
from ctrls.stages.common import backbone_for, problems_from_config
from ctrls.stages.runs import load_torch


def whole_pass(cfg, bb, problems, collect_dir: Path, out: Path) -> None:
    """The shards as the stage wrote them before: prompt and trajectory in one pass, right-padded per question."""
    by_q = {p.id: p for p in problems}
    for qid, g in kept_trajectories(collect_dir).groupby("qid", sort=False):
        ids, start = encode_prompt(bb.tokenizer, by_q[qid].question, cfg.prompt.use_chat_template, cfg.prompt.few_shot)
        P, sols = len(ids), [list(s) for s in g.solution_ids]
        batch = torch.zeros((len(sols), P + max(map(len, sols))), dtype=torch.long)
        mask = torch.zeros_like(batch)
        for i, s in enumerate(sols):
            batch[i, :P + len(s)], mask[i, :P + len(s)] = torch.as_tensor(ids + s), 1
        h = bb.hidden_states(batch, mask).float().cpu()
        items = [{"hidden": h[i, P - 1:P + len(s)].to(torch.float16)} for i, s in enumerate(sols)]
        torch.save({"qid": qid, "question_hidden": h[0, start:P].to(torch.float16), "trajectories": items},
                   shard_file(out, qid))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", default="runs/demo", help="a demo-profile run directory whose pretraining collected")
    ap.add_argument("--out", default=None)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    cfg = load_config("demo", [])
    (pair,) = cfg.pairs()
    pc = cfg.for_pair(*pair)
    collect_dir = next(Path(args.run).glob("pretrain/*/collect"))
    bb, problems = backbone_for(pc), problems_from_config(pc, "train")
    times: dict[str, list[float]] = {"template_once": [], "whole_pass": []}
    tmp = Path(tempfile.mkdtemp(prefix="features_"))
    dirs = {m: tmp / m for m in times}
    for r in range(args.rounds):
        for mode in times if r % 2 == 0 else list(times)[::-1]:
            dirs[mode].mkdir(exist_ok=True)
            for f in dirs[mode].glob("*"):
                f.unlink()
            t = time.perf_counter()
            if mode == "template_once":
                cache_features(pc, bb, problems, collect_dir, dirs[mode], progress=False)
            else:
                whole_pass(pc, bb, problems, collect_dir, dirs[mode])
            times[mode].append(time.perf_counter() - t)
            print(f"round {r} {mode}: {times[mode][-1]:.1f} s", flush=True)
    eq = tot = 0
    worst = 0.0
    files = sorted(dirs["whole_pass"].glob("*"))
    for f in files:
        a, b = load_torch(dirs["template_once"] / f.name), load_torch(f)
        pairs = [(a["question_hidden"], b["question_hidden"])] + [
            (x["hidden"], y["hidden"]) for x, y in zip(a["trajectories"], b["trajectories"], strict=True)]
        for x, y in pairs:
            eq, tot = eq + int((x == y).sum()), tot + x.numel()
            worst = max(worst, float((x.float() - y.float()).abs().max()))
    shutil.rmtree(tmp, ignore_errors=True)  # the bench's own scratch directory
    best = {k: min(v) for k, v in times.items()}
    write_result({"speedup": best["whole_pass"] / best["template_once"], "seconds": best, "runs_seconds": times,
                  "questions": len(files), "hidden_equal_fraction": eq / tot, "max_abs_difference": worst,
                  "backbone": pc.backbone.name, "dtype": "float32",
                  "command": shlex.join(["python", "bench/features.py", *sys.argv[1:]]),
                  "machine": machine()}, args.out)


if __name__ == "__main__":
    main()
