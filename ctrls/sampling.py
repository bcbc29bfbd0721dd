"""State-aware generation (the inner loop of Alg. 2), one batched KV-cache loop for Base and CTRLS.

For each prompt x_0 the prompt is run through the backbone once; its KV cache is expanded to the
prompt's n samples (prefix sharing). The prompts of a batch share their start (the system prompt
and the few-shot exemplars: 206 of the demo's 236 tokens), so that shared prefix is run once for
the whole batch, and each prompt's own suffix on its copy of the cache. With a CTRLS model,
s_0 = Q_phi(x_0) encodes the prompt, and at every step boundary (a newline token) the next state
s_{t+1} ~ pi~_theta(. | s_t) is drawn from the epsilon-greedy Dirichlet policy; the adapter then
rewrites the last hidden state of every token position that predicts step t+1 with
z_{t+1} = s_{t+1} Gamma (Eq. 7). The position rule of the design notes (book/design.md): the
newline that ends step t is consumed by a forward pass whose logits (predicting step t+1's
first token) already use the new state. Without a CTRLS model the loop is plain sampling: the
"Base" rows of the paper's tables.

Each sequence stops on its own: at EOS, after the final-answer line, after T steps, or at
``max_new_tokens``; the engine drops finished rows from the batch (and from the cache).

Randomness is per sample, not per batch. Sample m of prompt i draws every random number from a
stream keyed by (seed_i, m) alone: its t-th token by Gumbel-max with counter-based noise
u = splitmix64(key, t, j) (exact sampling from the top-k softmax, vectorised over the batch), its
state draws from the same kind of stream keyed by (key, draw index) (``policy.sample_policy_log_streams``,
vectorised over the rows). So a sample does not depend on
its batch-mates, the batch size, the device's RNG or the process that draws it: data-parallel
sharding (``ctrls.distributed``) reproduces a single-process run, up to floating-point batch effects.

**The static path** (``SampleParams.decode = "static"``, config ``sampling.decode``).
The engine (``_decode``) keeps the batch dense: its KV cache grows by one position per
token and finished rows are dropped, so every step has new shapes and a host-side cache copy. That
suits eager CPU decoding, but a step whose shapes change cannot be captured as one graph, and on a
GPU the ~1,500 kernel launches of an eager step, not FLOPs or bandwidth, set the time
(``bench/sampling.py``, ``bench/gpu_estimate.py``). Here every step has the same shapes:

- the KV cache is transformers' ``StaticCache``: preallocated to ``width + max_new_tokens + 1``
  positions, written in place at one shared position per step (prompts are left padded to a
  ``width`` rounded up to a multiple of 64, so every row of a group writes at the same index and
  groups share a few cache shapes);
- the attention mask is a preallocated (B, 1, 1, capacity) boolean buffer (transformers uses a 4-D
  mask as given), with one column switched on per step;
- batch slots are fixed: a finished row stays in its slot, masked out of everything the host reads,
  until at most half the slots are live; then the live rows move to the smallest power-of-two
  bucket that holds them, so a compiled step meets at most log2(B) + 2 shapes and the finished
  rows' wasted work stays below the live rows' work;
- the one query token attends on the KV heads (``ctrls.kv_cache.packed_sdpa_attention``; compiled,
  transformers would copy the cache once per query head);
- the step (decoder body, the CTRLS adapter of Eq. 7, the LM head and its top-k) is a function of
  tensors with no host synchronisation, compiled with ``torch.compile`` when ``sampling.compile``
  asks for it (``reduce-overhead``: CUDA-graph capture); the Gumbel-max draw among the top k from
  the counter-based streams follows it eagerly (``_step`` says why).

Between steps the host does what the engine does, with the same functions: the stopping rules
(``_advance``) and the state draws s_{t+1} ~ pi~(. | s_t) at step boundaries
(``_redraw``, per-row policies and epsilon included). A sample is a function of its seed and
index alone, so the two paths give the same samples, token for token, up to floating-point batch
effects (attention over the whole capacity, masked, instead of the live prefix);
``tests/test_static_decode.py`` compares them on tiny models and on the embedded backbone.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Sequence

import torch
from tqdm.auto import tqdm
from transformers import DynamicCache

from ctrls.backbone import Backbone, decoder_body
from ctrls.kv_cache import PreallocatedLayer, fill_holes, new_cache, packed_decode_attention, select_rows, static_cache
from ctrls.streams import stream_key, stream_uniform
from ctrls.prompts import ANSWER_LINE, newline_token_ids

if TYPE_CHECKING:
    from ctrls.model import CTRLSModel
    from ctrls.policy import TransitionPolicy


DECODE_PATHS = ("engine", "static")
COMPILE_MODES = ("none", "default", "reduce-overhead")


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
    decode: str = "engine"  # engine (dense, shrinking batch) | static (fixed shapes, one graph per step)
    compile: str = "none"  # static path: none | default | reduce-overhead (torch.compile; CUDA graphs on a GPU)

    def __post_init__(self):
        if self.decode not in DECODE_PATHS:
            raise ValueError(f"decode must be one of {DECODE_PATHS}, got {self.decode!r}")
        if self.compile not in COMPILE_MODES:
            raise ValueError(f"compile must be one of {COMPILE_MODES}, got {self.compile!r}")
        if self.compile != "none" and self.decode != "static":
            raise ValueError(f"compile={self.compile!r} needs decode='static': the engine's shapes change every step")


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


def _eos_ids(backbone: Backbone) -> set[int]:
    ids = {backbone.tokenizer.eos_token_id}
    gen = getattr(backbone.model, "generation_config", None)
    e = getattr(gen, "eos_token_id", None)
    ids.update(e if isinstance(e, (list, tuple)) else [e])
    return {i for i in ids if i is not None}


def _pick(logits: torch.Tensor, temperature: float, top_k: int, keys: torch.Tensor, counters: torch.Tensor) -> torch.Tensor:
    """Next tokens: greedy at temperature 0, else a draw from softmax(top-k logits / temperature)
    by Gumbel-max with each row's own noise stream."""
    return _draw_tokens(*_candidates(logits, temperature, top_k), temperature, keys, counters)


