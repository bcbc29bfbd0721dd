"""What the two decode loops of :mod:`ctrls.generate.sampling` share (the engine there, the static path in
:mod:`ctrls.generate.static_decode`): the parameters and the :class:`Generation` record, a row's bookkeeping,
the prefill of a group's prompts (their shared prefix once), the token draw (Gumbel-max with each
row's counter-based noise) and the state draw s_{t+1} ~ pi~(. | s_t), the stopping rules, and the
rows' generations. The rules themselves (positions, streams, stopping) are described in
:mod:`ctrls.generate.sampling`'s docstring; ``ctrls.generate.sampling`` re-exports the public names.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Sequence

import torch
from transformers import DynamicCache

from ctrls.data.prompts import ANSWER_LINE, newline_token_ids
from ctrls.generate.kv_cache import MIN_SHARED_PREFIX, new_cache
from ctrls.method.backbone import Backbone, decoder_body, with_cache
from ctrls.method.streams import stream_key, stream_uniform

if TYPE_CHECKING:
    from ctrls.method.model import CTRLSModel
    from ctrls.method.policy import TransitionPolicy


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
    # with transitions=False, the state every step is held in: None or "s0", the prompt's s_0 (under the state prompt's
    # position mask, None substitutes where s_0 cannot occur, "s0" never does); an int j, state j (a constant-state row)
    hold: int | str | None = None
    decode: str = "engine"  # engine (dense, shrinking batch) | static (fixed shapes, one graph per step)
    compile: str = "none"  # static path: none | default | reduce-overhead (torch.compile; CUDA graphs on a GPU)

    def __post_init__(self):
        if self.decode not in DECODE_PATHS:
            raise ValueError(f"decode must be one of {DECODE_PATHS}, got {self.decode!r}")
        if self.compile not in COMPILE_MODES:
            raise ValueError(f"compile must be one of {COMPILE_MODES}, got {self.compile!r}")
        if self.compile != "none" and self.decode != "static":
            raise ValueError(f"compile={self.compile!r} needs decode='static': the engine's shapes change every step")
        if not (self.hold is None or self.hold == "s0" or (isinstance(self.hold, int) and not isinstance(self.hold, bool)
                                                           and self.hold >= 0)):
            raise ValueError(f"hold must be None, 's0' or a state index >= 0, got {self.hold!r}")


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
    # Eq. 16's trajectory: s_0 then *every* state draw that conditioned a sampled token, (D+1, K), and the
    # exact log of each draw, (D, K) float64 (= policy_states[1:]). D is T' or T' + 1: a draw made when the
    # last step closed conditions the next token even when that token is EOS (or whitespace, then EOS),
    # so it enters the loss, though it starts no step. With transitions=False no state is drawn (None).
    log_actions: torch.Tensor | None = None
    policy_states: torch.Tensor | None = None
    # (D, K) bool: the states each draw was renormalised over (a position mask, ctrls.method.positions); None: all
    allowed: torch.Tensor | None = None
    # with sample(..., read_states=model), Base rows too: Q_phi's state of each step (the nearest centroid of its
    # spectral embedding, Sec. 5.2) read back from this decoding pass (StepReader), and the prompt's soft s_0 (K,)
    encoded: list[int] | None = None
    encoded_s0: torch.Tensor | None = None

    @property
    def n_tokens(self) -> int:
        return len(self.token_ids)


@dataclass
class Row:
    prompt_index: int
    sample_index: int
    key: int  # the sample's random stream (see the module docstring)
    tokens: list[int] = field(default_factory=list)
    step_start: int = 0
    spans: list[tuple[int, int]] = field(default_factory=list)
    states: list[torch.Tensor] = field(default_factory=list)
    log_actions: list[torch.Tensor] = field(default_factory=list)
    used_draws: int = 0  # how many of the draws so far conditioned a sampled token (Eq. 16 needs them all)
    finish: str | None = None
    policy: "TransitionPolicy | None" = None  # this row's state policy (lockstep RL); None: model.policy
    epsilon: float | None = None  # this row's epsilon; None: params.epsilon
    encoded_s0: torch.Tensor | None = None  # Q_phi(x_0) of the reader (StepReader), when states are read back



def eos_ids(backbone: Backbone) -> set[int]:
    ids = {backbone.tokenizer.eos_token_id}
    gen = getattr(backbone.model, "generation_config", None)
    e = getattr(gen, "eos_token_id", None)
    ids.update(e if isinstance(e, (list, tuple)) else [e])
    return {i for i in ids if i is not None}


def pick(logits: torch.Tensor, temperature: float, top_k: int, keys: torch.Tensor, counters: torch.Tensor) -> torch.Tensor:
    """Next tokens: greedy at temperature 0, else a draw from softmax(top-k logits / temperature)
    by Gumbel-max with each row's own noise stream."""
    return draw_tokens(*candidates(logits, temperature, top_k), temperature, keys, counters)


