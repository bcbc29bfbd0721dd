"""Alg. 1 (offline CTRLS pretraining) as resumable stages under ``runs/<profile>/pretrain/<pair>/``.

(a) ``collect`` correct CoTs (App. F; plus reference solutions, ``pretrain.sources``); (b) ``features``:
cache each step's last-layer hidden states; (c) ``spectral``: Eq. 5; (d) ``states``: k-means Q_phi, with
the CoTs of ``pretrain.heldout_fraction`` of the questions held out of (d)-(f); (e) ``transitions``: fit L
by the expected KL (the default ``policy.fit``; ``mixture``: the mixture-prior KL); (f) ``adapter``: train
on the relaxed objective from the cached features, with Thm. 5.3's bound on the held-out steps after every
epoch, early stopping (``pretrain.patience``) and the best held-out epoch kept; the checkpoint
(``CTRLSModel.from_pretrained``) is written at its end; (g) ``state_prompt`` (only with
``state_prompt.use``): the state prompt's vectors (``ctrls.stages.state_prompt``). Each stage ends with a checksummed
``done`` marker (``ctrls.stages.runs``); (a) and (b) resume per question. Details: book/method.md,
"ctrls/stages/pretrain.py".
"""
from __future__ import annotations

import json
import logging
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import torch

from ctrls.config.schema import Config
from ctrls.method.backbone import Backbone
from ctrls.method.controls import granularity_table
from ctrls.method.model import CTRLSModel
from ctrls.method.policy import fit_concentration, fit_transitions
from ctrls.method.spectral import spectral_embeddings
from ctrls.method.states import fit_states
from ctrls.stages.adapter_train import (  # noqa: F401 (re-exported)
    BOUND_COLUMNS,
    EVAL_BATCH_STEPS,
    StepData,
    adapter_optimizer,
    build_model,
    check_bound_keys,
    controls_summary,
    controls_table,
    evaluate_bound,
    evaluate_controls,
    step_batches,
    train_adapter,
    train_step,
    transition_pairs,
)
from ctrls.stages.collect import (
    PretrainError,
    cache_features,
    collect,
    feature_shards,
    read_trajectories,
)
from ctrls.stages.common import backbone_for, problems_from_config, save_json, save_parquet, save_torch
from ctrls.stages.progress import tqdm
from ctrls.stages.runs import (
    Stage,
    artifact_error,
    check_safetensors,
    load_torch,
    pair_slug,
    read_parquet,
    writing,
)
from ctrls.stats.metrics import interval

log = logging.getLogger(__name__)

# the config fields each stage depends on (its own and, through `upstream`, its inputs')
KEYS = {
    "collect": ("seed", "data", "backbone.name", "backbone.dtype", "prompt", "sampling.max_new_tokens",
                "sampling.top_k", "pretrain.sources", "pretrain.samples_per_question", "pretrain.temperature"),
    "features": ("backbone.hidden_layer",),
    "spectral": ("spectral",),
    "states": ("states", "pretrain.heldout_fraction"),
    "transitions": ("policy",),
    "adapter": ("adapter", "pretrain.epochs", "pretrain.patience", "pretrain.lr", "pretrain.batch_steps",
                "pretrain.max_tokens_per_step", "pretrain.bound_samples", "pretrain.bound_every"),
    "state_prompt": ("state_prompt",),  # only with state_prompt.use (ctrls.stages.state_prompt)
}


