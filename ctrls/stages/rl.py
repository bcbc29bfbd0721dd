"""The RL stage (Alg. 2 on a real backbone): every RL run of every pair, trained in lockstep, then
the test samples of each table policy (Tables 2 and 3). Wires config, data, the pretrained CTRLS
model, the sampler and ``ctrls.method.reinforce``'s Trainer; writes ``runs/<profile>/rl``.
"""
from __future__ import annotations

import math
import time
from collections import defaultdict
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from ctrls.config.schema import Config, override
from ctrls.config.settings import BASE, Setting, judge_pair, parse_setting
from ctrls.data.answers import grade
from ctrls.data.prompts import check_prompts, encode_prompt, model_positions
from ctrls.method.reinforce import Trajectory, state_usage_entropy
from ctrls.method.streams import seed_of
from ctrls.stages.common import (
    backbone_for,
    current_outputs,
    only_current,
    problems_from_config,
    read_results,
    sample_params,
)
from ctrls.stages.exploration import generation_rows, write_part
from ctrls.stages.pretrain import check_fitted, fitted_stages, load_pretrained, pretrain_stages
from ctrls.stages.runs import (
    Stage,
    file_name,
    pair_slug,
    read_parquet,
    safe_name,
    unify_parts,
    valid_part,
)
from ctrls.stages.trainer import Trainer, run_lockstep

RL_KEYS = ("seed", "data", "prompt", "sampling", "rl", "grid.n_samples")


def rl_stage(cfg: Config):
    # with state_prompt.use the rollouts decode under the state prompt's vectors (and its position mask):
    # its section, the mask's keys and its fit join the key, as in the exploration stage
    fitted = fitted_stages(cfg)
    keys = RL_KEYS + (("state_prompt", "grid.position_floor", "grid.position_buckets") if cfg.state_prompt.use else ())
    return Stage(cfg, "rl", keys, upstream=tuple(a.key for a in fitted), inputs=fitted)


def table_rows(cfg: Config, backbone: str, dataset: str) -> list[Setting]:
    """The RL policies whose test samples a pair needs: the rows of Table 2 (``rl.table2``) and, for
    the judge's pair only (``judge.pair``), the rows of Table 3 (``judge.settings``); one per
    (epsilon, alpha), in that order."""
    names = list(cfg.rl.table2) + (list(cfg.judge.settings) if (backbone, dataset) == judge_pair(cfg) else [])
    rows: dict[tuple[float, float], Setting] = {}
    for name in names:
        s = parse_setting(name, cfg)
        rows.setdefault((s.epsilon, s.alpha), s)
    return list(rows.values())


def rl_runs(cfg: Config, backbone: str, dataset: str) -> dict[tuple[float, float, int], Setting]:
    """Every RL run a pair needs, each once: the curves (``rl.settings``) with every seed, and each
    table row (``table_rows``) with the first seed; a row equal to a curve setting reuses its run."""
    runs: dict[tuple[float, float, int], Setting] = {}
    for s in (parse_setting(n, cfg) for n in cfg.rl.settings):
        for seed in cfg.rl.seeds:
            runs.setdefault((s.epsilon, s.alpha, seed), s)
    for s in table_rows(cfg, backbone, dataset):
        runs.setdefault((s.epsilon, s.alpha, cfg.rl.seeds[0]), s)
    return runs


PHASES = ("load", "decode: training samples", "decode: training samples with evaluation", "decode: evaluation",
          "decode: Table 2 samples", "grading", "policy update", "checkpoints")


class PhaseClock:
    """Wall seconds per phase of the RL stage (``PHASES``), summed over its calls; phases never nest,
    so the parts add up to the stage's time less what no phase covers (reported as "other")."""

    def __init__(self):
        self.seconds: dict[str, float] = defaultdict(float)

    @contextmanager
    def __call__(self, phase: str):
        t = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[phase] += time.perf_counter() - t

    def wrap(self, phase: str, fn):
        def timed(*a, **kw):
            with self(phase):
                return fn(*a, **kw)
        return timed

    def record(self, total: float) -> dict[str, float]:
        out = {p: round(self.seconds.get(p, 0.0), 1) for p in PHASES}
        out["other"] = round(max(0.0, total - sum(self.seconds.values())), 1)
        return out


