"""State-aware generation (the inner loop of Algorithm 2), one batched KV-cache loop for Base and CTRLS.

For each prompt x_0 the prompt is run through the backbone once; its KV cache is expanded to the
prompt's n samples (prefix sharing). With a CTRLS model, s_0 = Q_phi(x_0) encodes the prompt, and
at every step boundary (a newline token) the next state s_{t+1} ~ pi~_theta(. | s_t) is drawn from
the epsilon-greedy Dirichlet policy; the adapter then rewrites the last hidden state of every token
position that predicts step t+1 with z_{t+1} = s_{t+1} Gamma (Eq. 7). DESIGN.md's position rule:
the newline that ends step t is consumed by a forward pass whose logits (predicting step t+1's
first token) already use the new state. Without a CTRLS model the loop is plain sampling: the
"Base" rows of the paper's tables.

Each sequence stops on its own: at EOS, after the final-answer line, after T steps, or at
``max_new_tokens``; finished rows are dropped from the batch (and from the cache).

Randomness is per sample, not per batch. Sample m of prompt i draws every random number from a
stream keyed by (seed_i, m) alone: its t-th token by Gumbel-max with counter-based noise
u = splitmix64(key, t, j) (exact sampling from the top-k softmax, vectorised over the batch), its
state draws from a ``torch.Generator`` seeded by (key, draw index). So a sample does not depend on
its batch-mates, the batch size, the device's RNG or the process that draws it: data-parallel
sharding (``ctrls.distributed``) reproduces a single-process run, up to floating-point batch effects.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Sequence

import torch
from tqdm.auto import tqdm
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from ctrls.backbone import Backbone
from ctrls.prompts import ANSWER_LINE, newline_token_ids

if TYPE_CHECKING:
    from ctrls.model import CTRLSModel


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
    finish: str | None = None


class PreallocatedLayer(DynamicLayer):
    """A KV-cache layer that writes into a preallocated buffer instead of ``torch.cat``.

    transformers' ``DynamicLayer`` concatenates on every token, copying the whole cache each step
    (on 2 CPU cores that copy took as long as every matmul of SmolLM2 together). Here the keys
    and values are views of a buffer of ``capacity`` positions that grows by doubling if needed.
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

    def _reindex(self, fn) -> None:
        if self._len:
            self._k, self._v = fn(self._k), fn(self._v)
            self.keys, self.values = self._k[:, :, :self._len], self._v[:, :, :self._len]

    def batch_repeat_interleave(self, repeats: int) -> None:
        self._reindex(lambda t: t.repeat_interleave(repeats, dim=0))

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self._reindex(lambda t: t[indices])

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


def _body(model: torch.nn.Module) -> torch.nn.Module:
    """The decoder stack without the LM head (returns hidden states after the final norm)."""
    return getattr(model, model.base_model_prefix)


def _eos_ids(backbone: Backbone) -> set[int]:
    ids = {backbone.tokenizer.eos_token_id}
    gen = getattr(backbone.model, "generation_config", None)
    e = getattr(gen, "eos_token_id", None)
    ids.update(e if isinstance(e, (list, tuple)) else [e])
    return {i for i in ids if i is not None}


# ---- counter-based random streams (splitmix64) -----------------------------------------------
_MASK = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15
_M1, _M2 = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB


def _signed(x: int) -> int:
    x &= _MASK
    return x - (1 << 64) if x >> 63 else x


def stream_key(*parts: int) -> int:
    """A 64-bit stream key (signed, for int64 tensors) from integers, by chained splitmix64."""
    x = 0
    for p in parts:
        x = (x + (int(p) & _MASK) + _GOLDEN) & _MASK
        x = ((x ^ (x >> 30)) * _M1) & _MASK
        x = ((x ^ (x >> 27)) * _M2) & _MASK
        x ^= x >> 31
    return _signed(x)


def _lsr(x: torch.Tensor, s: int) -> torch.Tensor:
    """Logical right shift of int64 (torch's >> is arithmetic)."""
    return (x >> s) & ((1 << (64 - s)) - 1)


def _mix(x: torch.Tensor) -> torch.Tensor:
    """splitmix64's finaliser on int64 tensors (wrapping multiplication)."""
    x = (x ^ _lsr(x, 30)) * _signed(_M1)
    x = (x ^ _lsr(x, 27)) * _signed(_M2)
    return x ^ _lsr(x, 31)