@dataclass
class PretrainRun:
    """Paths and summaries of one (backbone, dataset) pretraining run."""

    root: Path
    checkpoint: Path
    summaries: dict[str, dict]
    dirs: dict[str, Path] = field(default_factory=dict)  # each stage's directory, in its run's slot

    def dir(self, stage: str) -> Path:
        """The directory of ``stage`` (collect, ..., adapter) of this run: ``<root>/<stage>`` or its slot beside it."""
        return Path(self.dirs.get(stage, self.root / stage))

    def trajectories(self) -> pd.DataFrame:
        """Every collected row (kept or not) of the committed questions, in file order."""
        return read_trajectories(self.dir("collect") / "trajectories.jsonl")

    def bound_history(self) -> pd.DataFrame:
        """Thm. 5.3's bound and the relaxed objective per evaluated epoch and split (``BOUND_COLUMNS``)."""
        return read_parquet(self.dir("adapter") / "bound_history.parquet")

    def bound_table(self) -> pd.DataFrame:
        """Thm. 5.3's bound at epoch 0 and at the kept epoch (the best held-out one), per split, with n
        and a 95% interval over questions, beside the relaxed objective (nats; ``BOUND_COLUMNS``)."""
        h = self.bound_history()
        kept = h.epoch[h.kept].max() if "kept" in h and h.kept.any() else h.epoch.max()
        h = h[h.epoch.isin([h.epoch.min(), kept])].reset_index(drop=True)
        t = pd.DataFrame({"epoch": h.epoch, "Adam steps": h.optimizer_steps, "split": h.split,
                          "questions": h.questions, "steps": h.steps,
                          "tokens": h.tokens, "ELBO / step": h.elbo_per_step.round(2),
                          "95% CI": [interval(lo, hi) for lo, hi in zip(h.elbo_per_step_lo, h.elbo_per_step_hi)],
                          "ELBO / token": h.elbo_per_token.round(3), "E_Q log P / token": h.rec_per_token.round(3),
                          "E KL / step": h.kl_per_step.round(3), "relaxed / step": h.relaxed_per_step.round(2),
                          "mean-z log P / token": h.relaxed_rec_per_token.round(3),
                          "mixture KL / step": h.mixture_kl_per_step.round(3)})
        if (h.elbo_mc_stderr_per_step > 0).any():
            t.insert(8, "MC s.e. / step", h.elbo_mc_stderr_per_step.round(3))
        return t

    def controls(self) -> pd.DataFrame:
        """``ctrls.method.controls`` on the held-out chains: log P per question and condition (``evaluate_controls``)."""
        return read_parquet(self.dir("adapter") / "controls.parquet")

    def controls_table(self) -> pd.DataFrame:
        """Held-out log P per token under each control condition, with intervals (``controls_table``)."""
        return controls_table(self.controls())

    def controls_summary(self) -> pd.DataFrame:
        return controls_summary(self.controls())

    def granularity(self, ks=(4, 8, 16, 32)) -> pd.DataFrame:
        """What k-means states of the training steps capture, per K, for this run's representation
        (the k rows of Eq. 5) and for its first row alone (``ctrls.method.controls.granularity_table``): moves
        or numbers. The run's own K and k are marked."""
        sp = load_torch(self.dir("spectral") / "spectral.pt", weights_only=True)
        steps = self.steps()
        keep = ~torch.tensor(steps.heldout.to_numpy(dtype=bool).tolist(), dtype=torch.bool)
        e, texts = sp["step_e"][keep], steps.text[~steps.heldout].tolist()
        k = int(self.model().config.spectral_k)
        d = e.shape[1] // k
        K = int(self.states()["centroids"].shape[0])
        out = []
        for rows, x in ((k, e), (1, e[:, :d])) if k > 1 else ((1, e),):
            t = granularity_table(x, texts, sorted(set(ks) | {K}))
            t.insert(0, "representation", f"k = {rows} row{'s' if rows > 1 else ''} of Eq. 5")
            t["this run"] = ["✓" if (r == k and kk == K) else "" for r, kk in zip([rows] * len(t), t.K)]
            out.append(t)
        return pd.concat(out, ignore_index=True)

    def schedule(self) -> str:
        """One sentence: epochs run and kept, Adam steps, and whether training stopped early."""
        a = self.summaries.get("adapter") or {}
        if "epochs_run" not in a:
            return "The adapter stage has not run."
        stop = (f"ran {a['epochs_run']} epochs and stopped early, as none after epoch {a['kept_epoch']} had a better "
                "held-out bound" if a["stopped_early"] else f"ran all {a['epochs_run']} epochs (at most {a['max_epochs']})")
        return (f"Adapter training: {a['optimizer_steps']} Adam steps ({a['optimizer_steps_per_epoch']} per epoch); "
                f"{stop}; the adapter of epoch {a['kept_epoch']}, the best held-out bound per token, is kept.")

    def split(self) -> dict:
        """The held-out split: fraction, seed, the held-out question ids, and a note when none could be held out."""
        return json.loads((self.dir("states") / "split.json").read_text())

    def transition_history(self) -> pd.DataFrame:
        return read_parquet(self.dir("transitions") / "kl_history.parquet")

    def states(self) -> dict:
        return load_torch(self.dir("states") / "states.pt", weights_only=True)

    def steps(self) -> pd.DataFrame:
        """One row per training step: question, trajectory, step index, text, hard state, distance."""
        return read_parquet(self.dir("states") / "steps.parquet")

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
         "transitions": ("states",), "adapter": ("features", "states", "transitions"),
         "state_prompt": ("features", "states")}


