"""The state prompt: m learned input vectors per state, inserted as input embeddings at each step
boundary, so that step t attends to its state z_t through every layer of the frozen backbone.

Our reading, not the paper's: Alg. 1 says "Inject z_t into token representations (Eq. 8)" and Sec. 5.3
applies Eq. 8 to each token's last hidden state, where a linear F_u is one logit bias per state
(``ctrls.method.adapter``). Here the state is a place in the sequence instead (prompt tuning, Lester
et al. 2021, per state):

    x_0 | V(z_1) x_1 | V(z_2) x_2 | ...      V(z) = sum_k z_k V_k,  V_k in R^{m x d}

Teacher forcing (:func:`chain_logprob`) and decoding (:func:`decode_chains`, the KV cache holding a
state's vectors from the moment the state is drawn) build the same sequence, positions included; the
read-back of a step is Q_phi on an unadapted pass *without* the vectors
(``ctrls.generate.controllability.encode_generations``). With a ``head`` (:func:`adapter_head`) the
last-hidden adapter of Eq. 8 is applied as well: each token is predicted from E'(h, z_t) of its step's
state, in teacher forcing and in decoding alike (``state_prompt.with_adapter``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch
import torch.nn.functional as F


class StatePrompt(torch.nn.Module):
    """V: (K, m, d), initialised at the mean token embedding plus noise of the embeddings' own scale."""

    def __init__(self, n_states: int, n_vectors: int, embeddings: torch.Tensor, seed: int = 0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        mu, sd = embeddings.float().mean(0).cpu(), embeddings.float().std(0).cpu()  # the noise is drawn on the CPU: the same vectors on any device
        noise = torch.randn((n_states, n_vectors, embeddings.shape[1]), generator=g)
        self.vectors = torch.nn.Parameter((mu + 0.5 * sd * noise).to(embeddings.device))  # distinct per state from the start

    @property
    def n_states(self) -> int:
        return self.vectors.shape[0]

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        """(..., K) one-hot or soft states -> (..., m, d) vectors."""
        return torch.einsum("...k,kmd->...md", z.to(self.vectors.device, self.vectors.dtype), self.vectors)


def interleave(embeds: torch.Tensor, prompt_len: int, spans: Sequence[tuple[int, int]],
               vectors: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The teacher-forced sequence of one chain: ``embeds`` (P + L, d) are the prompt's and the chain's
    token embeddings, ``spans`` each step's [a, b) within the chain, ``vectors`` (T, m, d) the states'.
    Returns (inputs (P + L + T m, d), where (P + L,): each token's position in the new sequence)."""
    if len(spans) > vectors.shape[0]:
        raise ValueError(f"{len(spans)} steps but vectors for {vectors.shape[0]}")
    parts, where, at, prev = [embeds[:prompt_len]], list(range(prompt_len)), prompt_len, 0
    m = vectors.shape[1]
    for t, (a, b) in enumerate(spans):
        if a < prev or b < a:
            raise ValueError(f"step spans must be ordered and disjoint, got {list(spans)}")
        gap = embeds[prompt_len + prev: prompt_len + a]  # tokens between steps (blank lines) keep their place
        parts += [gap, vectors[t]]
        where += list(range(at, at + len(gap)))
        at += len(gap) + m
        parts.append(embeds[prompt_len + a: prompt_len + b])
        where += list(range(at, at + b - a))
        at += b - a
        prev = b
    tail = embeds[prompt_len + prev:]
    parts.append(tail)
    where += list(range(at, at + len(tail)))
    return torch.cat(parts), torch.as_tensor(where)


Head = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (h (n, d), states (n, K)) -> logits (n, V)


def adapter_head(lm, adapter, centroids: torch.Tensor) -> Head:
    """The LM head after the last-hidden adapter (Eq. 8): logits of E'(h, s Gamma) for last hidden states h
    (n, d) under states s (n, K); a frozen adapter (its weights are not trained here)."""
    out = lm.get_output_embeddings()

    def head(h: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        return out(adapter.forward_s(h, s.to(h.device), centroids.to(h.device)))  # Eq. 8, then the LM head

    return head


def _run(lm, head: Head | None, **kw) -> torch.Tensor:
    """The backbone's logits (B, S, V) without a head, its last hidden states (B, S, d) with one."""
    if head is None:
        return lm(**kw).logits
    from ctrls.method.backbone import decoder_body

    return decoder_body(lm)(**kw).last_hidden_state


def _run_packed(lm, head: Head | None, x: torch.Tensor, pid: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """:func:`_run` of a ragged pass (``ctrls.method.ragged``: x (1, N, d), no cache argument, the layout's
    cache is written by attention), at the packed slots ``keep`` only: logits (n, V), or last hidden states with a head."""
    if head is None:
        return lm(inputs_embeds=x, position_ids=pid, use_cache=False, logits_to_keep=keep).logits[0]
    from ctrls.method.backbone import decoder_body

    return decoder_body(lm)(inputs_embeds=x, position_ids=pid, use_cache=False).last_hidden_state[0, keep]


def prompt_cache(lm, prompt: Sequence[int]):
    """The KV cache of the prompt alone (no state vector reaches it), for :func:`chain_logprob`'s ``cache``:
    pass a copy per chain (a forward extends the cache it is given)."""
    from transformers import DynamicCache

    kv = DynamicCache(config=lm.config)
    with torch.no_grad():
        lm(input_ids=torch.as_tensor([list(prompt)], device=lm.get_input_embeddings().weight.device),
           past_key_values=kv, use_cache=True)
    return kv


def chain_logprob(lm, prompt: Sequence[int], chain: Sequence[int], spans: Sequence[tuple[int, int]],
                  states: torch.Tensor, prompt_vectors: StatePrompt, cache=None,
                  head: Head | None = None) -> tuple[torch.Tensor, int]:
    """Summed log P of each step's tokens given the prompt, the earlier steps and each step's state
    vectors (teacher forcing); ``states`` (T, K). Gradients reach the vectors only (the backbone is frozen).
    ``cache``: the prompt's KV cache (:func:`prompt_cache`), consumed: only the chain is then run.
    ``head``: logits from the last hidden states and each token's step state (:func:`adapter_head`)."""
    emb = lm.get_input_embeddings()
    ids = torch.as_tensor([*prompt, *chain], device=emb.weight.device)
    x, where = interleave(emb(ids), len(prompt), spans, prompt_vectors(states).to(emb.weight.dtype))  # the backbone's dtype (bf16 on a GPU)
    P = len(prompt)
    if cache is None:
        out, offset = _run(lm, head, inputs_embeds=x[None])[0], 0
    else:  # positions continue from the cache's length, as in decoding
        out, offset = _run(lm, head, inputs_embeds=x[None, P:], past_key_values=cache, use_cache=True)[0], P
    want = [P + i for a, b in spans for i in range(a, b)]  # the step tokens
    src = where[want] - 1 - offset  # each predicted from the position before it (a state vector at a step's start)
    if head is None:
        logits = out[src]
    else:  # each token under its own step's state
        step = torch.as_tensor([t for t, (a, b) in enumerate(spans) for _ in range(a, b)], device=states.device)
        logits = head(out[src], states[step].float())
    lp = F.log_softmax(logits.float(), -1).gather(1, ids[want][:, None]).sum()
    return lp, len(want)


def _common_prefix(seqs: Sequence[Sequence[int]]) -> int:
    """The length of the sequences' longest common prefix, leaving each at least one token of its own."""
    n = min(len(x) for x in seqs) - 1
    for i in range(max(n, 0)):
        if any(x[i] != seqs[0][i] for x in seqs):
            return i
    return max(n, 0)


class PromptCaches:
    """Each prompt's KV cache (:func:`prompt_cache`), computed once; a copy per chain."""

    def __init__(self, lm):
        self.lm, self.caches = lm, {}

    def __call__(self, prompt: Sequence[int]):
        import copy

        key = tuple(prompt)
        if key not in self.caches:
            self.caches[key] = prompt_cache(self.lm, prompt)
        return copy.deepcopy(self.caches[key])


@dataclass
class Chain:
    """One teacher-forced chain of the fit: prompt ids, chain ids, each step's [a, b) and state (T,)."""

    prompt: list[int]
    chain: list[int]
    spans: list[tuple[int, int]]
    states: torch.Tensor


def _logp(lm, c: Chain, sp: StatePrompt, caches: PromptCaches, head: Head | None = None) -> tuple[torch.Tensor, int]:
    z = F.one_hot(c.states.long(), sp.n_states).float()
    return chain_logprob(lm, c.prompt, c.chain, c.spans, z, sp, cache=caches(c.prompt), head=head)


def logp_per_token(lm, chains: Sequence[Chain], sp: StatePrompt, caches: PromptCaches | None = None,
                   head: Head | None = None) -> float:
    """Mean log P of the chains' step tokens under their states' vectors (teacher forcing)."""
    caches = caches or PromptCaches(lm)
    tot, n = 0.0, 0
    with torch.no_grad():
        for c in chains:
            lp, k = _logp(lm, c, sp, caches, head)
            tot, n = tot + float(lp), n + k
    return tot / max(n, 1)


def accumulate_gradient(lm, chains: Sequence[Chain], sp: StatePrompt, caches: PromptCaches,
                        head: Head | None = None) -> None:
    """The gradient of minus the chains' mean log P per step token into ``sp.vectors.grad``: one chain's graph
    at a time, so the backbone's activations of one chain are held, not of the batch. The chains run last to
    first, the order in which autograd sums one graph's chains into the leaf: the gradient equals the one
    graph's to the bit (``tests/method/test_state_prompt.py``)."""
    n = max(1, sum(b - a for c in chains for a, b in c.spans))  # the step tokens (chain_logprob's count)
    for c in reversed(chains):
        lp, _ = _logp(lm, c, sp, caches, head)
        (-lp / n).backward()


def fit(lm, train: Sequence[Chain], heldout: Sequence[Chain], n_states: int, n_vectors: int, lr: float, epochs: int,
        patience: int, batch: int, seed: int, on_best: Callable | None = None,
        on_epoch: Callable[[dict], None] | None = None, head: Head | None = None) -> tuple[StatePrompt, dict]:
    """Adam on the vectors V only (the backbone frozen): maximise the mean log P per step token of the
    ``train`` chains, each step under its state; early stopping on the ``heldout`` chains' log P per
    token (``patience`` epochs without a better one), the best epoch's vectors kept (epoch 0: the
    initial vectors). ``on_best(sp, info)`` runs each time an epoch improves it (a checkpoint), ``on_epoch(row)``
    after every epoch; ``head``: the frozen adapter's (:func:`adapter_head`), trained through.
    Returns (the vectors, {history, kept_epoch, train_seconds, finished})."""
    import time

    sp = StatePrompt(n_states, n_vectors, lm.get_input_embeddings().weight.detach(), seed=seed)
    opt = torch.optim.Adam(sp.parameters(), lr=lr)
    caches = PromptCaches(lm)
    best = (logp_per_token(lm, heldout, sp, caches, head), 0, sp.vectors.detach().clone())
    hist = [{"epoch": 0, "heldout_logp_per_token": best[0]}]
    g, t0 = torch.Generator().manual_seed(seed), time.perf_counter()
    for ep in range(1, epochs + 1):
        order = torch.randperm(len(train), generator=g).tolist()
        for i in range(0, len(order), batch):  # one Adam step per ``batch`` chains: the mean log P per token
            opt.zero_grad()
            accumulate_gradient(lm, [train[j] for j in order[i:i + batch]], sp, caches, head)
            opt.step()
        v = logp_per_token(lm, heldout, sp, caches, head)
        if not torch.isfinite(torch.tensor(v)) or not torch.isfinite(sp.vectors).all():
            raise FloatingPointError(f"state prompt fit: the held-out log P per token is {v} after epoch {ep} "
                                     f"(learning rate {lr}); lower state_prompt.lr")
        hist.append({"epoch": ep, "heldout_logp_per_token": v, "seconds": time.perf_counter() - t0})
        if on_epoch is not None:
            on_epoch(hist[-1])
        if v > best[0]:
            best = (v, ep, sp.vectors.detach().clone())
            if on_best is not None:
                on_best(sp, {"history": hist, "kept_epoch": ep, "train_seconds": time.perf_counter() - t0,
                             "finished": False})
        elif ep - best[1] >= patience:
            break
    with torch.no_grad():
        sp.vectors.copy_(best[2])
    return sp, {"history": hist, "kept_epoch": best[1], "train_seconds": time.perf_counter() - t0, "finished": True}


@dataclass
class Decoded:
    """One sampled chain: its tokens, each step's span, the states it was generated under (one per step
    opened, so possibly one more than ``spans`` when the chain stopped right after a step) and why it ended
    (eos, max_tokens, or the reason ``closes_chain`` gave)."""

    token_ids: list[int]
    spans: list[tuple[int, int]] = field(default_factory=list)
    states: list[int] = field(default_factory=list)
    finish: str = "max_tokens"


def decode_chain(lm, prompt: Sequence[int], draw: Callable[[int], int], prompt_vectors: StatePrompt,
                 ends_step: Callable[[int, bool], bool], has_content: Callable[[int], bool], max_new_tokens: int,
                 max_steps: int, sample: Callable[[torch.Tensor], int], stop: set[int],
                 forced: Sequence[int] | None = None, record: list | None = None,
                 closes_chain: Callable[[list[int], int], str | None] | None = None, head: Head | None = None) -> Decoded:
    """One chain: :func:`decode_chains` with one row."""
    return decode_chains(lm, [prompt], [draw], prompt_vectors, ends_step, has_content, max_new_tokens, max_steps,
                         sample, stop, forced=None if forced is None else [forced],
                         record=None if record is None else [record], closes_chain=closes_chain, head=head)[0]


@torch.no_grad()
def decode_chains(lm, prompts: Sequence[Sequence[int]], draws: Sequence[Callable[[int], int]], prompt_vectors: StatePrompt,
                  ends_step: Callable[[int, bool], bool], has_content: Callable[[int], bool], max_new_tokens: int,
                  max_steps: int, sample: Callable[[torch.Tensor], int] | Sequence[Callable[[torch.Tensor], int]],
                  stop: set[int], forced: Sequence[Sequence[int]] | None = None, record: list[list] | None = None,
                  closes_chain: Callable[[list[int], int], str | None] | None = None, cache=None,
                  head: Head | None = None) -> list[Decoded]:
    """Decode one chain per row side by side with the KV cache: row r's prompt ``prompts[r]`` (left-padded
    to the longest), then
    the vectors of state ``draws[r](t)`` at the start of each step t (until ``max_steps``), then tokens
    from ``sample(logits)`` (or row r's ``forced`` tokens: teacher forcing through the decoder, for tests;
    ``record[r]`` then receives each token's log P). A step ends at a token for which
    ``ends_step(token, step_has_content)`` holds; ``has_content(token)`` marks a non-blank token; a
    ``stop`` token ends the chain and is not kept. ``sample`` is one callable for every row or one per row
    (a row's own random stream: its tokens then do not depend on its batch-mates' draws);
    ``closes_chain(step_tokens, steps_so_far)``, called when a step closes, returns a reason to end the
    chain there (the sampler's rules: after the answer line, after T steps) or None. ``cache``: the empty
    KV cache to decode into (default transformers' ``DynamicCache``; the stages pass the engine's
    preallocated one, ``ctrls.generate.kv_cache.new_cache``). Rows that open a step feed their token and the state's
    m vectors in one pass; the others pad those slots (masked out of attention, not counted as positions),
    so each row sees the sequence :func:`chain_logprob` builds; on ``sdpa`` models only the real slots go
    through the linear layers (``ctrls.method.ragged``). Rows with one prompt share its prefill, and the
    prompts' common prefix is run once; a finished row leaves the batch and its cache. ``head``: as :func:`chain_logprob`'s, each token under
    the state of the step it belongs to (the row's last drawn state)."""
    from transformers import DynamicCache

    from ctrls.method.ragged import Layout, causal_padding_mask, fill_holes, ragged_pass, supports_ragged

    emb = lm.get_input_embeddings()
    dev, dt = emb.weight.device, emb.weight.dtype
    B = len(draws)
    kv = cache if cache is not None else DynamicCache(config=lm.config)
    if len(prompts) != B or not all(len(p) for p in prompts):
        raise ValueError(f"one non-empty prompt per row: {len(prompts)} prompts for {B} rows")
    uniq: dict[tuple, int] = {}  # each distinct prompt is run once, its cache then copied to its rows
    of = [uniq.setdefault(tuple(p), len(uniq)) for p in prompts]
    U = [list(p) for p in uniq]
    shared = _common_prefix(U) if len(U) > 1 else 0  # the prompts' shared prefix (few-shot exemplars), run once
    S = max(len(p) for p in U) - shared
    # a row's cache: [shared prefix] [left padding] [its prompt's own suffix], then what it decodes
    layout = torch.as_tensor([[1] * shared + [0] * (S + shared - len(p)) + [1] * (len(p) - shared) for p in U], device=dev)
    mask = layout[torch.as_tensor(of, device=dev)]  # real cache slots
    pos = torch.as_tensor([len(p) for p in prompts], device=dev)  # each row's next position
    res = [Decoded([]) for _ in range(B)]
    content, start, step_open, done = [False] * B, [0] * B, [False] * B, [False] * B
    limit = [max_new_tokens if forced is None else len(forced[r]) for r in range(B)]
    pick = list(sample) if isinstance(sample, (list, tuple)) else [sample] * B
    if len(pick) != B:
        raise ValueError(f"{len(pick)} samplers for {B} rows")

    def vectors(r: int) -> torch.Tensor:  # draw row r's next state: its m vectors
        k = draws[r](len(res[r].states))
        res[r].states.append(k)
        step_open[r] = True
        return prompt_vectors(F.one_hot(torch.as_tensor(k), prompt_vectors.n_states).float()).to(dt)

    alive = list(range(B))  # the rows in the batch, in batch order: a finished row leaves it (and the cache)

    ragged = supports_ragged(lm)  # the real slots only through the linear layers (ctrls.method.ragged)
    pad = torch.zeros(emb.weight.shape[1], dtype=dt, device=dev)

    def forward(feed: dict[int, list[torch.Tensor]]) -> dict[int, torch.Tensor]:
        """Feed each alive row's slots (a row's list may be empty: all padding); the logits at its last real slot."""
        nonlocal mask
        slots = [feed.get(r) or [pad] for r in alive]  # a row with nothing to feed feeds one pad slot, masked
        n = torch.as_tensor([len(f) for f in slots], device=dev)
        L = int(n.max())
        new = (torch.arange(L, device=dev)[None] < torch.as_tensor([len(feed.get(r, ())) for r in alive], device=dev)[:, None]).long()
        pid = pos[:, None] + (new.cumsum(1) - 1).clamp(min=0)  # padding repeats the last real position
        mask = torch.cat([mask, new], 1)
        if ragged:  # one packed sequence of every row's slots; attention on the rectangle
            row = torch.repeat_interleave(torch.arange(len(alive), device=dev), n)
            col = torch.arange(int(n.sum()), device=dev) - (n.cumsum(0) - n)[row]
            ends = n.cumsum(0) - 1  # each row's last slot in the packed sequence
            lay = Layout(row, col, L, len(alive), kv, causal_padding_mask(mask, L))
            with ragged_pass(lm, lay):
                lg = _run_packed(lm, head, torch.stack([t for f in slots for t in f])[None], pid[row, col][None], ends)
        else:
            x = torch.zeros((len(alive), L, emb.weight.shape[1]), dtype=dt, device=dev)
            for j, f in enumerate(slots):
                x[j, :len(f)] = torch.stack(f)
            out = _run(lm, head, inputs_embeds=x, attention_mask=mask, position_ids=pid, past_key_values=kv, use_cache=True)
            lg = out[torch.arange(len(alive), device=dev), (new.sum(1) - 1).clamp(min=0)]
        pos.add_(new.sum(1))
        if head is not None:  # every alive row has drawn a state (the first forward draws one for each)
            z = F.one_hot(torch.as_tensor([res[r].states[-1] for r in alive], device=dev), prompt_vectors.n_states)
            lg = head(lg, z.float())
        return {r: lg[j] for j, r in enumerate(alive)}

    def drop_finished() -> None:
        """Take finished rows out of the batch: their cache rows, mask rows and positions."""
        nonlocal alive, mask, pos
        keep = [j for j, r in enumerate(alive) if not done[r]]
        if keep and len(keep) < len(alive):  # in the order that moves only rows into holes (each row has its sampler)
            keep = fill_holes(keep, len(alive))
            idx = torch.as_tensor(keep, device=dev)
            kv.batch_select_indices(idx)
            mask, pos, alive = mask[idx], pos[idx], [alive[j] for j in keep]

    if shared:  # the shared prefix once, its cache copied to each distinct prompt
        lm(input_ids=torch.as_tensor([U[0][:shared]], device=dev), past_key_values=kv, use_cache=True, logits_to_keep=1)
        kv.batch_repeat_interleave(len(U))
    ids = torch.as_tensor([[0] * (S + shared - len(p)) + p[shared:] for p in U], device=dev)  # left-padded suffixes
    first = lm(input_ids=ids, attention_mask=layout, position_ids=(layout.cumsum(1) - 1).clamp(min=0)[:, shared:],
               past_key_values=kv, use_cache=True, logits_to_keep=1).logits[:, -1]  # real tokens' positions
    if len(uniq) < B or of != list(range(B)):
        kv.batch_select_indices(torch.as_tensor(of, device=dev))
    logits = {r: first[of[r]] for r in range(B)}
    if max_steps > 0:
        logits = forward({r: list(vectors(r)) for r in range(B)})
    for i in range(max(limit, default=0)):
        feed: dict[int, list[torch.Tensor]] = {}
        for r in alive:
            if done[r]:
                continue
            if i >= limit[r]:
                done[r] = True
                continue
            tok = pick[r](logits[r]) if forced is None else int(forced[r][i])
            if record is not None:
                record[r].append(float(F.log_softmax(logits[r].float(), -1)[tok]))
            if tok in stop:
                done[r], res[r].finish = True, "eos"
                continue
            res[r].token_ids.append(tok)
            content[r] = content[r] or has_content(tok)
            feed[r] = [emb.weight[tok]]
            if ends_step(tok, content[r]) and step_open[r]:
                res[r].spans.append((start[r], len(res[r].token_ids)))
                why = None if closes_chain is None else closes_chain(res[r].token_ids[start[r]:], len(res[r].spans))
                start[r], content[r], step_open[r] = len(res[r].token_ids), False, False
                if why is not None:  # the chain ends with this step: its token is kept, nothing more is fed
                    done[r], res[r].finish = True, why
                    del feed[r]
                    continue
                if len(res[r].states) < max_steps and len(res[r].token_ids) < limit[r]:
                    feed[r] += list(vectors(r))  # the next step's state, in the same pass
        if all(done):
            break
        drop_finished()
        if feed:
            logits = forward(feed)
    for r in range(B):
        if step_open[r] and start[r] < len(res[r].token_ids):
            res[r].spans.append((start[r], len(res[r].token_ids)))
    return res