def _candidates(logits: torch.Tensor, temperature: float, top_k: int) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(values, token ids) the draw chooses among: (None, argmax) at temperature 0, the top k (the
    temperature does not change them), or (logits, None) for the whole vocabulary."""
    if temperature <= 0:
        return None, logits.argmax(-1)
    if top_k and top_k < logits.shape[-1]:
        return logits.topk(top_k, dim=-1)
    return logits, None


def _draw_tokens(vals: torch.Tensor | None, idx: torch.Tensor | None, temperature: float, keys: torch.Tensor,
                 counters: torch.Tensor) -> torch.Tensor:
    """The Gumbel-max draw among ``_candidates`` with each row's counter-based noise."""
    if vals is None:
        return idx
    u = stream_uniform(keys.to(vals.device), counters.to(vals.device), vals.shape[-1])
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
        decode = _decode_static if params.decode == "static" else _decode
        gens = decode(backbone, [prompts[i] for i, _ in group], [starts[i] for i, _ in group],
                      [m for _, m in group], [seeds[i] for i, _ in group], [i for i, _ in group], params, model,
                      [pol[i] for i, _ in group], [eps[i] for i, _ in group], cross_prefix=share_prefix)
        for (i, _), gs in zip(group, gens):
            out[i].extend(gs)
    return out


