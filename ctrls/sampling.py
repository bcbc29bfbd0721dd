"""State-aware generation (the inner loop of Alg. 2), one batched KV-cache loop for Base and CTRLS.

For each prompt x_0 the prompt is run through the backbone once; its KV cache is expanded to the
prompt's n samples (prefix sharing). With a CTRLS model, s_0 = Q_phi(x_0) encodes the prompt, and
at every step boundary (a newline token) the next state s_{t+1} ~ pi~_theta(. | s_t) is drawn from
the epsilon-greedy Dirichlet policy; the adapter then rewrites the last hidden state of every token
position that predicts step t+1 with z_{t+1} = s_{t+1} Gamma (Eq. 7). the position rule of the design notes (book/design.md):
the newline that ends step t is consumed by a forward pass whose logits (predicting step t+1's
first token) already use the new state. Without a CTRLS model the loop is plain sampling: the
"Base" rows of the paper's tables.

Each sequence stops on its own: at EOS, after the final-answer line, after T steps, or at
``max_new_tokens``; finished rows are dropped from the batch (and from the cache).

Randomness is per sample, not per batch. Sample m of prompt i draws every random number from a
stream keyed by (seed_i, m) alone: its t-th token by Gumbel-max with counter-based noise
u = splitmix64(key, t, j) (exact sampling from the top-k softmax, vectorised over the batch), its
state draws from the same kind of stream keyed by (key, draw index) (``policy.sample_policy_log_streams``,
vectorised over the rows). So a sample does not depend on
its batch-mates, the batch size, the device's RNG or the process that draws it: data-parallel
sharding (``ctrls.distributed``) reproduces a single-process run, up to floating-point batch effects.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Sequence

import torch
from tqdm.auto import tqdm
from transformers import DynamicCache

from ctrls.backbone import decoder_body
from ctrls.streams import stream_key, stream_uniform
from transformers.cache_utils import DynamicLayer

from ctrls.backbone import Backbone
from ctrls.prompts import ANSWER_LINE, newline_token_ids

if TYPE_CHECKING:
    from ctrls.model import CTRLSModel
    from ctrls.policy import TransitionPolicy


@dataclass
class SampleParams:
    temperature: float = 0.7  # eta; 0 = greedy
    top_k: int = 50  # 0 = no top-k filter
    max_new_tokens: int = 256
    max_steps: int = 12  # T
    batch_size: int = 64  # sequences decoded together (prompts x samples)
    epsilon: float = 0.0  # epsilon-greedy mixture weight of the state policy
    stop_at_answer: bool = True  # stop after the final-answer line
    ignore_eos: bool = False  # decode exactly max_new_tokens (benchmarks)
    transitions: bool = True  # False: every step keeps the prompt's s_0 and no state is drawn (the "fixed s0" ablation)


@dataclass
class Generation:
    """One sampled chain of thought."""

    prompt_index: int
    sample_index: int
    token_ids: list[int]  # generated tokens (EOS excluded)
    text: str
    steps: list[str]
    spans: list[tuple[int, int]]  # [a, b) of each step in token_ids
    finish: str  # eos | answer | max_steps | max_tokens
    states: torch.Tensor | None = None  # (T'+1, K): s_0 then the state drawn for each step (CTRLS only)
    # Eq. 14's trajectory: s_0 then *every* state draw that conditioned a sampled token, (D+1, K), and the
    # exact log of each draw, (D, K) float64 (= policy_states[1:]). D is T' or T' + 1: a draw made when the
    # last step closed conditions the next token even when that token is EOS (or whitespace, then EOS),
    # so it enters the loss, though it starts no step. With transitions=False no state is drawn (None).
    log_actions: torch.Tensor | None = None
    policy_states: torch.Tensor | None = None

    @property
    def n_tokens(self) -> int:
        return len(self.token_ids)


@dataclass
class _Row:
    prompt_index: int
    sample_index: int
    key: int  # the sample's random stream (see the module docstring)
    tokens: list[int] = field(default_factory=list)
    step_start: int = 0
    spans: list[tuple[int, int]] = field(default_factory=list)
    states: list[torch.Tensor] = field(default_factory=list)
    log_actions: list[torch.Tensor] = field(default_factory=list)
    used_draws: int = 0  # how many of the draws so far conditioned a sampled token (Eq. 14 needs them all)
    finish: str | None = None
    policy: "TransitionPolicy | None" = None  # this row's state policy (lockstep RL); None: model.policy
    epsilon: float | None = None  # this row's epsilon; None: params.epsilon


class PreallocatedLayer(DynamicLayer):
    """A KV-cache layer that writes into a preallocated buffer instead of ``torch.cat``.

    transformers' ``DynamicLayer`` concatenates on every token, copying the whole cache each step
    (on 2 CPU cores that copy took as long as every matmul of SmolLM2 together). Here the keys
    and values are views of a buffer of ``capacity`` positions that grows by doubling if needed.
    When rows end (``batch_select_indices``) only the kept rows' live prefix is copied.
    """

    def __init__(self, capacity: int = 256):
        super().__init__()
        self.capacity = capacity
        self._k = self._v = None
        self._len = 0

    def update(self, key_states, value_states, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        n = key_states.shape[-2]
        if self._k is None or self._len + n > self._k.shape[-2]:
            self._grow(max(self.capacity, 2 * self._len, self._len + n), key_states)
        self._k[:, :, self._len:self._len + n] = key_states
        self._v[:, :, self._len:self._len + n] = value_states
        self._len += n
        self.keys, self.values = self._k[:, :, :self._len], self._v[:, :, :self._len]
        return self.keys, self.values

    def _grow(self, cap: int, like: torch.Tensor) -> None:
        b, h, _, d = like.shape
        k = like.new_empty((b, h, cap, d))
        v = like.new_empty((b, h, cap, d))
        if self._len:
            k[:, :, :self._len] = self._k[:, :, :self._len]
            v[:, :, :self._len] = self._v[:, :, :self._len]
        self._k, self._v = k, v

    def _reindex(self, indices: torch.Tensor) -> None:
        """Row i of the cache becomes old row ``indices[i]``. Only the live prefix (``_len`` positions) of
        the kept rows is copied, by ``index_select`` straight into a new buffer of the same capacity:
        ``n x _len`` positions read and written, not the whole ``n x capacity`` buffer (the positions
        after ``_len`` hold nothing yet)."""
        if not self._len:
            return
        indices = indices.to(self._k.device)
        for name in ("_k", "_v"):
            old = getattr(self, name)
            new = old.new_empty((len(indices),) + tuple(old.shape[1:]))
            torch.index_select(old[:, :, :self._len], 0, indices, out=new[:, :, :self._len])
            setattr(self, name, new)
        self.keys, self.values = self._k[:, :, :self._len], self._v[:, :, :self._len]

    def _compact(self, keep: list[int]) -> None:
        """Keep rows ``keep`` in place: row i <- row keep[i], where every keep[i] is i itself or a row at
        or past len(keep) (``fill_holes`` orders them so), so no copy overwrites a row still to be
        read and only the rows moved into holes are copied; then view the first len(keep) rows.
        No allocation: on CPU a fresh buffer per finished row costs page faults on every position
        of it (the kernel zeroes each new page), which took most of a decode's time."""
        if self._len:
            moves = [(i, src) for i, src in enumerate(keep) if src != i]
            for name in ("_k", "_v"):
                buf = getattr(self, name)
                for i, src in moves:
                    buf[i, :, :self._len].copy_(buf[src, :, :self._len])
                setattr(self, name, buf[:len(keep)])
            self.keys, self.values = self._k[:, :, :self._len], self._v[:, :, :self._len]

    def batch_repeat_interleave(self, repeats: int) -> None:
        if self._len:
            self._reindex(torch.arange(self._k.shape[0], device=self._k.device).repeat_interleave(repeats))

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        keep = indices.tolist()
        n = len(keep)
        if len(set(keep)) == n and all(src == i or src >= n for i, src in enumerate(keep)):  # fill_holes' order
            self._compact(keep)
        else:
            self._reindex(indices)


