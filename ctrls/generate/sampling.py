"""State-aware generation (the inner loop of Alg. 2), one batched KV-cache loop for Base and CTRLS.

Each prompt is prefilled once (the batch's shared prefix once for all) and its cache shared by its
samples. With a CTRLS model s_0 = Q_phi(x_0), and at each newline s_{t+1} ~ pi~(. | s_t) is drawn; the
adapter (Eq. 8) then rewrites every position that predicts step t+1, the newline's own pass included
(the position rule). Without one it is plain sampling (the Base rows). A sequence stops at EOS, after
the final-answer line, after T steps or at ``max_new_tokens``. Sample m of prompt i draws its tokens
(Gumbel-max) and states from counter-based streams keyed by (seed_i, m) alone, whatever its batch,
device or process. ``read_states=model`` reads each step's Q_phi state (Eq. 5) back from the sampler's pass.
The static path (``sampling.decode``) is :mod:`ctrls.generate.static_decode`; what both loops share,
:mod:`ctrls.generate.decoding`. The rules in full: book/method.md, "ctrls/generate/sampling.py".
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import torch
from tqdm.auto import tqdm

from ctrls.data.prompts import check_prompts, model_positions
from ctrls.generate.conditioning import (  # noqa: F401 (re-exported)
    AdapterConditioning,
    Conditioning,
    LockstepConditioning,
    StatePromptConditioning,
    conditioning_for,
    redraw_states,
)
from ctrls.generate.decoding import (  # noqa: F401 (re-exported)
    COMPILE_MODES,
    DECODE_PATHS,
    MIN_SHARED_PREFIX,
    Generation,
    SampleParams,
    StepReader,
    advance,
    generations,
    prefill,
    shared_prefix_length,
)
from ctrls.generate.decoding import (
    pick as _pick,  # the engine's token draw (tests replace it here)
)
from ctrls.generate.kv_cache import PreallocatedLayer, fill_holes, new_cache, shared_prefix_attention  # noqa: F401 (re-exported)
from ctrls.generate.ragged import feed_pass
from ctrls.generate.static_decode import STATIC_PAD_TO, decode_static, step_fn  # noqa: F401 (re-exported)
from ctrls.method.backbone import Backbone, decoder_body, with_cache

if TYPE_CHECKING:
    from ctrls.method.model import CTRLSModel
    from ctrls.method.policy import TransitionPolicy


@torch.no_grad()
def sample(backbone: Backbone, prompts: Sequence[Sequence[int]], n: int = 1, params: SampleParams | None = None,
           model: "CTRLSModel | None" = None, generator: torch.Generator | None = None,
           prompt_starts: Sequence[int] | None = None, share_prefix: bool = True,
           progress: bool = False, seeds: Sequence[int] | None = None,
           sample_ids: Sequence[Sequence[int]] | None = None, policies: "Sequence[TransitionPolicy] | None" = None,
           epsilons: Sequence[float] | None = None, read_states: "CTRLSModel | None" = None,
           conditioning: Conditioning | None = None) -> list[list[Generation]]:
    """Sample ``n`` chains of thought for each tokenized prompt; Base when ``model`` is None.

    ``conditioning`` (:mod:`ctrls.generate.conditioning`) says how the state enters the decode: Base,
    the adapter (``AdapterConditioning(model)``, what ``model=`` means alone) or the state prompt
    (``StatePromptConditioning``, whose read-back is a re-encode without the vectors).

    ``prompt_starts[i]`` is the first token of prompt i whose hidden states encode s_0 (see
    ``prompts.encode_prompt``; default 0, the whole prompt). ``seeds[i]`` keys prompt i's random
    streams: sample m of prompt i is a function of (seeds[i], m) alone (module docstring); without
    ``seeds`` they are drawn from ``generator`` (or torch's global RNG). ``sample_ids[i]`` picks
    which sample indices of prompt i to draw (default ``range(n)``): any subset gives the same
    samples as the whole, which is how data-parallel ranks share a prompt's samples. ``policies[i]``
    and ``epsilons[i]`` (CTRLS only) replace ``model.policy`` and ``params.epsilon`` for prompt i's
    state draws, so runs that share the adapter but not the policy decode in one batch (lockstep
    RL); a sample is the same whichever batch it is in. ``read_states``: a CTRLS model whose Q_phi reads
    the state of every generated step back from this decoding pass (``Generation.encoded`` and
    ``encoded_s0``, Base rows too; ``ctrls.generate.decoding.StepReader``), instead of a second forward pass.
    Returns one list of :class:`Generation` per prompt, in the order of its sample indices.
    """
    starts = list(prompt_starts) if prompt_starts is not None else [0] * len(prompts)
    params = params or SampleParams()
    cond = conditioning_for(model, conditioning)
    # a direct call is checked as the stages check theirs: an empty prompt, or one that with max_new_tokens
    # (and the state prompt's vectors) runs past the model's positions, is a ValueError naming "prompt i"
    extra = cond.extra_positions(params)
    check_prompts(prompts, params.max_new_tokens, model_positions(backbone), extra=extra,
                  extra_why=f"the state prompt's vectors ({extra} positions: prompt.max_steps x state_prompt.vectors)")
    bad = [i for i, (p, a) in enumerate(zip(prompts, starts)) if not 0 <= a < len(p)]
    if len(starts) != len(prompts) or bad:
        raise ValueError(f"{len(starts)} prompt_starts for {len(prompts)} prompts" if len(starts) != len(prompts) else
                         f"prompt {bad[0]}: prompt_starts[{bad[0]}] = {starts[bad[0]]} is not among its "
                         f"{len(prompts[bad[0]])} tokens")
    if seeds is None:
        dev = generator.device if generator is not None else "cpu"
        seeds = torch.randint(0, 2**62, (len(prompts),), generator=generator, device=dev).tolist()
    if len(seeds) != len(prompts):
        raise ValueError(f"{len(seeds)} seeds for {len(prompts)} prompts")
    ids = [list(s) for s in sample_ids] if sample_ids is not None else [list(range(n))] * len(prompts)
    if len(ids) != len(prompts):
        raise ValueError(f"{len(ids)} sample_ids lists for {len(prompts)} prompts")
    cond.check(params, len(prompts), policies, epsilons)
    if read_states is not None and isinstance(cond, LockstepConditioning) and not cond.feeds_vectors:
        raise ValueError("read_states reads one Q_phi from the decoding pass: runs in lockstep through the adapter "
                         "have one each; re-encode their steps (ctrls.generate.controllability.encode_generations)")
    if params.decode == "static" and isinstance(cond, LockstepConditioning) and not cond.feeds_vectors:
        raise ValueError("sampling.decode=static applies one adapter inside its compiled step: runs in lockstep "
                         "through the adapter need sampling.decode=engine (under the state prompt both paths serve)")
    pol = list(policies) if policies is not None else [None] * len(prompts)
    eps = list(epsilons) if epsilons is not None else [None] * len(prompts)
    out: list[list[Generation]] = [[] for _ in prompts]
    if not any(ids):
        return out
    cond.prepare(backbone, prompts, starts, seeds, ids, params, policies, epsilons)
    reader = StepReader(read_states) if read_states is not None and not cond.feeds_vectors else None
    if share_prefix:  # prompts in groups of at most batch_size sequences (at least one prompt each)
        groups = [[(i, ids[i]) for i in g] for g in row_groups([len(m) for m in ids], params.batch_size)]
    else:  # reference path: every sample re-encodes its prompt
        flat = [(i, [m]) for i in range(len(prompts)) for m in ids[i]]
        groups = [flat[j:j + params.batch_size] for j in range(0, len(flat), params.batch_size)]
    for group in tqdm(groups, desc="sampling", unit="batch", disable=not progress):
        decode = decode_static if params.decode == "static" else _decode
        gens = decode(backbone, [prompts[i] for i, _ in group], [starts[i] for i, _ in group],
                      [m for _, m in group], [seeds[i] for i, _ in group], [i for i, _ in group], params, cond,
                      [pol[i] for i, _ in group], [eps[i] for i, _ in group], cross_prefix=share_prefix,
                      reader=StepReader(read_states) if reader is not None else None)
        for (i, _), gs in zip(group, gens):
            out[i].extend(gs)
    if read_states is not None and cond.feeds_vectors:  # the read-back: an unadapted pass without the vectors
        cond.read_back(backbone, prompts, starts, out, read_states)
    return out


def row_groups(rows_per_prompt: Sequence[int], batch_size: int) -> list[list[int]]:
    """The prompts (indices, in order) decoded together, given each prompt's rows (its samples): each group at
    most ``batch_size`` rows (``sampling.batch_size``), a prompt's rows never split, a prompt with more rows
    than that alone, and a prompt without rows in no group."""
    groups: list[list[int]] = []
    for i, n in enumerate(rows_per_prompt):
        if not n:
            continue
        if groups and sum(rows_per_prompt[j] for j in groups[-1]) + n <= batch_size:
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


def _decode(backbone: Backbone, prompts: Sequence[Sequence[int]], starts: Sequence[int], sample_ids: Sequence[list[int]],
            seeds: Sequence[int], prompt_index: Sequence[int], params: SampleParams, cond: Conditioning,
            policies: Sequence = (), epsilons: Sequence = (), cross_prefix: bool = True,
            reader: StepReader | None = None) -> list[list[Generation]]:
    """The engine: a growing KV cache whose finished rows are dropped from the batch (``fill_holes``).
    With a ``reader`` every fed token's last hidden state is read (``StepReader``): a row that ended on a
    token it keeps is fed it once more, then dropped. Each step reads the prompts' shared prefix once for
    all rows (``ctrls.generate.kv_cache.shared_prefix_attention``), except under the state prompt, whose
    passes are ragged (``ctrls.generate.ragged.feed_pass``)."""
    tok, lm = backbone.tokenizer, backbone.model
    room = params.max_new_tokens + (cond.extra_positions(params) if cond.feeds_vectors else 1)
    pre = prefill(backbone, prompts, starts, sample_ids, seeds, prompt_index, params, cond, policies, epsilons,
                  room, cross_prefix=cross_prefix, reader=reader)
    rows, cache, attn, next_pos, h_last, state = pre.rows, pre.cache, pre.attn, pre.next_pos, pre.h_last, pre.state
    active = list(range(len(rows)))  # row index of each batch position
    if cond.feeds_vectors and state is not None:  # step 1 opens before the first token: its vectors alone
        h_last, attn, next_pos = feed_pass(lm, cache, attn, next_pos, [list(v) for v in cond.vectors(rows)])
    # the shared prefix's keys read once a step, not once per row (the state prompt's passes are ragged)
    with shared_prefix_attention(lm, 0 if cond.feeds_vectors else pre.shared):
        _steps(backbone, pre, params, cond, reader, rows, cache, attn, next_pos, h_last, state, active)
    gens = generations(rows, pre.expand, len(prompts), tok, reader)
    cond.finish(gens, rows, pre.expand)
    return gens


def _steps(backbone: Backbone, pre, params: SampleParams, cond: Conditioning, reader, rows, cache, attn, next_pos,
           h_last, state, active) -> None:
    """The engine's decode steps after the prefill, until every row has ended (``_decode``)."""
    tok, lm, dev = backbone.tokenizer, backbone.model, backbone.device
    body, head = decoder_body(lm), lm.get_output_embeddings()
    emb = lm.get_input_embeddings().weight
    for _ in range(params.max_new_tokens):
        keys = torch.tensor([rows[ri].key for ri in active], dtype=torch.int64)
        counters = torch.tensor([len(rows[ri].tokens) for ri in active], dtype=torch.int64)
        logits = cond.logits(head, h_last, state, [rows[ri] for ri in active])
        nxt = _pick(logits, params.temperature, params.top_k, keys, counters).cpu()
        keep, redraw = advance(rows, active, nxt, pre, params, tok)
        tail = reader.tail(rows, active) if reader is not None else []  # fed once more, then dropped
        if not keep and not tail:
            break
        redraw = [keep[k] for k in redraw]  # batch positions
        feed = sorted(keep + tail) if tail else keep
        if len(feed) < len(active):
            pos = fill_holes(feed, len(active))  # positions in the old batch, in the new batch's order
            at = {j: i for i, j in enumerate(pos)}
            redraw = sorted(at[j] for j in redraw)
            attn, next_pos, state = _take(cache, pos, dev, attn, next_pos, state)
            nxt = nxt[pos]
            active = [active[j] for j in pos]
        if cond.model is not None and redraw:
            state = cond.redraw(params, state, redraw, [rows[active[j]] for j in redraw])
        if cond.feeds_vectors:  # each row its token; a row that opens a step its state's vectors after it
            opened = dict(zip(redraw, cond.vectors([rows[active[j]] for j in redraw]))) if redraw else {}
            x = emb[nxt.to(emb.device)]
            h_last, attn, next_pos = feed_pass(lm, cache, attn, next_pos,
                                               [[x[j], *opened[j]] if j in opened else [x[j]] for j in range(len(active))])
            continue
        attn = torch.cat([attn, attn.new_ones((attn.shape[0], 1))], dim=1)
        h_last = body(input_ids=nxt[:, None].to(dev), attention_mask=attn, position_ids=next_pos[:, None],
                      **with_cache(body, cache), use_cache=True).last_hidden_state[:, -1]
        next_pos = next_pos + 1
        if reader is not None:
            reader.add(h_last, active)
            if tail:
                live = [j for j, ri in enumerate(active) if rows[ri].finish is None]
                if not live:
                    break
                pos = fill_holes(live, len(active))
                attn, next_pos, state, h_last = _take(cache, pos, dev, attn, next_pos, state, h_last)
                active = [active[j] for j in pos]


def _take(cache, pos: list[int], dev, *tensors: torch.Tensor | None) -> list[torch.Tensor | None]:
    """Keep the batch rows ``pos`` (``fill_holes``' order) of the cache, in place, and of each tensor."""
    sel = torch.as_tensor(pos, device=dev)
    cache.batch_select_indices(sel)
    return [None if t is None else t[sel] for t in tensors]



def seeded(seed: int, device: str | torch.device = "cpu") -> torch.Generator:
    g = torch.Generator(device=device)
    g.manual_seed(seed)
    return g


def tokens_per_second(gens: list[list[Generation]], seconds: float) -> float:
    return sum(g.n_tokens for gs in gens for g in gs) / max(seconds, 1e-9)


__all__ = ["Generation", "SampleParams", "row_groups", "sample", "seeded", "tokens_per_second"]