@dataclass
class _Prefilled:
    """A group's state after its prompts' prefill (``_prefill``): everything either decode loop needs."""

    rows: list[_Row]
    expand: torch.Tensor  # prompt of each row
    cache: DynamicCache  # every row's prompt KV (rows expanded), ``width`` positions
    width: int
    attn: torch.Tensor  # (B, width) 1 on each row's prompt tokens (left padding is 0)
    next_pos: torch.Tensor  # (B,) position id of each row's next token
    h_last: torch.Tensor  # (B, d) last hidden state of each row's prompt
    state: torch.Tensor | None  # (B, K) the state that conditions each row's first token (CTRLS)
    is_nl: torch.Tensor  # (vocab,) bool
    is_eos: torch.Tensor


def _prefill(backbone: Backbone, prompts: Sequence[Sequence[int]], starts: Sequence[int], sample_ids: Sequence[list[int]],
             seeds: Sequence[int], prompt_index: Sequence[int], params: SampleParams, model: "CTRLSModel | None",
             policies: Sequence, epsilons: Sequence, room: int, pad_to: int = 1,
             cross_prefix: bool = True) -> _Prefilled:
    """Prefill the distinct prompts once, expand each to its samples, encode s_0 and draw s_1 (CTRLS):
    the part of a group's decoding that both loops share. With ``cross_prefix`` the prompts' shared
    prefix (``shared_prefix_length``: a system prompt and few-shot exemplars) is run once, then each
    prompt's own suffix on its cache; rows are left padded (between the prefix and the suffix) to a
    width that is a multiple of ``pad_to``. The cache is allocated for ``room`` positions past the
    prompts."""
    tok, lm = backbone.tokenizer, backbone.model
    dev = backbone.device
    body, head = decoder_body(lm), lm.get_output_embeddings()
    vocab = head.weight.shape[0]
    is_nl = torch.zeros(vocab, dtype=torch.bool)
    is_nl[list(i for i in newline_token_ids(tok) if i < vocab)] = True
    is_eos = torch.zeros(vocab, dtype=torch.bool)
    is_eos[list(_eos_ids(backbone))] = True

    # layout of a row: [the prompts' shared prefix (L)] [left padding] [the prompt's own suffix]
    n = len(prompts)
    L = shared_prefix_length(prompts) if cross_prefix else 0
    suffixes = [list(p)[L:] for p in prompts]
    width = -(-(L + max(len(x) for x in suffixes)) // pad_to) * pad_to
    S = width - L
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    ids = torch.full((n, S), pad, dtype=torch.long)
    attn = torch.zeros((n, width), dtype=torch.long)
    attn[:, :L] = 1
    for i, x in enumerate(suffixes):
        ids[i, S - len(x):] = torch.as_tensor(x)
        attn[i, width - len(x):] = 1
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    cache = new_cache(lm, width + room)
    h_pre = None
    if L:  # the shared prefix once, its cache copied to every prompt
        h_pre = body(input_ids=torch.as_tensor([list(prompts[0][:L])], device=dev), position_ids=pos[:1, :L].to(dev),
                     past_key_values=cache, use_cache=True).last_hidden_state[0]
        cache.batch_repeat_interleave(n)
    h = body(input_ids=ids.to(dev), attention_mask=attn.to(dev), position_ids=pos[:, L:].to(dev),
             past_key_values=cache, use_cache=True).last_hidden_state

    def prompt_hidden(i: int, st: int) -> torch.Tensor:
        """Hidden states of prompt i's tokens from its token ``st`` on."""
        own = h[i, S - len(suffixes[i]) + max(st - L, 0):]
        return torch.cat([h_pre[st:], own]) if st < L else own

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
        s0 = model.encode([prompt_hidden(i, st) for i, st in enumerate(starts)])
        state = s0[expand.to(s0.device)]
        for r, a in zip(rows, state):
            r.states.append(a.float().cpu())
        if params.transitions:
            log_s1 = _draw_states(model, state, rows, params.epsilon)
            _record_states(rows, log_s1)
            state = log_s1.exp().to(state.dtype)
        else:  # the fixed-s0 ablation: no state is drawn; s_0 is recorded for every step
            for r, b in zip(rows, state.float().cpu()):
                r.states.append(b)
    return _Prefilled(rows, expand, cache, width, attn[expand].to(dev), pos[expand, -1].to(dev) + 1,
                      h[expand.to(h.device), -1], state, is_nl, is_eos)


MIN_SHARED_PREFIX = 32  # tokens: a shorter common prefix is prefilled with the rest of each prompt


def shared_prefix_length(prompts: Sequence[Sequence[int]]) -> int:
    """Tokens the prompts share at their start, prefilled once for all (0 when fewer than
    ``MIN_SHARED_PREFIX`` or a single prompt); at most the shortest prompt's length - 1, so every
    prompt keeps a token of its own (its last hidden state predicts the first generated token)."""
    if len(prompts) < 2:
        return 0
    first, L = prompts[0], min(len(p) for p in prompts) - 1
    for p in prompts[1:]:
        L = next((j for j in range(L) if p[j] != first[j]), L)
    return L if L >= MIN_SHARED_PREFIX else 0


def _advance(rows: Sequence[_Row], active: Sequence[int], nxt: torch.Tensor, pre: _Prefilled, params: SampleParams,
             tok) -> tuple[list[int], list[int]]:
    """Append each active row's next token ``nxt[j]`` (row ``rows[active[j]]``) and apply the stopping
    rules. Returns ``keep``, the positions j whose row goes on, and ``redraw``, the indices into
    ``keep`` of the rows whose token closed a step (a new state is drawn for them)."""
    keep, redraw = [], []
    # python lists: the loop below reads one element per row, a tensor index per read costs a dispatch
    toks, nl, eos = nxt.tolist(), pre.is_nl[nxt].tolist(), (pre.is_eos[nxt] & (not params.ignore_eos)).tolist()
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
    return keep, redraw


def _redraw(model: "CTRLSModel", params: SampleParams, state: torch.Tensor, idx: Sequence[int],
            redraw_rows: Sequence[_Row]) -> torch.Tensor:
    """Draw s_{t+1} for the rows at batch positions ``idx`` whose step closed; returns the new state
    tensor (with the fixed-s0 ablation the state stays s_0 and is recorded once per step)."""
    at = torch.as_tensor(list(idx), device=state.device)
    if params.transitions:
        log_new = _draw_states(model, state[at], redraw_rows, params.epsilon)
        _record_states(redraw_rows, log_new)
        state = state.clone()
        state[at] = log_new.exp().to(state.dtype)
    else:
        for r, b in zip(redraw_rows, state[at].float().cpu()):
            r.states.append(b)
    return state


def _decode(backbone: Backbone, prompts: Sequence[Sequence[int]], starts: Sequence[int], sample_ids: Sequence[list[int]],
            seeds: Sequence[int], prompt_index: Sequence[int], params: SampleParams,
            model: "CTRLSModel | None", policies: Sequence = (), epsilons: Sequence = (),
            cross_prefix: bool = True) -> list[list[Generation]]:
    """The engine: a growing KV cache whose finished rows are dropped from the batch (``fill_holes``)."""
    tok, lm = backbone.tokenizer, backbone.model
    dev = backbone.device
    body, head = decoder_body(lm), lm.get_output_embeddings()
    pre = _prefill(backbone, prompts, starts, sample_ids, seeds, prompt_index, params, model, policies, epsilons,
                   params.max_new_tokens + 1, cross_prefix=cross_prefix)
    rows, cache, attn, next_pos, h_last, state = pre.rows, pre.cache, pre.attn, pre.next_pos, pre.h_last, pre.state
    active = list(range(len(rows)))  # row index of each batch position

    for _ in range(params.max_new_tokens):
        hh = model.adapt(h_last, state) if model is not None else h_last
        keys = torch.tensor([rows[ri].key for ri in active], dtype=torch.int64)
        counters = torch.tensor([len(rows[ri].tokens) for ri in active], dtype=torch.int64)
        # a 3-D input takes a faster GEMM path than a (B, d) matrix on CPU
        nxt = _pick(head(hh[:, None])[:, 0], params.temperature, params.top_k, keys, counters).cpu()
        keep, redraw = _advance(rows, active, nxt, pre, params, tok)
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
            state = _redraw(model, params, state, redraw, [rows[active[j]] for j in redraw])
        attn = torch.cat([attn, attn.new_ones((attn.shape[0], 1))], dim=1)
        h_last = body(input_ids=nxt[:, None].to(dev), attention_mask=attn, position_ids=next_pos[:, None],
                      past_key_values=cache, use_cache=True).last_hidden_state[:, -1]
        next_pos = next_pos + 1
    return _generations(rows, pre.expand, len(prompts), tok)


def _generations(rows: Sequence[_Row], expand: torch.Tensor, n_prompts: int, tok) -> list[list[Generation]]:
    """Each row's :class:`Generation`, grouped by prompt."""
    gens: list[list[Generation]] = [[] for _ in range(n_prompts)]
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


_COMPILED: dict[str, object] = {}
STATIC_PAD_TO = 64  # static path: prompts left padded to a multiple of this, so groups share cache shapes
RECOMPILE_LIMIT = 64  # shapes one compiled step may meet (batch buckets x cache capacities x Base/CTRLS)


def _head_candidates(head, model, temperature: float, top_k: int, h: torch.Tensor,
                     state: torch.Tensor | None) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """The draw's candidates from last hidden states: the adapter (Eq. 7, CTRLS), the LM head, top-k."""
    hh = model.adapt(h, state) if model is not None else h
    return _candidates(head(hh[:, None])[:, 0], temperature, top_k)


def _step(body, head, model, temperature: float, top_k: int, cache, ids: torch.Tensor, pos: torch.Tensor,
          mask: torch.Tensor, state: torch.Tensor | None) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """One static-shape decode step: consume tokens ``ids`` (B, 1) at positions ``pos`` (B, 1) into the
    cache; return the next token's candidates (``_candidates``). Shapes depend on the bucket only and
    nothing is read by the host. The draw itself (``_draw_tokens``, a few ops on B x top-k) runs
    eagerly after it: inductor's CPU code for splitmix64's wrapping int64 arithmetic corrupted memory
    (torch 2.13; ``free(): corrupted unsorted chunks``), and the draw is not where the time goes."""
    h = body(input_ids=ids, attention_mask=mask, position_ids=pos, past_key_values=cache,
             use_cache=True).last_hidden_state[:, -1]
    return _head_candidates(head, model, temperature, top_k, h, state)


def step_fn(mode: str):
    """``_step``, eager (``none``) or compiled once per process and mode (``torch.compile``; inductor's
    ``default`` or ``reduce-overhead``, which captures CUDA graphs on a GPU)."""
    if mode not in COMPILE_MODES:
        raise ValueError(f"sampling.compile must be one of {COMPILE_MODES}, got {mode!r}")
    if mode == "none":
        return _step
    if mode not in _COMPILED:
        # torch recompiles a function at most 8 times by default, then runs it eagerly: a 160-row batch
        # alone meets 9 buckets (160, 128, ..., 1), twice with Base and CTRLS
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT)
        _COMPILED[mode] = torch.compile(_step, mode=mode, dynamic=False)
    return _COMPILED[mode]