def pretrain_stages(cfg: Config) -> dict[str, Stage]:
    pair = pair_slug(cfg.backbone.name, cfg.data.dataset)
    out, upstream = {}, ()
    for name, keys in KEYS.items():
        if name == "state_prompt" and not cfg.state_prompt.use:
            continue  # off: the other stages' keys and directories are those of a run without the option
        # the adapter stage also writes the checkpoint next to its directory
        extra = (cfg.stage_dir("pretrain", pair, "checkpoint"),) if name == "adapter" else ()
        reads = READS[name] + (("adapter",) if name == "state_prompt" and cfg.state_prompt.with_adapter else ())
        st = Stage(cfg, "pretrain", keys, pair, name, upstream=upstream, inputs=tuple(out[r] for r in reads),
                   extra=extra)
        out[name] = st
        upstream = (st.key,)
    return out


def checkpoint_dir(stages: dict[str, Stage]) -> Path:
    """The pretrained checkpoint the adapter stage writes beside its directory, in its slot (``checkpoint``, or
    ``checkpoint@<key>`` for a run beside the plain one: ``ctrls.config.slots``)."""
    return stages["adapter"].extra[0]


def fitted_stages(cfg: Config) -> tuple[Stage, ...]:
    """Each pair's stage whose fit the CTRLS rows decode with: the state prompt's (``state_prompt.use``), else
    the adapter's; the downstream stages (exploration, RL) key on them and read them."""
    last = "state_prompt" if cfg.state_prompt.use else "adapter"
    return tuple(pretrain_stages(cfg.for_pair(b, d))[last] for b, d in cfg.pairs())


def check_fitted(cfg: Config, stage: str) -> None:
    """Refuse, before ``stage`` (exploration, RL) clears its directory, a run whose fits it decodes with are not
    finished (:func:`fitted_stages`): a ``PretrainError`` naming the fit's directory and the command, nothing removed."""
    for st in fitted_stages(cfg):
        if not st.is_done():
            what = "state prompt fit (state_prompt.use=true)" if st.dir.name == "state_prompt" else "pretraining"
            raise PretrainError(f"the {stage} stage needs a finished {what} in {st.dir}: run `ctrls stage pretrain` "
                                f"with the same overrides first (nothing was removed)")


def pretrain(cfg: Config, backbone: Backbone | None = None, force: bool = False, progress: bool = True,
             until: str | None = None) -> PretrainRun:
    """Run (or reuse) every stage of Alg. 1 for ``cfg.backbone.name`` x ``cfg.data.dataset``
    (only up to stage ``until`` when given)."""
    # Alg. 1: collect correct CoTs, cache features, Eq. 5, k-means Q_phi, fit P_theta, train the adapter
    check_bound_keys(cfg)
    stages = pretrain_stages(cfg)
    if until is not None:
        if until not in stages:
            raise PretrainError(f"unknown stage {until!r}; stages: {', '.join(stages)}")
        stages = dict(list(stages.items())[: list(stages).index(until) + 1])
    from ctrls.stages.distributed import world

    w = world()
    root = stages["collect"].dir.parent
    try:
        _run_stages(cfg, stages, backbone, force, progress)
    finally:
        for st in stages.values():  # a failed or interrupted stage gives its lock back (finish released the others)
            st.release()
    w.barrier()
    return PretrainRun(root=root, checkpoint=checkpoint_dir(stages), summaries={n: st.summary() for n, st in stages.items()},
                       dirs={n: st.dir for n, st in stages.items()})