def stream_uniform(keys: torch.Tensor, counters: torch.Tensor, width: int) -> torch.Tensor:
    """(B, width) float64 uniforms in (0, 1): entry j of row b is a hash of (keys[b], counters[b], j),
    the same on every device and in every batch."""
    base = _mix(keys * _signed(_GOLDEN) + counters)
    j = torch.arange(1, width + 1, device=keys.device, dtype=torch.int64)
    x = _mix(base[:, None] + j * _signed(_GOLDEN))
    return (_lsr(x, 11).double() + 0.5) * 2.0 ** -53


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
    """s_{t+1} ~ pi~(. | s_t) for each row, from a generator seeded by (row key, draw index)."""
    dev = model.policy.L.device
    out = [model.policy.sample(prev[j:j + 1], epsilon, generator=seeded(stream_key(r.key, len(r.states)) & _MASK, dev))
           for j, r in enumerate(rows)]
    return torch.cat(out).to(prev.dtype)


@torch.no_grad()
def sample(backbone: Backbone, prompts: Sequence[Sequence[int]], n: int = 1, params: SampleParams | None = None,
           model: "CTRLSModel | None" = None, generator: torch.Generator | None = None,
           prompt_starts: Sequence[int] | None = None, share_prefix: bool = True,
           progress: bool = False, seeds: Sequence[int] | None = None,
           sample_ids: Sequence[Sequence[int]] | None = None) -> list[list[Generation]]:
    """Sample ``n`` chains of thought for each tokenized prompt; Base when ``model`` is None.

    ``prompt_starts[i]`` is the first token of prompt i whose hidden states encode s_0 (see
    ``prompts.encode_prompt``; default 0, the whole prompt). ``seeds[i]`` keys prompt i's random
    streams: sample m of prompt i is a function of (seeds[i], m) alone (module docstring); without
    ``seeds`` they are drawn from ``generator`` (or torch's global RNG). ``sample_ids[i]`` picks
    which sample indices of prompt i to draw (default ``range(n)``): any subset gives the same
    samples as the whole, which is how data-parallel ranks share a prompt's samples. Returns one
    list of :class:`Generation` per prompt, in the order of its sample indices.
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
                       [m for _, m in group], [seeds[i] for i, _ in group], [i for i, _ in group], params, model)
        for (i, _), gs in zip(group, gens):
            out[i].extend(gs)
    return out


def _decode(backbone: Backbone, prompts: Sequence[Sequence[int]], starts: Sequence[int], sample_ids: Sequence[list[int]],
            seeds: Sequence[int], prompt_index: Sequence[int], params: SampleParams,
            model: "CTRLSModel | None") -> list[list[Generation]]:
    tok, lm = backbone.tokenizer, backbone.model
    dev = backbone.device
    body, head = _body(lm), lm.get_output_embeddings()
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
    rows = [_Row(prompt_index[i], m, stream_key(seeds[i], m)) for i, ms in enumerate(sample_ids) for m in ms]
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
        s1 = _draw_states(model, state, rows, params.epsilon) if params.transitions else state
        for r, b in zip(rows, s1):
            r.states.append(b.float().cpu())
        state = s1

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
            sel = torch.as_tensor(keep, device=dev)
            cache.batch_select_indices(sel)
            attn, next_pos = attn[sel], next_pos[sel]
            if state is not None:
                state = state[sel]
            nxt = nxt[keep]
            active = [active[j] for j in keep]
        if model is not None and redraw:
            idx = torch.as_tensor(redraw, device=dev)
            new = (_draw_states(model, state[idx], [rows[active[j]] for j in redraw], params.epsilon)
                   if params.transitions else state[idx])
            state = state.clone()
            state[idx] = new.to(state.dtype)
            for k, j in enumerate(redraw):
                rows[active[j]].states.append(new[k].float().cpu())
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
        gens[i].append(Generation(
            prompt_index=r.prompt_index, sample_index=r.sample_index, token_ids=r.tokens,
            text=tok.decode(r.tokens), steps=[tok.decode(r.tokens[a:b]).strip() for a, b in spans],
            spans=spans, finish=r.finish,
            states=torch.stack(r.states[: len(spans) + 1]) if r.states else None))
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


__all__ = ["Generation", "SampleParams", "sample", "seeded", "stream_key", "tokens_per_second"]