def fill_holes(keep: list[int], n_rows: int) -> list[int]:
    """The rows ``keep`` (of ``n_rows``) in the order the cache keeps them in place: a kept row below
    len(keep) stays where it is, and each hole below len(keep) takes a kept row from past it. A
    sample does not depend on its row's position in the batch (its streams are keyed by its own
    seed and index), so the order is free; this one moves only as many rows as finished."""
    n = len(keep)
    kept = set(keep)
    tail = [j for j in keep if j >= n]
    return [i if i in kept else tail.pop() for i in range(n)]

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove < 0 and self._len:
            self._len = max(0, self._len + tokens_to_remove)
            self.keys, self.values = self._k[:, :, :self._len], self._v[:, :, :self._len]
        else:
            super().crop(tokens_to_remove)


def new_cache(model: torch.nn.Module, capacity: int) -> DynamicCache:
    """A ``DynamicCache`` whose full-attention layers are :class:`PreallocatedLayer`."""
    cache = DynamicCache(config=model.config)
    cache.layers = [PreallocatedLayer(capacity) if type(layer) is DynamicLayer else layer for layer in cache.layers]
    return cache


def _eos_ids(backbone: Backbone) -> set[int]:
    ids = {backbone.tokenizer.eos_token_id}
    gen = getattr(backbone.model, "generation_config", None)
    e = getattr(gen, "eos_token_id", None)
    ids.update(e if isinstance(e, (list, tuple)) else [e])
    return {i for i in ids if i is not None}


