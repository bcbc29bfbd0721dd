"""Time of on-policy RL (Alg. 2) on the CPU with SmolLM2-135M.

1. Per step: sampling vs grading vs update (one run).
2. Lockstep vs sequential, side by side in one process on the demo profile's RL sizes: every run
   the demo trains (curves, Table 2 and Table 3 rows, deduped) for ``rl.steps`` steps of
   ``rl.questions_per_step x rl.group_size`` trajectories, once one run after another
   (``Trainer.run``) and once all in one shared decode batch (``run_lockstep``); the curves and
   policies are checked equal. The last line is a JSON object; ``lockstep_speedup`` is sequential
   time / lockstep time, with the machine it was measured on.

    PYTHONPATH=. python bench/rl.py [--steps N] [--max-new-tokens N]
"""
import argparse
import copy
import json
import os
import platform
import tempfile
import time
from pathlib import Path

import pandas as pd
import torch
from common import QUESTIONS, random_ctrls

from ctrls.config.schema import load_config
from ctrls.config.settings import ADAPTER
from ctrls.data.answers import grade
from ctrls.data.prompts import prompt_ids
from ctrls.generate.sampling import SampleParams, sample, seeded
from ctrls.method.backbone import load_backbone
from ctrls.method.policy import TransitionPolicy
from ctrls.method.reinforce import Trajectory, reinforce_loss
from ctrls.report.provenance import cpu_model
from ctrls.stages.rl import rl_runs
from ctrls.stages.trainer import Trainer, run_lockstep


def machine() -> str:
    cpu = cpu_model() or platform.machine()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return f"{cpu}; {os.cpu_count()} cores; torch threads {torch.get_num_threads()}; load {load:.1f}"


def lockstep_vs_sequential(steps: int | None = None, max_new_tokens: int | None = None) -> dict:
    """Both ways on the same runs; returns the seconds of each and their ratio."""
    cfg = load_config("demo", [*ADAPTER, *([f"rl.steps={steps}"] if steps else [])])
    bb = load_backbone(cfg.backbone.name)
    shared = random_ctrls(bb)
    prompts = [prompt_ids(bb.tokenizer, q, few_shot=0) for q in QUESTIONS[:4]]
    eos = max_new_tokens or cfg.sampling.max_new_tokens

    def params(eps):
        return SampleParams(temperature=cfg.rl.temperature, top_k=cfg.sampling.top_k, max_new_tokens=eos,
                            max_steps=cfg.prompt.max_steps, batch_size=cfg.sampling.batch_size, epsilon=eps)

    def trajs(gens):
        return [Trajectory(g.policy_states if g.policy_states is not None else g.states[:1],
                           float(grade(g.text, "0").correct), gi, log_actions=g.log_actions)
                for gi, gs in enumerate(gens) for g in gs]

    def trainers(root):
        out = []
        for (eps, alpha, seed), setting in rl_runs(cfg, *cfg.pairs()[0]).items():
            model = copy.deepcopy(shared)
            t = Trainer(model.policy, cfg, setting, seed, root / f"{setting.name}{seed}", None, len(prompts))
            t.model = model
            t.sampler = lambda qs, ids, e, seeds, m=model: trajs(sample(
                bb, [prompts[q] for q in qs], params=params(e), model=m, seeds=seeds, sample_ids=ids))
            out.append(t)
        return out

    def sample_many(plans):
        flat = [(k, q, ids, seed) for k, (t, p) in enumerate(plans) for q, ids, seed in zip(p.questions, p.sample_ids, p.seeds)]
        gens = sample(bb, [prompts[q] for _, q, _, _ in flat], params=params(0.0), model=shared, seeds=[s for *_, s in flat],
                      sample_ids=[ids for _, _, ids, _ in flat], policies=[plans[k][0].policy for k, *_ in flat],
                      epsilons=[plans[k][0].setting.epsilon for k, *_ in flat])
        per = [[] for _ in plans]
        for (k, *_), gs in zip(flat, gens):
            per[k].append(gs)
        return [trajs(g) for g in per]

    with tempfile.TemporaryDirectory() as d:
        seq = trainers(Path(d) / "seq")
        t0 = time.perf_counter()
        for t in seq:
            t.run(cfg.rl.steps, progress=False)
        t_seq = time.perf_counter() - t0
        lock = trainers(Path(d) / "lock")
        t0 = time.perf_counter()
        run_lockstep(lock, cfg.rl.steps, sample_many=sample_many, progress=False)
        t_lock = time.perf_counter() - t0
        equal = all(pd.DataFrame(a.log).equals(pd.DataFrame(b.log)) and torch.equal(a.policy.L, b.policy.L)
                    for a, b in zip(seq, lock))
    runs = len(seq)
    print(f"{runs} RL runs x {cfg.rl.steps} steps x {cfg.rl.questions_per_step * cfg.rl.group_size} trajectories "
          f"(max {eos} tokens): sequential {t_seq:.1f} s, lockstep {t_lock:.1f} s, x{t_seq / t_lock:.2f}; equal: {equal}")
    return {"lockstep_runs": runs, "lockstep_steps": cfg.rl.steps, "sequential_s": round(t_seq, 2),
            "lockstep_s": round(t_lock, 2), "lockstep_speedup": round(t_seq / t_lock, 3), "lockstep_equal": equal,
            "machine": machine()}


