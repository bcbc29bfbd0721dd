"""The exploration grid of Table 1: Base vs CTRLS(epsilon) sampling at temperatures eta.

For every backbone x dataset pair, temperature eta and row we draw ``grid.n_samples`` chains of
thought per test question and grade them. The rows: Base (the backbone alone); "fixed s0" (with
``grid.fixed_state``: the trained adapter decoding every step under the prompt's own state s_0, no
transition drawn, which separates what the adapter learned from what the state transitions add);
and CTRLS(epsilon) for each epsilon of the profile. Every step of every sample is also re-encoded by
the pretrained Q_phi, and every Base sample gets state chains drawn from the policy without being
generated under them (``ctrls.controllability``): the controllability table reads both.

Results are written per question as parquet parts of the dataset directory
``runs/<profile>/exploration/samples.parquet/`` (atomic renames): after a kill -9 a rerun recomputes only the missing questions, with the same seeds,
so nothing is lost or duplicated. A part is reused only if it reads as a parquet file of
``grid.n_samples`` rows; once the stage is finished, its ``done`` marker holds every part's sha256,
and a rerun redoes a part that is missing or changed (``ctrls.runs``).
"""
from __future__ import annotations

import logging
import math
import time
import zlib
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pandas as pd
from tqdm.auto import tqdm

from ctrls import controllability as ctl
from ctrls.answers import grade, normalize
from ctrls.backbone import load_backbone
from ctrls.config import Config
from ctrls.data import problems_from_config
from ctrls.metrics import metric_with_ci, paired_bootstrap, pass_at_k, pass_at_k_paper, success_rate
from ctrls.pretrain import pretrain_stages
from ctrls.pretrain import load_pretrained
from ctrls.prompts import encode_prompt
from ctrls.report import with_pct_ci
from ctrls.runs import Stage, pair_slug, read_parquet, slug, valid_part
from ctrls.sampling import Generation, SampleParams, sample, seeded

log = logging.getLogger(__name__)

BASE = "Base"
FIXED = "fixed s0"  # the ablation row: the trained adapter with s_0 at every step, no transitions
KEYS = ("seed", "data", "prompt", "sampling", "grid")

# Table 1 of the paper (pass@20 and Succ., in %), keyed by (backbone, dataset, eta, row).
PAPER_TABLE1 = {
    ("Llama-3.2-3B-Instruct", "gsm8k"): {0.5: {BASE: (72.5, 95.0), "eps=0.1": (77.5, 100.0), "eps=0.3": (75.0, 100.0), "eps=0.5": (82.5, 100.0)},
                                         0.7: {BASE: (77.5, 100.0), "eps=0.1": (77.5, 100.0), "eps=0.3": (70.0, 100.0), "eps=0.5": (85.0, 100.0)}},
    ("Llama-3.2-3B-Instruct", "math"): {0.5: {BASE: (50.0, 90.0), "eps=0.1": (47.5, 95.0), "eps=0.3": (60.0, 95.0), "eps=0.5": (52.5, 90.0)},
                                        0.7: {BASE: (47.5, 97.5), "eps=0.1": (50.0, 97.5), "eps=0.3": (60.0, 97.5), "eps=0.5": (47.5, 90.0)}},
    ("Qwen2.5-3B-Instruct", "gsm8k"): {0.5: {BASE: (87.5, 100.0), "eps=0.1": (90.0, 100.0), "eps=0.3": (87.5, 100.0), "eps=0.5": (87.5, 100.0)},
                                       0.7: {BASE: (80.0, 100.0), "eps=0.1": (85.0, 97.5), "eps=0.3": (82.5, 97.5), "eps=0.5": (80.0, 97.5)}},
    ("Qwen2.5-3B-Instruct", "math"): {0.5: {BASE: (65.0, 65.0), "eps=0.1": (57.5, 60.0), "eps=0.3": (62.5, 52.5), "eps=0.5": (65.0, 75.0)},
                                      0.7: {BASE: (72.5, 67.5), "eps=0.1": (62.5, 65.0), "eps=0.3": (62.5, 67.5), "eps=0.5": (77.5, 67.5)}},
}