def _pick(logits: torch.Tensor, temperature: float, top_k: int, keys: torch.Tensor, counters: torch.Tensor) -> torch.Tensor:
    """Next tokens: greedy at temperature 0, else a draw from softmax(top-k logits / temperature)
    by Gumbel-max with each row's own noise stream."""
    if temperature <= 0:
        return logits.argmax(-1)
    idx = None
    vals = logits
    if top_k and top_k < logits.shape[-1]:
        vals, idx = logits.topk(top_k, dim=-1)  # the temperature does not change the top k
    u = stream_uniform(keys.to(logits.device), counters.to(logits.device), vals.shape[-1])
    choice = (vals.float() / temperature - torch.log(-torch.log(u)).float()).argmax(-1)
    return idx.gather(-1, choice[:, None]).squeeze(-1) if idx is not None else choice


def _draw_states(model: "CTRLSModel", prev: torch.Tensor, rows: Sequence["_Row"], epsilon: float) -> torch.Tensor:
    """log s_{t+1} (B, K), s_{t+1} ~ pi~(. | s_t) for every row at once (float64): row b's draw comes from
    its counter-based stream (row key, draw index) alone (``policy.sample_policy_log_streams``), so it
    does not depend on its batch-mates. Each row uses its own policy and epsilon when it has them
    (lockstep RL: one batch, many policies), else ``model.policy`` and ``epsilon``. The exact
    log-actions are kept for Eq. 14 (``policy`` module docstring)."""
    from ctrls.policy import sample_policy_log_streams

    dev = model.policy.L.device
    keys = torch.tensor([r.key for r in rows], dtype=torch.int64, device=dev)
    counters = torch.tensor([len(r.states) for r in rows], dtype=torch.int64, device=dev)
    if all(r.policy is None and r.epsilon is None for r in rows):
        return model.policy.sample_log_streams(prev, epsilon, keys, counters)
    prev = prev.to(dev)
    alpha = torch.empty(prev.shape, dtype=model.policy.L.dtype, device=dev)
    groups: dict[int, list[int]] = {}
    for j, r in enumerate(rows):
        groups.setdefault(id(r.policy), []).append(j)
    for idx in groups.values():  # one concentration per distinct policy in the batch
        pol = rows[idx[0]].policy if rows[idx[0]].policy is not None else model.policy
        sel = torch.as_tensor(idx, device=dev)
        alpha[sel] = pol.concentration(prev[sel]).to(alpha.dtype)
    eps = torch.tensor([epsilon if r.epsilon is None else r.epsilon for r in rows], dtype=torch.float64, device=dev)
    return sample_policy_log_streams(alpha, eps, keys, counters)


