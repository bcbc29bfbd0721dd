"""Controllability and diversity: does a generated step follow the state it was sampled under (Eq. 8)?

The paper claims that a step follows its state z_t (Eq. 8) but never measures it. We re-encode each
generated step with the pretrained Q_phi (Sec. 5.2: the frozen backbone's hidden states of the step in
context, its spectral embedding (Eq. 5), its nearest centroid) and compare it with the drawn state.
:func:`encode_generations` re-encodes (the exploration stage reads the same states back from the
sampler's own pass instead); :func:`draw_chains` draws the chains of pi~ (Sec. 5.4) that Base steps are
paired with; :func:`match_rate` and :func:`match_rate_difference` give step-weighted rates with
question-clustered Wilson and Newcombe paired intervals; :func:`distinct_answers` and
:func:`state_entropy` measure diversity. Inputs are arrays (one entry per step, or per question);
outputs numbers. Details: book/method.md, "ctrls/generate/controllability.py".
"""
from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Hashable, Sequence

import numpy as np
import torch

from ctrls.method.backbone import decoder_body, with_cache
from ctrls.stats.metrics import bootstrap_ci, paired_rate_difference, rate_interval

if TYPE_CHECKING:
    from ctrls.method.backbone import Backbone
    from ctrls.method.model import CTRLSModel
    from ctrls.method.policy import TransitionPolicy
    from ctrls.method.positions import PositionMask


# ---- re-encoding generated steps with Q_phi ----------------------------------------------------


def feature_precision(h: torch.Tensor) -> torch.Tensor:
    """Hidden states at the precision pretraining's feature cache keeps them (float16), as float32."""
    return h.float().to(torch.float16).float()


class PromptPasses:
    """The prompts' passes of :func:`encode_generations`, each run once: s_0 of every prompt seen, and the KV
    cache of the last ``keep`` (a later read-back of that prompt's generations decodes on it). Valid for one
    Q_phi (``model.encode``) and one backbone: the RL runs share the pretrained encoder, and the exploration
    stage's rows share a pair's. The prompts' template (their tokens before ``start``: the system prompt and
    the few-shot exemplars, when at least ``MIN_SHARED_PREFIX`` tokens) is run once too, and each prompt's
    own tokens on a copy of its cache, as the engine's prefill shares it: s_0 then equals a full pass's up
    to float rounding (about 3e-5 on SmolLM2's hidden states), and a memoised pass equals itself to the bit."""

    TEMPLATES = 4  # templates kept (one per dataset's prompt format)

    def __init__(self, keep: int = 0):
        self.keep = keep  # KV caches kept (each a prompt's length x layers x 2 x KV width); 0 keeps s_0 only
        self.s0: dict[tuple, torch.Tensor] = {}
        self.caches: dict[tuple, object] = {}  # insertion order: the oldest is dropped first
        self.templates: dict[tuple, object] = {}
        self.passes = 0  # prompt passes run (tests and benchmarks count them), templates apart
        self.template_passes = 0

    def template(self, ids: tuple, run):
        """A copy of the KV cache of the template ``ids``, ``run(ids)`` the first time."""
        if ids not in self.templates:
            self.templates[ids] = run(ids)
            self.template_passes += 1
            _drop_oldest(self.templates, self.TEMPLATES)
        return copy.deepcopy(self.templates[ids])

    def cache(self, key: tuple):
        """A copy of the prompt's kept KV cache (the caller's read-back repeats it per generation), or None."""
        return copy.deepcopy(self.caches[key]) if key in self.caches else None

    def put(self, key: tuple, s0: torch.Tensor, cache, in_use: bool) -> None:
        """Keep a pass just run: its s_0, and its KV cache (a copy when the caller goes on to extend it)."""
        self.passes += 1
        self.s0[key] = s0.detach().clone()  # the memo's own: a caller's in-place edit of its s_0 cannot reach it
        if self.keep > 0:
            self.caches.pop(key, None)
            self.caches[key] = copy.deepcopy(cache) if in_use else cache
            _drop_oldest(self.caches, self.keep)


