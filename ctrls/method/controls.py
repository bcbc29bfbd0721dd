"""Controls for the adapter P_omega (Eq. 8): does the state z_t steer step t, or only add style?

Teacher forcing on held-out chains, log P_omega(x_t | x_<t, z_t) per token under conditions that
differ only in the state the adapter is given:

- ``no adapter``: the frozen backbone alone (the fresh adapter is the identity);
- ``posterior (soft)``: z_t = s_t Gamma, the relaxed objective's state (it has seen step t itself);
- ``posterior (one-hot)``: z_t = gamma_j, j = argmax s_t;
- ``prior draw``: gamma_j with j ~ s_{t-1} softmax(L) (what decoding draws at epsilon = 0; Sec. 5.3);
- ``s0 every step``: z_t = s_0 Gamma for every step (the "fixed s0" row of the exploration table);
- ``random state``: gamma_j, j uniform over the K states;
- ``shuffled states``: the one-hot posterior states permuted across the held-out steps.

How to read them: posterior minus shuffled is what the step's own state adds beyond a state's
average effect (steering plus content leaked through a posterior that saw the step); shuffled,
random and s0-every-step minus no adapter is the style the adapter adds whatever the state (the
fine-tuning effect); prior draw minus random is what the learned transitions add.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pandas as pd

import zlib

import numpy as np
import torch
import torch.nn.functional as F

from ctrls.method.adapter import StateAdapter

CONDITIONS = ("no adapter", "posterior (soft)", "posterior (one-hot)", "prior draw", "s0 every step",
              "random state", "shuffled states")


def control_states(s_post: torch.Tensor, s_prev: torch.Tensor, s0: torch.Tensor, L: torch.Tensor,
                   generator: torch.Generator) -> dict[str, torch.Tensor | None]:
    """The state distribution (S, K) each condition gives the S steps (None: no adapter).

    ``s_post`` (S, K): each step's posterior s_t; ``s_prev`` (S, K): s_{t-1} (s_0 before a first
    step); ``s0`` (S, K): the prompt's state of each step's question; ``L`` (K, K): the transition
    logits. Draws use ``generator`` (CPU)."""
    S, K = s_post.shape
    if s_prev.shape != (S, K) or s0.shape != (S, K) or L.shape != (K, K):
        raise ValueError(f"shapes: s_post {tuple(s_post.shape)}, s_prev {tuple(s_prev.shape)}, s0 {tuple(s0.shape)}, "
                         f"L {tuple(L.shape)}: expected (S, K) x 3 and (K, K)")
    eye = torch.eye(K, dtype=s_post.dtype)
    hard = s_post.argmax(-1)
    prior = (s_prev.double() @ L.double().softmax(-1)).clamp_min(0)  # Sec. 5.3: s_{t-1} softmax(L)
    drawn = torch.multinomial(prior.cpu(), 1, generator=generator)[:, 0]
    rand = torch.randint(0, K, (S,), generator=generator)
    perm = torch.randperm(S, generator=generator)
    return {"no adapter": None, "posterior (soft)": s_post, "posterior (one-hot)": eye[hard],
            "prior draw": eye[drawn], "s0 every step": s0, "random state": eye[rand],
            "shuffled states": eye[hard[perm]]}


def step_logprobs(adapter: StateAdapter | None, lm_head: torch.nn.Module, centroids: torch.Tensor,
                  hidden: torch.Tensor, targets: torch.Tensor, step_index: torch.Tensor, s: torch.Tensor | None,
                  chunk: int = 512) -> torch.Tensor:
    """sum_p log P_omega(y_p | z = s_{t(p)} Gamma) per step (S,) float64, no gradient (Eq. 8 + softmax).

    ``hidden`` (P, d): the frozen backbone's last hidden states at the positions that predict the
    steps' tokens ``targets`` (P,); ``step_index`` (P,) in 0..S-1; ``s`` (S, K), or None for the
    backbone alone (``adapter`` None also means the backbone alone)."""
    n_steps = int(step_index.max()) + 1 if len(step_index) else 0
    out = torch.zeros(n_steps if s is None else s.shape[0], dtype=torch.float64)
    with torch.no_grad():
        code = None if s is None or adapter is None else adapter.mixture_code(s.to(hidden.device), centroids)
        for a in range(0, hidden.shape[0], chunk):
            h = hidden[a:a + chunk]
            idx = step_index[a:a + chunk]
            if code is not None:
                h = adapter.fuse(h, code[idx])
            logp = F.linear(h.to(lm_head.weight.dtype), lm_head.weight, lm_head.bias).double().log_softmax(-1)
            out.index_add_(0, idx.cpu(), logp.gather(-1, targets[a:a + chunk, None])[:, 0].cpu())
    return out


def ratio_interval(num: np.ndarray, den: np.ndarray, seed: int, n_boot: int = 2000) -> tuple[float, float]:
    """95% percentile bootstrap interval of sum(num) / sum(den), resampling rows (questions);
    (nan, nan) with fewer than 2 rows: one question gives no interval."""
    num, den = np.asarray(num, float), np.asarray(den, float)
    if len(num) < 2:
        return float("nan"), float("nan")
    idx = np.random.default_rng(seed).integers(0, len(num), (n_boot, len(num)))
    r = num[idx].sum(1) / den[idx].sum(1)
    return float(np.quantile(r, 0.025)), float(np.quantile(r, 0.975))


def control_seed(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(zlib.crc32(f"controls|{seed}".encode()))


# ---- what the states capture: reasoning moves or content ----------------------------------------

STEP_KINDS = ("answer", "arithmetic", "statement")


def step_kind(text: str) -> str:
    """A step's reasoning move, by its surface form: ``answer`` (a final-answer line), ``arithmetic``
    (an operation with "="), else ``statement`` (a fact restated or a quantity introduced)."""
    import re

    t = text.strip().lower()
    if t.startswith("the answer is") or "####" in t or "\\boxed" in t:
        return "answer"
    if re.search(r"\d\s*[-+*/x×÷]\s*\d.*=", t):
        return "arithmetic"
    return "statement"


def _nmi(a, b) -> float:
    from sklearn.metrics import normalized_mutual_info_score

    return float(normalized_mutual_info_score(a, b))


def granularity_table(e: torch.Tensor, texts, ks=(4, 8, 16, 32), seed: int = 0) -> "pd.DataFrame":
    """For each K, k-means states of the step embeddings ``e`` (N, D) (``ctrls.method.states.fit_states``)
    against what they could capture: the normalised mutual information of the hard states with the
    steps' reasoning moves (``step_kind``) and with their numbers (the digits in the step), the share
    of steps whose state's majority move is their own (purity), and the coincidence rate sum_j p_j^2
    (two independent steps in the same state), the floor a follows-its-state rate must beat."""
    import re

    import pandas as pd

    from ctrls.method.states import fit_states

    kinds = [step_kind(t) for t in texts]
    numbers = [" ".join(re.findall(r"\d+", t)) for t in texts]
    rows = []
    for k in ks:
        if k > len(texts):
            continue
        hard = fit_states(e, k, seed=seed).assign(e).argmax(-1).numpy()
        tab = pd.crosstab(hard, kinds)
        p = np.bincount(hard, minlength=k) / len(hard)
        rows.append({"K": k, "NMI with move": round(_nmi(hard, kinds), 3), "NMI with numbers": round(_nmi(hard, numbers), 3),
                     "move purity": round(float(tab.max(axis=1).sum() / len(hard)), 3),
                     "coincidence": round(float((p ** 2).sum()), 3)})
    return pd.DataFrame(rows)
