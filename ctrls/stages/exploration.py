"""The exploration grid of Table 1: Base vs CTRLS(epsilon) sampling at temperatures eta.

For every backbone x dataset pair, temperature eta and row we draw ``grid.n_samples`` chains of
thought per test question and grade them. The rows: Base (the backbone alone); "fixed s0" (with
``grid.fixed_state``: the trained adapter decoding every step under the prompt's own state s_0, no
transition drawn, which separates what the adapter learned from what the state transitions add);
and CTRLS(epsilon) for each epsilon of the profile. Every step of every sample, Base included, also gets
the pretrained Q_phi's state, read back from the sampler's own pass (``sample(..., read_states=model)``:
the frozen body's hidden states of the step's tokens, computed while decoding, are the ones a re-encode
in context computes; ``readback=False`` re-encodes them in a second forward pass instead,
``ctrls.generate.controllability.encode_generations``), and every Base sample gets state chains drawn from the
policy without being generated under them (``ctrls.generate.controllability``): the controllability table reads
both.

Results are written per question as parquet parts of the dataset directory
``runs/<profile>/exploration/samples.parquet/`` (atomic renames): after a kill -9 a rerun recomputes only the missing
questions, with the same seeds, so nothing is lost or duplicated. A part is reused only if it reads as a parquet file of
``grid.n_samples`` rows; once the stage is finished, its ``done`` marker holds every part's sha256,
and a rerun redoes a part that is missing or changed (``ctrls.stages.runs``).

With ``state_prompt.use`` the fixed-s0 and CTRLS(epsilon) rows are decoded under the state prompt's vectors
instead of the adapter (with ``state_prompt.with_adapter``: as well as the adapter; ``ctrls.stages.state_prompt``);
Base rows and the read-back are unchanged. With
``grid.position_floor`` > 0 as well, their drawn states and Base's independent chains keep to the states that
can occur at each step (``ctrls.method.positions``), and the fixed-s0 row holds s_0 only where it can occur;
the stage's ``done`` record holds each pair's mask.
"""
from __future__ import annotations

import logging
import math
import time
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

import pandas as pd

from ctrls.config.schema import Config
from ctrls.config.settings import BASE, FIXED, HOLD, constant_label, row_label
from ctrls.data.answers import grade
from ctrls.data.problems import load_problems
from ctrls.data.prompts import encode_prompt
from ctrls.generate import controllability as ctl
from ctrls.method.streams import seed_of
from ctrls.stages.common import (
    backbone_for,
    current_outputs,
    only_current,
    problems_from_config,
    read_results,
    sample_params,
    save_parquet,
)
from ctrls.stages.pretrain import check_fitted, fitted_stages, load_pretrained, pretrain_stages
from ctrls.stages.progress import tqdm
from ctrls.stages.runs import Stage, file_name, pair_slug, unify_parts, valid_part
from ctrls.stages.state_prompt import ctrls_conditioning, pair_state_prompt

if TYPE_CHECKING:
    from ctrls.generate.sampling import Generation

log = logging.getLogger(__name__)

KEYS = ("seed", "data", "prompt", "sampling", "grid")


class GridRow(NamedTuple):
    """One row of Table 1: how its samples are drawn."""

    label: str
    epsilon: float | None  # epsilon of the state policy; None: no state is drawn
    ctrls: bool  # decode with the trained adapter
    transitions: bool  # draw s_{t+1} ~ pi~(. | s_t) at every step boundary (else keep s_0)
    hold: int | str | None = None  # without transitions: the held state (SampleParams.hold)


def grid_rows(cfg: Config) -> list[GridRow]:
    """Base, then "fixed s0" (when ``grid.fixed_state``), "hold s0" (``grid.hold_state``), "state 1" ... "state K"
    (``grid.constant_states``), then CTRLS(epsilon) for each ``grid.epsilons``."""
    rows = [GridRow(BASE, None, False, False)]
    if cfg.grid.fixed_state:
        rows.append(GridRow(FIXED, None, True, False))
    if cfg.grid.hold_state:
        rows.append(GridRow(HOLD, None, True, False, "s0"))
    if cfg.grid.constant_states:
        rows += [GridRow(constant_label(j), None, True, False, j) for j in range(cfg.states.n_states)]
    return rows + [GridRow(row_label(e), e, True, True) for e in cfg.grid.epsilons]