def run_rl(cfg: Config, force: bool = False, progress: bool = True) -> Path:
    """Train every RL run of every pair (``rl_runs``), then sample the test questions with each
    table policy (``table_rows``). Returns ``runs/<profile>/rl``.

    Lockstep (``rl.lockstep``, default): all runs of a pair train together, every step's
    trajectories of all runs decoded in one batch, each row with its own policy and epsilon (the
    backbone and adapter are shared and frozen); evaluations and table samples are batched the
    same way. Every sample draws from its own counter-based stream, so the result equals the
    sequential runs (``rl.lockstep=false``).

    Sizes: the curves evaluate on the first ``rl.eval_questions`` and Table 2 samples the first
    ``rl.n_test`` (default ``data.n_test``) test questions of one seeded pool (the paper: 500
    each, while Table 1 uses ``data.n_test`` = 40). With ``rl.n_test`` set, Base is sampled here
    on the same questions; otherwise Table 2's Base is the exploration stage's.

    Data parallel under a launcher (``ctrls.stages.distributed``): trajectory slots, evaluation questions
    and table questions are sharded by rank and gathered; the result equals a single process's."""
    return run_rl_lockstep([cfg], force, progress)[0]  # Alg. 2 for one config: its runs in lockstep with each other


def run_rl_lockstep(cfgs: list[Config], force: bool = False, progress: bool = True) -> list[Path]:
    """:func:`run_rl` for several training runs at once (configs that differ in their seeds and run directory,
    each with its own pretraining): every RL run of every config trains in one lockstep loop, each decode's
    rows of all of them in one batch over the frozen backbone's passes, each row under its own run's
    conditioning (``ctrls.generate.conditioning.LockstepConditioning``). Each config's stage is begun,
    written and finished as :func:`run_rl` writes it; a run's samples are the ones it draws alone, up to the
    batch's float rounding. Returns each config's ``rl`` directory."""
    from ctrls.stages.distributed import world

    w = world()
    stages = [rl_stage(c) for c in cfgs]
    todo = [(c, st) for c, st in zip(cfgs, stages) if force or not st.is_done()]
    if len(todo) > 1:
        _check_lockstep([c for c, _ in todo])
    clock, t0 = PhaseClock(), time.perf_counter()
    begun: list[Stage] = []
    try:
        if w.is_main:
            for c, st in todo:  # each takes its stage's lock and checks its fits before clearing another config's runs
                st.begin(force=force, check=lambda c=c: check_fitted(c, "RL"))
                begun.append(st)
        w.barrier()
        if todo:
            _train_and_sample(todo, w, progress, clock)  # Alg. 2: sample with pi~, reward, Eq. 16 update
        w.barrier()
        if w.is_main:  # profile_s: where this run's time went (ctrls.stages.rl.PHASES), main process
            prof = clock.record(time.perf_counter() - t0)
            for _, st in todo:
                unify_parts(st.dir / "table2.parquet")  # one schema over the parts, for pandas.read_parquet
                st.finish(pairs=len(st.cfg.pairs()), profile_s=prof,  # releases the lock
                          **({"lockstep_configs": len(todo)} if len(todo) > 1 else {}))
                begun.remove(st)
    except BaseException:
        for st in begun:
            st.release()  # a failed or killed run gives the lock back; a rerun resumes from what it wrote
        raise
    w.barrier()
    return [st.dir for st in stages]


def _check_lockstep(cfgs: list[Config]) -> None:
    """Refuse configs that cannot share one lockstep loop, naming the first key that differs."""
    same = ("backbone", "sampling", "prompt", "state_prompt.use", "rl.steps", "rl.temperature", "rl.lockstep",
            "rl.eval_every", "grid.n_samples")
    ref = cfgs[0]
    for c in cfgs[1:]:
        for key in same:
            a, b = (ref, c)
            for part in key.split("."):
                a, b = getattr(a, part), getattr(b, part)
            if a != b:
                raise ValueError(f"RL runs in lockstep need the same {key}: {a!r} in one config, {b!r} in another")
    dirs = [rl_stage(c).dir.resolve() for c in cfgs]
    if len(set(dirs)) != len(dirs):
        raise ValueError("RL runs in lockstep need a run directory each: two configs write the same rl directory")
    if not ref.rl.lockstep:
        raise ValueError("RL runs of several configs train together only with rl.lockstep=true")


