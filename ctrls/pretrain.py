"""Algorithm 1 (offline CTRLS pretraining) as resumable stages under ``runs/<profile>/pretrain/<pair>/``.

(a) ``collect``:  sample n CoTs per training question from the backbone and keep the correct ones
                  (App. F); reference solutions are added when ``pretrain.sources`` says so.
(b) ``features``: one backbone forward per trajectory; cache the last-layer hidden states of its
                  steps (and of the question, for s_0) on disk.
(c) ``spectral``: e_t of every step (Eq. 5) and e_0 of every question.
(d) ``states``:   k-means centroids, tau, soft assignments s_t (Q_phi).
(e) ``transitions``: fit L by minimising sum_t KL(s_t || s_{t-1} softmax(L)) (the ELBO's KL term).
(f) ``adapter``:  train the adapter on the ELBO (Thm 5.3) from the cached hidden states (with
                  last-hidden injection the backbone is not re-run).
(g) ``checkpoint``: config.json + model.safetensors, reloadable with ``CTRLSModel.from_pretrained``.

Each stage writes its outputs and then a ``done`` marker keyed by the config it depends on, with
the sha256 of each output (``ctrls.runs``), so a rerun reuses finished stages whose files are
intact, and (a) and (b) resume per question after an interruption. (a) commits a question by
writing its ``_end`` row after its rows; a resumed run first cuts the rows after the last
committed question off the JSONL, so a question cut by a kill is neither lost nor counted twice.
"""
from __future__ import annotations

import json
import logging
import os
import zlib
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch
from tqdm.auto import tqdm

from ctrls.answers import grade
from ctrls.backbone import Backbone, load_backbone
from ctrls.config import Config
from ctrls.data import Problem, problems_from_config
from ctrls.elbo import elbo_loss, elbo_terms
from ctrls.model import CTRLSConfig, CTRLSModel
from ctrls.policy import fit_transitions
from ctrls.prompts import (encode_prompt, encode_solution, final_answer_line, newline_token_ids, split_steps,
                           step_spans)
from ctrls.runs import (ArtifactError, Stage, artifact_error, check_safetensors, load_torch, pair_slug,
                        read_parquet, safe_name)
from ctrls.sampling import SampleParams, sample
from ctrls.spectral import spectral_embeddings
from ctrls.states import fit_states

log = logging.getLogger(__name__)

# the config fields each stage depends on (its own and, through `upstream`, its inputs')
KEYS = {
    "collect": ("seed", "data", "backbone.name", "backbone.dtype", "prompt", "sampling.max_new_tokens",
                "sampling.top_k", "pretrain.sources", "pretrain.samples_per_question", "pretrain.temperature"),
    "features": ("backbone.hidden_layer",),
    "spectral": ("spectral",),
    "states": ("states",),
    "transitions": ("policy",),
    "adapter": ("adapter", "pretrain.epochs", "pretrain.lr", "pretrain.batch_steps", "pretrain.max_tokens_per_step"),
}


class PretrainError(RuntimeError):
    pass


@dataclass
class PretrainRun:
    """Paths and summaries of one (backbone, dataset) pretraining run."""

    root: Path
    checkpoint: Path
    summaries: dict[str, dict]

    def trajectories(self) -> pd.DataFrame:
        """Every collected row (kept or not) of the committed questions, in file order."""
        return read_trajectories(self.root / "collect" / "trajectories.jsonl")

    def elbo_history(self) -> pd.DataFrame:
        return read_parquet(self.root / "adapter" / "elbo_history.parquet")

    def transition_history(self) -> pd.DataFrame:
        return read_parquet(self.root / "transitions" / "kl_history.parquet")

    def states(self) -> dict:
        return load_torch(self.root / "states" / "states.pt", weights_only=True)

    def steps(self) -> pd.DataFrame:
        """One row per training step: question, trajectory, step index, text, hard state, distance."""
        return read_parquet(self.root / "states" / "steps.parquet")

    def model(self, backbone: Backbone | None = None) -> CTRLSModel:
        return load_checkpoint(self.checkpoint, backbone)

    def nearest_steps(self, n_states: int = 4, per_state: int = 3) -> pd.DataFrame:
        """For the ``n_states`` most used states, the training steps nearest their centroid."""
        steps = self.steps()
        top = steps.state.value_counts().index[:n_states]
        near = steps[steps.state.isin(top)].sort_values("dist2").groupby("state", sort=False).head(per_state)
        near = near.assign(state=pd.Categorical(near.state, categories=list(top), ordered=True))
        return near.sort_values(["state", "dist2"])[["state", "text", "p_state", "qid", "step"]].reset_index(drop=True)

    def trajectory_view(self, i: int = 0, source: str | None = "samples") -> pd.DataFrame:
        """One training trajectory's steps beside their latent states."""
        steps = self.steps()
        keys = steps[["qid", "trajectory", "source"]].drop_duplicates()
        if source is not None and (keys.source == source).any():
            keys = keys[keys.source == source]
        q, t = keys.iloc[i % len(keys)][["qid", "trajectory"]]
        one = steps[(steps.qid == q) & (steps.trajectory == t)]
        return one[["step", "state", "p_state", "text"]].reset_index(drop=True)