def _drop_oldest(kept: dict, n: int) -> None:
    """Drop a dict's first-inserted entries until ``n`` remain."""
    while len(kept) > n:
        kept.pop(next(iter(kept)))


@torch.no_grad()
def encode_generations(backbone: "Backbone", model: "CTRLSModel", prompt: Sequence[int], start: int,
                       generations: Sequence, layer: int = -1,
                       passes: PromptPasses | None = None) -> tuple[torch.Tensor, list[list[int]]]:
    """Q_phi of one prompt and of every step of its generations (objects with ``token_ids`` and
    ``spans``, e.g. :class:`ctrls.generate.sampling.Generation`).

    Returns (s_0, states): the prompt's soft state (K,) from its hidden states ``[start:]`` (as the
    sampler encodes it), and for each generation the nearest centroid of each step (its hidden
    states rounded to float16 first, as pretraining's feature cache stores them).
    Step t's hidden states are those of its own tokens, computed in context; ``layer`` is
    ``backbone.hidden_layer``. One forward of the prompt, then one of all the generations on the
    prompt's KV cache (right-padded: causal attention, so padding never reaches a real token).
    ``passes`` (:class:`PromptPasses`): the prompt's pass is taken from it when it holds what is needed
    (s_0, and the KV cache when there are generations), else run and kept there.
    """
    from transformers import DynamicCache

    from ctrls.generate.kv_cache import MIN_SHARED_PREFIX  # here: pages that read tables skip transformers

    lm = backbone.model
    body = decoder_body(lm)
    dev = backbone.device
    P = len(prompt)
    want = layer != -1

    def pick(out):
        return out.hidden_states[layer] if want else out.last_hidden_state

    gens = [g for g in generations if len(g.token_ids)]
    key = (tuple(int(t) for t in prompt), int(start), layer)
    cache = None if passes is None or not gens else passes.cache(key)
    if passes is not None and key in passes.s0 and (cache is not None or not gens):
        s0 = passes.s0[key].clone()  # the prompt's pass ran before: a copy of its s_0 (and of its KV cache)
    else:
        if passes is not None and start >= MIN_SHARED_PREFIX:  # the template once, then the prompt's own tokens

            def run(ids: tuple):
                kv = DynamicCache(config=lm.config)
                body(input_ids=torch.as_tensor([list(ids)], device=dev), **with_cache(body, kv), use_cache=True)
                return kv

            cache = passes.template(tuple(int(t) for t in prompt[:start]), run)
            out = body(input_ids=torch.as_tensor([list(prompt[start:])], device=dev), **with_cache(body, cache),
                       position_ids=torch.arange(start, P, device=dev)[None], use_cache=True, output_hidden_states=want)
            h = pick(out)[0]  # the hidden states [start:P]
        else:
            cache = DynamicCache(config=lm.config)
            out = body(input_ids=torch.as_tensor([list(prompt)], device=dev), **with_cache(body, cache), use_cache=True,
                       output_hidden_states=want)
            h = pick(out)[0, start:P]
        s0 = model.encode([h])[0]  # as the sampler encodes s_0 (no float16 rounding)
        if passes is not None:
            passes.put(key, s0, cache, in_use=bool(gens))  # the read-back below extends this cache
    steps: list[torch.Tensor] = []
    if gens:
        n, G = len(gens), max(len(g.token_ids) for g in gens)
        pad = backbone.tokenizer.pad_token_id or 0
        ids = torch.full((n, G), pad, dtype=torch.long)
        attn = torch.zeros((n, P + G), dtype=torch.long)
        attn[:, :P] = 1
        for i, g in enumerate(gens):
            ids[i, :len(g.token_ids)] = torch.as_tensor(g.token_ids)
            attn[i, P:P + len(g.token_ids)] = 1
        cache.batch_repeat_interleave(n)
        pos = torch.arange(P, P + G)[None].expand(n, -1)
        h = pick(body(input_ids=ids.to(dev), attention_mask=attn.to(dev), position_ids=pos.to(dev),
                      **with_cache(body, cache), use_cache=True, output_hidden_states=want))
        # generated token j sits at position P + j: step [a, b) is h[i, a:b] (pretraining's H[1+a : 1+b])
        steps = [feature_precision(h[i, a:b]) for i, g in enumerate(gens) for a, b in g.spans]
    counts = [len(g.spans) if len(g.token_ids) else 0 for g in generations]
    return s0.float().cpu(), step_states(model, steps, counts)


