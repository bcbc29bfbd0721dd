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

Each stage writes its outputs and then a ``done`` marker keyed by the config it depends on, so a
rerun reuses finished stages, and (a) and (b) resume per question after an interruption.
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
from ctrls.runs import Stage, pair_slug, safe_name
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
        return pd.read_json(self.root / "collect" / "trajectories.jsonl", lines=True)

    def elbo_history(self) -> pd.DataFrame:
        return pd.read_parquet(self.root / "adapter" / "elbo_history.parquet")

    def transition_history(self) -> pd.DataFrame:
        return pd.read_parquet(self.root / "transitions" / "kl_history.parquet")

    def states(self) -> dict:
        return torch.load(self.root / "states" / "states.pt", weights_only=True)

    def steps(self) -> pd.DataFrame:
        """One row per training step: question, trajectory, step index, text, hard state, distance."""
        return pd.read_parquet(self.root / "states" / "steps.parquet")

    def model(self, backbone: Backbone | None = None) -> CTRLSModel:
        return CTRLSModel.from_pretrained(self.checkpoint, backbone)

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


def pretrain_stages(cfg: Config) -> dict[str, Stage]:
    pair = pair_slug(cfg.backbone.name, cfg.data.dataset)
    out, upstream = {}, ()
    for name, keys in KEYS.items():
        st = Stage(cfg, "pretrain", keys, pair, name, upstream=upstream)
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
    done = _done_questions(path)
    tok = bb.tokenizer
    n = cfg.pretrain.samples_per_question
    params = SampleParams(temperature=cfg.pretrain.temperature, top_k=cfg.sampling.top_k,
                          max_new_tokens=cfg.sampling.max_new_tokens, max_steps=cfg.prompt.max_steps,
                          batch_size=cfg.sampling.batch_size)
    from ctrls.distributed import world

    w = world()
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
            rows.append({"qid": p.id, "source": "_end", "sample_index": -2})  # marks the question complete
        rows, sizes = w.gather_list(rows), w.gather(len(chunk))
        if rows and w.is_main:
            _append_jsonl(path, rows)
        bar.update(sum(sizes))
    bar.close()
    w.barrier()
    df = pd.read_json(path, lines=True)
    df = df[df.source != "_end"]
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


def _done_questions(path: Path) -> set[str]:
    if not path.exists():
        return set()
    done = set()
    with open(path) as f:
        for line in f:
            try:
                row = json.loads(line)
            except json.JSONDecodeError:  # a line cut by a kill: the question is redone
                continue
            if row.get("source") == "_end":
                done.add(row["qid"])
    return done


def _append_jsonl(path: Path, rows: list[dict]) -> None:
    """Append whole rows; a partial last line from an earlier kill is cut off first."""
    if path.exists() and path.stat().st_size:
        with open(path, "rb+") as f:
            f.seek(-1, os.SEEK_END)
            if f.read(1) != b"\n":
                data = path.read_bytes()
                f.seek(0)
                f.truncate(data.rfind(b"\n") + 1)
    # rows of questions not marked complete are dropped on read (see kept_trajectories)
    with open(path, "a") as f:
        f.write("".join(json.dumps(r) + "\n" for r in rows))
        f.flush()
        os.fsync(f.fileno())


def kept_trajectories(collect_dir: Path) -> pd.DataFrame:
    """The kept trajectories of completed questions, in file order, without duplicates."""
    df = pd.read_json(collect_dir / "trajectories.jsonl", lines=True)
    complete = set(df.qid[df.source == "_end"])
    df = df[(df.source != "_end") & df.qid.isin(complete)]
    df = df.drop_duplicates(subset=["qid", "source", "sample_index"], keep="last")
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
        if f.exists():
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


def _shards(features_dir: Path) -> list[dict]:
    return [torch.load(f, weights_only=False) for f in sorted(features_dir.glob("*.pt"))]


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
    sp = torch.load(spectral_dir / "spectral.pt", weights_only=True)
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
    st = torch.load(states_dir / "states.pt", weights_only=True)
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
    if not stages["adapter"].is_done():
        raise PretrainError(f"no finished pretraining run in {stages['adapter'].dir.parent}; run the pretraining stage first")
    return CTRLSModel.from_pretrained(stages["adapter"].dir.parent / "checkpoint", backbone)
