"""The state prompt: m learned input vectors per state, inserted as input embeddings at each step
boundary, so that step t attends to its state z_t through every layer of the frozen backbone.

Our reading, not the paper's: Alg. 1 says "Inject z_t into token representations (Eq. 8)" and Sec. 5.3
applies Eq. 8 to each token's last hidden state, where a linear F_u is one logit bias per state
(``ctrls.method.adapter``). Here the state is a place in the sequence instead (prompt tuning, Lester
et al. 2021, per state):

    x_0 | V(z_1) x_1 | V(z_2) x_2 | ...      V(z) = sum_k z_k V_k,  V_k in R^{m x d}

Teacher forcing (:func:`chain_logprob`) and decoding (the engine under
``ctrls.generate.conditioning.StatePromptConditioning``, the KV cache holding a state's vectors from the moment
the state is drawn) build the same sequence, positions included; the
read-back of a step is Q_phi on an unadapted pass *without* the vectors
(``ctrls.generate.controllability.encode_generations``). With a ``head`` (:func:`adapter_head`) the
last-hidden adapter of Eq. 8 is applied as well: each token is predicted from E'(h, z_t) of its step's
state, in teacher forcing and in decoding alike (``state_prompt.with_adapter``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import torch
import torch.nn.functional as F


class StatePrompt(torch.nn.Module):
    """V: (K, m, d), initialised at the mean token embedding plus noise of the embeddings' own scale."""

    def __init__(self, n_states: int, n_vectors: int, embeddings: torch.Tensor, seed: int = 0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        # the noise is drawn on the CPU: the same vectors on any device
        mu, sd = embeddings.float().mean(0).cpu(), embeddings.float().std(0).cpu()
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


def _run(lm, head: Head | None, cache=None, **kw) -> torch.Tensor:
    """The backbone's logits (B, S, V) without a head, its last hidden states (B, S, d) with one; with a KV
    ``cache``, the tokens continue its sequence."""
    from ctrls.method.backbone import decoder_body, with_cache

    fn = lm if head is None else decoder_body(lm)
    out = fn(**kw, **(with_cache(fn, cache) if cache is not None else {}))
    return out.logits if head is None else out.last_hidden_state


def prompt_cache(lm, prompt: Sequence[int]):
    """The KV cache of the prompt alone (no state vector reaches it), for :func:`chain_logprob`'s ``cache``:
    pass a copy per chain (a forward extends the cache it is given)."""
    with torch.no_grad():  # the model's own KV cache class
        return lm(input_ids=torch.as_tensor([list(prompt)], device=lm.get_input_embeddings().weight.device),
                  use_cache=True).past_key_values


def chain_logprob(lm, prompt: Sequence[int], chain: Sequence[int], spans: Sequence[tuple[int, int]],
                  states: torch.Tensor, prompt_vectors: StatePrompt, cache=None,
                  head: Head | None = None) -> tuple[torch.Tensor, int]:
    """Summed log P of each step's tokens given the prompt, the earlier steps and each step's state
    vectors (teacher forcing); ``states`` (T, K). Gradients reach the vectors only (the backbone is frozen).
    ``cache``: the prompt's KV cache (:func:`prompt_cache`), consumed: only the chain is then run.
    ``head``: logits from the last hidden states and each token's step state (:func:`adapter_head`)."""
    emb = lm.get_input_embeddings()
    ids = torch.as_tensor([*prompt, *chain], device=emb.weight.device)
    x, where = interleave(emb(ids), len(prompt), spans,
                          prompt_vectors(states).to(emb.weight.dtype))  # the backbone's dtype (bf16 on a GPU)
    P = len(prompt)
    if cache is None:
        out, offset = _run(lm, head, inputs_embeds=x[None])[0], 0
    else:  # positions continue from the cache's length, as in decoding
        out, offset = _run(lm, head, cache=cache, inputs_embeds=x[None, P:], use_cache=True)[0], P
    want = [P + i for a, b in spans for i in range(a, b)]  # the step tokens
    src = where[want] - 1 - offset  # each predicted from the position before it (a state vector at a step's start)
    if head is None:
        logits = out[src]
    else:  # each token under its own step's state
        step = torch.as_tensor([t for t, (a, b) in enumerate(spans) for _ in range(a, b)], device=states.device)
        logits = head(out[src], states[step].float())
    lp = F.log_softmax(logits.float(), -1).gather(1, ids[want][:, None]).sum()
    return lp, len(want)


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
