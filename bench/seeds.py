"""Fresh training runs in lockstep: S runs' decodes in one batch over the frozen backbone's passes
(``ctrls.generate.conditioning.LockstepConditioning``) against the same S decodes one after another, side by
side in one run, at the seeds study's sizes.

Each run is the demo's conditioning, the state prompt (K = 4 states, m = 2 vectors a state) with its own
random CTRLS model (Q_phi, policy) and vectors: the speed does not depend on their values. Two workloads,
per run: ``rl``, one RL training decode (6 questions x 4 samples = 24 rows, the lockstep RL stage's
per-run batch at the study's sizes) and ``exploration``, one CTRLS(epsilon) row of the study's grid
(24 test questions x 4 samples = 96 rows). SmolLM2-135M-Instruct in fp32, the demo's prompt, temperature,
top-k, token and step limits and ``sampling.batch_size`` (so lockstep batches stay within it). Every run
decodes the same questions with its own seeds, and a lockstep sample is checked equal to its run's alone
(``tokens_equal_fraction``). One warm-up decode first; the two modes alternate which runs first. The
machine's 128 x 576 x 1536 fp32 GEMM rate is measured at the start.

A seed's budget beside it (``seed_budget``): the seeds study's stage seconds (``studies/results/seeds_study``,
each seed run alone), split into the stages whose passes lockstep shares (RL, collection) and those bound by
arithmetic, with each stage's time in lockstep projected from the measured ratios: RL's from
``bench/results/rl_lockstep.json`` (the whole stage), collection's and exploration's from this run's
``exploration`` workload at S = 8, the rest unchanged (they run one training run at a time). The projection
is a computed estimate, named as one; ``bound_lockstep_speedup`` is what a seed would gain if RL and
collection cost nothing.
Usage: python bench/seeds.py [--out bench/results/seeds.json] [--runs 1 2 4 8] [--workloads rl exploration]
       python bench/seeds.py --budget-only [--out ...]   # recompute the budget from the stored results
"""
from __future__ import annotations

import argparse
import glob
import json
import statistics
import time
from pathlib import Path

import torch
from common import machine, write_result

K, M = 4, 2  # the demo's states and vectors per state
ROWS = {"rl": 6, "exploration": 24}  # questions per run (x 4 samples)
ROOT = Path(__file__).resolve().parents[1]
SHARED = ("collect", "rl")  # the stages whose passes carry few rows, so lockstep shares their fixed cost


def seed_budget(res: dict, runs: int = 8) -> dict:
    """One seed's stage seconds alone (the seeds study's mean) and in lockstep of ``runs`` seeds, projected from
    the measured ratios (see the module docstring); every number computed from the stored results."""
    seeds = [json.loads(Path(f).read_text()) for f in sorted(glob.glob(str(ROOT / "studies/results/seeds_study/seed_*.json")))]
    if not seeds:
        raise SystemExit("seed_budget: no studies/results/seeds_study/seed_*.json (run studies/seeds_study.py first)")
    pre = seeds[0]["stage_seconds"]["pretrain"]
    stages = {**{k: statistics.mean(s["stage_seconds"]["pretrain"][k] for s in seeds) for k in pre},
              **{k: statistics.mean(s["stage_seconds"][k] for s in seeds) for k in ("exploration", "rl")}}
    rl = json.loads((ROOT / "bench/results/rl_lockstep.json").read_text())["results"]
    rl_ratio = max(rl, key=lambda r: r["runs"])
    ex = {r["runs"]: r["speedup"] for r in res.get("workloads", {}).get("exploration", {}).get("results", [])}
    alone = sum(stages.values())
    out = {"seeds": len(seeds), "stage_seconds_alone": {k: round(v, 1) for k, v in stages.items()},
           "gemm_gflops_mean": round(statistics.mean(s["machine"]["gemm_gflops"] for s in seeds), 1),
           "seconds_per_seed_alone": round(alone, 1),
           "arithmetic_bound_share": round(sum(v for k, v in stages.items() if k not in SHARED) / alone, 3),
           "bound_lockstep_speedup": round(alone / sum(v for k, v in stages.items() if k not in SHARED), 3)}
    if runs not in ex:  # the bound needs only the stage seconds; the projection needs the measured ratio at S = runs
        return {**out, "projection": f"not computed: the exploration workload at S = {runs} is not in this result"}
    ratio = {"rl": rl_ratio["speedup"], "collect": ex[runs], "exploration": ex[runs]}
    lock = sum(v / ratio.get(k, 1.0) for k, v in stages.items())
    measured = {"speedup": ex[runs], "runs": runs, "from": "the exploration workload"}
    return {**out, "lockstep_ratio": {"rl": {"speedup": ratio["rl"], "runs": rl_ratio["runs"],
                                             "from": "bench/results/rl_lockstep.json"},
                                      "collect": measured, "exploration": measured},
            f"projected_seconds_per_seed_lockstep_{runs}": round(lock, 1),
            f"projected_lockstep_speedup_{runs}": round(alone / lock, 3)}