def candidates(logits: torch.Tensor, temperature: float, top_k: int) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(values, token ids) the draw chooses among: (None, argmax) at temperature 0, the top k (the
    temperature does not change them), or (logits, None) for the whole vocabulary."""
    if temperature <= 0:
        return None, logits.argmax(-1)
    if top_k and top_k < logits.shape[-1]:
        return logits.topk(top_k, dim=-1)
    return logits, None


def draw_tokens(vals: torch.Tensor | None, idx: torch.Tensor | None, temperature: float, keys: torch.Tensor,
                counters: torch.Tensor) -> torch.Tensor:
    """The Gumbel-max draw among ``candidates`` with each row's counter-based noise."""
    if vals is None:
        return idx
    u = stream_uniform(keys.to(vals.device), counters.to(vals.device), vals.shape[-1])
    choice = (vals.float() / temperature - torch.log(-torch.log(u)).float()).argmax(-1)
    return idx.gather(-1, choice[:, None]).squeeze(-1) if idx is not None else choice


@dataclass
class Prefilled:
    """A group's state after its prompts' prefill (``prefill``): everything either decode loop needs."""

    rows: list[Row]
    expand: torch.Tensor  # prompt of each row
    cache: DynamicCache  # every row's prompt KV (rows expanded), ``width`` positions
    width: int
    attn: torch.Tensor  # (B, width) 1 on each row's prompt tokens (left padding is 0)
    next_pos: torch.Tensor  # (B,) position id of each row's next token
    h_last: torch.Tensor  # (B, d) last hidden state of each row's prompt
    state: torch.Tensor | None  # (B, K) the state that conditions each row's first token (CTRLS)
    is_nl: torch.Tensor  # (vocab,) bool
    is_eos: torch.Tensor
    shared: int = 0  # the cache's first positions, the prompts' shared prefix: the same in every row