def samples_dir(cfg: Config) -> Path:
    """The exploration stage's samples of this config: ``samples.parquet`` in its run's slot."""
    return _stage(cfg).dir / "samples.parquet"


def _stage(cfg: Config) -> Stage:
    # with state_prompt.use the CTRLS rows come from the state prompt's vectors: its section and fit join the key
    fitted = fitted_stages(cfg)
    keys = KEYS + (("state_prompt",) if cfg.state_prompt.use else ())
    return Stage(cfg, "exploration", keys, upstream=tuple(a.key for a in fitted), inputs=fitted)


def stage_summary(cfg: Config) -> dict:
    """The exploration stage's ``done`` record: wall_s, samples, questions, readback (whether the steps'
    states were read back from the sampler's pass), reencode_s (the seconds its last run spent on the
    controllability columns besides sampling: re-encoding steps when not read back, drawing Base's state
    chains), or {} before it ran."""
    return _stage(cfg).summary()



def sample_note(samples: pd.DataFrame, run: dict) -> str:
    """The page's count of samples, per dataset (the transfer rows have their own questions and
    rows), and the stage's wall time."""
    parts = []
    for ds, d in samples.groupby("dataset", sort=False):
        n_q, n_t = d.question_id.nunique(), d.temperature.nunique()
        n_s = int(d.groupby(["temperature", "config", "question_id"]).size().max())
        parts.append(f"{ds}: {len(d)} = {n_q} test questions × {n_s} samples × {n_t} "
                     f"temperature{'s' if n_t != 1 else ''} × {d.config.nunique()} rows")
    wall, enc = run.get("wall_s", float("nan")), run.get("reencode_s", float("nan"))
    if run.get("readback", False):
        what = (f"{enc:.0f} s drew Base's state chains for the controllability table (each step's state is read "
                f"back from the sampler's own pass)")
    else:
        what = f"{enc:.0f} s re-encoded the steps for the controllability table"
    return f"{len(samples)} samples ({'; '.join(parts)}). The stage's last run took {wall:.0f} s, of which {what}."


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


def explore(cfg: Config, force: bool = False, progress: bool = True, readback: bool = True) -> Path:
    """Run (or resume, or reuse) the whole exploration grid; return the samples directory.
    ``readback``: read each step's state back from the sampler's pass (else re-encode it: the old path,
    kept for ``bench/readback.py``).

    Under a data-parallel launch (``ctrls.stages.distributed``) each process samples its block of the
    test questions; every question's samples are seeded by its id, so the parts written are the
    ones a single process writes."""
    from ctrls.stages.distributed import world

    w = world()
    stage = _stage(cfg)
    out = samples_dir(cfg)
    if stage.is_done() and not force:
        return out
    try:
        if w.is_main:
            # before it clears another config's samples, the stage checks the fits it decodes with exist
            stage.begin(force=force, check=lambda: check_fitted(cfg, "exploration"))
            out.mkdir(parents=True, exist_ok=True)
        w.barrier()
        masks: dict = {}
        reencode_s = _sample_pairs(cfg, out, progress and w.is_main, readback, masks)
        w.barrier()
        if w.is_main:
            unify_parts(out)  # one schema over the parts: pandas.read_parquet reads samples.parquet whole
            df = load_samples(cfg, unfinished=True)
            # seconds this process spent on the controllability columns besides sampling (re-encoding, Base's chains)
            stage.finish(samples=len(df), questions=int(df.question_id.nunique()), reencode_s=round(reencode_s, 1),
                         readback=readback, **({"position_masks": masks} if masks else {}))
    finally:
        stage.release()  # a failed or interrupted grid gives the lock back (finish released it otherwise)
    w.barrier()
    return out