# the stages whose outputs each stage reads: it runs again when one of them is redone with other outputs
READS = {"collect": (), "features": ("collect",), "spectral": ("features",), "states": ("spectral", "features"),
         "transitions": ("states",), "adapter": ("features", "states", "transitions")}


def pretrain_stages(cfg: Config) -> dict[str, Stage]:
    pair = pair_slug(cfg.backbone.name, cfg.data.dataset)
    out, upstream = {}, ()
    for name, keys in KEYS.items():
        # the adapter stage also writes the checkpoint next to its directory
        extra = (cfg.stage_dir("pretrain", pair, "checkpoint"),) if name == "adapter" else ()
        st = Stage(cfg, "pretrain", keys, pair, name, upstream=upstream, inputs=tuple(out[r] for r in READS[name]),
                   extra=extra)
        out[name] = st
        upstream = (st.key,)
    return out


def pretrain(cfg: Config, backbone: Backbone | None = None, force: bool = False, progress: bool = True,
             until: str | None = None) -> PretrainRun:
    """Run (or reuse) every stage of Algorithm 1 for ``cfg.backbone.name`` x ``cfg.data.dataset``
    (only up to stage ``until`` when given)."""
    stages = pretrain_stages(cfg)
    if until is not None:
        if until not in stages:
            raise PretrainError(f"unknown stage {until!r}; stages: {', '.join(stages)}")
        stages = dict(list(stages.items())[: list(stages).index(until) + 1])
    from ctrls.distributed import world

    w = world()
    root = stages["collect"].dir.parent
    ckpt = root / "checkpoint"
    if force and w.is_main:
        for st in stages.values():
            st.begin(force=True)
    w.barrier()
    todo = [n for n, st in stages.items() if not st.is_done()]
    if todo and w.is_main:
        log.info("pretraining %s: stages to run: %s", root, ", ".join(todo))
    bb = None

    def need_backbone() -> Backbone:
        nonlocal bb
        if bb is None:
            bb = backbone or load_backbone(cfg.backbone.name, w.device(cfg.backbone.device), cfg.backbone.dtype,
                                           cfg.backbone.cache_dir)
        return bb

    problems = None
    for name, st in stages.items():
        if st.is_done():
            continue
        # data parallel: every rank samples its shard in (a); rank 0 alone runs (b)-(g)
        if name != "collect" and not w.is_main:
            break
        if w.is_main:
            st.begin()
        if problems is None:
            problems = problems_from_config(cfg, "train")
        if name == "collect":
            w.barrier()
            summary = collect(cfg, need_backbone(), problems, st.dir, progress)
        elif name == "features":
            summary = cache_features(cfg, need_backbone(), problems, stages["collect"].dir, st.dir, progress)
        elif name == "spectral":
            summary = compute_spectral(cfg, stages["features"].dir, st.dir, progress)
        elif name == "states":
            summary = cluster_states(cfg, stages["spectral"].dir, stages["features"].dir, st.dir)
        elif name == "transitions":
            summary = fit_transition_model(cfg, stages["states"].dir, st.dir)
        else:
            summary = train_adapter(cfg, need_backbone(), stages, st.dir, progress)
            _save_checkpoint(cfg, need_backbone(), stages, st.dir, ckpt)
        if w.is_main:
            st.finish(**summary)
    w.barrier()
    return PretrainRun(root=root, checkpoint=ckpt, summaries={n: st.summary() for n, st in stages.items()})


# ---- (a) collect ---------------------------------------------------------------------------