def prefill(backbone: Backbone, prompts: Sequence[Sequence[int]], starts: Sequence[int], sample_ids: Sequence[list[int]],
            seeds: Sequence[int], prompt_index: Sequence[int], params: SampleParams, cond,
            policies: Sequence, epsilons: Sequence, room: int, pad_to: int = 1,
            cross_prefix: bool = True, reader: "StepReader | None" = None) -> Prefilled:
    """Prefill the distinct prompts once, expand each to its samples, encode s_0 and draw s_1 (CTRLS):
    the part of a group's decoding that both loops share. With ``cross_prefix`` the prompts' shared
    prefix (``shared_prefix_length``: a system prompt and few-shot exemplars) is run once, then each
    prompt's own suffix on its cache; rows are left padded (between the prefix and the suffix) to a
    width that is a multiple of ``pad_to``. The cache is allocated for ``room`` positions past the
    prompts. ``cond`` (``ctrls.generate.conditioning.Conditioning``) gives each row's s_0 and first state. With
    a ``reader``, each row's ``encoded_s0`` is its Q_phi of the prompt."""
    tok, lm = backbone.tokenizer, backbone.model
    dev = backbone.device
    body, head = decoder_body(lm), lm.get_output_embeddings()
    vocab = head.weight.shape[0]
    is_nl = torch.zeros(vocab, dtype=torch.bool)
    is_nl[list(i for i in newline_token_ids(tok) if i < vocab)] = True
    is_eos = torch.zeros(vocab, dtype=torch.bool)
    is_eos[list(eos_ids(backbone))] = True

    # layout of a row: [the prompts' shared prefix (L)] [left padding] [the prompt's own suffix]
    uniq: dict[tuple, int] = {}  # each distinct prompt is run once (lockstep RL repeats a question per setting)
    of = [uniq.setdefault(tuple(p), len(uniq)) for p in prompts]
    U = [list(p) for p in uniq]
    n = len(U)
    L = shared_prefix_length(U) if cross_prefix else 0
    suffixes = [p[L:] for p in U]
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
        h_pre = body(input_ids=torch.as_tensor([U[0][:L]], device=dev), position_ids=pos[:1, :L].to(dev),
                     **with_cache(body, cache), use_cache=True).last_hidden_state[0]
        cache.batch_repeat_interleave(n)
    h = body(input_ids=ids.to(dev), attention_mask=attn.to(dev), position_ids=pos[:, L:].to(dev),
             **with_cache(body, cache), use_cache=True).last_hidden_state

    def prompt_hidden(i: int, st: int) -> torch.Tensor:
        """Hidden states of prompt i's tokens from its token ``st`` on."""
        u = of[i]
        own = h[u, S - len(suffixes[u]) + max(st - L, 0):]
        return torch.cat([h_pre[st:], own]) if st < L else own

    # ---- expand each prompt to its samples ----------------------------------------------------
    policies = list(policies) or [None] * len(prompts)
    epsilons = list(epsilons) or [None] * len(prompts)
    rows = [Row(prompt_index[i], m, stream_key(seeds[i], m), policy=policies[i], epsilon=epsilons[i])
            for i, ms in enumerate(sample_ids) for m in ms]
    expand = torch.repeat_interleave(torch.arange(len(prompts)), torch.tensor([len(ms) for ms in sample_ids]))
    src = torch.as_tensor(of, dtype=torch.long)[expand]  # the distinct prompt of each row
    if len(src) != n or bool((src != torch.arange(n)).any()):
        cache.batch_select_indices(src.to(dev))
    state, s0 = cond.start(rows, expand, lambda: [prompt_hidden(i, st) for i, st in enumerate(starts)], params)
    if reader is not None:
        s0r = s0 if s0 is not None and reader.model is cond.model else reader.model.encode([prompt_hidden(i, st)
                                                                    for i, st in enumerate(starts)])
        for r, a in zip(rows, s0r[expand.to(s0r.device)].float().cpu()):
            r.encoded_s0 = a
    return Prefilled(rows, expand, cache, width, attn[src].to(dev), pos[src, -1].to(dev) + 1,
                     h[src.to(h.device), -1], state, is_nl, is_eos, L)


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