def _run_stages(cfg: Config, stages: dict[str, Stage], backbone: Backbone | None, force: bool, progress: bool) -> None:
    """The body of :func:`pretrain`: begin, run and finish each stage that is not done."""
    from ctrls.stages.distributed import world

    w = world()
    root = stages["collect"].dir.parent
    ckpt = checkpoint_dir(stages)
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
            bb = backbone or backbone_for(cfg)
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
        elif name == "adapter":
            summary = train_adapter(cfg, need_backbone(), stages, st.dir, progress)
            _save_checkpoint(cfg, need_backbone(), stages, st.dir, ckpt)
        else:  # (g) state_prompt.use: the state prompt's vectors
            from ctrls.stages.state_prompt import fit_state_prompt

            frozen = (load_checkpoint(checkpoint_dir(stages), need_backbone())  # the adapter it fits through
                      if cfg.state_prompt.with_adapter else None)
            summary = fit_state_prompt(cfg, need_backbone(), stages, st.dir, progress, adapter_model=frozen)
        if w.is_main:
            st.finish(**summary)


# ---- (a) collect ---------------------------------------------------------------------------


# The JSONL protocol of (a): a question's rows, then its `_end` row, which commits it. Questions are
# appended in order, so the file is a run of committed blocks and, after a kill, an uncommitted tail.


# ---- (b) features --------------------------------------------------------------------------


# ---- (c) spectral --------------------------------------------------------------------------


def compute_spectral(cfg: Config, features_dir: Path, out: Path, progress: bool = True) -> dict:
    k, norm = cfg.spectral.k, cfg.spectral.normalize
    step_e, prompt_e, index = [], [], []
    for qi, shard in enumerate(tqdm(feature_shards(features_dir), desc="(c) spectral", unit="q", disable=not progress)):
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
    save_torch({"step_e": e, "prompt_e": torch.stack(prompt_e),
                "index": torch.as_tensor(index, dtype=torch.long)}, out / "spectral.pt")
    return {"steps": len(index), "dim": e.shape[1]}


# ---- (d) states ----------------------------------------------------------------------------


def heldout_questions(qids, fraction: float, seed: int) -> list[str]:
    """The question ids whose CoTs are held out of the fits of stages (d)-(f), sorted.

    round(fraction * N) of the N distinct ids, at least 1 when fraction > 0 and at most N - 1 (none
    when N < 2), drawn by a permutation seeded by ``seed`` over the sorted ids: the split does not
    depend on the order in which the questions were collected."""
    if not 0 <= fraction < 1:
        raise PretrainError(f"pretrain.heldout_fraction must be in [0, 1), got {fraction}")
    ids = sorted(set(qids))
    if fraction == 0 or len(ids) < 2:
        return []
    n = min(max(1, round(fraction * len(ids))), len(ids) - 1)
    perm = torch.randperm(len(ids), generator=torch.Generator().manual_seed(zlib.crc32(f"heldout|{seed}".encode())))
    return sorted(ids[i] for i in perm[:n].tolist())