def _bucket(live: int, slots: int) -> int:
    """The slot count once only ``live`` of ``slots`` rows are live: the smallest power of two that
    holds them, once they fill at most half the slots (else the slots stay)."""
    return 1 << max(live - 1, 0).bit_length() if live <= slots // 2 else slots


def _decode_static(backbone: Backbone, prompts: Sequence[Sequence[int]], starts: Sequence[int],
                  sample_ids: Sequence[list[int]], seeds: Sequence[int], prompt_index: Sequence[int],
                  params: SampleParams, model: "CTRLSModel | None", policies: Sequence = (),
                  epsilons: Sequence = (), cross_prefix: bool = True) -> list[list[Generation]]:
    """``_decode`` with static shapes (see "The static path" in the module docstring); the same arguments and result."""
    tok, lm = backbone.tokenizer, backbone.model
    dev = backbone.device
    body, head = decoder_body(lm), lm.get_output_embeddings()
    pre = _prefill(backbone, prompts, starts, sample_ids, seeds, prompt_index, params, model, policies, epsilons,
                   0, pad_to=STATIC_PAD_TO, cross_prefix=cross_prefix)
    rows, state, width = pre.rows, pre.state, pre.width
    cap = width + params.max_new_tokens + 1
    cache = static_cache(lm.config, [(layer.keys, layer.values) for layer in pre.cache.layers], width, cap)
    del pre.cache
    n = len(rows)
    mask = torch.zeros((n, 1, 1, cap), dtype=torch.bool, device=dev)
    mask[:, 0, 0, :width] = pre.attn.bool()
    next_pos = pre.next_pos.clone()
    slot_row = list(range(n))  # the row in each slot (a finished row keeps its slot until the next bucket)
    live = [True] * n
    keys = torch.tensor([r.key for r in rows], dtype=torch.int64, device=dev)
    step = step_fn(params.compile)
    cur = width  # the cache position the next token is written to

    def counters():
        return torch.tensor([len(rows[ri].tokens) for ri in slot_row], dtype=torch.int64, device=dev)

    nxt = _draw_tokens(*_head_candidates(head, model, params.temperature, params.top_k, pre.h_last, state),
                       params.temperature, keys, counters())
    with packed_decode_attention(lm):  # attention on the KV heads, also when compiled (its docstring says why)
        for _ in range(params.max_new_tokens):
            nxt = nxt.cpu()  # the step's one host read
            slots = [s for s, on in enumerate(live) if on]
            keep, redraw = _advance(rows, [slot_row[s] for s in slots], nxt[slots], pre, params, tok)
            if not keep:
                break
            kept = {slots[j] for j in keep}
            for s in slots:
                live[s] = s in kept
            redraw_slots = [slots[keep[k]] for k in redraw]
            n_slots = _bucket(len(kept), len(slot_row))
            if n_slots < len(slot_row):  # move the live rows (in slot order) to a smaller bucket
                order = sorted(kept) + [s for s in range(len(slot_row)) if s not in kept][: n_slots - len(kept)]
                at = {s: i for i, s in enumerate(order)}
                redraw_slots = [at[s] for s in redraw_slots]
                sel = torch.as_tensor(order, device=dev)
                cache = select_rows(cache, lm.config, sel, cur)
                mask, next_pos, keys, nxt = mask[sel].contiguous(), next_pos[sel], keys[sel], nxt[order]
                if state is not None:
                    state = state[sel]
                slot_row = [slot_row[s] for s in order]
                live = [s in kept for s in order]
            if model is not None and redraw_slots:
                state = _redraw(model, params, state, redraw_slots, [rows[slot_row[s]] for s in redraw_slots])
            mask[:, 0, 0, cur] = True
            cand = step(body, head, model, params.temperature, params.top_k, cache, nxt[:, None].to(dev),
                        next_pos[:, None], mask, state)
            nxt = _draw_tokens(*cand, params.temperature, keys, counters())
            next_pos = next_pos + 1
            cur += 1
    return _generations(rows, pre.expand, len(prompts), tok)


def seeded(seed: int, device: str | torch.device = "cpu") -> torch.Generator:
    g = torch.Generator(device=device)
    g.manual_seed(seed)
    return g


def tokens_per_second(gens: list[list[Generation]], seconds: float) -> float:
    return sum(g.n_tokens for gs in gens for g in gs) / max(seconds, 1e-9)


__all__ = ["Generation", "SampleParams", "sample", "seeded", "tokens_per_second"]