def advance(rows: Sequence[Row], active: Sequence[int], nxt: torch.Tensor, pre: Prefilled, params: SampleParams,
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


def generations(rows: Sequence[Row], expand: torch.Tensor, n_prompts: int, tok,
                reader: "StepReader | None" = None) -> list[list[Generation]]:
    """Each row's :class:`Generation`, grouped by prompt (with the states a ``reader`` read back)."""
    gens: list[list[Generation]] = [[] for _ in range(n_prompts)]
    for r in rows:
        if r.finish is None:  # loop ran out (max_new_tokens == 0)
            _end_step(r, tok)
            r.finish = "max_tokens"
    encoded = reader.states(rows) if reader is not None else [None] * len(rows)
    for r, i, enc in zip(rows, expand.tolist(), encoded):
        spans = r.spans
        d = r.used_draws
        gens[i].append(Generation(
            prompt_index=r.prompt_index, sample_index=r.sample_index, token_ids=r.tokens,
            text=tok.decode(r.tokens), steps=[tok.decode(r.tokens[a:b]).strip() for a, b in spans],
            spans=spans, finish=r.finish,
            states=torch.stack(r.states[: len(spans) + 1]) if r.states else None,
            log_actions=torch.stack(r.log_actions[:d]) if d else None,  # Eq. 16: every draw that conditioned a token
            policy_states=torch.stack(r.states[: d + 1]) if d else None,  # s_0, then draw i = log_actions[i].exp()
            encoded=enc, encoded_s0=r.encoded_s0))
    return gens


def _close_step(r: Row, tok) -> bool:
    """A newline was appended: close the current step unless its line is blank. A blank line
    stays open and becomes the start of the next step, whose state already predicted it.
    Returns whether a step was closed."""
    a, b = r.step_start, len(r.tokens)
    if not tok.decode(r.tokens[a:b]).strip():
        return False
    r.spans.append((a, b))
    r.step_start = b
    return True


def _end_step(r: Row, tok) -> None:
    """The sequence ends: a non-blank unfinished line is the last step."""
    a, b = r.step_start, len(r.tokens)
    if b > a:
        if tok.decode(r.tokens[a:b]).strip() or not r.spans:
            r.spans.append((a, b))
        else:
            r.spans[-1] = (r.spans[-1][0], b)
        r.step_start = b


class StepReader:
    """Q_phi's state of every generated step, read back from the decoding pass itself (no second forward).

    The adapter rewrites only the last hidden state *after* the frozen decoder body (Eq. 8), so the body's
    last-layer hidden state of a generated token, computed when the token is fed as input, is the one a
    re-encode of the generation in context computes (``ctrls.generate.controllability.encode_generations``: token j
    of the generation at position P + j, step [a, b) = its tokens a .. b-1, the closing newline included).
    The loops hand each fed batch to :meth:`add`; a row that ends on a token it keeps (the answer line's
    newline, the T-th step's, the token limit; not EOS, which is not kept) is fed that token once more
    (:meth:`tail`) before it leaves the batch, so every kept token's state is read. The states are kept at
    float16, the precision of pretraining's feature cache (``controllability.feature_precision``), and at
    the end :meth:`states` gives each step's spectral embedding (Eq. 5) and nearest centroid
    (``CTRLSModel.assign``), as the re-encode does. Only the last layer (``backbone.hidden_layer`` = -1).
    """

    def __init__(self, model: "CTRLSModel"):
        if model.config.hidden_layer != -1:
            raise ValueError(f"read_states reads the last layer's hidden states; this model's states are of layer "
                             f"{model.config.hidden_layer} (re-encode them: ctrls.generate.controllability.encode_generations)")
        self.model = model
        self._h: list[torch.Tensor] = []
        self._owner: list[int] = []

    @staticmethod
    def tail(rows: Sequence[Row], active: Sequence[int]) -> list[int]:
        """Positions j of ``active`` whose row has just ended on a token it keeps: fed once more."""
        return [j for j, ri in enumerate(active) if rows[ri].finish not in (None, "eos")]

    def add(self, h: torch.Tensor, owner: Sequence[int]) -> None:
        """The last hidden states ``h`` (B, d) of the tokens just fed; ``owner[b]``: row index of h[b]."""
        self._h.append(h.to(torch.float16))
        self._owner.extend(owner)

    def hidden(self, n_rows: int) -> list[torch.Tensor]:
        """Each row's hidden states (its fed tokens in order, float16)."""
        if not self._h:
            return [torch.zeros(0, 0)] * n_rows
        owner = torch.tensor(self._owner)
        flat = torch.cat(self._h)[torch.argsort(owner, stable=True).to(self._h[0].device)]
        return list(flat.split(torch.bincount(owner, minlength=n_rows).tolist()))

    def states(self, rows: Sequence[Row]) -> list[list[int]]:
        """The hard state (nearest centroid) of each step of each row."""
        steps, counts = [], []
        for i, (r, H) in enumerate(zip(rows, self.hidden(len(rows)))):
            if len(r.tokens) and H.shape[0] != len(r.tokens):
                raise RuntimeError(f"row {i}: {H.shape[0]} hidden states read for {len(r.tokens)} tokens")
            spans = r.spans if r.tokens else []
            steps += [H[a:b].float() for a, b in spans]
            counts.append(len(spans))
        from ctrls.generate.controllability import step_states

        return step_states(self.model, steps, counts)