def step_states(model: "CTRLSModel", steps: Sequence[torch.Tensor], counts: Sequence[int]) -> list[list[int]]:
    """Q_phi's hard state of each step (its hidden states (n_i, d), in order), split into consecutive groups
    of ``counts`` steps (one per generation): the spectral embedding (Eq. 5) and the nearest centroid."""
    # Q_phi: Eq. 5, nearest centroid (Sec. 5.2)
    hard = model.assign(model.embed(list(steps))).argmax(-1).tolist() if steps else []
    out, k = [], 0
    for c in counts:
        out.append(hard[k:k + c])
        k += c
    return out


@torch.no_grad()
def draw_actions(policy: "TransitionPolicy", s0: torch.Tensor, n: int, steps: int, epsilon: float,
                 generator: torch.Generator | None = None, mask: "PositionMask | None" = None
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` action chains of ``steps`` draws, a_1 ~ pi~(. | s_0), a_{t+1} ~ pi~(. | a_t), drawn together from one
    ``generator``: (actions (n, steps, K), their exact logs (n, steps, K), float64). With ``mask``
    (``ctrls.method.positions``) step t's action is renormalised over the states that can occur at t (log a =
    -inf elsewhere; its density: ``TransitionPolicy.log_prob_log`` with ``allowed``)."""
    prev = s0.to(policy.L.device, policy.L.dtype).reshape(1, -1).expand(n, -1)
    acts, logs = [], []
    for t in range(steps):
        log_a = policy.sample_log(prev, epsilon, generator=generator)  # a_{t+1} ~ pi~(. | a_t) (Sec. 5.4)
        if mask is not None:  # the same draw, renormalised over the states allowed at step t
            log_a = mask.mask_log(log_a, t)
        prev = log_a.exp().to(policy.L.dtype)
        acts.append(prev.cpu())
        logs.append(log_a.double().cpu())
    K = policy.n_states
    if not steps:
        return torch.zeros((n, 0, K)), torch.zeros((n, 0, K), dtype=torch.float64)
    return torch.stack(acts, 1), torch.stack(logs, 1)


def draw_chains(policy: "TransitionPolicy", s0: torch.Tensor, lengths: Sequence[int], epsilon: float,
                generator: torch.Generator | None = None, mask: "PositionMask | None" = None) -> list[list[int]]:
    """One state chain per entry of ``lengths``: :func:`draw_actions`, as the sampler draws them
    (``ctrls.generate.conditioning.draw_states``), returned as the argmax of each a_t, ``lengths[i]`` states for
    chain i. The chains are drawn together from one ``generator``. With ``mask`` (``ctrls.method.positions``)
    step t's action is restricted to the states that can occur at t."""
    lengths = [int(n) for n in lengths]
    if not lengths or max(lengths) == 0:
        return [[] for _ in lengths]
    acts, _ = draw_actions(policy, s0, len(lengths), max(lengths), epsilon, generator, mask)
    return [row[:n] for row, n in zip(acts.argmax(-1).tolist(), lengths)]


# ---- the metrics -------------------------------------------------------------------------------------------


def _steps(target: np.ndarray, encoded: np.ndarray, question: Sequence[Hashable]) -> tuple[np.ndarray, np.ndarray]:
    """(matches, steps) per question, questions in order of first appearance."""
    t, e = np.asarray(target), np.asarray(encoded)
    q = np.asarray(question, dtype=object)
    if not (t.ndim == e.ndim == 1) or not (len(t) == len(e) == len(q)):
        raise ValueError(f"target, encoded and question must be 1-D and of one length, got {t.shape}, {e.shape}, {q.shape}")
    if len(t) == 0:
        raise ValueError("no steps to compare")
    _, first, inv = np.unique(q.astype(str), return_index=True, return_inverse=True)
    order = np.argsort(np.argsort(first))  # group ids in order of first appearance
    g = order[inv]
    matches = np.bincount(g, weights=(t == e).astype(float), minlength=len(first))
    steps = np.bincount(g, minlength=len(first)).astype(float)
    return matches, steps


def match_rate(target: np.ndarray, encoded: np.ndarray, question: Sequence[Hashable], n_boot: int = 2000,
               alpha: float = 0.05, seed: int = 0) -> dict[str, float]:
    """Fraction of steps whose re-encoded state equals their target state, with a Wilson interval.

    ``target[i]``, ``encoded[i]``, ``question[i]``: step i's state it was generated under (or paired
    with), its re-encoded state, and its question. Returns {rate, lo, hi, steps, questions}: the
    rate is sum of matches / sum of steps; the 1 - alpha interval is Wilson's at the
    question-clustered effective size (``ctrls.stats.metrics.rate_interval``). ``n_boot`` and ``seed`` are
    unused (kept for callers).
    """
    m, n = _steps(target, encoded, question)
    r = rate_interval(m, n, alpha)
    return {"rate": r["rate"], "lo": r["lo"], "hi": r["hi"], "steps": int(n.sum()), "questions": len(m)}


def match_rate_difference(a: tuple[np.ndarray, np.ndarray, Sequence[Hashable]],
                          b: tuple[np.ndarray, np.ndarray, Sequence[Hashable]], n_boot: int = 2000,
                          alpha: float = 0.05, seed: int = 0) -> dict[str, float]:
    """rate(a) - rate(b) for two sets of (target, encoded, question) steps on the same questions,
    with Newcombe's paired interval and a within-question permutation p-value (``n_boot``
    permutations; :func:`ctrls.stats.metrics.paired_rate_difference`). Questions present in one set only
    are an error."""
    ma, na = _steps(*a)
    mb, nb = _steps(*b)
    qa = list(dict.fromkeys(map(str, a[2])))
    qb = list(dict.fromkeys(map(str, b[2])))
    if set(qa) != set(qb):
        only = sorted(set(qa) ^ set(qb))[:3]
        raise ValueError(f"paired match rates need the same questions; in one set only: {only}")
    where = {q: i for i, q in enumerate(qb)}
    perm = [where[q] for q in qa]
    mb, nb = mb[perm], nb[perm]
    d = paired_rate_difference(ma, na, mb, nb, alpha=alpha, n_perm=n_boot, seed=seed)
    return {k: d[k] for k in ("diff", "lo", "hi", "p_value")}


def distinct_answers(answers: Sequence[Sequence[str | None]]) -> np.ndarray:
    """Per question, the number of distinct final answers among its samples (None: no answer, not counted)."""
    return np.array([len({a for a in qa if a is not None}) for qa in answers], dtype=float)


def entropy_bits(states: Sequence[int]) -> float:
    """Plug-in entropy (bits) of the empirical distribution of ``states`` (0 for none)."""
    s = np.asarray(list(states))
    if len(s) == 0:
        return 0.0
    _, counts = np.unique(s, return_counts=True)
    p = counts / counts.sum()
    return float(-(p * np.log2(p)).sum())


def state_entropy(sequences: Sequence[Sequence[Sequence[int]]]) -> np.ndarray:
    """Per question, the plug-in entropy (bits) of the states visited by its samples, all steps of
    all its state sequences pooled (``sequences[q][m]`` is sample m's sequence). Biased low: see
    book/method.md."""
    return np.array([entropy_bits([s for seq in qs for s in seq]) for qs in sequences], dtype=float)


def mean_with_ci(per_question: np.ndarray, n_boot: int = 2000, seed: int = 0) -> tuple[float, float, float]:
    """(mean, lo, hi) over questions: :func:`ctrls.stats.metrics.bootstrap_ci`."""
    return bootstrap_ci(per_question, n_boot=n_boot, seed=seed)


__all__ = ["PromptPasses", "draw_actions", "draw_chains", "encode_generations", "match_rate", "match_rate_difference",
           "distinct_answers", "entropy_bits", "state_entropy", "mean_with_ci", "feature_precision"]