def collect(cfg: Config, bb: Backbone, problems: list[Problem], out: Path, progress: bool = True) -> dict:
    """Sample CoTs per training question; keep the correct ones; add reference solutions."""
    unknown = set(cfg.pretrain.sources) - {"samples", "reference"}
    if unknown or not cfg.pretrain.sources:
        raise PretrainError(f"pretrain.sources must be a non-empty subset of [samples, reference], got {cfg.pretrain.sources}")
    path = out / "trajectories.jsonl"
    from ctrls.distributed import world

    w = world()
    if w.is_main:
        _drop_uncommitted(path)
    w.barrier()
    done = _done_questions(path)
    tok = bb.tokenizer
    n = cfg.pretrain.samples_per_question
    params = SampleParams(temperature=cfg.pretrain.temperature, top_k=cfg.sampling.top_k,
                          max_new_tokens=cfg.sampling.max_new_tokens, max_steps=cfg.prompt.max_steps,
                          batch_size=cfg.sampling.batch_size)
    per_chunk = max(1, cfg.sampling.batch_size // max(n, 1))
    # data parallel: each round covers the next `size * per_chunk` questions, every rank sampling its
    # contiguous block of them (perhaps empty) so that the gathers line up; gathered in rank order,
    # the rows rank 0 appends come in the single-process order
    span = per_chunk * w.size
    bar = tqdm(total=len(problems), desc="(a) collect CoTs", unit="q", disable=not (progress and w.is_main))
    for lo in range(0, len(problems), span):
        chunk = w.shard(problems[lo:lo + span])
        todo = [p for p in chunk if p.id not in done]
        rows = []
        gens = [[] for _ in todo]
        if todo and "samples" in cfg.pretrain.sources and n > 0:
            enc = [encode_prompt(tok, p.question, cfg.prompt.use_chat_template, cfg.prompt.few_shot) for p in todo]
            # one seed per question: a resumed or sharded run regenerates exactly the same samples
            gens = sample(bb, [e[0] for e in enc], n, params, seeds=[_question_seed(cfg.seed, p.id) for p in todo])
        for p, gs in zip(todo, gens):
            for g in gs:
                gr = grade(g.text, p.answer)
                rows.append({"qid": p.id, "source": "samples", "sample_index": g.sample_index,
                             "solution_ids": g.token_ids, "steps": g.steps, "valid": gr.valid,
                             "correct": gr.correct, "pred": gr.pred, "kept": gr.correct and len(g.steps) > 0,
                             "finish": g.finish})
            if "reference" in cfg.pretrain.sources:
                # steps beyond T merge into step T, as split_steps does for generations
                steps = split_steps("\n".join([*p.steps, final_answer_line(p.answer)]), cfg.prompt.max_steps)
                rows.append({"qid": p.id, "source": "reference", "sample_index": -1,
                             "solution_ids": encode_solution(tok, steps), "steps": steps, "valid": True,
                             "correct": True, "pred": p.answer, "kept": True, "finish": "reference"})
            rows.append({"qid": p.id, "source": "_end", "sample_index": -2})  # commits the question (after its rows)
        rows, sizes = w.gather_list(rows), w.gather(len(chunk))
        if rows and w.is_main:
            _append_jsonl(path, rows)
        bar.update(sum(sizes))
    bar.close()
    w.barrier()
    df = read_trajectories(path)
    sampled = df[df.source == "samples"]
    kept = df[df.kept.astype(bool)]
    if kept.empty:
        raise PretrainError("no correct trajectory was collected: raise pretrain.samples_per_question or add "
                            "'reference' to pretrain.sources")
    return {"questions": len(problems), "sampled": len(sampled), "sampled_correct": int(sampled.correct.sum()),
            "acceptance_rate": float(sampled.correct.mean()) if len(sampled) else None,
            "reference": int((df.source == "reference").sum()), "kept": len(kept),
            "sources": list(cfg.pretrain.sources)}


def _question_seed(seed: int, qid: str) -> int:
    return zlib.crc32(f"collect|{seed}|{qid}".encode())


# The JSONL protocol of (a): a question's rows, then its `_end` row, which commits it. Questions are
# appended in order, so the file is a run of committed blocks and, after a kill, an uncommitted tail.

TRAJ_COLUMNS = ["qid", "source", "sample_index", "solution_ids", "steps", "valid", "correct", "pred", "kept", "finish"]


def _is_end(line: bytes) -> bool:
    if b'"_end"' not in line or not line.endswith(b"\n"):
        return False
    try:
        row = json.loads(line)
    except ValueError:
        return False
    return isinstance(row, dict) and row.get("source") == "_end"


def _drop_uncommitted(path: Path) -> None:
    """Cut the rows after the last committed question (a question whose write a kill cut short) off
    the JSONL, so that redoing that question does not add its rows twice."""
    if not path.exists():
        return
    end = pos = 0
    with open(path, "rb") as f:
        for line in f:
            pos += len(line)
            if _is_end(line):
                end = pos
    if end < pos:
        log.info("%s: dropping %d bytes after the last committed question (a write cut short); "
                 "that question is sampled again", path, pos - end)
        with open(path, "rb+") as f:
            f.truncate(end)
            f.flush()
            os.fsync(f.fileno())


def _done_questions(path: Path) -> set[str]:
    if not path.exists():
        return set()
    with open(path, "rb") as f:
        return {json.loads(line)["qid"] for line in f if _is_end(line)}


def _append_jsonl(path: Path, rows: list[dict]) -> None:
    """Append whole rows and sync them to disk (a question counts once its `_end` row is written)."""
    with open(path, "a") as f:
        f.write("".join(json.dumps(r) + "\n" for r in rows))
        f.flush()
        os.fsync(f.fileno())


def read_trajectories(path: Path) -> pd.DataFrame:
    """The rows of every committed question, in file order, without the `_end` rows.

    A question's rows are those just before its `_end` row. Rows after the last `_end` (a write cut
    by a kill) are not read. Runs resumed by older versions could also hold such cut rows between
    blocks: rows of another question are dropped, and a row repeated within a block counts once
    (the last). A line that is not JSON inside a committed block is an error naming the line."""
    rows: list[dict] = []
    block: list[tuple[int, dict | None]] = []
    seen: set[str] = set()
    try:
        f = open(path, encoding="utf-8")
    except OSError as e:
        raise artifact_error(path, e) from e
    with f:
        for n, line in enumerate(f, 1):
            if not line.endswith("\n"):
                break  # cut by a kill: uncommitted
            try:
                row = json.loads(line)
            except ValueError:
                row = None
            if not isinstance(row, dict):
                row = None
            if row is None or row.get("source") != "_end":
                block.append((n, row))
                continue
            bad = [k for k, r in block if r is None]
            if bad:
                raise ArtifactError(f"{path}, line {bad[0]}: not a JSON row; the file is corrupt: delete it "
                                    "and rerun the pretraining stage")
            qid = row["qid"]
            if qid not in seen:
                seen.add(qid)
                mine = {(r["source"], r["sample_index"]): r for _, r in block if r["qid"] == qid}
                rows += mine.values()
            block = []
    return pd.DataFrame(rows, columns=TRAJ_COLUMNS)


def kept_trajectories(collect_dir: Path) -> pd.DataFrame:
    """The kept trajectories of committed questions, in file order."""
    df = read_trajectories(collect_dir / "trajectories.jsonl")
    return df[df.kept.astype(bool)].reset_index(drop=True)


# ---- (b) features --------------------------------------------------------------------------


def cache_features(cfg: Config, bb: Backbone, problems: list[Problem], collect_dir: Path, out: Path,
                   progress: bool = True) -> dict:
    """One forward per trajectory (batched per question); cache step and question hidden states."""
    traj = kept_trajectories(collect_dir)
    by_q = {p.id: p for p in problems}
    nl = newline_token_ids(bb.tokenizer)
    n_traj = 0
    order = {p.id: i for i, p in enumerate(problems)}  # question order, whatever order (a) wrote them in
    groups = sorted(traj.groupby("qid", sort=False), key=lambda kv: order.get(kv[0], len(order)))
    for qid, g in tqdm(groups, desc="(b) hidden states", unit="q", disable=not progress):
        f = out / f"{safe_name(qid)}.pt"
        if f.exists() and _valid_shard(f, qid, len(g)):
            n_traj += len(g)
            continue
        p = by_q[qid]
        ids, start = encode_prompt(bb.tokenizer, p.question, cfg.prompt.use_chat_template, cfg.prompt.few_shot)
        P = len(ids)
        sols = [list(s) for s in g.solution_ids]
        width = P + max(len(s) for s in sols)
        batch = torch.full((len(sols), width), bb.tokenizer.pad_token_id or 0, dtype=torch.long)
        mask = torch.zeros_like(batch)
        for i, s in enumerate(sols):
            batch[i, : P + len(s)] = torch.as_tensor(ids + s)
            mask[i, : P + len(s)] = 1
        h = bb.hidden_states(batch, mask, layer=cfg.backbone.hidden_layer).float().cpu()
        items = []
        for i, s in enumerate(sols):
            spans = step_spans(s, nl, bb.tokenizer, max_steps=cfg.prompt.max_steps)
            steps = [bb.tokenizer.decode(s[a:b]).strip() for a, b in spans]
            # H[j] is the hidden state at position P-1+j: it predicts solution token j, and
            # H[1+a : 1+b] are the hidden states E_t of the step's own tokens.
            items.append({"hidden": h[i, P - 1: P + len(s)].to(torch.float16), "targets": torch.as_tensor(s),
                          "spans": torch.as_tensor(spans, dtype=torch.long).reshape(-1, 2),
                          "steps": steps, "source": g.source.iloc[i], "sample_index": int(g.sample_index.iloc[i])})
        question_hidden = h[0, start:P].to(torch.float16)
        tmp = f.with_suffix(".tmp")
        torch.save({"qid": qid, "question_hidden": question_hidden, "trajectories": items}, tmp)
        tmp.replace(f)
        n_traj += len(items)
    return {"trajectories": n_traj, "questions": len(groups)}


def _valid_shard(f: Path, qid: str, n_traj: int) -> bool:
    """Whether a shard written earlier can be reused: it loads, for this question and its trajectories."""
    try:
        shard = torch.load(f, weights_only=False, mmap=True)  # reads the zip index, not the tensors
        ok = shard["qid"] == qid and len(shard["trajectories"]) == n_traj
        why = f"it holds {shard['qid']!r} with {len(shard['trajectories'])} trajectories, expected {qid!r} with {n_traj}"
    except Exception as e:
        ok, why = False, f"{type(e).__name__}: {e}"
    if not ok:
        log.warning("features shard %s is unusable (%s): recomputing it", f, why)
    return ok


def _shards(features_dir: Path) -> list[dict]:
    return [load_torch(f, weights_only=False) for f in sorted(features_dir.glob("*.pt"))]


# ---- (c) spectral --------------------------------------------------------------------------


def compute_spectral(cfg: Config, features_dir: Path, out: Path, progress: bool = True) -> dict:
    k, norm = cfg.spectral.k, cfg.spectral.normalize
    step_e, prompt_e, index = [], [], []
    for qi, shard in enumerate(tqdm(_shards(features_dir), desc="(c) spectral", unit="q", disable=not progress)):
        prompt_e.append(spectral_embeddings([shard["question_hidden"].float()], k, norm,
                                            names=[f"{shard['qid']}/question"])[0])
        for ti, tr in enumerate(shard["trajectories"]):
            H = tr["hidden"].float()
            steps = [H[1 + a: 1 + b] for a, b in tr["spans"].tolist()]
            if steps:
                names = [f"{shard['qid']}/traj{ti}/step{t}" for t in range(len(steps))]
                step_e.append(spectral_embeddings(steps, k, norm, names=names))
            index += [(qi, ti, t) for t in range(len(steps))]
    if not index:
        raise PretrainError("no steps to embed")
    e = torch.cat(step_e)
    torch.save({"step_e": e, "prompt_e": torch.stack(prompt_e),
                "index": torch.as_tensor(index, dtype=torch.long)}, out / "spectral.pt")
    return {"steps": len(index), "dim": e.shape[1]}


# ---- (d) states ----------------------------------------------------------------------------


def cluster_states(cfg: Config, spectral_dir: Path, features_dir: Path, out: Path) -> dict:
    sp = load_torch(spectral_dir / "spectral.pt", weights_only=True)
    ids = [f"q{q}/traj{t}/step{s}" for q, t, s in sp["index"].tolist()]
    space = fit_states(sp["step_e"], cfg.states.n_states, seed=cfg.seed, minibatch_above=cfg.states.minibatch_above,
                       tau=cfg.states.tau, reduce_k=cfg.states.reduce_k, ids=ids)
    s_post = space.assign(sp["step_e"])
    s0 = space.assign(sp["prompt_e"])
    torch.save({"centroids": space.centroids, "tau": torch.tensor(space.tau), "s_post": s_post, "s0": s0,
                "index": sp["index"], "requested_k": torch.tensor(space.requested_k)}, out / "states.pt")
    (out / "notes.json").write_text(json.dumps(space.notes))
    # one row per step, for the book's latent-state explorer
    shards = _shards(features_dir)
    d2 = torch.cdist(sp["step_e"].float(), space.centroids.float()).pow(2)
    hard = s_post.argmax(-1)
    rows = []
    for r, (q, t, k) in enumerate(sp["index"].tolist()):
        tr = shards[q]["trajectories"][t]
        rows.append({"qid": shards[q]["qid"], "trajectory": t, "source": tr["source"], "step": k,
                     "text": tr["steps"][k], "state": int(hard[r]), "p_state": float(s_post[r, hard[r]]),
                     "dist2": float(d2[r, hard[r]])})
    pd.DataFrame(rows).to_parquet(out / "steps.parquet")
    return {"k": int(space.centroids.shape[0]), "requested_k": space.requested_k, "tau": float(space.tau),
            "notes": space.notes}


def _transition_pairs(states: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """(s_{t-1}, s_t) for every step; s_0 of the question precedes step 1."""
    idx, s_post, s0 = states["index"], states["s_post"], states["s0"]
    prev = torch.empty_like(s_post)
    for r, (q, t, s) in enumerate(idx.tolist()):
        prev[r] = s0[q] if s == 0 else s_post[r - 1]
    return prev, s_post


# ---- (e) transitions -----------------------------------------------------------------------


def fit_transition_model(cfg: Config, states_dir: Path, out: Path) -> dict:
    st = load_torch(states_dir / "states.pt", weights_only=True)
    prev, nxt = _transition_pairs(st)
    L, history = fit_transitions(prev, nxt, st["s_post"].shape[1], steps=cfg.policy.fit_steps,
                                 lr=cfg.policy.fit_lr, smoothing=cfg.policy.count_smoothing)
    torch.save({"L": L.detach()}, out / "transitions.pt")
    pd.DataFrame({"step": range(len(history)), "kl": [float(h) for h in history]}).to_parquet(out / "kl_history.parquet")
    return {"pairs": len(prev), "kl_start": float(history[0]), "kl_end": float(history[-1])}


# ---- (f) adapter ---------------------------------------------------------------------------


def _batches(cfg: Config, stages: dict[str, Stage], shuffle_seed: int | None):
    """Yield ELBO batches (hidden, targets, step_index, s_post, s_prev) from the cached features."""
    st = torch.load(stages["states"].dir / "states.pt", weights_only=True)
    prev, post = _transition_pairs(st)
    row_of = {tuple(x): r for r, x in enumerate(st["index"].tolist())}
    shards = _shards(stages["features"].dir)
    items = [(qi, ti) for qi, sh in enumerate(shards) for ti in range(len(sh["trajectories"]))]
    if shuffle_seed is not None:
        g = torch.Generator().manual_seed(shuffle_seed)
        items = [items[i] for i in torch.randperm(len(items), generator=g).tolist()]
    m = cfg.pretrain.max_tokens_per_step
    buf: list = []
    n_steps = 0
    for qi, ti in items:
        tr = shards[qi]["trajectories"][ti]
        H = tr["hidden"]
        for t, (a, b) in enumerate(tr["spans"].tolist()):
            b = min(b, a + m)
            buf.append((H[a:b], tr["targets"][a:b], row_of[(qi, ti, t)]))
            n_steps += 1
        if n_steps >= cfg.pretrain.batch_steps:
            yield _collate(buf, post, prev)
            buf, n_steps = [], 0
    if buf:
        yield _collate(buf, post, prev)


def _collate(buf, post, prev):
    hidden = torch.cat([h for h, _, _ in buf]).float()
    targets = torch.cat([y for _, y, _ in buf])
    step_index = torch.cat([torch.full((len(y),), i, dtype=torch.long) for i, (_, y, _) in enumerate(buf)])
    rows = torch.as_tensor([r for _, _, r in buf])
    return hidden, targets, step_index, post[rows], prev[rows]


def train_adapter(cfg: Config, bb: Backbone, stages: dict[str, Stage], out: Path, progress: bool = True) -> dict:
    st = torch.load(stages["states"].dir / "states.pt", weights_only=True)
    L = torch.load(stages["transitions"].dir / "transitions.pt", weights_only=True)["L"]
    torch.manual_seed(cfg.seed)  # the adapter's initialisation, whatever ran before in this process
    model = _build_model(cfg, bb, st, L)
    adapter = model.adapter.to(bb.device)
    head = bb.lm_head
    opt = torch.optim.Adam(adapter.parameters(), lr=cfg.pretrain.lr)
    centroids = model.centroids.to(bb.device)
    history = []
    for epoch in tqdm(range(cfg.pretrain.epochs + 1), desc="(f) adapter ELBO", unit="epoch", disable=not progress):
        rec = kl = tokens = steps = 0.0
        for hidden, targets, step_index, s_post, s_prev in _batches(cfg, stages, shuffle_seed=cfg.seed + epoch):
            dev = bb.device
            terms = elbo_terms(adapter, head, centroids, hidden.to(dev), targets.to(dev), step_index.to(dev),
                               s_post.to(dev), s_prev.to(dev), L.to(dev))
            if epoch > 0:  # epoch 0 measures the fresh (identity) adapter: the backbone's own ELBO
                opt.zero_grad()
                elbo_loss(terms).backward()
                opt.step()
            rec += float(terms.rec_per_step.detach().sum())
            kl += float(terms.kl_per_step.sum())
            tokens += float(terms.n_tokens.sum())
            steps += len(terms.kl_per_step)
        history.append({"epoch": epoch, "rec_per_token": rec / tokens, "kl_per_step": kl / steps,
                        "elbo_per_step": (rec - kl) / steps, "tokens": int(tokens), "steps": int(steps)})
        log.info("epoch %d: %s", epoch, history[-1])
    pd.DataFrame(history).to_parquet(out / "elbo_history.parquet")
    torch.save(adapter.state_dict(), out / "adapter.pt")
    return {"epochs": cfg.pretrain.epochs, "final": history[-1], "initial": history[0]}


def _build_model(cfg: Config, bb: Backbone, st: dict, L: torch.Tensor, notes: list[str] | None = None) -> CTRLSModel:
    K = int(st["centroids"].shape[0])
    conf = CTRLSConfig(hidden_size=bb.hidden_size, n_states=K, requested_states=int(st["requested_k"]),
                       spectral_k=cfg.spectral.k, spectral_normalize=cfg.spectral.normalize, tau=float(st["tau"]),
                       rank=cfg.adapter.rank, inject_at=cfg.adapter.inject_at, hidden_layer=cfg.backbone.hidden_layer,
                       backbone=cfg.backbone.name, notes=list(notes or []))
    return CTRLSModel.build(conf, st["centroids"], concentration=cfg.policy.concentration, L=L)


def _save_checkpoint(cfg: Config, bb: Backbone, stages: dict[str, Stage], adapter_dir: Path, ckpt: Path) -> None:
    st = torch.load(stages["states"].dir / "states.pt", weights_only=True)
    L = torch.load(stages["transitions"].dir / "transitions.pt", weights_only=True)["L"]
    model = _build_model(cfg, bb, st, L, notes=json.loads((stages["states"].dir / "notes.json").read_text()))
    model.adapter.load_state_dict(torch.load(adapter_dir / "adapter.pt", weights_only=True))
    model.save_pretrained(ckpt)


def load_pretrained(cfg: Config, backbone: Backbone | None = None) -> CTRLSModel:
    """The checkpoint of a finished pretraining run for ``cfg``'s backbone and dataset."""
    stages = pretrain_stages(cfg)
    adapter = stages["adapter"]
    if not adapter.is_done():
        if adapter.problems:
            raise PretrainError(f"the pretraining run in {adapter.dir.parent} is damaged: {'; '.join(adapter.problems)}; "
                                "rerun the pretraining stage to redo it")
        raise PretrainError(f"no finished pretraining run in {adapter.dir.parent}; run the pretraining stage first")
    return load_checkpoint(adapter.dir.parent / "checkpoint", backbone)


def load_checkpoint(path: Path, backbone: Backbone | None = None) -> CTRLSModel:
    """``CTRLSModel.from_pretrained``, with errors that name the file that could not be read."""
    path = Path(path)
    try:
        json.loads((path / "config.json").read_text())
    except (OSError, ValueError) as e:
        raise artifact_error(path / "config.json", e) from e
    check_safetensors(path / "model.safetensors")
    try:
        return CTRLSModel.from_pretrained(path, backbone)
    except ValueError:  # a backbone of another hidden size: the message names the checkpoint
        raise
    except Exception as e:
        raise artifact_error(path / "model.safetensors", e) from e