def _record_states(rows: Sequence["_Row"], log_a: torch.Tensor) -> None:
    log_a = log_a.double().cpu()  # one device-to-host copy for all rows
    for r, la, s in zip(rows, log_a, log_a.exp().float()):
        r.log_actions.append(la)
        r.states.append(s)


@torch.no_grad()
def sample(backbone: Backbone, prompts: Sequence[Sequence[int]], n: int = 1, params: SampleParams | None = None,
           model: "CTRLSModel | None" = None, generator: torch.Generator | None = None,
           prompt_starts: Sequence[int] | None = None, share_prefix: bool = True,
           progress: bool = False, seeds: Sequence[int] | None = None,
           sample_ids: Sequence[Sequence[int]] | None = None, policies: "Sequence[TransitionPolicy] | None" = None,
           epsilons: Sequence[float] | None = None) -> list[list[Generation]]:
    """Sample ``n`` chains of thought for each tokenized prompt; Base when ``model`` is None.

    ``prompt_starts[i]`` is the first token of prompt i whose hidden states encode s_0 (see
    ``prompts.encode_prompt``; default 0, the whole prompt). ``seeds[i]`` keys prompt i's random
    streams: sample m of prompt i is a function of (seeds[i], m) alone (module docstring); without
    ``seeds`` they are drawn from ``generator`` (or torch's global RNG). ``sample_ids[i]`` picks
    which sample indices of prompt i to draw (default ``range(n)``): any subset gives the same
    samples as the whole, which is how data-parallel ranks share a prompt's samples. ``policies[i]``
    and ``epsilons[i]`` (CTRLS only) replace ``model.policy`` and ``params.epsilon`` for prompt i's
    state draws, so runs that share the adapter but not the policy decode in one batch (lockstep
    RL); a sample is the same whichever batch it is in. Returns one list of :class:`Generation` per
    prompt, in the order of its sample indices.
    """
    starts = list(prompt_starts) if prompt_starts is not None else [0] * len(prompts)
    params = params or SampleParams()
    if seeds is None:
        dev = generator.device if generator is not None else "cpu"
        seeds = torch.randint(0, 2**62, (len(prompts),), generator=generator, device=dev).tolist()
    if len(seeds) != len(prompts):
        raise ValueError(f"{len(seeds)} seeds for {len(prompts)} prompts")
    ids = [list(s) for s in sample_ids] if sample_ids is not None else [list(range(n))] * len(prompts)
    if len(ids) != len(prompts):
        raise ValueError(f"{len(ids)} sample_ids lists for {len(prompts)} prompts")
    for name, per in (("policies", policies), ("epsilons", epsilons)):
        if per is not None and (model is None or len(per) != len(prompts)):
            raise ValueError(f"{name} needs a CTRLS model and one entry per prompt: {len(per)} for {len(prompts)} prompts"
                             + ("" if model is not None else " (model is None)"))
    pol = list(policies) if policies is not None else [None] * len(prompts)
    eps = list(epsilons) if epsilons is not None else [None] * len(prompts)
    out: list[list[Generation]] = [[] for _ in prompts]
    if share_prefix:  # prompts in groups of at most batch_size sequences (at least one prompt each)
        jobs = [[(i, ids[i])] for i in range(len(prompts)) if ids[i]]
        groups: list[list[tuple[int, list[int]]]] = []
        for job in jobs:
            if groups and sum(len(m) for _, m in groups[-1]) + len(job[0][1]) <= params.batch_size:
                groups[-1] += job
            else:
                groups.append(job)
    else:  # reference path: every sample re-encodes its prompt
        flat = [(i, [m]) for i in range(len(prompts)) for m in ids[i]]
        groups = [flat[j:j + params.batch_size] for j in range(0, len(flat), params.batch_size)]
    for group in tqdm(groups, desc="sampling", unit="batch", disable=not progress):
        gens = _decode(backbone, [prompts[i] for i, _ in group], [starts[i] for i, _ in group],
                       [m for _, m in group], [seeds[i] for i, _ in group], [i for i, _ in group], params, model,
                       [pol[i] for i, _ in group], [eps[i] for i, _ in group])
        for (i, _), gs in zip(group, gens):
            out[i].extend(gs)
    return out