class _PairRL:
    """One config's pair in the RL stage: its backbone, pretrained model, conditioning, questions and prompts."""

    def __init__(self, cfg: Config, stage: Stage, bname: str, ds: str, clock: "PhaseClock", backbones: dict):
        from ctrls.generate.controllability import PromptPasses
        from ctrls.stages.state_prompt import ctrls_conditioning, pair_state_prompt

        rl = cfg.rl
        self.cfg, self.stage, self.bname, self.ds = cfg, stage, bname, ds
        self.pc = pc = cfg.for_pair(bname, ds)
        self.slug = pair_slug(bname, ds)
        with clock("load"):
            b = pc.backbone
            at = (bname, b.device, b.dtype, b.cache_dir)
            if at not in backbones:  # configs in lockstep share the frozen backbone's passes: one copy of it
                backbones[at] = backbone_for(pc, bname)
            self.bb = bb = backbones[at]
            self.pretrained = load_pretrained(pc, bb)
            self.sp, mask = pair_state_prompt(pc, bb, self.pretrained, pretrain_stages(pc))
        self.train = problems_from_config(pc, "train")
        n_table = rl.n_test if rl.n_test is not None else pc.data.n_test
        self.test = problems_from_config(override(pc, {"data.n_test": max(n_table, rl.eval_questions)}), "test")
        self.n_table, self.n_eval = min(n_table, len(self.test)), min(rl.eval_questions, len(self.test))
        self.encoded: dict[tuple[str, int], tuple[list[int], int]] = {}
        # each prompt's s_0 pass once for every run, step and table row (all share the pretrained Q_phi); no read-back
        self.cond = ctrls_conditioning(pc, bb, self.pretrained, self.sp, mask, PromptPasses(keep=0))

    def problems(self, split: str):
        return self.train if split == "train" else self.test

    def enc(self, split: str, i: int) -> tuple[list[int], int]:
        if (split, i) not in self.encoded:
            p, pc = self.problems(split)[i], self.pc
            self.encoded[split, i] = encode_prompt(self.bb.tokenizer, p.question, pc.prompt.use_chat_template,
                                                   pc.prompt.few_shot)
            # refused, not decoded, when it does not fit the model's positions with its new tokens
            check_prompts([self.encoded[split, i][0]], pc.sampling.max_new_tokens, model_positions(self.bb),
                          [f"the prompt of {split} question {p.id!r}"])
        return self.encoded[split, i]


