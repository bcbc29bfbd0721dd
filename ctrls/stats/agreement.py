"""Does a step land in the state it was drawn for more often than a no-steering null? Cohen's kappa
against an independent-chain null, with question-cluster bootstrap intervals and paired tests.

Per step, ``follows`` is 1 when the step's read-back state equals the state it was generated under,
``null`` is 1 when it equals the state an *independent* chain (drawn by the same policy from the same
s_0) holds at that step. Without steering the two chains are exchangeable, so E[follows] = E[null]
whatever the adapter does to the read-back's marginal (that is why this null, not 1/K or Base's
steps, is the reference). With F and N the step-weighted rates,

    kappa = (F - N) / (1 - N)                                               (Cohen 1960)

the share of the steps the null leaves to be steered that do land in their drawn state. The steps of
one question are not independent: intervals resample questions (percentile bootstrap), and the test
flips, per question, which chain is "drawn" (valid under the exchangeability above).
"""
from __future__ import annotations

import math
from typing import Hashable, Sequence

import numpy as np
import pandas as pd

ALPHA = 0.05


def _clusters(follows, null, question) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-question sums (follows, null, steps), in first-seen order; inputs checked."""
    f, n = np.asarray(follows, dtype=float), np.asarray(null, dtype=float)
    if f.shape != n.shape or f.ndim != 1 or len(question) != len(f):
        raise ValueError(f"follows {f.shape}, null {n.shape} and question ({len(question)}) need one entry per step")
    if len(f) == 0:
        raise ValueError("no steps: kappa needs at least one step")
    if not (np.isin(f, (0, 1)).all() and np.isin(n, (0, 1)).all()):
        raise ValueError("follows and null are 0/1 per step")
    keys = list(dict.fromkeys(question))
    idx = np.asarray([keys.index(q) for q in question]) if len(keys) < 2000 else np.unique(question, return_inverse=True)[1]
    Q = len(keys)
    return (np.bincount(idx, weights=f, minlength=Q), np.bincount(idx, weights=n, minlength=Q),
            np.bincount(idx, minlength=Q).astype(float))


def kappa(F: float, N: float) -> float:
    """(F - N) / (1 - N); NaN when the null is 1 (every step would land by chance: nothing to steer)."""
    return (F - N) / (1 - N) if N < 1 else float("nan")


def kappa_vs_null(follows: Sequence[int], null: Sequence[int], question: Sequence[Hashable], n_boot: int = 2000,
                  alpha: float = ALPHA, seed: int = 0, n_perm: int = 10_000) -> dict:
    """kappa of ``follows`` against ``null`` (0/1 per step, paired on the same steps), with its
    question-cluster bootstrap interval at 1 - alpha, the difference F - N with its interval, and a
    two-sided sign-flip p-value of F - N (Monte Carlo over n_perm flips of whole questions, exact
    enumeration at 16 questions or fewer)."""
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must lie in (0, 1), got {alpha}")
    fq, nq, sq = _clusters(follows, null, question)
    F, N = fq.sum() / sq.sum(), nq.sum() / sq.sum()
    rng = np.random.default_rng(seed)
    b = rng.integers(0, len(sq), size=(n_boot, len(sq)))  # questions drawn with replacement
    Fb, Nb = fq[b].sum(1) / sq[b].sum(1), nq[b].sum(1) / sq[b].sum(1)
    with np.errstate(divide="ignore", invalid="ignore"):
        kb = np.where(Nb < 1, (Fb - Nb) / (1 - Nb), np.nan)
    q = [100 * alpha / 2, 100 * (1 - alpha / 2)]
    k_lo, k_hi = np.nanpercentile(kb, q) if np.isfinite(kb).any() else (np.nan, np.nan)
    d_lo, d_hi = np.percentile(Fb - Nb, q)
    dq = fq - nq  # per-question difference; a flip swaps the two chains of a question
    obs = abs(dq.sum())
    if len(dq) <= 16:
        signs = 1 - 2 * ((np.arange(2 ** len(dq))[:, None] >> np.arange(len(dq))) & 1)
    else:
        signs = rng.choice((-1.0, 1.0), size=(n_perm, len(dq)))
    stats = np.abs(signs @ dq)
    p = float((1 + (stats >= obs - 1e-9).sum()) / (1 + len(stats))) if len(dq) > 16 else float((stats >= obs - 1e-9).mean())
    return {"follows": float(F), "null": float(N), "kappa": kappa(F, N), "kappa lo": float(k_lo), "kappa hi": float(k_hi),
            "diff": float(F - N), "diff lo": float(d_lo), "diff hi": float(d_hi), "p_value": p,
            "steps": int(sq.sum()), "questions": int(len(sq))}


def kappa_difference(a: tuple, b: tuple, n_boot: int = 2000, alpha: float = ALPHA, seed: int = 0,
                     n_perm: int = 5000) -> dict:
    """kappa(a) - kappa(b) for two variants on the same questions, each a (follows, null, question)
    triple: a paired question-cluster bootstrap interval and a permutation p-value that swaps, per
    question, which variant's steps are which (valid when the variants are exchangeable per question)."""
    keys = list(dict.fromkeys(a[2]))
    if set(keys) != set(b[2]):
        raise ValueError("the two variants must be measured on the same questions")
    fa, na, sa = _clusters(*a)
    fb, nb, sb = _clusters(b[0], b[1], list(b[2]))
    order = [list(dict.fromkeys(b[2])).index(k) for k in keys]  # b's questions in a's order
    fb, nb, sb = fb[order], nb[order], sb[order]

    def k(f, n, s):
        F, N = f.sum(-1) / s.sum(-1), n.sum(-1) / s.sum(-1)
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(N < 1, (F - N) / (1 - N), np.nan)

    d = float(k(fa, na, sa) - k(fb, nb, sb))
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(keys), size=(n_boot, len(keys)))
    db = k(fa[idx], na[idx], sa[idx]) - k(fb[idx], nb[idx], sb[idx])
    lo, hi = np.nanpercentile(db, [100 * alpha / 2, 100 * (1 - alpha / 2)])
    swap = rng.random((n_perm, len(keys))) < 0.5
    pa = k(np.where(swap, fb, fa), np.where(swap, nb, na), np.where(swap, sb, sa))
    pb = k(np.where(swap, fa, fb), np.where(swap, na, nb), np.where(swap, sa, sb))
    perm = np.abs(pa - pb)
    p = float((1 + (perm >= abs(d) - 1e-12).sum()) / (1 + n_perm))
    return {"diff": d, "lo": float(lo), "hi": float(hi), "p_value": p, "questions": len(keys)}