class Questions(NamedTuple):
    """One dataset's test questions in a pair's grid: the rows and temperatures they are sampled at."""

    problems: list
    dataset: str  # the dataset the questions come from
    rows: list[GridRow]
    temperatures: list[float]
    trained_on: str | None = None  # transfer questions: the dataset the CTRLS model was pretrained on

    @property
    def where(self) -> str:  # transfer parts apart from the pair's own
        return self.dataset if self.trained_on is None else f"{self.dataset}-from-{self.trained_on}"


def _sample_pairs(cfg: Config, out: Path, progress: bool, readback: bool, masks: dict) -> float:
    """Sample every pair's grid and transfer rows (the parts not on disk); the seconds spent on the
    controllability columns besides sampling. Each pair's position mask (``grid.position_floor`` > 0) goes
    into ``masks``."""
    g = cfg.grid
    grid = grid_rows(cfg)
    reencode_s = 0.0
    for bname, ds in cfg.pairs():
        pc = cfg.for_pair(bname, ds)
        bb = backbone_for(pc, bname)
        model = load_pretrained(pc, bb)
        sp, mask = pair_state_prompt(pc, bb, model, pretrain_stages(pc))
        if mask is not None:
            masks[pair_slug(bname, ds)] = mask.to_dict()
        sources = [Questions(problems_from_config(pc, "test"), ds, grid, g.temperatures)]
        # the transfer rows: this pair's CTRLS model on a few questions of other datasets (e.g. GSM8K)
        rows = [r for r in grid if r.label == BASE or r.epsilon == (g.epsilons[0] if g.epsilons else None)]
        d = pc.data
        for td in g.transfer_datasets:
            problems = load_problems(td, "test", n=g.transfer_questions, seed=d.seed, data_dir=d.data_dir,
                                     max_bad_fraction=d.max_bad_fraction, difficulty=d.word_problems.difficulty())
            sources.append(Questions(problems, td, rows, [cfg.rl.temperature], trained_on=ds))
        reencode_s += _sample_grid(cfg, pc, bb, model, sources, out, progress, readback=readback, state_prompt=sp,
                                   mask=mask)
    return reencode_s


def _jobs(sources: list[Questions], shards: list[list[int]], per_chunk: int) -> list[tuple]:
    """(eta, row, [(source, question)]): each temperature's questions of every source, in chunks of
    ``per_chunk``, then each row of a chunk on the chunk's questions the row is sampled on. The transfer
    questions join the pair's own in the chunks, so a small grid's few transfer questions do not decode
    in batches of their own (each pass reads all of the model's weights, however few its rows)."""
    jobs = []
    rows = list({r.label: r for s in sources for r in s.rows}.values())
    for eta in dict.fromkeys(t for s in sources for t in s.temperatures):
        qs = [(k, j) for k, s in enumerate(sources) if eta in s.temperatures for j in shards[k]]
        for i in range(0, len(qs), per_chunk):
            for row in rows:
                on = [(k, j) for k, j in qs[i:i + per_chunk] if row in sources[k].rows]
                if on:
                    jobs.append((eta, row, on))
    return jobs