def _train_and_sample(todo: list[tuple[Config, Stage]], w, progress: bool, clock: PhaseClock) -> None:
    """The body of :func:`run_rl_lockstep`, between the stages' begin and finish; ``clock`` times its phases."""
    # Alg. 2: sample trajectories with pi~ (ctrls.generate.sampling), reward, Eq. 16 update per run
    import copy

    # here, not at the top: the engine loads transformers, which pages that only read results skip
    from ctrls.generate.conditioning import LockstepConditioning
    from ctrls.generate.sampling import sample

    rl = todo[0][0].rl  # the keys every config in lockstep shares (_check_lockstep)
    backbones: dict = {}
    pairs = [_PairRL(c, st, b, d, clock, backbones) for c, st in todo for b, d in c.pairs()]

    def generate(reqs, lockstep, phase):
        with clock(phase):
            return _generate(reqs, lockstep)

    def _generate(reqs, lockstep):
        """reqs: [(pair, split, model or None for Base, question indices, sample ids, epsilon, seeds)]; returns one
        list of (problem, generations) per request. Lockstep: the CTRLS requests in one call, each prompt with its
        request's policy and epsilon under its pair's conditioning (the state prompt, else the pretrained adapter);
        the requests of several pairs (training runs) under ``LockstepConditioning``."""
        together: dict[int, list[int]] = {}  # the CTRLS requests of each backbone (pairs may differ in it)
        for j, r in enumerate(reqs):
            if lockstep and r[2] is not None:
                together.setdefault(id(r[0].bb), []).append(j)
        joint = {j for c in together.values() for j in c}
        chunks = list(together.values()) + [[j] for j in range(len(reqs)) if j not in joint]
        out: list = [None] * len(reqs)
        for chunk in chunks:
            flat = [(j, i, ids, seed) for j in chunk for i, ids, seed in zip(reqs[j][3], reqs[j][4], reqs[j][6])]
            prompts = [reqs[j][0].enc(reqs[j][1], i) for j, i, _, _ in flat]
            first = reqs[chunk[0]][0]
            kw = dict(seeds=[s for *_, s in flat], sample_ids=[ids for _, _, ids, _ in flat],
                      prompt_starts=[st for _, st in prompts])
            if reqs[chunk[0]][2] is not None and (first.sp is not None or lockstep or len(chunk) > 1):
                owners = list(dict.fromkeys(reqs[j][0] for j in chunk))  # the pairs (training runs) in this call
                cond = first.cond if len(owners) == 1 else LockstepConditioning(
                    [o.cond for o in owners], [owners.index(reqs[j][0]) for j, *_ in flat])
                gens = sample(first.bb, [p for p, _ in prompts], params=sample_params(first.pc, rl.temperature, epsilon=0.0),
                              conditioning=cond, policies=[reqs[j][2].policy for j, *_ in flat],
                              epsilons=[reqs[j][5] for j, *_ in flat], **kw)
            else:
                _, _, m, _, _, eps, _ = reqs[chunk[0]]
                gens = sample(first.bb, [p for p, _ in prompts], params=sample_params(first.pc, rl.temperature, epsilon=eps),
                              model=m, **kw)
            for j in chunk:
                out[j] = []
            for (j, i, _, _), gs in zip(flat, gens):
                out[j].append((reqs[j][0].problems(reqs[j][1])[i], gs))
        return out

    def trajectories(res) -> list[Trajectory]:
        # Eq. 16's trajectory: every state draw that conditioned a sampled token (Generation.policy_states)
        return [Trajectory(states=x.policy_states if x.policy_states is not None else x.states[:1],
                           reward=float(grade(x.text, p.answer).correct), group=gi, log_actions=x.log_actions,
                           allowed=x.allowed)
                for gi, (p, gs) in enumerate(res) for x in gs]

    trajectories = clock.wrap("grading", trajectories)  # rewards: math-verify on every sample

    def eval_request(t: Trainer, step: int):
        pr = t.pair
        idx = w.shard(range(pr.n_eval))
        return (pr, "test", t.model, idx, [range(rl.eval_samples)] * len(idx), t.setting.epsilon,
                [seed_of(t.seed, "eval", step, pr.test[i].id) for i in idx])

    def metrics(t: Trainer, res) -> dict:
        policy = t.policy
        correct = [[grade(x.text, p.answer).correct for x in gs] for p, gs in res]
        valid = [[grade(x.text, p.answer).valid for x in gs] for p, gs in res]
        states = [x.states for _, gs in res for x in gs if x.states is not None and len(x.states) > 1]
        with torch.no_grad():
            H = [float(policy.entropy(s[:-1].to(policy.L.device), kind=t.pair.cfg.policy.entropy).mean())
                 for s in states]
        hard = [int(k) for s in states for k in s[1:].argmax(-1)]
        correct, valid = np.array(w.gather_list(correct)), np.array(w.gather_list(valid))
        H, hard = w.gather_list(H), w.gather_list(hard)
        return {"accuracy": float(correct.mean()), "pass@k": float(correct.any(1).mean()),
                "correct_by_question": correct.sum(1).astype(int).tolist(),  # eval questions in order: paired verdicts
                "samples_per_question": int(correct.shape[1]),
                "succ": float(valid.mean()), "policy_entropy": float(np.mean(H)) if H else math.nan,
                "state_usage_entropy": state_usage_entropy(hard, policy.L.shape[0])}

    metrics = clock.wrap("grading", metrics)

    def train_request(t: Trainer, p):
        return (t.pair, "train", t.model, p.questions, p.sample_ids, t.setting.epsilon, p.seeds)

    trainers: dict[tuple[int, tuple[float, float, int]], Trainer] = {}
    for k, pr in enumerate(pairs):
        for key, setting in rl_runs(pr.cfg, pr.bname, pr.ds).items():
            seed = key[2]
            model = copy.deepcopy(pr.pretrained)
            out = pr.stage.dir / pr.slug / f"{file_name(setting.name)}__seed{seed}"
            tb = pr.stage.dir / "tensorboard" / pr.slug / out.name if pr.cfg.rl.tensorboard else None
            t = Trainer(model.policy, pr.pc, setting, seed, out, None, len(pr.train), None, tensorboard=tb)
            t.model, t.pair = model, pr
            t.sampler = lambda qs, ids, eps, seeds, t=t: trajectories(
                generate([(t.pair, "train", t.model, qs, ids, eps, seeds)], False, "decode: training samples")[0])
            t.evaluate = lambda policy, step, t=t: metrics(
                t, generate([eval_request(t, step)], False, "decode: evaluation")[0])
            t.update = clock.wrap("policy update", t.update)  # the instance's own timed Eq. 16 step
            t.save = clock.wrap("checkpoints", t.save)
            trainers[k, key] = t

    def sample_and_evaluate(plans, due):
        """A step's training samples and the evaluations of the policies they are drawn with, in one batch."""
        with clock("decode: training samples with evaluation"):
            res = _generate([train_request(t, p) for t, p in plans] + [eval_request(t, step) for t, step in due], True)
        return ([trajectories(r) for r in res[:len(plans)]],
                [metrics(t, r) for (t, _), r in zip(due, res[len(plans):])])

    if rl.lockstep:
        run_lockstep(list(trainers.values()), rl.steps, progress=progress,
                     sample_many=lambda plans: [trajectories(r) for r in generate(
                         [train_request(t, p) for t, p in plans], True, "decode: training samples")],
                     evaluate_many=lambda due: [metrics(t, r) for (t, _), r in zip(
                         due, generate([eval_request(t, step) for t, step in due], True, "decode: evaluation"))],
                     sample_and_evaluate=sample_and_evaluate)
    else:
        for t in trainers.values():
            t.run(rl.steps, progress=progress)

    # the table samples: every test question grid.n_samples times with each table policy (Tables 2, 3)
    jobs, reqs = [], []
    for k, pr in enumerate(pairs):
        prl = pr.cfg.rl
        parts = pr.stage.dir / "table2.parquet"
        idx = w.shard(range(pr.n_table))
        todo_rows = []
        if prl.n_test is not None:  # Base on the same questions (the exploration stage has data.n_test of them)
            todo_rows.append((None, BASE, math.nan, math.nan, pr.cfg.seed))
        for row in table_rows(pr.cfg, pr.bname, pr.ds):
            t = trainers[k, (row.epsilon, row.alpha, prl.seeds[0])]
            todo_rows.append((t.model, row.label, row.epsilon, row.alpha, t.seed))

        def part(label, eps, alpha, parts=parts, pr=pr):  # an ASCII file name per table row
            return parts / f"{pr.slug}__{'Base' if label == BASE else safe_name(f'eps{float(eps)!r}_H{float(alpha)!r}')}.parquet"

        for m, label, eps, alpha, seed in todo_rows:
            if valid_part(part(label, eps, alpha), pr.n_table * pr.pc.grid.n_samples):  # a truncated part is redone
                continue
            jobs.append((pr, part(label, eps, alpha), {"config": label, "epsilon": eps, "alpha": alpha, "seed": seed}))
            reqs.append((pr, "test", m, idx, [range(pr.pc.grid.n_samples)] * len(idx), 0.0 if m is None else eps,
                         [seed_of(seed, "table2", label, pr.test[i].id) for i in idx]))
    for (pr, path, meta), res in zip(jobs, generate(reqs, rl.lockstep, "decode: Table 2 samples")):
        _write_table_part(pr.pc, path, res, meta)