def base_chain(r, epsilon: float) -> list[int]:
    """The state chain a Base sample (a row with ``chains`` and ``chain_eps``) drew with ``epsilon``."""
    eps = [float(x) for x in r.chain_eps]
    hit = [i for i, x in enumerate(eps) if math.isclose(x, epsilon)]
    if not hit:
        raise ValueError(f"Base question {r.question_id!r}, sample {r.sample_index}: no state chain drawn with "
                         f"epsilon {epsilon:g} (drawn: {eps}); rerun the exploration stage")
    return [int(s) for s in r.chains[hit[0]]]


def null_steps(g: pd.DataFrame, base: pd.DataFrame, epsilon: float) -> tuple[np.ndarray, np.ndarray, list]:
    """(follows, null, question) per step of the CTRLS(epsilon) samples ``g``: whether the step's
    read-back state equals the state it was drawn for, and whether it equals the state an independent
    chain holds at that step: the Base sample of the same question and index drew one from the same
    epsilon-greedy policy and s_0 (``chains``); where that chain is shorter than the sample, the
    question's next Base chain that is long enough (every Base chain is drawn independently of g's)."""
    chains: dict = {}
    for r in base.itertuples(index=False):
        chains.setdefault(r.question_id, {})[int(r.sample_index)] = base_chain(r, epsilon)
    f, n, q = [], [], []
    for r in g.itertuples(index=False):
        own = chains.get(r.question_id)
        if not own:
            raise ValueError(f"question {r.question_id!r} has no Base samples to draw the null from")
        order = sorted(own, key=lambda j: (j - int(r.sample_index)) % (max(own) + 1))  # its own index first
        drawn, enc = list(r.states), list(r.encoded)
        for t_, (d, e) in enumerate(zip(drawn, enc)):
            other = next((own[j][t_] for j in order if len(own[j]) > t_), None)
            if other is None:
                continue  # no Base chain of this question is that long: the step has no null
            f.append(int(d == e)), n.append(int(other == e)), q.append(r.question_id)
    return np.asarray(f, dtype=int), np.asarray(n, dtype=int), q