def cluster_states(cfg: Config, spectral_dir: Path, features_dir: Path, out: Path) -> dict:
    sp = load_torch(spectral_dir / "spectral.pt", weights_only=True)
    shards = feature_shards(features_dir)
    qids = [sh["qid"] for sh in shards]
    frac = cfg.pretrain.heldout_fraction
    held = set(heldout_questions(qids, frac, cfg.seed))
    heldout = torch.tensor([qids[q] in held for q, _, _ in sp["index"].tolist()], dtype=torch.bool)
    nq = len(set(qids))
    note = None if held or frac == 0 else f"only {nq} question{'s' if nq != 1 else ''} with a kept CoT: none held out"
    save_json({"heldout_fraction": frac, "seed": cfg.seed, "questions": len(set(qids)), "heldout_qids": sorted(held),
               "note": note}, out / "split.json")
    ids = [f"q{q}/traj{t}/step{s}" for (q, t, s), h in zip(sp["index"].tolist(), heldout.tolist()) if not h]
    space = fit_states(sp["step_e"][~heldout], cfg.states.n_states, seed=cfg.seed,
                       minibatch_above=cfg.states.minibatch_above, tau=cfg.states.tau, reduce_k=cfg.states.reduce_k,
                       ids=ids)
    s_post = space.assign(sp["step_e"])  # every step, the held-out ones included (for evaluation)
    s0 = space.assign(sp["prompt_e"])
    save_torch({"centroids": space.centroids, "tau": torch.tensor(space.tau), "s_post": s_post, "s0": s0,
                "index": sp["index"], "requested_k": torch.tensor(space.requested_k), "heldout": heldout},
               out / "states.pt")
    save_json(space.notes, out / "notes.json")
    # one row per step, for the book's latent-state explorer
    d2 = torch.cdist(sp["step_e"].float(), space.centroids.float()).pow(2)
    hard = s_post.argmax(-1)
    rows = []
    for r, (q, t, k) in enumerate(sp["index"].tolist()):
        tr = shards[q]["trajectories"][t]
        rows.append({"qid": shards[q]["qid"], "trajectory": t, "source": tr["source"], "step": k,
                     "text": tr["steps"][k], "state": int(hard[r]), "p_state": float(s_post[r, hard[r]]),
                     "dist2": float(d2[r, hard[r]]), "heldout": bool(heldout[r])})
    save_parquet(pd.DataFrame(rows), out / "steps.parquet")
    return {"k": int(space.centroids.shape[0]), "requested_k": space.requested_k, "tau": float(space.tau),
            "notes": space.notes, "heldout_questions": len(held), "heldout_steps": int(heldout.sum()),
            "train_steps": int((~heldout).sum())}


# ---- (e) transitions -----------------------------------------------------------------------


def fit_transition_model(cfg: Config, states_dir: Path, out: Path) -> dict:
    st = load_torch(states_dir / "states.pt", weights_only=True)
    prev, nxt = transition_pairs(st)
    train = ~st["heldout"]  # the held-out questions' steps stay out of the fit
    prev, nxt = prev[train], nxt[train]
    L, history = fit_transitions(prev, nxt, st["s_post"].shape[1], steps=cfg.policy.fit_steps,
                                 lr=cfg.policy.fit_lr, smoothing=cfg.policy.count_smoothing, method=cfg.policy.fit)
    saved, extra = {"L": L.detach()}, {}
    if cfg.policy.fit_concentration:  # Sec. 5.4's Dirichlet: c by maximum likelihood of the posteriors
        c, info = fit_concentration(prev, nxt, L)
        saved["c"] = torch.tensor(c)
        extra = {"concentration": c, "concentration_fit": info}
    save_torch(saved, out / "transitions.pt")
    # kl: the fitted objective's mean per pair, Thm. 5.3's expected KL (fit expected_kl: one closed-form
    # value) or the mixture-prior KL (fit mixture: one value per gradient step)
    save_parquet(pd.DataFrame({"step": range(len(history)), "kl": [float(h) for h in history],
                               "objective": cfg.policy.fit}), out / "kl_history.parquet")
    return {"pairs": len(prev), "fit": cfg.policy.fit, "kl_start": float(history[0]), "kl_end": float(history[-1]),
            **extra}


# ---- (f) adapter: ctrls.stages.adapter_train ----------------------------------------------

def _save_checkpoint(cfg: Config, bb: Backbone, stages: dict[str, Stage], adapter_dir: Path, ckpt: Path) -> None:
    st = torch.load(stages["states"].dir / "states.pt", weights_only=True)
    tr = torch.load(stages["transitions"].dir / "transitions.pt", weights_only=True)
    model = build_model(cfg, bb, st, tr, notes=json.loads((stages["states"].dir / "notes.json").read_text()))
    model.adapter.load_state_dict(torch.load(adapter_dir / "adapter.pt", weights_only=True))
    with writing(ckpt / "model.safetensors"):  # a full disk (safetensors' own error too) is a RunDirError naming it
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
    return load_checkpoint(checkpoint_dir(stages), backbone)


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