def _write_table_part(cfg: Config, part: Path, res, meta: dict) -> None:
    """Gather one table policy's samples over ranks; rank 0 writes them."""
    from ctrls.stages.distributed import world

    w = world()
    meta = {"backbone": cfg.backbone.name, "dataset": cfg.data.dataset, "temperature": cfg.rl.temperature, **meta}
    rows = w.gather_list([r for p, gs in res for r in generation_rows(gs, p, meta)])
    if w.is_main:
        part.parent.mkdir(parents=True, exist_ok=True)
        write_part(pd.DataFrame(rows), part)
    w.barrier()


def load_curves(cfg: Config) -> pd.DataFrame:
    """Every run's logged curve, with its pair, setting and seed: of this config's finished RL stage
    only (``ctrls.stages.common.current_outputs``; else ``NotRunError`` naming why)."""
    stage = rl_stage(cfg)
    root, frames = stage.dir, []
    allowed = current_outputs(stage, "RL curves")
    for f in only_current(sorted(root.glob("*/*/curve.parquet")), allowed):
        # the evaluations the verdicts read: never NaN in a curve the stage wrote
        frames.append(read_results(f, ("step", "correct_by_question", "samples_per_question"),
                                   rows=lambda d: d[d.kind == "eval"] if "kind" in d else d).assign(pair=f.parent.parent.name))
    if not frames:
        raise FileNotFoundError(f"no RL curves under {root}; run the RL stage first")
    return pd.concat(frames, ignore_index=True)


