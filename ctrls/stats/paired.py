"""Paired differences between two rows of samples on the same questions: the unbiased pass@k of Chen et
al. (2021) per question, its mean difference, a question-bootstrap 95% interval and a sign-flip permutation p
(under H0 a question's two arms are exchangeable, so its difference is as likely negative).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from ctrls.stats.sizing import unbiased_pass_k


def per_question_pass(a: pd.DataFrame, k: int = 1) -> pd.Series:
    """Each question's unbiased pass@k from its m >= k samples (columns question_id, correct), by question id."""
    c = a.groupby("question_id").correct.agg(["sum", "size"])
    m = int(c["size"].min()) if len(c) else 0
    if not len(c) or not (c["size"] == m).all() or m < k:
        raise ValueError(f"pass@{k} per question needs the same m >= {k} samples for every question")
    return pd.Series(unbiased_pass_k(c["sum"].to_numpy(), m, k), index=c.index)


def paired_pass(a: pd.DataFrame, b: pd.DataFrame, k: int = 1, n_boot: int = 4000, n_perm: int = 20000,
                seed: int = 0) -> dict:
    """Unbiased pass@k of the samples ``a`` minus those of ``b`` (columns question_id, correct), paired by
    question; both rows need the same m >= k samples for every question. k = 1 is pass@1 (the mean)."""
    ca = a.groupby("question_id").correct.agg(["sum", "size"])
    cb = b.groupby("question_id").correct.agg(["sum", "size"]).reindex(ca.index)
    if len(ca) == 0 or cb.isna().any().any() or len(b.question_id.unique()) != len(ca):
        raise ValueError("the two rows do not cover the same questions")
    m = int(ca["size"].min())
    if not (ca["size"] == m).all() or not (cb["size"] == m).all() or m < k:
        raise ValueError(f"a paired pass@{k} needs the same m >= {k} samples for every question in both rows")
    pa, pb = unbiased_pass_k(ca["sum"].to_numpy(), m, k), unbiased_pass_k(cb["sum"].to_numpy(), m, k)
    d = pa - pb
    rng = np.random.default_rng(seed)
    boot = d[rng.integers(0, len(d), size=(n_boot, len(d)))].mean(1)  # questions resampled jointly
    lo, hi = np.percentile(boot, [2.5, 97.5])
    signs = np.where(rng.random((n_perm, len(d))) < 0.5, -1.0, 1.0)
    p = (1 + (np.abs(signs @ d) >= abs(d.sum()) - 1e-9).sum()) / (1 + n_perm)  # never 0
    return {"k": k, "samples_per_question": m, "questions": len(d), "a": float(pa.mean()), "b": float(pb.mean()),
            "diff": float(d.mean()), "lo": float(lo), "hi": float(hi), "p": float(p)}
