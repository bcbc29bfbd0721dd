"""The seeds study: CTRLS's claims over fresh training runs.

Each seed of ``SEEDS`` (fixed before any run; no choice was ever made on them, so they are test seeds) is one
training run of the demo's defaults on fresh data (``data.seed``: new training and test questions): pretraining,
exploration and RL, at the study's sizes (``STUDY``). Per seed it stores, per question and sample, what a later
analysis needs (``studies/results/seeds_study/seed_<S>.parquet``: graded samples of every row, drawn chains,
read-back states, s_0, the step texts) and the run's parameters (``seed_<S>.json``: the learned RL policies' L
and c, the pretrained policy's, the fitted vectors' sha256, the position mask, the commit, the machine and its
GEMM rate, the stage seconds). ``pool`` recomputes every claim from those files alone
(``studies/results/seeds_pooled.json``): a random-effects estimate over seeds with its HKSJ interval, tau, I^2,
Cochran's Q and the 95% prediction interval for one new run (``ctrls.stats.meta``), a seed-then-question
bootstrap beside it, each state's constant-state pass@1 and meaning, and RL against the best constant state.

The rows: Base; "hold s0" (s_0 at every step, no transitions, no position-mask substitution); "state j" for every
state j = 1..K (every step under j: the constant-state policies the Dirichlet policy class contains); eps=0.1
(the pretrained policy with epsilon-greedy exploration); and RL's Table 2 policies (eps=0, H=0 and the demo's
default eps=0.1, H=0.01, each after rl.steps steps). RL's end policy is compared with the best constant state
chosen on each seed's validation half of the test questions (a seeded split by question id), on the other half.

Usage (from the repository root; resumable: a killed seed resumes, a finished one is reused):
    .venv/bin/python studies/seeds_study.py run --lanes 2          # every seed, two side by side, one thread each
    .venv/bin/python studies/seeds_study.py pool                   # studies/results/seeds_pooled.json
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "studies" / "results" / "seeds_study"
POOLED = ROOT / "studies" / "results" / "seeds_pooled.json"
SEEDS = list(range(100, 108))  # fixed before the first run; no choice has used them
PROFILE = "demo"
# The study's sizes. With runs differing by tau ~ 18 points (the data seeds 6-10), a seed's own sampling error at
# 24 questions x 4 samples (about 5-7 points for a paired pass@1 difference) is small beside tau: more seeds buy
# more than more questions per seed. One RL seed per training run, the two Table 2 settings only.
STUDY = ["data.n_test=24", "grid.transfer_datasets=[]", "grid.fixed_state=false", "grid.hold_state=true",
         "grid.constant_states=true", "rl.seeds=[0]", "rl.settings=[none, both]"]
RL_END = "ε=0.1, H=0.01"  # the demo's default RL setting (rl.settings "both"), as Table 2 labels it
RL_OTHER = "ε=0.0, H=0.0"
CLAIMS = ("eps_minus_base_pass_n", "eps_minus_hold_s0_pass1", "eps_minus_hold_s0_pass_n", "hold_s0_minus_base_pass1",
          "rl_minus_pretrained_pass1", "rl_minus_best_constant_pass1", "kappa")
EXTRA = ("eps_minus_base_pass1", "rl_minus_base_pass1", "best_constant_minus_base_pass1",
         "rl_no_exploration_minus_best_constant_pass1", "rl_no_exploration_minus_pretrained_pass1")
KINDS = ("answer", "compute", "restate", "other")  # the step kinds of step_kind, in its order of precedence


def config(seed: int, run_root: Path):
    from ctrls.config.overrides import parse_overrides
    from ctrls.config.schema import load_config

    return load_config(PROFILE, {**parse_overrides(STUDY), "data.seed": seed, "run_dir": str(run_root / str(seed))})


def commit() -> str:
    out = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return out.stdout.strip() or "unknown"


def machine() -> dict:
    import torch

    from ctrls.method.backbone import cpu_model, gemm_gflops

    return {"cpu": cpu_model(), "threads": torch.get_num_threads(), "torch": torch.__version__,
            "python": platform.python_version(), "gemm_gflops": round(gemm_gflops(), 1)}


# ---- running the seeds ---------------------------------------------------------------------------------------


def run_seed(seed: int, run_root: Path, threads: int, stages=("pretrain", "exploration", "rl"), store: bool = True) -> dict:
    """The ``stages`` of one seed (each reused when finished), then (``store``) its stored files."""
    t0 = time.time()
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    cmd = [sys.executable, "-m", "ctrls", "stage", *stages, "--profile", PROFILE,
           "--run-dir", str(run_root / str(seed)), "--quiet", "-o", f"data.seed={seed}", *[x for o in STUDY for x in ("-o", o)]]
    log = run_root / f"seed_{seed}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "a") as f:
        rc = subprocess.run(cmd, env=env, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT).returncode
    if rc != 0:
        raise SystemExit(f"seed {seed}: the stages failed (exit {rc}); see {log}")
    if not store:
        return {"seed": seed, "seconds": round(time.time() - t0)}
    rc = subprocess.run([sys.executable, __file__, "collect", "--seeds", str(seed), "--run-root", str(run_root)],
                        env=env, cwd=ROOT).returncode
    if rc != 0:
        raise SystemExit(f"seed {seed}: storing its results failed (exit {rc})")
    return {"seed": seed, "seconds": round(time.time() - t0)}


def run(seeds: list[int], run_root: Path, lanes: int, threads: int, lockstep_rl: bool = False) -> None:
    """The seeds in ``lanes`` side by side (each seed's stages one after another, ``threads`` threads each). With
    ``lockstep_rl`` the seeds' RL stages run together after their pretraining and exploration, in this process
    (``ctrls.stages.rl.run_rl_lockstep``: every seed's decodes in one batch over the backbone's passes)."""
    from concurrent.futures import ThreadPoolExecutor

    todo = [s for s in seeds if not (OUT / f"seed_{s}.json").is_file()]
    print(f"seeds study: {len(seeds) - len(todo)} of {len(seeds)} seeds stored; running {todo} in {lanes} lane(s)"
          + (", RL in lockstep" if lockstep_rl else ""), flush=True)
    stages = ("pretrain", "exploration") if lockstep_rl else ("pretrain", "exploration", "rl")
    with ThreadPoolExecutor(lanes) as ex:
        for r in ex.map(lambda s: run_seed(s, run_root, threads, stages, store=not lockstep_rl), todo):
            print(f"seed {r['seed']}: {'stored' if not lockstep_rl else 'pretrained and explored'} in {r['seconds']} s",
                  flush=True)
    if lockstep_rl and todo:
        import torch

        from ctrls.stages.rl import run_rl_lockstep

        torch.set_num_threads(threads * lanes)  # one process now: every lane's threads
        t0 = time.time()
        run_rl_lockstep([config(s, run_root) for s in todo], progress=False)
        print(f"seeds {todo}: RL in lockstep in {round(time.time() - t0)} s", flush=True)
        for s in todo:
            collect(s, run_root)
            print(f"seed {s}: stored", flush=True)


# ---- storing one seed ----------------------------------------------------------------------------------------


def split_of(seed: int, qids: list[str]) -> dict[str, str]:
    """Each question's half: "validation" (where the best constant state is chosen) or "test", by a seeded hash
    of its id, half each (the first half of the hash order is validation)."""
    order = sorted(qids, key=lambda q: hashlib.sha256(f"{seed}:{q}".encode()).hexdigest())
    return {q: ("validation" if i < len(order) // 2 else "test") for i, q in enumerate(order)}


def policy_params(state: dict) -> dict:
    """L (K x K) and c of a TransitionPolicy state dict (keys ending in ``L`` and ``log_c``)."""
    import math

    L = next(v for k, v in state.items() if k.split(".")[-1] == "L")
    c = next(v for k, v in state.items() if k.split(".")[-1] == "log_c")
    return {"L": [[round(float(x), 6) for x in row] for row in L.tolist()], "c": round(math.exp(float(c)), 6)}


def collect(seed: int, run_root: Path) -> None:
    """Write ``seed_<S>.parquet`` and ``seed_<S>.json`` from the seed's finished run directory."""
    import torch
    from safetensors import safe_open

    from ctrls.data.answers import grade
    from ctrls.stages.exploration import load_samples, stage_summary
    from ctrls.stages.pretrain import checkpoint_dir, pretrain_stages
    from ctrls.stages.rl import load_table2_samples, rl_runs, rl_stage
    from ctrls.stages.rl import stage_summary as rl_summary
    from ctrls.stages.runs import file_name, pair_slug
    from ctrls.stages.state_prompt import VECTORS

    cfg = config(seed, run_root)
    bname, ds = cfg.pairs()[0]
    pc = cfg.for_pair(bname, ds)
    ex = load_samples(cfg).assign(source="exploration")
    rl = load_table2_samples(cfg).assign(source="rl")
    rl = rl[rl.config != "Base"]
    keep = ["source", "config", "question_id", "question", "sample_index", "temperature", "correct", "valid", "pred", "gold",
            "n_tokens", "finish", "text", "steps", "states", "encoded", "s0", "chains", "chain_eps"]
    df = pd.concat([ex, rl], ignore_index=True)
    df = df[[c for c in keep if c in df]].copy()
    # every seed graded by this checkout's answer checker, whenever its stages ran (RL's rewards were its own)
    regraded = [grade(t, g).correct for t, g in zip(df.text, df.gold.astype(str))]
    changed = int((df.correct.astype(bool) != pd.Series(regraded, index=df.index)).sum())
    df["correct"] = regraded
    df["split"] = df.question_id.map(split_of(seed, sorted(ex.question_id.unique())))
    df.insert(0, "data_seed", seed)
    st = pretrain_stages(pc)
    with safe_open(str(checkpoint_dir(st) / "model.safetensors"), "pt") as f:
        pre = policy_params({k: f.get_tensor(k) for k in f.keys() if k.startswith("policy.")})
    rl_dir = rl_stage(cfg).dir / pair_slug(bname, ds)
    policies = {}
    for (eps, alpha, rs), s in rl_runs(cfg, bname, ds).items():
        ck = torch.load(rl_dir / f"{file_name(s.name)}__seed{rs}" / "checkpoint.pt", weights_only=True)
        policies[s.label] = {**policy_params(ck["policy"]), "steps": int(ck["step"]), "rl_seed": rs}
    res = {"data_seed": seed, "commit": commit(), "machine": machine(), "profile": PROFILE, "overrides": STUDY,
           "n_states": int(cfg.states.n_states),
           "vectors_sha256": hashlib.sha256((st["state_prompt"].dir / VECTORS).read_bytes()).hexdigest(),
           "position_mask": (stage_summary(cfg).get("position_masks") or {}).get(pair_slug(bname, ds)),
           "pretrained_policy": pre, "rl_policies": policies, "regraded_changed": changed,
           "stage_seconds": {"pretrain": {k: v.summary().get("wall_s") for k, v in st.items()},
                             "exploration": stage_summary(cfg).get("wall_s"), "rl": rl_summary(cfg).get("wall_s")}}
    OUT.mkdir(parents=True, exist_ok=True)
    tmp = OUT / f".seed_{seed}.parquet.tmp"
    df.to_parquet(tmp, index=False)
    tmp.replace(OUT / f"seed_{seed}.parquet")
    write_json(res, OUT / f"seed_{seed}.json")  # written last: its presence marks the seed as stored


def write_json(res: dict, path: Path) -> None:
    """Atomically, and refusing a non-finite number (no reader takes a bare NaN): serialised first, so a refusal
    writes nothing, then a temporary file in the same folder, fsynced and renamed."""
    text = json.dumps(res, indent=1, allow_nan=False)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with open(tmp, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)  # gone after the rename; a half-written one on a failure


# ---- pooling ---------------------------------------------------------------------------------------------------


NUMBER = re.compile(r"\d+(?:\.\d+)?")
ARITH = re.compile(r"\d\s*[-+*/×÷]\s*\d|\d\s*=|=\s*\d")


def step_kind(step: str, question: str, index: int) -> str:
    """The rule the design notes state for a step's meaning: "answer" (the final-answer line), "compute" (an
    arithmetic expression: a number, an operator, a number; or an equals sign beside a number), "restate"
    (no computation, but a number of the question), else "other" (plans and prose)."""
    from ctrls.data.prompts import ANSWER_LINE

    if ANSWER_LINE.search(step):
        return "answer"
    if ARITH.search(step):
        return "compute"
    if set(NUMBER.findall(step)) & set(NUMBER.findall(question)):
        return "restate"
    return "other"


def per_question(df: pd.DataFrame, config: str, any_correct: bool = False) -> pd.Series:
    g = df[df.config == config].groupby("question_id").correct
    return (g.max() if any_correct else g.mean()).astype(float)


def seed_claims(df: pd.DataFrame, meta: dict) -> tuple[dict, dict]:
    """One seed's estimate and within-run variance of every claim (``CLAIMS`` and ``EXTRA``), and what its
    states are; pass@n is each question's any-correct over its samples (n = the samples per question)."""
    from ctrls.stats.agreement import kappa_vs_null, null_steps
    from ctrls.stats.meta import paired_mean

    K = int(meta["n_states"])
    ex, rl = df[df.source == "exploration"], df[df.source == "rl"]
    eps = "eps=0.1"
    out, arrays = {}, {}

    def diff(name, a, b, questions=None):
        qs = sorted(a.index if questions is None else questions)
        x, y = a.reindex(qs), b.reindex(qs)
        if x.isna().any() or y.isna().any():
            raise ValueError(f"seed {meta['data_seed']}: {name} misses questions")
        d, v = paired_mean(x.to_numpy(), y.to_numpy())
        out[name] = {"estimate": d, "variance": v, "questions": len(qs)}
        arrays[name] = (x - y).to_numpy()

    P1 = {c: per_question(ex, c) for c in ex.config.unique()} | {c: per_question(rl, c) for c in rl.config.unique()}
    Pn = {c: per_question(ex, c, True) for c in ex.config.unique()}
    diff("eps_minus_base_pass_n", Pn[eps], Pn["Base"])
    diff("eps_minus_base_pass1", P1[eps], P1["Base"])
    diff("eps_minus_hold_s0_pass1", P1[eps], P1["hold s0"])
    diff("eps_minus_hold_s0_pass_n", Pn[eps], Pn["hold s0"])
    diff("hold_s0_minus_base_pass1", P1["hold s0"], P1["Base"])
    diff("rl_minus_pretrained_pass1", P1[RL_END], P1[eps])
    diff("rl_minus_base_pass1", P1[RL_END], P1["Base"])
    diff("rl_no_exploration_minus_pretrained_pass1", P1[RL_OTHER], P1[eps])
    split = ex.drop_duplicates("question_id").set_index("question_id").split
    val, test = split.index[split == "validation"], split.index[split == "test"]
    const = {j: P1[f"state {j + 1}"] for j in range(K)}
    val_pass = {j: float(const[j].reindex(val).mean()) for j in range(K)}
    best = max(range(K), key=lambda j: (val_pass[j], -j))  # the lowest state on a tie
    diff("rl_minus_best_constant_pass1", P1[RL_END], const[best], test)
    diff("best_constant_minus_base_pass1", const[best], P1["Base"], test)
    diff("rl_no_exploration_minus_best_constant_pass1", P1[RL_OTHER], const[best], test)
    row, base = ex[ex.config == eps], ex[ex.config == "Base"]
    k = kappa_vs_null(*null_steps(row, base, 0.1), seed=0)
    se = (k["kappa hi"] - k["kappa lo"]) / (2 * 1.959964)  # the question bootstrap's spread as a normal SE
    out["kappa"] = {"estimate": float(k["kappa"]), "variance": se ** 2, "questions": k["questions"], "lo": k["kappa lo"],
                    "hi": k["kappa hi"], "steps": k["steps"]}
    # what the states are: the kinds of Base's steps read back as each state, each state's pass@1
    qtext = dict(zip(ex.question_id, ex.question))
    kinds = np.zeros((K, len(KINDS)))
    for r in base.itertuples():
        for t, (s, e) in enumerate(zip(r.steps, r.encoded)):
            kinds[int(e), KINDS.index(step_kind(s, str(qtext.get(r.question_id, "")), t))] += 1
    s0 = ex.drop_duplicates("question_id").s0.astype(int)
    states = {"best_constant": best + 1, "validation_pass1": {str(j + 1): val_pass[j] for j in range(K)},
              "constant_pass1": {str(j + 1): float(const[j].mean()) for j in range(K)},
              "s0_share": {str(j + 1): float((s0 == j).mean()) for j in range(K)},
              "step_kinds": {str(j + 1): dict(zip(KINDS, (kinds[j] / max(kinds[j].sum(), 1)).round(4).tolist()))
                             for j in range(K)},
              "steps_read_back": {str(j + 1): int(kinds[j].sum()) for j in range(K)},
              "pass1": {c: float(v.mean()) for c, v in P1.items()}}
    return out, {"states": states, "arrays": arrays}


def pool(seeds: list[int] | None = None) -> dict:
    """Every claim over the stored seeds (``ctrls.stats.meta``), written to ``seeds_pooled.json``."""
    from ctrls.stats.meta import pooled_power, random_effects, two_stage_bootstrap

    files = sorted(OUT.glob("seed_*.json"), key=lambda p: int(p.stem.split("_")[1]))
    metas = [json.loads(p.read_text()) for p in files]
    metas = [m for m in metas if seeds is None or m["data_seed"] in seeds]
    if len(metas) < 2:
        raise SystemExit(f"pooling needs at least 2 stored seeds in {OUT}, found {len(metas)}")
    per, info = [], []
    for m in metas:
        df = pd.read_parquet(OUT / f"seed_{m['data_seed']}.parquet")
        c, i = seed_claims(df, m)
        per.append(c)
        info.append(i)
    claims = {}
    for name in CLAIMS + EXTRA:
        y = [p[name]["estimate"] for p in per]
        v = [p[name]["variance"] for p in per]
        r = random_effects(y, v, bounds=(-1.0, 1.0))  # a difference of rates, and kappa, lie in [-1, 1]
        r["unit"] = "kappa" if name == "kappa" else "fraction"
        if name != "kappa":
            r["bootstrap"] = two_stage_bootstrap([i["arrays"][name] for i in info])
        r["per_seed"] = [{"data_seed": m["data_seed"], "estimate": p[name]["estimate"], "se": p[name]["variance"] ** 0.5,
                          "questions": p[name]["questions"]} for m, p in zip(metas, per)]
        claims[name] = r
    rb = claims["rl_minus_best_constant_pass1"]
    v = [p["rl_minus_best_constant_pass1"]["variance"] for p in per]
    power = {"delta": 0.05, "tau": rb["tau"], "n_seeds": len(per),
             "power": pooled_power(0.05, rb["tau"], v, n_sims=1000),
             "seeds_for_80": next((k for k in (8, 12, 16, 24, 32, 48, 64, 96, 128)
                                   if pooled_power(0.05, rb["tau"], v, n_sims=400, n_seeds=k) >= 0.8), None)}
    res = {"seeds": [m["data_seed"] for m in metas], "profile": PROFILE, "overrides": STUDY,
           "commands": ["python studies/seeds_study.py run --lanes 2", "python studies/seeds_study.py pool"],
           "commit": commit(), "machine": metas[0]["machine"],
           "machines": sorted({json.dumps(m["machine"], sort_keys=True) for m in metas}),
           "claims": claims, "rl_power": power,
           "states": [{"data_seed": m["data_seed"], **i["states"]} for m, i in zip(metas, info)],
           "rl_policies": [{"data_seed": m["data_seed"], "pretrained": m["pretrained_policy"], **m["rl_policies"]}
                           for m in metas]}
    write_json(res, POOLED)
    return res


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("command", choices=("run", "collect", "pool"))
    ap.add_argument("--seeds", default=None, help="comma-separated data seeds (default: the study's own, 100-107)")
    ap.add_argument("--run-root", default=str(ROOT / "runs" / "seeds"), help="one run directory per seed below it")
    ap.add_argument("--lanes", type=int, default=1, help="seeds run side by side")
    ap.add_argument("--threads", type=int, default=None, help="torch threads per lane (default: cores / lanes)")
    ap.add_argument("--lockstep-rl", action="store_true",
                    help="the seeds' RL stages together, after their pretraining and exploration (run_rl_lockstep)")
    args = ap.parse_args(argv)
    try:
        seeds = SEEDS if args.seeds is None else [int(s) for s in args.seeds.split(",")]
    except ValueError:
        raise SystemExit(f"seeds_study: --seeds takes comma-separated integers, got {args.seeds!r}") from None
    if len(set(seeds)) != len(seeds):
        raise SystemExit(f"seeds_study: --seeds lists a seed twice: {args.seeds}")
    if args.lanes < 1:
        raise SystemExit(f"seeds_study: --lanes must be >= 1, got {args.lanes}")
    threads = args.threads or max(1, (os.cpu_count() or 1) // args.lanes)
    root = Path(args.run_root)
    if args.command == "run":
        run(seeds, root, args.lanes, threads, args.lockstep_rl)
    elif args.command == "collect":
        for s in seeds:
            collect(s, root)
    else:
        r = pool(None if args.seeds is None else seeds)
        print(json.dumps({k: {x: r["claims"][k][x] for x in ("estimate", "lo", "hi", "pred_lo", "pred_hi", "tau")}
                          for k in CLAIMS}, indent=1))


if __name__ == "__main__":
    main()