def row_label(epsilon: float | None) -> str:
    return BASE if epsilon is None else f"eps={epsilon:g}"


class GridRow(NamedTuple):
    """One row of Table 1: how its samples are drawn."""

    label: str
    epsilon: float | None  # epsilon of the state policy; None: no state is drawn
    ctrls: bool  # decode with the trained adapter
    transitions: bool  # draw s_{t+1} ~ pi~(. | s_t) at every step boundary (else keep s_0)


def grid_rows(cfg: Config) -> list[GridRow]:
    """Base, then "fixed s0" (when ``grid.fixed_state``), then CTRLS(epsilon) for each ``grid.epsilons``."""
    rows = [GridRow(BASE, None, False, False)]
    if cfg.grid.fixed_state:
        rows.append(GridRow(FIXED, None, True, False))
    return rows + [GridRow(row_label(e), e, True, True) for e in cfg.grid.epsilons]


def _row_order(label: str) -> float:
    """Table order: Base, fixed s0, then epsilon ascending, then anything else."""
    if label == BASE:
        return -2.0
    if label == FIXED:
        return -1.0
    try:
        return float(label.split("=")[1]) if label.startswith("eps=") else 99.0
    except ValueError:
        return 99.0


def samples_dir(cfg: Config) -> Path:
    return cfg.stage_dir("exploration") / "samples.parquet"


def _stage(cfg: Config) -> Stage:
    adapters = tuple(pretrain_stages(cfg.for_pair(b, d))["adapter"] for b, d in cfg.pairs())
    return Stage(cfg, "exploration", KEYS, upstream=tuple(a.key for a in adapters), inputs=adapters)


def stage_summary(cfg: Config) -> dict:
    """The exploration stage's ``done`` record: wall_s, samples, questions, reencode_s (the seconds
    its last run spent re-encoding steps and drawing Base's state chains), or {} before it ran."""
    return _stage(cfg).summary()


def _seed(*parts) -> int:
    return zlib.crc32(repr(parts).encode())


def generation_rows(gens: list[Generation], problem, meta: dict) -> list[dict]:
    rows = []
    for g in gens:
        gr = grade(g.text, problem.answer)
        states = g.states.argmax(-1).tolist()[1:] if g.states is not None else []
        rows.append({**meta, "question_id": problem.id, "question": problem.question, "gold": problem.answer,
                     "sample_index": g.sample_index, "text": g.text, "steps": g.steps, "states": states,
                     "pred": gr.pred, "valid": gr.valid, "correct": gr.correct, "n_tokens": g.n_tokens,
                     "finish": g.finish})
    return rows