def load_table2_samples(cfg: Config) -> pd.DataFrame:
    """Table 2's RL samples of this config's finished RL stage only (as :func:`load_curves`)."""
    stage = rl_stage(cfg)
    allowed = current_outputs(stage, "Table 2 samples")
    files = only_current(sorted((stage.dir / "table2.parquet").glob("*.parquet")), allowed)
    if not files:
        raise FileNotFoundError("no Table 2 samples; run the RL stage first")
    return pd.concat([read_parquet(f) for f in files], ignore_index=True)


def stage_summary(cfg: Config) -> dict:
    """The RL stage's ``done`` record (wall_s, profile_s per phase, ...), or {} before it ran."""
    return rl_stage(cfg).summary()


def profile_markdown(cfg: Config) -> str:
    """Where the RL stage's last run spent its time (the ``profile_s`` of its ``done`` record, timed by
    :class:`PhaseClock`): a table of seconds and shares per phase, or one sentence when the stage has
    not run in this run directory (or ran before it was timed)."""
    rec = stage_summary(cfg)
    prof, wall = rec.get("profile_s"), rec.get("wall_s")
    if not prof or not wall:
        return (f"The RL stage has no timed run in this run directory (profile `{cfg.profile}`): "
                "run `ctrls stage rl` or the RL notebook to time it.\n")
    runs = sum(len(rl_runs(cfg, b, d)) for b, d in cfg.pairs())
    total = sum(prof.values())
    rows = "\n".join(f"| {p} | {s:.0f} | {100 * s / total:.0f}% |" for p, s in prof.items() if s >= 0.05)
    decode = sum(s for p, s in prof.items() if p.startswith("decode"))
    how = ("`ctrls.generate.sampling.sample` under the state prompt: the chain drawn before decoding, each step under "
           "its state's vectors, no read-back" if cfg.state_prompt.use else
           "`ctrls.generate.sampling.sample` through the adapter, states drawn and read in the same pass: no step is "
           "re-encoded")
    return (f"The RL stage's last run took {wall:.0f} s ({runs} runs × {cfg.rl.steps} steps "
            f"{'in lockstep' if cfg.rl.lockstep else 'one after another'}, profile `{cfg.profile}`); "
            f"{100 * decode / total:.0f}% of it decoded samples ({how}). Timed by `ctrls.stages.rl.PhaseClock`, "
            "from the stage's `done` record:\n\n| phase | seconds | share |\n|---|---:|---:|\n" + rows + "\n")