def runs(bb, n: int) -> list:
    """``n`` runs' state-prompt conditionings, each its own random model and vectors."""
    from ctrls.generate.conditioning import StatePromptConditioning
    from ctrls.method.model import CTRLSModel
    from ctrls.method.state_prompt import StatePrompt

    emb = bb.model.get_input_embeddings().weight.detach()
    return [StatePromptConditioning(CTRLSModel.random(bb.hidden_size, K, 2, 8, s, centroid_scale=0.5, concentration=5.0),
                                    StatePrompt(K, M, emb, seed=s)) for s in range(n)]


def decode(bb, prompts, params, conds, lockstep: bool) -> tuple[float, list]:
    """(seconds, tokens per run) of every run's decode of ``prompts`` (4 samples each, run r's seeds r*1000 + i)."""
    from ctrls.generate.conditioning import LockstepConditioning
    from ctrls.generate.sampling import sample

    seeds = [[1000 * r + i for i in range(len(prompts))] for r in range(len(conds))]
    t = time.perf_counter()
    if lockstep:
        owner = [r for r in range(len(conds)) for _ in prompts]
        out = sample(bb, prompts * len(conds), 4, params, seeds=sum(seeds, []),
                     conditioning=LockstepConditioning(conds, owner))
        per = [out[r * len(prompts):(r + 1) * len(prompts)] for r in range(len(conds))]
    else:
        per = [sample(bb, prompts, 4, params, seeds=seeds[r], conditioning=c) for r, c in enumerate(conds)]
    return time.perf_counter() - t, [[g.token_ids for gs in p for g in gs] for p in per]


def main():
    from ctrls.config.schema import load_config
    from ctrls.data.problems import load_problems
    from ctrls.data.prompts import prompt_ids
    from ctrls.generate.sampling import SampleParams
    from ctrls.method.backbone import gemm_gflops, load_backbone

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None)
    ap.add_argument("--runs", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--workloads", nargs="+", default=list(ROWS), choices=list(ROWS))
    ap.add_argument("--budget-only", action="store_true", help="recompute seed_budget from the stored --out")
    args = ap.parse_args()
    if args.budget_only:
        res = json.loads(Path(args.out or ROOT / "bench/results/seeds.json").read_text())
        res["seed_budget"] = seed_budget(res)
        write_result(res, args.out)
        return
    gemm = gemm_gflops()
    bb = load_backbone("smollm2-135m-instruct", device="cpu", dtype="float32")
    cfg = load_config("demo")
    probs = load_problems("word_problems", "test", max(ROWS.values()), seed=0,
                          difficulty=cfg.data.word_problems.difficulty())
    allp = [prompt_ids(bb.tokenizer, q.question, True, cfg.prompt.few_shot) for q in probs]
    params = SampleParams(temperature=0.7, top_k=cfg.sampling.top_k, max_new_tokens=cfg.sampling.max_new_tokens,
                          max_steps=cfg.prompt.max_steps, epsilon=0.1, batch_size=cfg.sampling.batch_size)
    res: dict = {"workloads": {}}
    with torch.no_grad():
        decode(bb, allp[:2], params, runs(bb, 1), lockstep=False)  # warm-up: threads, allocator, the prompts' template
        for w in args.workloads:
            prompts = allp[:ROWS[w]]
            rows = []
            for i, s in enumerate(args.runs):
                conds = runs(bb, s)
                timed = {}
                for mode in (("sequential", "lockstep") if i % 2 == 0 else ("lockstep", "sequential")):  # alternate order
                    timed[mode] = decode(bb, prompts, params, conds, lockstep=mode == "lockstep")
                (seq, seq_tok), (lock, lock_tok) = timed["sequential"], timed["lockstep"]
                eq = [a == b for x, y in zip(seq_tok, lock_tok) for a, b in zip(x, y)]
                rows.append({"runs": s, "sequential_seconds": seq, "lockstep_seconds": lock,
                             "sequential_seconds_per_run": seq / s, "lockstep_seconds_per_run": lock / s,
                             "speedup": seq / lock, "tokens_equal_fraction": sum(eq) / len(eq),
                             "tokens": sum(len(t) for x in lock_tok for t in x)})
                print(f"{w} S={s}: sequential {seq:.1f} s, lockstep {lock:.1f} s ({seq / lock:.2f}x), "
                      f"tokens equal {sum(eq)}/{len(eq)}", flush=True)
            res["workloads"][w] = {"questions_per_run": ROWS[w], "samples": 4, "rows_per_run": 4 * ROWS[w],
                                   "results": rows}
    eq = [r["tokens_equal_fraction"] for w in res["workloads"].values() for r in w["results"]]
    res["samples_equal_fraction"] = min(eq)  # the lowest over every workload and S
    if 8 in args.runs and "exploration" in args.workloads:
        res["seed_budget"] = seed_budget(res)
    res.update({"decode": {"backbone": "smollm2-135m-instruct", "dtype": "float32", "states": K, "vectors": M,
                           "max_new_tokens": params.max_new_tokens, "max_steps": params.max_steps,
                           "batch_size": params.batch_size, "conditioning": "state prompt"},
                "gemm_gflops": gemm, "machine": machine(),
                "command": "python bench/seeds.py --out bench/results/seeds.json"})
    write_result(res, args.out)


if __name__ == "__main__":
    main()