def _sample_grid(cfg: Config, pc: Config, bb, model, sources: list[Questions], out: Path, progress: bool,
                 readback: bool = True, state_prompt=None, mask=None) -> float:
    """Sample and write every (temperature, row, question) part of the ``sources``' questions that is not
    already on disk; return the seconds spent on the controllability columns besides sampling. With
    ``state_prompt`` (a ``StatePrompt``) the CTRLS rows are decoded under it instead of the adapter
    (``ctrls.stages.state_prompt.ctrls_conditioning``); ``mask`` (a ``ctrls.method.positions.PositionMask``)
    restricts their drawn states and Base's chains to the states that can occur at each step."""
    # here, not at the top: the engine loads transformers, which pages that only read samples skip
    from ctrls.generate.sampling import sample
    from ctrls.stages.distributed import world

    w = world()
    g = cfg.grid
    bname = pc.backbone.name
    reencode_s = 0.0
    shards = [w.shard(range(len(s.problems))) for s in sources]
    enc = {(k, j): encode_prompt(bb.tokenizer, sources[k].problems[j].question, pc.prompt.use_chat_template,
                                 pc.prompt.few_shot) for k in range(len(sources)) for j in shards[k]}
    per_chunk = max(1, pc.sampling.batch_size // g.n_samples)
    # a chunk's rows one after another: the CTRLS rows under the state prompt share its prompts' passes (s_0 and
    # the read-back's KV cache: ctrls.generate.controllability.PromptPasses); each row's samples are the same in any order
    jobs = _jobs(sources, shards, per_chunk)
    passes = ctl.PromptPasses(keep=per_chunk) if state_prompt is not None else None
    cond = ctrls_conditioning(pc, bb, model, state_prompt, mask, passes)  # the CTRLS rows' conditioning
    bar = tqdm(jobs, desc=f"exploration {pair_slug(bname, sources[0].dataset)}", unit="batch", disable=not progress)
    for eta, row, chunk in bar:
        label = row.label
        problem = {q: sources[q[0]].problems[q[1]] for q in chunk}
        parts = {q: part_file(out, bname, sources[q[0]].where, eta, label, problem[q].id) for q in chunk}
        todo = [q for q in chunk if not valid_part(parts[q], g.n_samples)]
        if not todo:
            continue
        bar.set_postfix_str(f"eta={eta:g} {label}")
        params = sample_params(pc, eta, epsilon=row.epsilon or 0.0, transitions=row.transitions, hold=row.hold)
        # one seed per question: its samples do not depend on the process. The whole chunk is sampled again
        # when one of its parts is missing (a resumed run): the rows decoded beside a question change the
        # batched arithmetic in its last bits, and so, rarely, a sampled token; only the missing parts are written
        seeds = [seed_of(cfg.seed, bname, sources[q[0]].dataset, eta, label, problem[q].id) for q in chunk]
        # under the state prompt the CTRLS rows are read back by a re-encode: the decoding pass holds the vectors
        reread = readback or (row.ctrls and state_prompt is not None)
        gens = sample(bb, [enc[q][0] for q in chunk], g.n_samples, params, conditioning=cond if row.ctrls else None,
                      seeds=seeds, prompt_starts=[enc[q][1] for q in chunk], read_states=model if reread else None)
        gens = [gs for q, gs in zip(chunk, gens) if q in todo]
        for q, gs in zip(todo, gens):
            src = sources[q[0]]
            meta = {"backbone": bname, "dataset": src.dataset, "temperature": eta, "config": label,
                    "epsilon": math.nan if row.epsilon is None else row.epsilon, "seed": cfg.seed,
                    "trained_on": src.trained_on or src.dataset}  # the dataset the CTRLS model was pretrained on
            t0 = time.perf_counter()
            extra = _controllability_columns(cfg, pc, bb, model, enc[q], gs, row, eta, problem[q].id, reread, mask=mask)
            reencode_s += time.perf_counter() - t0
            write_part(pd.DataFrame(generation_rows(gs, problem[q], meta)).assign(**extra), parts[q])
    bar.close()
    return reencode_s


def _controllability_columns(cfg: Config, pc: Config, bb, model, prompt: tuple[list[int], int], gens: list[Generation],
                             row: GridRow, eta: float, qid: str, readback: bool = True, mask=None) -> dict[str, list]:
    """The columns the controllability and diversity tables read, one entry per generation:
    ``encoded`` (Q_phi's state of each step: read back from the sampler's pass with ``readback``, else
    re-encoded), ``s0`` (the prompt's state), ``n_states`` (K); for Base rows ``chains`` / ``chain_eps``:
    one state chain per grid epsilon, drawn from the policy pi~ from the prompt's s_0, as long as the
    sample (the states it is paired with), under the CTRLS rows' position ``mask`` when there is one."""
    from ctrls.generate.sampling import seeded  # as in _sample_grid

    if readback:  # sample(..., read_states=model) filled them in; a prompt's samples share its s_0
        s0, encoded = gens[0].encoded_s0, [g.encoded for g in gens]
    else:
        s0, encoded = ctl.encode_generations(bb, model, prompt[0], prompt[1], gens, layer=pc.backbone.hidden_layer)
    n = len(gens)
    chains: list[list[list[int]]] = [[] for _ in range(n)]
    chain_eps = [[] for _ in range(n)]
    if not row.ctrls:
        lengths = [len(e) for e in encoded]
        for eps in cfg.grid.epsilons:
            gen = seeded(seed_of(cfg.seed, pc.backbone.name, pc.data.dataset, eta, "chain", eps, qid), model.policy.L.device)
            for m, c in enumerate(ctl.draw_chains(model.policy, s0, lengths, eps, generator=gen, mask=mask)):
                chains[m].append(c)
                chain_eps[m].append(float(eps))
    return {"encoded": encoded, "s0": [int(s0.argmax())] * n, "n_states": [int(model.config.n_states)] * n,
            "chains": chains, "chain_eps": chain_eps}


def part_file(out: Path, backbone: str, dataset: str, eta: float, label: str, qid: str) -> Path:
    """The part file of one question's samples in one grid cell: injective in the question id
    (``ctrls.data.names.file_name``), so no two questions share a part."""
    return out / f"{pair_slug(backbone, dataset)}__eta{float(eta)!r}__{label.replace(' ', '_')}__{file_name(qid)}.parquet"


# the types of the columns a part may hold only nulls or empty lists in (a Base row draws no states, a sample
# with no answer has no pred): every part has one schema, so that pandas reads the whole directory
PART_TYPES = {"pred": "string", "states": "list<int64>", "encoded": "list<int64>", "chains": "list<list<int64>>",
              "chain_eps": "list<double>", "steps": "list<string>"}


def _arrow_type(name: str):
    import pyarrow as pa

    return {"string": pa.large_string(), "list<int64>": pa.list_(pa.int64()), "list<list<int64>>": pa.list_(pa.list_(pa.int64())),
            "list<double>": pa.list_(pa.float64()), "list<string>": pa.list_(pa.large_string())}[name]


def write_part(df: pd.DataFrame, path: Path) -> None:
    """One part, written atomically, its null-only columns typed as :data:`PART_TYPES` says."""
    import pyarrow as pa

    table = pa.Table.from_pandas(df, preserve_index=False)
    for i, field in enumerate(table.schema):
        if field.name in PART_TYPES and field.type != (want := _arrow_type(PART_TYPES[field.name])):
            table = table.set_column(i, pa.field(field.name, want), table.column(i).cast(want))
    save_parquet(table, path)


def load_samples(cfg: Config, unfinished: bool = False) -> pd.DataFrame:
    """The exploration samples of this config: only the parts the stage's ``done`` marker recorded
    under this config's key (``ctrls.stages.common.current_outputs``). Samples made under another
    config (e.g. another ``grid.n_samples``) or an unfinished stage (unless ``unfinished``: the stage
    itself, before it finishes) raise ``NotRunError`` (a ``FileNotFoundError``) naming the directory;
    a part that cannot be read or holds NaN in ``SAMPLE_RESULTS`` raises ``UnreadableResultsError`` naming it."""
    d = samples_dir(cfg)
    allowed = current_outputs(_stage(cfg), "exploration samples", unfinished=unfinished)
    files = only_current(sorted(d.glob("*.parquet")), allowed)
    if not files:
        raise FileNotFoundError(f"no exploration samples in {d}; run the exploration stage first")
    return pd.concat([read_results(f, SAMPLE_RESULTS) for f in files], ignore_index=True)


SAMPLE_RESULTS = ("temperature", "config", "question_id", "valid", "correct")  # never NaN in a part the stage wrote


# ---- tables and curves -----------------------------------------------------------------------


__all__ = ["explore", "generation_rows", "grid_rows", "load_samples", "part_file", "samples_dir", "stage_summary", "write_part"]


