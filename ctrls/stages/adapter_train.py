"""Alg. 1, stage (f): the adapter trained on the relaxed objective from the cached hidden states, with
Thm. 5.3's bound on the training and held-out steps after every epoch, early stopping on the held-out
bound, and the controls (``ctrls.method.controls``) at the kept epoch. Wired into the resumable stages by
:mod:`ctrls.stages.pretrain` (which re-exports these names); also builds the CTRLS model of a run's
fitted states and transitions (``build_model``)."""
from __future__ import annotations

import logging
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from ctrls.config.schema import Config
from ctrls.method.backbone import Backbone
from ctrls.method.controls import (
    CONDITIONS,
    control_seed,
    control_states,
    ratio_interval,
    step_logprobs,
)
from ctrls.method.elbo import elbo, relaxed_loss, relaxed_terms
from ctrls.method.model import CTRLSConfig, CTRLSModel
from ctrls.method.policy import kl_to_prior
from ctrls.stages.collect import PretrainError, feature_shards
from ctrls.stages.common import save_parquet, save_torch
from ctrls.stages.progress import tqdm
from ctrls.stages.runs import Stage
from ctrls.stats.metrics import interval

log = logging.getLogger(__name__)


def transition_pairs(states: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """(s_{t-1}, s_t) for every step; s_0 of the question precedes step 1."""
    idx, s_post, s0 = states["index"], states["s_post"], states["s0"]
    prev = torch.empty_like(s_post)
    for r, (q, t, s) in enumerate(idx.tolist()):
        prev[r] = s0[q] if s == 0 else s_post[r - 1]
    return prev, s_post


# ---- (f) adapter ---------------------------------------------------------------------------

# the columns of adapter/bound_history.parquet: one row per evaluated epoch and split (nats)
BOUND_COLUMNS = {
    "epoch": "0 = the fresh adapter (the frozen backbone's own likelihood); n = after n training epochs",
    "optimizer_steps": "Adam steps taken before this evaluation",
    "split": "train: the steps the states, L and the adapter were fitted on; heldout: the held-out questions' steps",
    "questions": "questions in the split", "steps": "reasoning steps evaluated", "tokens": "tokens evaluated",
    "elbo_per_step": "Thm. 5.3's bound, (sum_t rec_t - sum_t KL_t) / steps",
    "elbo_per_step_lo": "95% bootstrap interval over questions (lower end)",
    "elbo_per_step_hi": "95% bootstrap interval over questions (upper end)",
    "elbo_per_token": "Thm. 5.3's bound / tokens",
    "elbo_mc_stderr_per_step": "Monte Carlo standard error of elbo_per_step (0 when exact over the K states)",
    "rec_per_token": "E_{z_t~Q}[log P(x_t | x_<t, z_t)] / tokens (exact over K, or Monte Carlo)",
    "kl_per_step": "sum_i s_{t-1,i} KL(s_t || softmax(L)_i) / steps (the theorem's expected KL)",
    "relaxed_per_step": "the relaxed objective (training), (rec at the mean z - mixture-prior KL) / steps; not a bound",
    "relaxed_rec_per_token": "log P(x_t | x_<t, z_t = sum_j s_tj gamma_j) / tokens",
    "mixture_kl_per_step": "KL(s_t || s_{t-1} softmax(L)) / steps (<= kl_per_step by convexity)",
}


@dataclass
class StepData:
    """The cached features and states that stage (f) trains and evaluates on, loaded once."""

    shards: list[dict]
    post: torch.Tensor  # (N, K) s_t of every step
    prev: torch.Tensor  # (N, K) s_{t-1} (s_0 of the question before a first step)
    row_of: dict  # (question, trajectory, step) -> row of post / prev
    heldout: set  # held-out question ids
    s0: torch.Tensor | None = None  # (N, K) s_0 of each step's question

    @classmethod
    def load(cls, stages: dict[str, Stage]) -> "StepData":
        st = torch.load(stages["states"].dir / "states.pt", weights_only=True)
        prev, post = transition_pairs(st)
        held = {r for r, h in zip(st["index"][:, 0].tolist(), st["heldout"].tolist()) if h}
        shards = feature_shards(stages["features"].dir)
        return cls(shards, post, prev, {tuple(x): r for r, x in enumerate(st["index"].tolist())},
                   {shards[q]["qid"] for q in held}, st["s0"][st["index"][:, 0]])

    def trajectories(self, split: str) -> list[tuple[int, int]]:
        want = split == "heldout"
        return [(qi, ti) for qi, sh in enumerate(self.shards) if (sh["qid"] in self.heldout) == want
                for ti in range(len(sh["trajectories"]))]


def prompted_trajectories(cfg: Config, data: StepData, tok, split: str):
    """(question row, trajectory index, question id, trajectory, prompt ids) of each pretraining chain of
    ``split``, its prompt encoded as the stages encode it: the chains the studies train on."""
    from ctrls.data.prompts import encode_prompt
    from ctrls.stages.common import problems_from_config

    by_id = {p.id: p for p in problems_from_config(cfg, "train")}
    for qi, ti in data.trajectories(split):
        sh = data.shards[qi]
        ids, _ = encode_prompt(tok, by_id[sh["qid"]].question, cfg.prompt.use_chat_template, cfg.prompt.few_shot)
        yield qi, ti, sh["qid"], sh["trajectories"][ti], ids


def step_batches(data: StepData, split: str, batch_steps: int, max_tokens: int | None, shuffle_seed: int | None):
    """Yield batches (hidden, targets, step_index, s_post, s_prev, qids) of one split's trajectories;
    steps longer than ``max_tokens`` are truncated (None: every token)."""
    items = data.trajectories(split)
    if shuffle_seed is not None:
        g = torch.Generator().manual_seed(shuffle_seed)
        items = [items[i] for i in torch.randperm(len(items), generator=g).tolist()]
    buf: list = []
    for qi, ti in items:
        tr = data.shards[qi]["trajectories"][ti]
        H = tr["hidden"]
        for t, (a, b) in enumerate(tr["spans"].tolist()):
            b = b if max_tokens is None else min(b, a + max_tokens)
            buf.append((H[a:b], tr["targets"][a:b], data.row_of[(qi, ti, t)], data.shards[qi]["qid"]))
        if len(buf) >= batch_steps:
            yield _collate(buf, data.post, data.prev)
            buf = []
    if buf:
        yield _collate(buf, data.post, data.prev)


def _collate(buf, post, prev):
    hidden = torch.cat([h for h, _, _, _ in buf]).float()
    targets = torch.cat([y for _, y, _, _ in buf])
    step_index = torch.cat([torch.full((len(y),), i, dtype=torch.long) for i, (_, y, _, _) in enumerate(buf)])
    rows = torch.as_tensor([r for _, _, r, _ in buf])
    return hidden, targets, step_index, post[rows], prev[rows], [q for _, _, _, q in buf], rows


def adapter_optimizer(adapter: torch.nn.Module, lr: float) -> torch.optim.Optimizer:
    """Adam over the adapter's parameters only: the backbone and its LM head stay frozen."""
    return torch.optim.Adam(adapter.parameters(), lr=lr)


def train_step(adapter, opt: torch.optim.Optimizer, head: torch.nn.Module, centroids: torch.Tensor, L: torch.Tensor,
               hidden: torch.Tensor, targets: torch.Tensor, step_index: torch.Tensor, s_post: torch.Tensor,
               s_prev: torch.Tensor) -> float:
    """One Adam step on the relaxed objective (``ctrls.method.elbo.relaxed_loss``); returns the loss."""
    adapter.train()
    dev = head.weight.device
    terms = relaxed_terms(adapter, head, centroids, hidden.to(dev), targets.to(dev), step_index.to(dev),
                          s_post.to(dev), s_prev.to(dev), L.to(dev))
    loss = relaxed_loss(terms)
    opt.zero_grad()
    loss.backward()
    opt.step()
    return float(loss.detach())


def evaluate_bound(adapter, head: torch.nn.Module, centroids: torch.Tensor, L: torch.Tensor, data: StepData,
                   split: str, batch_steps: int, samples: int = 0, seed: int = 0) -> dict | None:
    """Thm. 5.3's bound (``ctrls.method.elbo.elbo``) and the relaxed objective on every step of a split,
    every token of each step, with the adapter in eval mode: one row of ``BOUND_COLUMNS`` (None when
    the split has no step). ``samples``: 0 exact over the K states, n Monte Carlo draws per step."""
    adapter.eval()
    dev = head.weight.device
    gen = torch.Generator().manual_seed(zlib.crc32(f"bound|{seed}|{split}".encode()))
    per_q: dict[str, np.ndarray] = {}  # question -> [sum_t (rec_t - KL_t), steps, tokens]
    tot = np.zeros(6)  # rec, kl, mc variance, relaxed rec, mixture kl, tokens
    for hidden, targets, step_index, s_post, s_prev, qids, _ in step_batches(data, split, batch_steps, None, None):
        b = elbo(adapter, head, centroids, hidden.to(dev), targets.to(dev), step_index.to(dev), s_post.to(dev),
                 s_prev.to(dev), L.to(dev), samples=samples, generator=gen)
        mix = kl_to_prior(s_post.double(), s_prev.double(), L.double())
        tot += [float(b.rec_per_step.sum()), float(b.kl_per_step.sum()), float(b.rec_var_per_step.sum()),
                float(b.relaxed_rec_per_step.sum()), float(mix.sum()), float(b.n_tokens.sum())]
        step_elbo = (b.rec_per_step - b.kl_per_step).cpu().numpy()
        for q, v, n in zip(qids, step_elbo, b.n_tokens.cpu().numpy()):
            per_q.setdefault(q, np.zeros(3))
            per_q[q] += [v, 1, n]
    if not per_q:
        return None
    rec, kl, var, rrec, mkl, T = tot.tolist()
    q = np.stack(list(per_q.values()))
    S = float(q[:, 1].sum())
    lo, hi = ratio_interval(q[:, 0], q[:, 1], seed)
    return {"questions": len(q), "steps": int(S), "tokens": int(T), "elbo_per_step": (rec - kl) / S,
            "elbo_per_step_lo": lo, "elbo_per_step_hi": hi, "elbo_per_token": (rec - kl) / T,
            "elbo_mc_stderr_per_step": var ** 0.5 / S, "rec_per_token": rec / T, "kl_per_step": kl / S,
            "relaxed_per_step": (rrec - mkl) / S, "relaxed_rec_per_token": rrec / T, "mixture_kl_per_step": mkl / S}


def evaluate_controls(adapter, head: torch.nn.Module, centroids: torch.Tensor, L: torch.Tensor, data: StepData,
                      split: str, seed: int) -> pd.DataFrame:
    """``ctrls.method.controls``: log P per step of a split's chains under each of ``CONDITIONS``, summed per
    question: one row per (question, condition) with columns split, qid, condition, steps, tokens, logp.
    Random draws and the shuffle are per evaluation batch (``EVAL_BATCH_STEPS`` steps)."""
    adapter.eval()
    dev = head.weight.device
    gen = control_seed(seed)
    acc: dict[tuple[str, str], np.ndarray] = {}
    for hidden, targets, step_index, s_post, s_prev, qids, rows in step_batches(data, split, EVAL_BATCH_STEPS, None, None):
        conds = control_states(s_post, s_prev, data.s0[rows], L, gen)
        n_tok = torch.bincount(step_index, minlength=len(qids)).numpy()
        for name in CONDITIONS:
            lp = step_logprobs(adapter, head, centroids.to(dev), hidden.to(dev), targets.to(dev), step_index.to(dev),
                               conds[name]).numpy()
            for q, v, n in zip(qids, lp, n_tok):
                acc.setdefault((q, name), np.zeros(3))
                acc[(q, name)] += [1, n, v]
    return pd.DataFrame([{"split": split, "qid": q, "condition": c, "steps": int(v[0]), "tokens": int(v[1]),
                          "logp": float(v[2])} for (q, c), v in acc.items()])


def controls_summary(controls: pd.DataFrame, seed: int = 0) -> pd.DataFrame:
    """Per condition (``ctrls.method.controls.CONDITIONS`` order): questions, steps, tokens, log P per token
    with a 95% bootstrap interval over questions (lo, hi), and its paired difference to the backbone
    alone (delta, delta_lo, delta_hi: the same questions resampled for both)."""
    if controls.empty:
        raise PretrainError("no control rows: the adapter stage evaluated no chain")
    wide = controls.pivot_table(index="qid", columns="condition", values="logp", aggfunc="sum")
    ref = controls[controls.condition == "no adapter"].set_index("qid")
    tokens = ref.tokens.reindex(wide.index).to_numpy()
    base = wide["no adapter"].to_numpy()
    out = []
    for c in [c for c in CONDITIONS if c in wide]:
        v = wide[c].to_numpy()
        lo, hi = ratio_interval(v, tokens, seed)
        dlo, dhi = ratio_interval(v - base, tokens, seed)
        out.append({"condition": c, "questions": len(v), "steps": int(ref.steps.sum()), "tokens": int(tokens.sum()),
                    "logp_per_token": v.sum() / tokens.sum(), "lo": lo, "hi": hi,
                    "delta": (v - base).sum() / tokens.sum(), "delta_lo": dlo, "delta_hi": dhi})
    return pd.DataFrame(out)


def controls_table(controls: pd.DataFrame, seed: int = 0) -> pd.DataFrame:
    """``controls_summary`` for the page: log P per token and its gain over the backbone alone, each
    with its 95% interval over questions."""
    t = controls_summary(controls, seed)
    return pd.DataFrame({"state given to the adapter": t.condition, "questions": t.questions, "steps": t.steps,
                         "tokens": t.tokens, "log P / token": t.logp_per_token.round(3),
                         "95% CI": [interval(a, b, 3) for a, b in zip(t.lo, t.hi)],
                         # the reference row against itself has no difference to show
                         "vs no adapter": [float("nan") if c == "no adapter" else round(d, 3)
                                           for c, d in zip(t.condition, t.delta)],
                         "95% CI (paired)": ["—" if c == "no adapter" else interval(a, b, 3)
                                             for c, a, b in zip(t.condition, t.delta_lo, t.delta_hi)]})


def check_bound_keys(cfg: Config) -> None:
    p = cfg.pretrain
    if not 0 <= p.heldout_fraction < 1:
        raise PretrainError(f"pretrain.heldout_fraction must be in [0, 1), got {p.heldout_fraction}")
    if p.bound_samples != 0 and p.bound_samples < 2:
        raise PretrainError(f"pretrain.bound_samples must be 0 (exact over the K states) or at least 2 (Monte Carlo "
                            f"with a standard error), got {p.bound_samples}")
    if p.bound_every < 1:
        raise PretrainError(f"pretrain.bound_every must be a positive number of epochs, got {p.bound_every}")


EVAL_BATCH_STEPS = 256  # steps per bound-evaluation batch (no gradient: larger batches only cost memory)


def train_adapter(cfg: Config, bb: Backbone, stages: dict[str, Stage], out: Path, progress: bool = True) -> dict:
    """Train the adapter on the relaxed objective over the training split, one Adam step per
    ``pretrain.batch_steps`` steps, for at most ``pretrain.epochs`` epochs.

    Thm. 5.3's bound is evaluated on the held-out split after every epoch (and on the training split
    at epoch 0, every ``pretrain.bound_every`` epochs and at the kept epoch). Training stops after
    ``pretrain.patience`` epochs without a better held-out bound per token (0: never early), and the
    adapter of the best held-out epoch is kept (the last epoch when nothing is held out)."""
    check_bound_keys(cfg)
    st = torch.load(stages["states"].dir / "states.pt", weights_only=True)
    tr = torch.load(stages["transitions"].dir / "transitions.pt", weights_only=True)
    torch.manual_seed(cfg.seed)  # the adapter's initialisation, whatever ran before in this process
    model = build_model(cfg, bb, st, tr)
    L = tr["L"]
    adapter = model.adapter.to(bb.device)
    head = bb.lm_head
    opt = adapter_optimizer(adapter, cfg.pretrain.lr)
    centroids = model.centroids.to(bb.device)
    data = StepData.load(stages)
    p = cfg.pretrain
    history = []
    trained_on: set[str] = set()  # the questions whose steps the adapter was trained on
    best = {"epoch": 0, "score": float("-inf"), "state": None}
    has_heldout = bool(data.trajectories("heldout"))
    opt_steps, stopped_early, epoch = 0, False, 0

    def evaluate(epoch: int, splits: tuple[str, ...]) -> dict:
        rows = {}
        for split in splits:
            row = evaluate_bound(adapter, head, centroids, L, data, split, EVAL_BATCH_STEPS, p.bound_samples,
                                 cfg.seed + epoch)
            if row is not None:
                rows[split] = row
                history.append({"epoch": epoch, "split": split, "optimizer_steps": opt_steps, **row})
                log.debug("epoch %d %s: %s", epoch, split, row)  # the log file and bound_history.parquet, not the console
        return rows

    bar = tqdm(range(p.epochs + 1), desc="(f) adapter", unit="epoch", disable=not progress)
    for epoch in bar:
        if epoch > 0:  # epoch 0 evaluates the fresh (identity) adapter: the frozen backbone's likelihood
            for hidden, targets, step_index, s_post, s_prev, qids, _ in step_batches(data, "train", p.batch_steps,
                                                                                p.max_tokens_per_step, cfg.seed + epoch):
                train_step(adapter, opt, head, centroids, L, hidden, targets, step_index, s_post, s_prev)
                trained_on.update(qids)
                opt_steps += 1
        splits = ("train", "heldout") if epoch % p.bound_every == 0 or epoch == p.epochs else ("heldout",)
        rows = evaluate(epoch, splits)
        score = rows["heldout"]["elbo_per_token"] if "heldout" in rows else float(epoch)  # nothing held out: the last
        if score > best["score"]:
            best = {"epoch": epoch, "score": score, "state": {k: v.detach().clone() for k, v in adapter.state_dict().items()}}
        elif p.patience and has_heldout and epoch - best["epoch"] >= p.patience:
            stopped_early = True
            break
    last = epoch
    adapter.load_state_dict(best["state"])
    if not any(h["epoch"] == best["epoch"] and h["split"] == "train" for h in history):
        evaluate(best["epoch"], ("train",))
    hist = pd.DataFrame(history, columns=list(BOUND_COLUMNS))
    hist["kept"] = hist.epoch == best["epoch"]
    save_parquet(hist, out / "bound_history.parquet")
    save_torch(adapter.state_dict(), out / "adapter.pt")
    split = "heldout" if has_heldout else "train"
    save_parquet(evaluate_controls(adapter, head, centroids, L, data, split, cfg.seed), out / "controls.parquet")

    def at(epoch: int) -> dict:
        return {h["split"]: {k: v for k, v in h.items() if k not in ("epoch", "split")}
                for h in history if h["epoch"] == epoch}

    steps_per_epoch = -(-opt_steps // last) if last else 0
    return {"max_epochs": p.epochs, "epochs_run": last, "kept_epoch": best["epoch"], "stopped_early": stopped_early,
            "optimizer_steps": opt_steps, "optimizer_steps_per_epoch": steps_per_epoch,
            "bound": "exact" if p.bound_samples == 0 else f"monte_carlo ({p.bound_samples} draws)",
            "trained_questions": len(trained_on), "trained_on_heldout": sorted(trained_on & data.heldout),
            "initial": at(0), "final": at(best["epoch"])}


def build_model(cfg: Config, bb: Backbone, st: dict, tr: dict, notes: list[str] | None = None) -> CTRLSModel:
    """The CTRLS model of the fitted states and transitions ``tr`` (L, and c where it was fitted:
    ``policy.fit_concentration``; else ``policy.concentration``)."""
    K = int(st["centroids"].shape[0])
    conf = CTRLSConfig(hidden_size=bb.hidden_size, n_states=K, requested_states=int(st["requested_k"]),
                       spectral_k=cfg.spectral.k, spectral_normalize=cfg.spectral.normalize, tau=float(st["tau"]),
                       rank=cfg.adapter.rank, fusion=cfg.adapter.fusion, inject_at=cfg.adapter.inject_at,
                       hidden_layer=cfg.backbone.hidden_layer, backbone=cfg.backbone.name, notes=list(notes or []))
    c = float(tr["c"]) if "c" in tr else cfg.policy.concentration
    return CTRLSModel.build(conf, st["centroids"], concentration=c, L=tr["L"])
