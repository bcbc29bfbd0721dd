"""The exploration grid of Table 1: Base vs CTRLS(epsilon) sampling at temperatures eta.

For every backbone x dataset pair, temperature eta and row (Base, then each epsilon of the profile)
we draw ``grid.n_samples`` chains of thought per test question and grade them. Results are written
per question as parquet parts of the dataset directory ``runs/<profile>/exploration/samples.parquet/``
(atomic renames): after a kill -9 a rerun recomputes only the missing questions, with the same seeds,
so nothing is lost or duplicated. A part is reused only if it reads as a parquet file of
``grid.n_samples`` rows; once the stage is finished, its ``done`` marker holds every part's sha256,
and a rerun redoes a part that is missing or changed (``ctrls.runs``).
"""
from __future__ import annotations

import logging
import math
import zlib
from pathlib import Path

import numpy as np
import pandas as pd
from tqdm.auto import tqdm

from ctrls.answers import grade
from ctrls.backbone import load_backbone
from ctrls.config import Config
from ctrls.data import problems_from_config
from ctrls.metrics import metric_with_ci, paired_bootstrap, pass_at_k, pass_at_k_paper, success_rate
from ctrls.pretrain import pretrain_stages
from ctrls.pretrain import load_pretrained
from ctrls.prompts import encode_prompt
from ctrls.report import with_pct_ci
from ctrls.runs import Stage, pair_slug, read_parquet, slug, valid_part
from ctrls.sampling import Generation, SampleParams, sample

log = logging.getLogger(__name__)

BASE = "Base"
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


def samples_dir(cfg: Config) -> Path:
    return cfg.stage_dir("exploration") / "samples.parquet"


def _stage(cfg: Config) -> Stage:
    adapters = tuple(pretrain_stages(cfg.for_pair(b, d))["adapter"] for b, d in cfg.pairs())
    return Stage(cfg, "exploration", KEYS, upstream=tuple(a.key for a in adapters), inputs=adapters)


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
    rows_cfg = [None, *g.epsilons]
    for bname, ds in cfg.pairs():
        pc = cfg.for_pair(bname, ds)
        bb = load_backbone(bname, w.device(pc.backbone.device), pc.backbone.dtype, pc.backbone.cache_dir)
        model = load_pretrained(pc, bb)
        problems = problems_from_config(pc, "test")
        mine = w.shard(range(len(problems)))
        enc = {j: encode_prompt(bb.tokenizer, problems[j].question, pc.prompt.use_chat_template, pc.prompt.few_shot)
               for j in mine}
        per_chunk = max(1, pc.sampling.batch_size // g.n_samples)
        jobs = [(eta, eps, mine[i:i + per_chunk]) for eta in g.temperatures for eps in rows_cfg
                for i in range(0, len(mine), per_chunk)]
        bar = tqdm(jobs, desc=f"exploration {pair_slug(bname, ds)}", unit="batch", disable=not (progress and w.is_main))
        for eta, eps, chunk in bar:
            label = row_label(eps)
            parts = {j: out / f"{pair_slug(bname, ds)}__eta{eta:g}__{label}__{slug(problems[j].id)}.parquet" for j in chunk}
            todo = [j for j in chunk if not valid_part(parts[j], g.n_samples)]
            if not todo:
                continue
            bar.set_postfix_str(f"eta={eta:g} {label}")
            params = SampleParams(temperature=eta, top_k=pc.sampling.top_k, max_new_tokens=pc.sampling.max_new_tokens,
                                  max_steps=pc.prompt.max_steps, batch_size=pc.sampling.batch_size, epsilon=eps or 0.0)
            # one seed per question: its samples do not depend on the chunking or on the process
            seeds = [_seed(cfg.seed, bname, ds, eta, label, problems[j].id) for j in todo]
            gens = sample(bb, [enc[j][0] for j in todo], g.n_samples, params, model=None if eps is None else model,
                          seeds=seeds, prompt_starts=[enc[j][1] for j in todo])
            meta = {"backbone": bname, "dataset": ds, "temperature": eta, "config": label,
                    "epsilon": math.nan if eps is None else eps, "seed": cfg.seed}
            for j, gs in zip(todo, gens):
                write_part(pd.DataFrame(generation_rows(gs, problems[j], meta)), parts[j])
        bar.close()
    w.barrier()
    if w.is_main:
        df = load_samples(cfg)
        stage.finish(samples=len(df), questions=int(df.question_id.nunique()))
    w.barrier()
    return out


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


def matrices(df: pd.DataFrame, column: str) -> np.ndarray:
    """(questions x samples) matrix of a boolean column, questions sorted by id."""
    piv = df.pivot_table(index="question_id", columns="sample_index", values=column, aggfunc="first")
    return piv.sort_index().to_numpy(dtype=bool)


def table1(df: pd.DataFrame, n_boot: int = 2000, seed: int = 0) -> pd.DataFrame:
    """Table 1 in long form: one row per (backbone, dataset, eta, config) with pass@n and Succ.
    (fractions, with 95% bootstrap CIs over questions) and a paired comparison to Base."""
    out = []
    for (b, ds, eta), grp in df.groupby(["backbone", "dataset", "temperature"], sort=False):
        base_c = matrices(grp[grp.config == BASE], "correct") if (grp.config == BASE).any() else None
        for cfg_label, g in grp.groupby("config", sort=False):
            c, v = matrices(g, "correct"), matrices(g, "valid")
            p, plo, phi = metric_with_ci(c, pass_at_k_paper, n_boot=n_boot, seed=seed)
            s, slo, shi = metric_with_ci(v, success_rate, n_boot=n_boot, seed=seed)
            row = {"backbone": b, "dataset": ds, "temperature": eta, "config": cfg_label,
                   "questions": c.shape[0], "samples": c.shape[1], "pass@n": p, "pass@n lo": plo, "pass@n hi": phi,
                   "succ": s, "succ lo": slo, "succ hi": shi}
            if base_c is not None and cfg_label != BASE and base_c.shape == c.shape:
                cmp = paired_bootstrap(c, base_c, pass_at_k_paper, n_boot=n_boot, seed=seed)
                row.update({"Δ pass@n vs Base": cmp["diff"], "Δ lo": cmp["lo"], "Δ hi": cmp["hi"], "p": cmp["p_value"]})
            out.append(row)
    t = pd.DataFrame(out)
    order = {BASE: -1.0}
    t["_o"] = t.config.map(lambda s: order.get(s, float(s.split("=")[1]) if "=" in s else 99))
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
    """How often each latent state was drawn, per CTRLS config."""
    d = df[df.config != BASE].explode("states").dropna(subset=["states"])
    return d.groupby(["config", "states"]).size().rename("steps").reset_index()


__all__ = ["BASE", "PAPER_TABLE1", "explore", "load_samples", "table1", "paper_table1", "pass_at_k_curves",
           "state_usage", "row_label"]


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