def _decode(backbone: Backbone, prompts: Sequence[Sequence[int]], starts: Sequence[int], sample_ids: Sequence[list[int]],
            seeds: Sequence[int], prompt_index: Sequence[int], params: SampleParams,
            model: "CTRLSModel | None", policies: Sequence = (), epsilons: Sequence = ()) -> list[list[Generation]]:
    tok, lm = backbone.tokenizer, backbone.model
    dev = backbone.device
    body, head = decoder_body(lm), lm.get_output_embeddings()
    vocab = head.weight.shape[0]
    is_nl = torch.zeros(vocab, dtype=torch.bool)
    is_nl[list(i for i in newline_token_ids(tok) if i < vocab)] = True
    is_eos = torch.zeros(vocab, dtype=torch.bool)
    is_eos[list(_eos_ids(backbone))] = True

    # ---- prefill the distinct prompts once (left padded) ------------------------------------
    width = max(len(p) for p in prompts)
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    attn = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.as_tensor(list(p))
        attn[i, width - len(p):] = 1
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    cache = new_cache(lm, width + params.max_new_tokens + 1)
    h = body(input_ids=ids.to(dev), attention_mask=attn.to(dev), position_ids=pos.to(dev),
             past_key_values=cache, use_cache=True).last_hidden_state

    # ---- expand each prompt to its samples ----------------------------------------------------
    policies = list(policies) or [None] * len(prompts)
    epsilons = list(epsilons) or [None] * len(prompts)
    rows = [_Row(prompt_index[i], m, stream_key(seeds[i], m), policy=policies[i], epsilon=epsilons[i])
            for i, ms in enumerate(sample_ids) for m in ms]
    expand = torch.repeat_interleave(torch.arange(len(prompts)), torch.tensor([len(ms) for ms in sample_ids]))
    if len(expand) != len(prompts) or bool((expand != torch.arange(len(prompts))).any()):
        cache.batch_select_indices(expand.to(dev))
    state = None
    if model is not None:
        s0 = model.encode([h[i, width - len(p) + st:] for i, (p, st) in enumerate(zip(prompts, starts))])
        state = s0[expand.to(s0.device)]
    attn = attn[expand].to(dev)
    next_pos = pos[expand, -1].to(dev) + 1
    h_last = h[expand.to(h.device), -1]
    active = list(range(len(rows)))  # row index of each batch position
    if model is not None:
        for r, a in zip(rows, state):
            r.states.append(a.float().cpu())
        if params.transitions:
            log_s1 = _draw_states(model, state, rows, params.epsilon)
            _record_states(rows, log_s1)
            state = log_s1.exp().to(state.dtype)
        else:  # the fixed-s0 ablation: no state is drawn; s_0 is recorded for every step
            for r, b in zip(rows, state.float().cpu()):
                r.states.append(b)

    for _ in range(params.max_new_tokens):
        hh = model.adapt(h_last, state) if model is not None else h_last
        keys = torch.tensor([rows[ri].key for ri in active], dtype=torch.int64)
        counters = torch.tensor([len(rows[ri].tokens) for ri in active], dtype=torch.int64)
        # a 3-D input takes a faster GEMM path than a (B, d) matrix on CPU
        nxt = _pick(head(hh[:, None])[:, 0], params.temperature, params.top_k, keys, counters).cpu()
        keep, redraw = [], []
        # python lists: the loop below reads one element per row, a tensor index per read costs a dispatch
        toks, nl, eos = nxt.tolist(), is_nl[nxt].tolist(), (is_eos[nxt] & (not params.ignore_eos)).tolist()
        for j, ri in enumerate(active):
            r = rows[ri]
            r.used_draws = len(r.log_actions)  # every draw so far conditioned this token (EOS included)
            t = toks[j]
            if eos[j]:
                _end_step(r, tok)
                r.finish = "eos"
                continue
            r.tokens.append(t)
            new_step = False
            if nl[j] and _close_step(r, tok):
                text = tok.decode(r.tokens[r.spans[-1][0]:r.spans[-1][1]])
                if params.stop_at_answer and ANSWER_LINE.search(text):
                    r.finish = "answer"
                elif len(r.spans) >= params.max_steps:
                    r.finish = "max_steps"
                else:
                    new_step = True
            if r.finish is None and len(r.tokens) >= params.max_new_tokens:
                _end_step(r, tok)
                r.finish = "max_tokens"
            if r.finish is None:
                if new_step:
                    redraw.append(len(keep))
                keep.append(j)
        if not keep:
            break
        if len(keep) < len(active):
            pos = fill_holes(keep, len(active))  # positions in the old batch, in the new batch's order
            at = {j: i for i, j in enumerate(pos)}
            redraw = sorted(at[keep[k]] for k in redraw)
            keep = pos
            sel = torch.as_tensor(keep, device=dev)
            cache.batch_select_indices(sel)
            attn, next_pos = attn[sel], next_pos[sel]
            if state is not None:
                state = state[sel]
            nxt = nxt[keep]
            active = [active[j] for j in keep]
        if model is not None and redraw:
            idx = torch.as_tensor(redraw, device=dev)
            redraw_rows = [rows[active[j]] for j in redraw]
            if params.transitions:
                log_new = _draw_states(model, state[idx], redraw_rows, params.epsilon)
                _record_states(redraw_rows, log_new)
                state = state.clone()
                state[idx] = log_new.exp().to(state.dtype)
            else:  # the fixed-s0 ablation: the state stays s_0, recorded once per step
                for r, b in zip(redraw_rows, state[idx].float().cpu()):
                    r.states.append(b)
        attn = torch.cat([attn, attn.new_ones((attn.shape[0], 1))], dim=1)
        h_last = body(input_ids=nxt[:, None].to(dev), attention_mask=attn, position_ids=next_pos[:, None],
                      past_key_values=cache, use_cache=True).last_hidden_state[:, -1]
        next_pos = next_pos + 1

    gens: list[list[Generation]] = [[] for _ in prompts]
    for r, i in zip(rows, expand.tolist()):
        if r.finish is None:  # loop ran out (max_new_tokens == 0)
            _end_step(r, tok)
            r.finish = "max_tokens"
        spans = r.spans
        d = r.used_draws
        gens[i].append(Generation(
            prompt_index=r.prompt_index, sample_index=r.sample_index, token_ids=r.tokens,
            text=tok.decode(r.tokens), steps=[tok.decode(r.tokens[a:b]).strip() for a, b in spans],
            spans=spans, finish=r.finish,
            states=torch.stack(r.states[: len(spans) + 1]) if r.states else None,
            log_actions=torch.stack(r.log_actions[:d]) if d else None,  # Eq. 14: every draw that conditioned a token
            policy_states=torch.stack(r.states[: d + 1]) if d else None))  # s_0, then draw i = log_actions[i].exp()
    return gens


def _close_step(r: _Row, tok) -> bool:
    """A newline was appended: close the current step unless its line is blank. A blank line
    stays open and becomes the start of the next step, whose state already predicted it.
    Returns whether a step was closed."""
    a, b = r.step_start, len(r.tokens)
    if not tok.decode(r.tokens[a:b]).strip():
        return False
    r.spans.append((a, b))
    r.step_start = b
    return True


def _end_step(r: _Row, tok) -> None:
    """The sequence ends: a non-blank unfinished line is the last step."""
    a, b = r.step_start, len(r.tokens)
    if b > a:
        if tok.decode(r.tokens[a:b]).strip() or not r.spans:
            r.spans.append((a, b))
        else:
            r.spans[-1] = (r.spans[-1][0], b)
        r.step_start = b


def seeded(seed: int, device: str | torch.device = "cpu") -> torch.Generator:
    g = torch.Generator(device=device)
    g.manual_seed(seed)
    return g


def tokens_per_second(gens: list[list[Generation]], seconds: float) -> float:
    return sum(g.n_tokens for gs in gens for g in gs) / max(seconds, 1e-9)


__all__ = ["Generation", "SampleParams", "sample", "seeded", "tokens_per_second"]
