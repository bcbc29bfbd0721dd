"""The estimate: the work counts of a profile times the seconds of one batch, hours per stage and pair,
with the 'mean' and 'cap' bounds, on one GPU or sharded over ``world`` data-parallel processes. It reads a
measured run and an analytic one (``analytic.analytic_backbone``) alike."""
from __future__ import annotations

import math

# assumptions (not measured), per dataset
MEAN_TOKENS = {"gsm8k": 250, "math": 450}
STEPS_PER_COT = {"gsm8k": 8, "math": 12}
ACCEPTANCE = {"gsm8k": 1.0, "math": 1.0}  # fraction of sampled CoTs kept for pretraining (1.0: upper bound)


def seconds_at(rec: dict, length: float) -> float:
    """Seconds one batch of the measured shape takes to decode ``length`` tokens per row, prefill
    included: read off the run's body timeline (token L is sampled after decode forward L-1) where
    length <= the tokens measured, else extrapolated with the slope of the run's last quarter (the
    KV cache, and so the cost of an iteration, grows with the context)."""
    t, total, new = rec.get("t_body"), rec["seconds"], rec["new_tokens"]
    if not t or len(t) < 2:
        return total * length / new
    tail = max(total - t[-1], 0.0)  # the last token's sampling and the bookkeeping after the last forward
    n_dec = len(t) - 1
    i = max(int(math.ceil(length)) - 1, 0)
    if i <= n_dec:
        return t[i] + tail
    q = max(1, n_dec // 4)
    slope = (t[-1] - t[-1 - q]) / q
    return t[-1] + tail + (length - 1 - n_dec) * slope


def rl_runs(cfg, pair: tuple[str, str] | None = None) -> int:
    """Distinct RL trainings of a pair, as the RL stage dedups them (``ctrls.stages.rl.rl_runs``:
    the curves x seeds, the Table 2 rows, and Table 3's rows for ``judge.pair``); without a pair,
    the largest over the profile's pairs (the lockstep batch that is measured)."""
    from ctrls.stages.rl import rl_runs as stage_runs

    pairs = [pair] if pair is not None else cfg.pairs()
    return max(len(stage_runs(cfg, b, d)) for b, d in pairs)


def lockstep_batch(cfg, prompts: list, starts: list) -> tuple[list, list]:
    """The prompts and prompt starts of one lockstep RL decode batch (every run's step at once:
    ``rl_runs`` x ``rl.questions_per_step`` prompts, each sampled ``rl.group_size`` times), cycling
    through ``prompts``."""
    n = rl_runs(cfg) * cfg.rl.questions_per_step
    return [prompts[i % len(prompts)] for i in range(n)], [starts[i % len(starts)] for i in range(n)]


def table_policies(cfg, pair: tuple[str, str]) -> int:
    """Policies whose test samples the RL stage draws for a pair: the table rows, plus Base when
    ``rl.n_test`` is set (Table 2's own Base on its own questions)."""
    from ctrls.stages.rl import table_rows

    return len(table_rows(cfg, *pair)) + (1 if cfg.rl.n_test is not None else 0)


def estimate(cfg, measured_: dict, mean_tokens: dict, steps_per_cot: dict, acceptance: dict, world: int = 1) -> dict:
    """Hours per stage and pair, with the 'mean' and 'cap' bounds (``bench/gpu/gpu_estimate.py``'s docstring).

    ``world`` data-parallel processes (``accelerate launch --multi_gpu --num_processes N``), sharded as
    ``ctrls.stages.distributed`` shards them: collect by training question, exploration, RL evaluation and
    Table 2 by test question, an RL step by trajectory slot; pretraining stages (b)-(f) run on rank 0
    alone. A stage's wall time is its largest shard's batches x the seconds of one batch; a batch with
    fewer rows is charged the measured batch's seconds (one iteration costs about the same at any
    batch size: an upper bound). ``stages_hours`` is wall-clock hours; GPU-hours are ``world`` times
    that (``total_gpu_hours``)."""
    B, cap = cfg.sampling.batch_size, cfg.sampling.max_new_tokens
    n_evals = 1 + cfg.rl.steps // cfg.rl.eval_every + (1 if cfg.rl.steps % cfg.rl.eval_every else 0)
    shard = lambda n: -(-n // world)  # noqa: E731 - the largest block of World.shard
    rows, disk, seq_hours = [], {}, {}
    for bname, ds in cfg.pairs():
        m = measured_["backbones"].get(bname)
        if m is None:
            raise KeyError(f"no measurement for backbone {bname!r}")
        runs_m = {k: m[k] for k in ("base_b160", "ctrls_b160", "ctrls_rl", "ctrls_lockstep") if k in m}
        runs, policies = rl_runs(cfg, (bname, ds)), table_policies(cfg, (bname, ds))
        pt = m["pretrain"]
        L = mean_tokens[ds]
        kept = cfg.data.n_train * cfg.pretrain.samples_per_question * acceptance[ds]
        steps = kept * min(steps_per_cot[ds], cfg.prompt.max_steps)
        prompt_tokens = sum(m["prompt_tokens"]) / len(m["prompt_tokens"])
        pt_steps = pt["spectral"]["steps"]
        batches = lambda questions, n: math.ceil(shard(questions) / max(1, B // n))  # noqa: E731
        test_q = cfg.data.n_test  # Table 1
        table_q = cfg.rl.n_test if cfg.rl.n_test is not None else test_q  # Table 2 (the RL stage's test questions)
        eval_q = cfg.rl.eval_questions  # the RL curves: the first eval_questions of the same pool

        def sampling(label, kind, n_batches, detail):
            for bound, length in (("mean", L), ("cap", cap)):
                rows.append({"backbone": bname, "dataset": ds, "stage": label, "bound": bound,
                             "seconds": n_batches * seconds_at(runs_m[kind], length),
                             "batch_seconds": seconds_at(runs_m[kind], length), "batches": n_batches,
                             "tokens_per_row": length, "detail": detail})

        def fixed(label, seconds, detail):
            for bound in ("mean", "cap"):
                rows.append({"backbone": bname, "dataset": ds, "stage": label, "bound": bound, "seconds": seconds,
                             "detail": detail})

        per = f" per rank ({world} ranks)" if world > 1 else ""
        nb = batches(cfg.data.n_train, cfg.pretrain.samples_per_question)
        sampling("pretrain (a) collect", "base_b160", nb,
                 f"{cfg.data.n_train} q x {cfg.pretrain.samples_per_question} CoTs: {nb} batches{per}, Base")
        rank0 = " (rank 0 alone)" if world > 1 else ""
        fixed("pretrain (b) features", kept * (prompt_tokens + L) / pt["features"]["tokens_per_s"],
              f"{kept:.0f} kept CoTs x {prompt_tokens + L:.0f} tokens, one forward{rank0}")
        full = m.get("cpu_fits_full")
        if full and "error" not in full:
            # spectral and the states stage's I/O linear in the steps; k-means and the transition fit at full
            # size (measured at the largest dataset's step count, scaled down linearly: an upper bound)
            # (--analytic times the fits at a reduced size, "scaled_linearly": scaled up as well as down)
            scale = steps / full["steps"] if full.get("scaled_linearly") else min(1.0, steps / full["steps"])
            cpu_s = ((pt["spectral"]["seconds"] + pt["states"]["seconds"]) * steps / pt_steps + pt["transitions"]["seconds"]
                     + (full["fit_states_seconds"] + full["fit_transitions_seconds"]) * scale)
            how = (f"{steps:.0f} steps: (c) and (d) scaled linearly, k-means and L fit "
                   + ("timed at" if full.get("scaled_linearly") else "measured at") + f" {full['steps']} steps"
                   + (" and scaled linearly" if full.get("scaled_linearly") else ""))
        else:  # the transition fit is mostly its fixed 300 Adam steps: not scaled
            cpu_s = (pt["spectral"]["seconds"] + pt["states"]["seconds"]) * steps / pt_steps + pt["transitions"]["seconds"]
            how = f"{steps:.0f} steps: (c) and (d) scaled linearly, (e) as measured"
        fixed("pretrain (c-e) spectral, states, transitions (CPU)", cpu_s, how + rank0)
        tok = kept * L
        per_token = pt["features"]["disk_bytes"] / (pt["trajectories"] * (pt["cot_tokens"] + 1))
        disk[f"{bname} / {ds}"] = kept * (L + 1) * per_token / 2**30
        n_eval = len({*range(0, cfg.pretrain.epochs + 1, cfg.pretrain.bound_every), cfg.pretrain.epochs})
        fixed("pretrain (f) adapter", n_eval * tok / pt["adapter_eval_tokens_per_s"]
              + cfg.pretrain.epochs * tok / pt["adapter_train_tokens_per_s"],
              f"{cfg.pretrain.epochs} epochs + {n_eval} bound evaluations over {tok / 1e6:.1f} M tokens{rank0}")
        rows_cfg = 1 + len(cfg.grid.epsilons)
        nb = batches(test_q, cfg.grid.n_samples)
        T = len(cfg.grid.temperatures)
        sampling("exploration Base", "base_b160", T * nb,
                 f"{T} eta x {test_q} q x {cfg.grid.n_samples}: {T * nb} batches{per}")
        sampling("exploration CTRLS", "ctrls_b160", T * (rows_cfg - 1) * nb,
                 f"{T} eta x {rows_cfg - 1} eps x {test_q} q x {cfg.grid.n_samples}: "
                 f"{T * (rows_cfg - 1) * nb} batches{per}")
        G = cfg.rl.questions_per_step * cfg.rl.group_size
        for bound, length in (("mean", L), ("cap", cap)):  # for comparison: one run after another
            seq_hours.setdefault(bound, 0.0)
            seq_hours[bound] += runs * cfg.rl.steps * seconds_at(runs_m["ctrls_rl"], length) / 3600
        if "ctrls_lockstep" in runs_m:  # lockstep: every run's step in one decode batch
            sampling("RL training", "ctrls_lockstep", cfg.rl.steps,
                     f"{cfg.rl.steps} lockstep steps, each one batch of {runs} runs x {G} trajectories "
                     f"({shard(runs * G)} rows{per})")
        else:
            sampling("RL training", "ctrls_rl", runs * cfg.rl.steps,
                     f"{runs} runs x {cfg.rl.steps} steps, {shard(G)} of the step's {G} trajectories{per}")
        nb = batches(eval_q, cfg.rl.eval_samples)
        sampling("RL evaluation", "ctrls_b160", runs * n_evals * nb,
                 f"{runs} runs x {n_evals} evals x {eval_q} q x {cfg.rl.eval_samples}: {nb} batches each{per}")
        nb = batches(table_q, cfg.grid.n_samples)
        sampling("RL Table 2 samples", "ctrls_b160", policies * nb,
                 f"{policies} policies x {table_q} q x {cfg.grid.n_samples}: {nb} batches each{per}")
    stages: dict[str, dict[str, float]] = {}
    pairs: dict[str, dict[str, float]] = {}
    for r in rows:
        stages.setdefault(r["stage"], {"mean": 0.0, "cap": 0.0})[r["bound"]] += r["seconds"] / 3600
        pairs.setdefault(f"{r['backbone']} / {r['dataset']}", {"mean": 0.0, "cap": 0.0})[r["bound"]] += r["seconds"] / 3600
    total = {b: sum(s[b] for s in stages.values()) for b in ("mean", "cap")}
    return {"world_size": world, "rows": rows, "stages_hours": stages, "pairs_hours": pairs, "total_hours": total,
            "total_gpu_hours": {b: world * h for b, h in total.items()},
            "rl_runs_per_pair": rl_runs(cfg), "rl_evals_per_run": n_evals, "rl_eval_questions_used": eval_q,
            "rl_lockstep": all("ctrls_lockstep" in measured_["backbones"][b] for b, _ in cfg.pairs()),
            "rl_training_sequential_hours": seq_hours,
            "features_disk_gib": disk,
            "assumptions": {"mean_tokens": mean_tokens, "steps_per_cot": steps_per_cot, "acceptance": acceptance,
                            "cap_tokens": cap, "judge": "excluded (API-bound)"}}


def print_estimate(est: dict) -> None:
    W = est["world_size"]
    what = "GPU hours on one GPU" if W == 1 else f"wall-clock hours on {W} GPUs (data parallel, sharded as ctrls does)"
    print(f"\n{what} (mean: batches decode the assumed mean CoT length; cap: max_new_tokens)")
    w = max(len(s) for s in est["stages_hours"])
    print(f"  {'stage':{w}s}  {'mean':>8s}  {'cap':>8s}")
    for s, h in est["stages_hours"].items():
        print(f"  {s:{w}s}  {h['mean']:8.1f}  {h['cap']:8.1f}")
    print(f"  {'total':{w}s}  {est['total_hours']['mean']:8.1f}  {est['total_hours']['cap']:8.1f}")
    if W > 1:
        print(f"  {'GPU-hours (x ' + str(W) + ')':{w}s}  {est['total_gpu_hours']['mean']:8.1f}  "
              f"{est['total_gpu_hours']['cap']:8.1f}")
        if "linear_wall_hours" in est:
            print(f"  {'linear scaling (1 GPU / ' + str(W) + ')':{w}s}  {est['linear_wall_hours']['mean']:8.1f}  "
                  f"{est['linear_wall_hours']['cap']:8.1f}")
        return
    print("  per pair:")
    for p, h in est["pairs_hours"].items():
        print(f"    {p:{w - 2}s}  {h['mean']:8.1f}  {h['cap']:8.1f}")
    print(f"  RL: {est['rl_runs_per_pair']} runs per pair, {est['rl_evals_per_run']} evaluations per run on "
          f"{est['rl_eval_questions_used']} questions; judge excluded (API-bound)")