def explore(cfg: Config, force: bool = False, progress: bool = True) -> Path:
    """Run (or resume, or reuse) the whole exploration grid; return the samples directory.

    Under a data-parallel launch (``ctrls.distributed``) each process samples its block of the
    test questions; every question's samples are seeded by its id, so the parts written are the
    ones a single process writes."""
    from ctrls.distributed import world

    w = world()
    stage = _stage(cfg)
    out = samples_dir(cfg)
    if stage.is_done() and not force:
        return out
    if w.is_main:
        stage.begin(force=force)
        out.mkdir(parents=True, exist_ok=True)
    w.barrier()
    g = cfg.grid
    grid = grid_rows(cfg)
    reencode_s = 0.0
    for bname, ds in cfg.pairs():
        pc = cfg.for_pair(bname, ds)
        bb = load_backbone(bname, w.device(pc.backbone.device), pc.backbone.dtype, pc.backbone.cache_dir)
        model = load_pretrained(pc, bb)
        problems = problems_from_config(pc, "test")
        mine = w.shard(range(len(problems)))
        enc = {j: encode_prompt(bb.tokenizer, problems[j].question, pc.prompt.use_chat_template, pc.prompt.few_shot)
               for j in mine}
        per_chunk = max(1, pc.sampling.batch_size // g.n_samples)
        jobs = [(eta, row, mine[i:i + per_chunk]) for eta in g.temperatures for row in grid
                for i in range(0, len(mine), per_chunk)]
        bar = tqdm(jobs, desc=f"exploration {pair_slug(bname, ds)}", unit="batch", disable=not (progress and w.is_main))
        for eta, row, chunk in bar:
            label = row.label
            parts = {j: out / f"{pair_slug(bname, ds)}__eta{eta:g}__{label.replace(' ', '_')}__{slug(problems[j].id)}.parquet"
                     for j in chunk}
            todo = [j for j in chunk if not valid_part(parts[j], g.n_samples)]
            if not todo:
                continue
            bar.set_postfix_str(f"eta={eta:g} {label}")
            params = SampleParams(temperature=eta, top_k=pc.sampling.top_k, max_new_tokens=pc.sampling.max_new_tokens,
                                  max_steps=pc.prompt.max_steps, batch_size=pc.sampling.batch_size,
                                  epsilon=row.epsilon or 0.0, transitions=row.transitions)
            # one seed per question: its samples do not depend on the chunking or on the process
            seeds = [_seed(cfg.seed, bname, ds, eta, label, problems[j].id) for j in todo]
            gens = sample(bb, [enc[j][0] for j in todo], g.n_samples, params, model=model if row.ctrls else None,
                          seeds=seeds, prompt_starts=[enc[j][1] for j in todo])
            meta = {"backbone": bname, "dataset": ds, "temperature": eta, "config": label,
                    "epsilon": math.nan if row.epsilon is None else row.epsilon, "seed": cfg.seed}
            for j, gs in zip(todo, gens):
                t0 = time.perf_counter()
                extra = _controllability_columns(cfg, pc, bb, model, enc[j], gs, row, eta, problems[j].id)
                reencode_s += time.perf_counter() - t0
                write_part(pd.DataFrame(generation_rows(gs, problems[j], meta)).assign(**extra), parts[j])
        bar.close()
    w.barrier()
    if w.is_main:
        df = load_samples(cfg)
        # seconds this process spent re-encoding steps and drawing Base's chains (controllability)
        stage.finish(samples=len(df), questions=int(df.question_id.nunique()), reencode_s=round(reencode_s, 1))
    w.barrier()
    return out


def _controllability_columns(cfg: Config, pc: Config, bb, model, prompt: tuple[list[int], int], gens: list[Generation],
                             row: GridRow, eta: float, qid: str) -> dict[str, list]:
    """The columns the controllability and diversity tables read, one entry per generation:
    ``encoded`` (Q_phi's state of each step, re-encoded), ``s0`` (the prompt's state), ``n_states``
    (K); for Base rows ``chains`` / ``chain_eps``: one state chain per grid epsilon, drawn from the
    policy pi~ from the prompt's s_0, as long as the sample (the states it is paired with)."""
    s0, encoded = ctl.encode_generations(bb, model, prompt[0], prompt[1], gens, layer=pc.backbone.hidden_layer)
    n = len(gens)
    chains: list[list[list[int]]] = [[] for _ in range(n)]
    chain_eps = [[] for _ in range(n)]
    if not row.ctrls:
        lengths = [len(e) for e in encoded]
        for eps in cfg.grid.epsilons:
            gen = seeded(_seed(cfg.seed, pc.backbone.name, pc.data.dataset, eta, "chain", eps, qid), model.policy.L.device)
            for m, c in enumerate(ctl.draw_chains(model.policy, s0, lengths, eps, generator=gen)):
                chains[m].append(c)
                chain_eps[m].append(float(eps))
    return {"encoded": encoded, "s0": [int(s0.argmax())] * n, "n_states": [int(model.config.n_states)] * n,
            "chains": chains, "chain_eps": chain_eps}


def write_part(df: pd.DataFrame, path: Path) -> None:
    tmp = path.with_name(path.name + ".tmp")
    df.to_parquet(tmp, index=False)
    tmp.replace(path)


def load_samples(cfg: Config) -> pd.DataFrame:
    d = samples_dir(cfg)
    files = sorted(d.glob("*.parquet"))
    if not files:
        raise FileNotFoundError(f"no exploration samples in {d}; run the exploration stage first")
    return pd.concat([read_parquet(f) for f in files], ignore_index=True)


# ---- tables and curves -----------------------------------------------------------------------


def _where(df: pd.DataFrame) -> str:
    """"config 'eps=0.1' (backbone ..., dataset ..., eta 0.7)" for error messages."""
    def one(col: str) -> str:
        vals = df[col].unique().tolist() if col in df else []
        return repr(vals[0]) if len(vals) == 1 else repr(vals)
    return f"config {one('config')} (backbone {one('backbone')}, dataset {one('dataset')}, eta {one('temperature')})"


def matrix_frame(df: pd.DataFrame, column: str) -> pd.DataFrame:
    """(questions x samples) frame of ``column`` for the samples of one config, questions sorted by id.

    Every question must hold every sample index of the config exactly once: a missing sample would
    otherwise enter the matrix as NaN, which ``bool`` turns into True (a correct answer). A question
    that is short, a (question, sample) that occurs twice, or a missing value is a ValueError naming
    the config and the question."""
    if df.empty:
        raise ValueError(f"no samples for {column!r}")
    key = ["question_id", "sample_index"]
    dup = df.duplicated(key)
    if dup.any():
        r = df[dup].iloc[0]
        raise ValueError(f"{_where(df)}: question {r.question_id!r} has sample {int(r.sample_index)} more than once")
    piv = df.pivot(index="question_id", columns="sample_index", values=column).sort_index()
    short = piv.isna().any(axis=1)
    if short.any():
        qid = short[short].index[0]
        missing = [int(c) for c in piv.columns[piv.loc[qid].isna()]]
        raise ValueError(f"{_where(df)}: question {qid!r} is short: {len(missing)} of {piv.shape[1]} samples "
                         f"missing or without a {column!r} value (sample index {missing[:10]}); "
                         f"rerun the stage that wrote them")
    return piv


def matrices(df: pd.DataFrame, column: str) -> np.ndarray:
    """(questions x samples) matrix of a boolean column, questions sorted by id (see :func:`matrix_frame`)."""
    return matrix_frame(df, column).to_numpy(dtype=bool)


def _paired(a: pd.DataFrame, b: pd.DataFrame) -> bool:
    """Two matrix frames cover the same questions and sample indices (a paired comparison is possible)."""
    return a.index.equals(b.index) and a.columns.equals(b.columns)


def table1(df: pd.DataFrame, n_boot: int = 2000, seed: int = 0) -> pd.DataFrame:
    """Table 1 in long form: one row per (backbone, dataset, eta, config) with pass@n and Succ.
    (fractions, with 95% bootstrap CIs over questions) and a paired comparison to Base (on the same
    questions; left empty where Base has other questions or sample counts)."""
    # Table 1: pass@n and Succ. per (backbone, dataset, eta, row)
    out = []
    for (b, ds, eta), grp in df.groupby(["backbone", "dataset", "temperature"], sort=False):
        base_c = matrix_frame(grp[grp.config == BASE], "correct") if (grp.config == BASE).any() else None
        for cfg_label, g in grp.groupby("config", sort=False):
            cf = matrix_frame(g, "correct")
            c, v = cf.to_numpy(dtype=bool), matrices(g, "valid")
            p, plo, phi = metric_with_ci(c, pass_at_k_paper, n_boot=n_boot, seed=seed)
            s, slo, shi = metric_with_ci(v, success_rate, n_boot=n_boot, seed=seed)
            row = {"backbone": b, "dataset": ds, "temperature": eta, "config": cfg_label,
                   "questions": c.shape[0], "samples": c.shape[1], "pass@n": p, "pass@n lo": plo, "pass@n hi": phi,
                   "succ": s, "succ lo": slo, "succ hi": shi}
            if base_c is not None and cfg_label != BASE and _paired(cf, base_c):
                cmp = paired_bootstrap(c, base_c.to_numpy(dtype=bool), pass_at_k_paper, n_boot=n_boot, seed=seed)
                row.update({"Δ pass@n vs Base": cmp["diff"], "Δ lo": cmp["lo"], "Δ hi": cmp["hi"], "p": cmp["p_value"]})
            out.append(row)
    t = pd.DataFrame(out)
    for col in ("Δ pass@n vs Base", "Δ lo", "Δ hi", "p"):  # present (NaN) when no row could be paired
        if col not in t:
            t[col] = math.nan
    t["_o"] = t.config.map(_row_order)
    return t.sort_values(["backbone", "dataset", "temperature", "_o"]).drop(columns="_o").reset_index(drop=True)


def ablation_table(df: pd.DataFrame, n_boot: int = 2000, seed: int = 0) -> pd.DataFrame:
    """The no-transition ablation's paired comparisons, per (backbone, dataset, eta): "fixed s0" − Base
    (what the trained adapter does without transitions) and CTRLS(epsilon) − "fixed s0" for each
    epsilon (what the transitions add). Differences in pass@n and in Succ. (fractions), each with a
    paired bootstrap 95% interval over questions and a two-sided bootstrap p-value
    (:func:`ctrls.metrics.paired_bootstrap`)."""
    out = []
    for (b, ds, eta), grp in df.groupby(["backbone", "dataset", "temperature"], sort=False):
        labels = sorted(grp.config.unique(), key=_row_order)
        if FIXED not in labels:
            continue
        pairs = [(FIXED, BASE)] if BASE in labels else []
        pairs += [(c, FIXED) for c in labels if c not in (BASE, FIXED)]
        for a_label, b_label in pairs:
            ga, gb = grp[grp.config == a_label], grp[grp.config == b_label]
            row = {"backbone": b, "dataset": ds, "temperature": eta, "comparison": f"{a_label} − {b_label}"}
            for metric_name, column, fn in (("pass@n", "correct", pass_at_k_paper), ("Succ.", "valid", success_rate)):
                fa, fb = matrix_frame(ga, column), matrix_frame(gb, column)
                if not _paired(fa, fb):
                    raise ValueError(f"{a_label!r} and {b_label!r} (backbone {b!r}, dataset {ds!r}, eta {eta}) "
                                     f"do not cover the same questions and samples: no paired comparison")
                cmp = paired_bootstrap(fa.to_numpy(dtype=bool), fb.to_numpy(dtype=bool), fn, n_boot=n_boot, seed=seed)
                row.update({f"Δ {metric_name}": cmp["diff"], f"Δ {metric_name} lo": cmp["lo"],
                            f"Δ {metric_name} hi": cmp["hi"], f"p ({metric_name})": cmp["p_value"]})
            row["questions"] = fa.shape[0]
            out.append(row)
    return pd.DataFrame(out)


def _flat_steps(g: pd.DataFrame, target: str) -> tuple[np.ndarray, np.ndarray, list]:
    """(target, encoded, question) per step of the samples in ``g``; ``target`` names the column of
    the states each step is compared with (a list per sample, as long as ``encoded``)."""
    t, e, q = [], [], []
    for r in g.itertuples(index=False):
        ts, es = list(getattr(r, target)), list(r.encoded)
        if len(ts) != len(es):
            raise ValueError(f"config {r.config!r}, question {r.question_id!r}, sample {r.sample_index}: "
                             f"{len(ts)} {target} for {len(es)} re-encoded steps")
        t += ts
        e += es
        q += [r.question_id] * len(es)
    return np.asarray(t, dtype=int), np.asarray(e, dtype=int), q


def _base_targets(base: pd.DataFrame, label: str, epsilon: float) -> pd.DataFrame:
    """Base samples with a ``target`` column: the random states a Base step is paired with for row
    ``label``: the prompt's s_0 at every step for "fixed s0", else the chain drawn with that epsilon."""
    if label == FIXED:
        return base.assign(target=[[int(s0)] * len(e) for s0, e in zip(base.s0, base.encoded)])
    targets = []
    for r in base.itertuples(index=False):
        eps = [float(x) for x in r.chain_eps]
        hit = [i for i, x in enumerate(eps) if math.isclose(x, epsilon)]
        if not hit:
            raise ValueError(f"Base question {r.question_id!r}, sample {r.sample_index}: no state chain drawn with "
                             f"epsilon {epsilon:g} (drawn: {eps}); rerun the exploration stage")
        targets.append(list(r.chains[hit[0]]))
    return base.assign(target=targets)


def _with_ci(prefix: str, d: dict) -> dict:
    return {prefix: d["rate"], f"{prefix} lo": d["lo"], f"{prefix} hi": d["hi"]}


def controllability_table(df: pd.DataFrame, n_boot: int = 2000, seed: int = 0) -> pd.DataFrame:
    """Does a step follow the state it was generated under? Per (backbone, dataset, eta, config)
    other than Base: the fraction of steps whose state re-encoded by Q_phi equals the state the step
    was generated under ("follows"), against chance 1/K and against Base steps paired with random
    states ("Base, random states": for CTRLS(epsilon) a chain drawn from the same epsilon-greedy
    policy from the prompt's s_0, for "fixed s0" the prompt's s_0 at every step), with the paired
    difference follows − Base. Rates are fractions of steps, 95% intervals a bootstrap over
    questions (``ctrls.controllability``)."""
    need = {"encoded", "s0", "n_states", "chains", "chain_eps"} - set(df.columns)
    if need:
        raise ValueError(f"the exploration samples lack the columns {sorted(need)}: rerun the exploration stage "
                         f"(--force exploration) to re-encode their steps")
    out = []
    for (b, ds, eta), grp in df.groupby(["backbone", "dataset", "temperature"], sort=False):
        base = grp[grp.config == BASE]
        for label, g in sorted(grp[grp.config != BASE].groupby("config", sort=False), key=lambda kv: _row_order(kv[0])):
            k = int(g.n_states.iloc[0])
            steps = _flat_steps(g, "states")
            row = {"backbone": b, "dataset": ds, "temperature": eta, "config": label, "K": k, "chance": 1.0 / k}
            ours = ctl.match_rate(*steps, n_boot=n_boot, seed=seed)
            row.update({"questions": ours["questions"], "steps": ours["steps"], **_with_ci("follows", ours)})
            if not base.empty:
                eps = float(g.epsilon.iloc[0]) if label != FIXED else math.nan
                bsteps = _flat_steps(_base_targets(base, label, eps), "target")
                ref = ctl.match_rate(*bsteps, n_boot=n_boot, seed=seed)
                row.update({"Base steps": ref["steps"], **_with_ci("Base, random states", ref)})
                if set(map(str, steps[2])) == set(map(str, bsteps[2])):
                    d = ctl.match_rate_difference(steps, bsteps, n_boot=n_boot, seed=seed)
                    row.update({"Δ vs Base": d["diff"], "Δ lo": d["lo"], "Δ hi": d["hi"], "p": d["p_value"]})
            out.append(row)
    return pd.DataFrame(out)


def diversity_table(df: pd.DataFrame, n_boot: int = 2000, seed: int = 0) -> pd.DataFrame:
    """Diversity per (backbone, dataset, eta, config), each a mean over questions with a 95%
    bootstrap interval: the number of distinct final answers among a question's samples
    (``answers.normalize``d, no-answer samples not counted); the entropy (bits) of the states its
    samples' steps visit, as re-encoded by Q_phi (every row, Base included); and for CTRLS rows the
    entropy of the states drawn for them. Entropies are plug-in estimates over a question's pooled
    steps, biased low (``ctrls.controllability``)."""
    out = []
    for (b, ds, eta, label), g in df.groupby(["backbone", "dataset", "temperature", "config"], sort=False):
        by_q = [q for _, q in g.groupby("question_id", sort=True)]
        answers = [[normalize(p) if v and isinstance(p, str) else None for p, v in zip(q.pred, q.valid)] for q in by_q]
        row = {"backbone": b, "dataset": ds, "temperature": eta, "config": label, "questions": len(by_q),
               "samples": int(g.groupby("question_id").size().max())}
        for name, values in (("distinct answers", ctl.distinct_answers(answers)),
                             ("encoded-state entropy (bits)",
                              ctl.state_entropy([list(q.encoded) for q in by_q]) if "encoded" in g else None),
                             ("drawn-state entropy (bits)",
                              ctl.state_entropy([list(q.states) for q in by_q]) if label != BASE else None)):
            if values is None:
                continue
            m, lo, hi = ctl.mean_with_ci(values, n_boot=n_boot, seed=seed)
            row.update({name: m, f"{name} lo": lo, f"{name} hi": hi})
        out.append(row)
    t = pd.DataFrame(out)
    t["_o"] = t.config.map(_row_order)
    return t.sort_values(["backbone", "dataset", "temperature", "_o"]).drop(columns="_o").reset_index(drop=True)


def paper_table1() -> pd.DataFrame:
    rows = []
    for (b, ds), by_eta in PAPER_TABLE1.items():
        for eta, by_row in by_eta.items():
            for label, (p20, succ) in by_row.items():
                rows.append({"backbone": b, "dataset": ds, "temperature": eta, "config": label,
                             "paper pass@20": p20, "paper Succ.": succ})
    return pd.DataFrame(rows)


def pass_at_k_curves(df: pd.DataFrame) -> pd.DataFrame:
    """Unbiased pass@k for k = 1..n per (backbone, dataset, eta, config)."""
    out = []
    for keys, g in df.groupby(["backbone", "dataset", "temperature", "config"], sort=False):
        c = matrices(g, "correct")
        for k in range(1, c.shape[1] + 1):
            out.append(dict(zip(["backbone", "dataset", "temperature", "config"], keys), k=k, pass_at_k=pass_at_k(c, k)))
    return pd.DataFrame(out)


def state_usage(df: pd.DataFrame) -> pd.DataFrame:
    """How often each latent state was drawn, per CTRLS config (the fixed-s0 row draws none)."""
    d = df[~df.config.isin([BASE, FIXED])].explode("states").dropna(subset=["states"])
    return d.groupby(["config", "states"]).size().rename("steps").reset_index()


__all__ = ["BASE", "FIXED", "PAPER_TABLE1", "explore", "load_samples", "table1", "ablation_table",
           "controllability_table", "diversity_table", "paper_table1", "pass_at_k_curves", "state_usage", "row_label",
           "grid_rows", "matrices", "matrix_frame", "stage_summary", "layout", "paper_layout",
           "ablation_view", "controllability_view", "diversity_view"]


def layout(t: pd.DataFrame) -> pd.DataFrame:
    """Our Table 1 in the paper's layout: rows (eta, config), columns (backbone · dataset, metric)."""
    t = with_pct_ci(t).assign(model=t.backbone.str.split("/").str[-1] + " · " + t.dataset)
    wide = t.pivot_table(index=["temperature", "config"], columns="model", values=["pass@n (%)", "Succ. (%)"],
                         aggfunc="first", sort=False)
    wide = wide.swaplevel(0, 1, axis=1).sort_index(axis=1, level=0, sort_remaining=False)
    wide.index = wide.index.set_names(["η", "exploration"])
    return wide


def paper_layout() -> pd.DataFrame:
    p = paper_table1()
    p = p.assign(model=p.backbone + " · " + p.dataset)
    wide = p.pivot_table(index=["temperature", "config"], columns="model", values=["paper pass@20", "paper Succ."],
                         aggfunc="first", sort=False)
    wide = wide.swaplevel(0, 1, axis=1).sort_index(axis=1, level=0, sort_remaining=False)
    wide.index = wide.index.set_names(["η", "exploration"])
    return wide


def _fmt(v: float, lo: float, hi: float, scale: float = 100.0, digits: int = 1, sign: bool = False) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "–"
    f = f"{{:{'+' if sign else ''}.{digits}f}}"
    return f"{f.format(scale * v)} [{f.format(scale * lo)}, {f.format(scale * hi)}]"


def ablation_view(t: pd.DataFrame) -> pd.DataFrame:
    """:func:`ablation_table` for the book: differences in percentage points with their 95% intervals."""
    if t.empty:
        return pd.DataFrame({"note": ["no fixed-s0 row in these samples (grid.fixed_state is false)"]})
    return pd.DataFrame({
        "backbone": t.backbone.str.split("/").str[-1], "dataset": t.dataset, "η": t.temperature,
        "comparison": t.comparison, "questions": t.questions,
        "Δ pass@n (pts)": list(map(lambda *a: _fmt(*a, sign=True), t["Δ pass@n"], t["Δ pass@n lo"], t["Δ pass@n hi"])),
        "p (pass@n)": t["p (pass@n)"].round(3),
        "Δ Succ. (pts)": list(map(lambda *a: _fmt(*a, sign=True), t["Δ Succ."], t["Δ Succ. lo"], t["Δ Succ. hi"])),
        "p (Succ.)": t["p (Succ.)"].round(3)})


def controllability_view(t: pd.DataFrame) -> pd.DataFrame:
    """:func:`controllability_table` for the book: rates in % with their 95% intervals."""
    cols = {"backbone": t.backbone.str.split("/").str[-1], "dataset": t.dataset, "η": t.temperature,
            "config": t.config, "K": t.K, "questions": t.questions, "steps": t.steps,
            "follows its state (%)": list(map(_fmt, t["follows"], t["follows lo"], t["follows hi"])),
            "chance 1/K (%)": (100 * t.chance).round(1)}
    if "Base, random states" in t:
        cols["Base steps"] = t["Base steps"]
        cols["Base, random states (%)"] = list(map(_fmt, t["Base, random states"], t["Base, random states lo"],
                                                   t["Base, random states hi"]))
    if "Δ vs Base" in t:
        cols["Δ vs Base (pts)"] = list(map(lambda *a: _fmt(*a, sign=True), t["Δ vs Base"], t["Δ lo"], t["Δ hi"]))
        cols["p"] = t["p"].round(3)
    return pd.DataFrame(cols)


def diversity_view(t: pd.DataFrame) -> pd.DataFrame:
    """:func:`diversity_table` for the book: means over questions with their 95% intervals."""
    cols = {"backbone": t.backbone.str.split("/").str[-1], "dataset": t.dataset, "η": t.temperature,
            "config": t.config, "questions": t.questions, "samples": t.samples}
    for name in ("distinct answers", "encoded-state entropy (bits)", "drawn-state entropy (bits)"):
        if name in t:
            cols[name] = list(map(lambda *a: _fmt(*a, scale=1.0, digits=2), t[name], t[f"{name} lo"], t[f"{name} hi"]))
    return pd.DataFrame(cols)