def main(steps=3, G=8):
    cfg = load_config("demo", list(ADAPTER))
    bb = load_backbone(cfg.backbone.name)
    model = random_ctrls(bb)
    policy: TransitionPolicy = model.policy
    opt = torch.optim.Adam(policy.parameters(), lr=cfg.rl.lr)
    prompts = [prompt_ids(bb.tokenizer, q, few_shot=0) for q in QUESTIONS[:4]]
    params = SampleParams(temperature=0.7, max_new_tokens=cfg.sampling.max_new_tokens, epsilon=0.1, batch_size=128)
    t_sample = t_grade = t_update = 0.0
    tokens = 0
    for step in range(steps):
        t = time.perf_counter()
        gens = sample(bb, prompts, G, params, model=model, generator=seeded(step))
        t_sample += time.perf_counter() - t
        t = time.perf_counter()
        trajs = [Trajectory(g.policy_states if g.policy_states is not None else g.states[:1],
                            float(grade(g.text, "0").correct), i, log_actions=g.log_actions)
                 for i, gs in enumerate(gens) for g in gs]
        t_grade += time.perf_counter() - t
        tokens += sum(g.n_tokens for gs in gens for g in gs)
        t = time.perf_counter()
        loss, _ = reinforce_loss(policy, trajs, 0.1, 0.01)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(policy.parameters(), 1.0)
        opt.step()
        t_update += time.perf_counter() - t
    total = t_sample + t_grade + t_update
    print(f"{steps} RL steps, {len(prompts)} questions x G={G} trajectories, {tokens / steps:.0f} tokens per step")
    print(f"per step: sampling {t_sample / steps:.2f} s ({t_sample / total:.1%}), grading {t_grade / steps:.3f} s "
          f"({t_grade / total:.1%}), update {t_update / steps:.4f} s ({t_update / total:.2%})")
    return {"sampling_s": round(t_sample / steps, 3), "grading_s": round(t_grade / steps, 4),
            "update_s": round(t_update / steps, 5), "sampling_fraction": round(t_sample / total, 4)}


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=None, help="RL steps per run (default: the demo's rl.steps)")
    ap.add_argument("--max-new-tokens", type=int, default=None, help="default: the demo's sampling.max_new_tokens")
    ap.add_argument("--skip-split", action="store_true", help="only the lockstep comparison")
    a = ap.parse_args()
    out = {} if a.skip_split else main()
    out.update(lockstep_vs_sequential(a.steps, a.max_new_tokens))
    print(json.dumps(out))
