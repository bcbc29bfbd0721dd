"""The static path of :mod:`ctrls.generate.sampling` (``SampleParams.decode = "static"``, config ``sampling.decode``).

Every step has the same shapes, so that it can be compiled and, on a GPU, captured as one CUDA graph
(``sampling.compile``): transformers' ``StaticCache`` preallocated to ``width + max_new_tokens + 1``
positions, a preallocated attention-mask buffer, fixed batch slots repacked into power-of-two buckets,
and attention on the KV heads. The step (decoder body, the adapter of Eq. 8, the LM head and its top-k)
has no host synchronisation; the Gumbel-max draw follows it eagerly (``_step`` says why).

Between steps the host applies the engine's own stopping rules and state draws, so the two paths give the
same samples up to floating-point batch effects (``tests/generate/test_static_decode.py``).

Under the state prompt (``Conditioning.feeds_vectors``, one run or several in lockstep) a row that opens a step
feeds its state's m vectors after its token. Each row then writes at its own cache column
(``kv_cache.row_static_cache``), and a pass has one of two shapes: the token step (B, 1), and, when some row
opened a step, a vector step (B, m) in which the other rows' slots are padding, masked and overwritten later. Why and how:
the design notes (book/design.md, "Two decode paths") and book/method.md.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import torch

from ctrls.generate.decoding import (
    COMPILE_MODES,
    Generation,
    SampleParams,
    StepReader,
    advance,
    candidates,
    draw_tokens,
    generations,
    prefill,
)
from ctrls.generate.decoding import (
    pick as _pick,  # the draw of the state prompt's static path (tests replace it here, as in sampling)
)
from ctrls.generate.kv_cache import (
    packed_decode_attention,
    row_static_cache,
    select_row_cache,
    select_rows,
    static_cache,
)
from ctrls.method.backbone import Backbone, decoder_body, with_cache

if TYPE_CHECKING:
    from ctrls.generate.conditioning import Conditioning


_COMPILED: dict[str, object] = {}
STATIC_PAD_TO = 64  # static path: prompts left padded to a multiple of this, so groups share cache shapes
RECOMPILE_LIMIT = 64  # shapes one compiled step may meet (batch buckets x cache capacities x Base/CTRLS)


def _head_candidates(head, model, temperature: float, top_k: int, h: torch.Tensor,
                     state: torch.Tensor | None) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """The draw's candidates from last hidden states: the adapter (Eq. 8, CTRLS), the LM head, top-k."""
    hh = model.adapt(h, state) if model is not None else h
    return candidates(head(hh[:, None])[:, 0], temperature, top_k)


def _step(body, head, model, temperature: float, top_k: int, cache, ids: torch.Tensor, pos: torch.Tensor,
          mask: torch.Tensor, state: torch.Tensor | None
          ) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor]:
    """One static-shape decode step: consume tokens ``ids`` (B, 1) at positions ``pos`` (B, 1) into the
    cache; return the next token's candidates (``candidates``) and the body's last hidden states (B, d) of
    the tokens consumed (what ``StepReader`` reads). Shapes depend on the bucket only and
    nothing is read by the host. The draw itself (``draw_tokens``, a few ops on B x top-k) runs
    eagerly after it: inductor's CPU code for splitmix64's wrapping int64 arithmetic corrupted memory
    (torch 2.13; ``free(): corrupted unsorted chunks``), and the draw is not where the time goes."""
    h = body(input_ids=ids, attention_mask=mask, position_ids=pos, **with_cache(body, cache),
             use_cache=True).last_hidden_state[:, -1]
    return (*_head_candidates(head, model, temperature, top_k, h, state), h)


def _fed_step(body, cache, embeds: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """One static-shape pass of the state prompt's decode: input embeddings ``embeds`` (B, w) at positions
    ``pos`` (B, w) under ``mask`` (B, 1, w, capacity) into a row cache; the last slot's hidden states (B, d)."""
    return body(inputs_embeds=embeds, attention_mask=mask, position_ids=pos, **with_cache(body, cache),
                use_cache=True).last_hidden_state[:, -1]


def step_fn(mode: str, fn=_step):
    """``fn`` (``_step`` or ``_fed_step``), eager (``none``) or compiled once per process and mode
    (``torch.compile``; inductor's ``default`` or ``reduce-overhead``, which captures CUDA graphs on a GPU)."""
    if mode not in COMPILE_MODES:
        raise ValueError(f"sampling.compile must be one of {COMPILE_MODES}, got {mode!r}")
    if mode == "none":
        return fn
    key = f"{fn.__name__}:{mode}"
    if key not in _COMPILED:
        # torch recompiles a function at most 8 times by default, then runs it eagerly: a 160-row batch
        # alone meets 9 buckets (160, 128, ..., 1), twice with Base and CTRLS
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT)
        _COMPILED[key] = torch.compile(fn, mode=mode, dynamic=False)
    return _COMPILED[key]


def _bucket(live: int, slots: int) -> int:
    """The slot count once only ``live`` of ``slots`` rows are live: the smallest power of two that
    holds them, once they fill at most half the slots (else the slots stay)."""
    return 1 << max(live - 1, 0).bit_length() if live <= slots // 2 else slots


def _bucket_order(hold: set[int], slots: int) -> list[int] | None:
    """The old slot of each slot of the smaller bucket (``_bucket``) the slots ``hold`` move to: they in slot
    order, then finished slots to fill it; None when the slots stay."""
    n = _bucket(len(hold), slots)
    if n >= slots:
        return None
    return sorted(hold) + [s for s in range(slots) if s not in hold][: n - len(hold)]


def decode_static(backbone: Backbone, prompts: Sequence[Sequence[int]], starts: Sequence[int],
                 sample_ids: Sequence[list[int]], seeds: Sequence[int], prompt_index: Sequence[int],
                 params: SampleParams, cond: "Conditioning", policies: Sequence = (),
                 epsilons: Sequence = (), cross_prefix: bool = True,
                 reader: StepReader | None = None) -> list[list[Generation]]:
    """The engine (``ctrls.generate.sampling._decode``) with static shapes (module docstring); the same arguments and
    result. With a ``reader``, a row that ended on a token it keeps stays in its slot for one more step
    (a bucket move keeps it), so that the step reads that token's hidden state."""
    if cond.feeds_vectors:
        return _decode_fed(backbone, prompts, starts, sample_ids, seeds, prompt_index, params, cond, policies,
                           epsilons, cross_prefix)
    tok, lm = backbone.tokenizer, backbone.model
    dev = backbone.device
    body, head = decoder_body(lm), lm.get_output_embeddings()
    model = cond.model  # the compiled step applies the adapter (Eq. 8) itself
    pre = prefill(backbone, prompts, starts, sample_ids, seeds, prompt_index, params, cond, policies, epsilons,
                  0, pad_to=STATIC_PAD_TO, cross_prefix=cross_prefix, reader=reader)
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

    nxt = draw_tokens(*_head_candidates(head, model, params.temperature, params.top_k, pre.h_last, state),
                      params.temperature, keys, counters())
    with packed_decode_attention(lm):  # attention on the KV heads, also when compiled (its docstring says why)
        for _ in range(params.max_new_tokens):
            nxt = nxt.cpu()  # the step's one host read
            slots = [s for s, on in enumerate(live) if on]
            keep, redraw = advance(rows, [slot_row[s] for s in slots], nxt[slots], pre, params, tok)
            tail = [slots[j] for j in reader.tail(rows, [slot_row[s] for s in slots])] if reader is not None else []
            if not keep and not tail:
                break
            kept = {slots[j] for j in keep}
            for s in slots:
                live[s] = s in kept
            redraw_slots = [slots[keep[k]] for k in redraw]
            hold = kept | set(tail)  # the slots this step must keep: the live rows, and the tail to be read
            order = _bucket_order(hold, len(slot_row))
            if order is not None:  # move the held rows (in slot order) to a smaller bucket
                at = {s: i for i, s in enumerate(order)}
                redraw_slots = [at[s] for s in redraw_slots]
                tail = [at[s] for s in tail]
                sel = torch.as_tensor(order, device=dev)
                cache = select_rows(cache, lm.config, sel, cur)
                mask, next_pos, keys, nxt = mask[sel].contiguous(), next_pos[sel], keys[sel], nxt[order]
                if state is not None:
                    state = state[sel]
                slot_row = [slot_row[s] for s in order]
                live = [s in kept for s in order]
            if model is not None and redraw_slots:
                state = cond.redraw(params, state, redraw_slots, [rows[slot_row[s]] for s in redraw_slots])
            mask[:, 0, 0, cur] = True
            vals, idx, h = step(body, head, model, params.temperature, params.top_k, cache, nxt[:, None].to(dev),
                                next_pos[:, None], mask, state)
            if reader is not None:
                read = sorted([s for s, on in enumerate(live) if on] + tail)
                reader.add(h[torch.as_tensor(read, dtype=torch.long, device=h.device)], [slot_row[s] for s in read])
            nxt = draw_tokens(vals, idx, params.temperature, keys, counters())
            next_pos = next_pos + 1
            cur += 1
    gens = generations(rows, pre.expand, len(prompts), tok, reader)
    cond.finish(gens, rows, pre.expand)
    return gens


def _decode_fed(backbone: Backbone, prompts, starts, sample_ids, seeds, prompt_index, params: SampleParams,
                cond: "Conditioning", policies, epsilons, cross_prefix: bool) -> list[list[Generation]]:
    """:func:`decode_static` under the state prompt (module docstring): the token step, then the vector step
    for the rows that opened a step; the draw reads each row's last slot, as the engine's ragged pass does."""
    tok, lm = backbone.tokenizer, backbone.model
    dev = backbone.device
    body, head = decoder_body(lm), lm.get_output_embeddings()
    emb = lm.get_input_embeddings().weight
    pre = prefill(backbone, prompts, starts, sample_ids, seeds, prompt_index, params, cond, policies, epsilons,
                  0, pad_to=STATIC_PAD_TO, cross_prefix=cross_prefix)
    rows, state, width = pre.rows, pre.state, pre.width
    m = max(cond.extra_positions(params) // max(params.max_steps, 1), 1)  # vectors per state
    cap = width + params.max_new_tokens + cond.extra_positions(params) + m + 1  # + one vector step's padding
    cache = row_static_cache(lm.config, [(layer.keys, layer.values) for layer in pre.cache.layers], width, cap)
    del pre.cache
    n = len(rows)
    mask = torch.zeros((n, 1, 1, cap), dtype=torch.bool, device=dev)
    mask[:, 0, 0, :width] = pre.attn.bool()
    next_pos = pre.next_pos.clone()
    slot_row = list(range(n))
    live = [True] * n
    keys = torch.tensor([r.key for r in rows], dtype=torch.int64, device=dev)
    fed_step = step_fn(params.compile, _fed_step)  # one compiled function: the token step and the vector step
    ar = torch.arange(m, device=dev)

    def feed_vectors(h, slots):  # the rows in ``slots`` open a step: their state's m vectors after their token
        nonlocal mask, next_pos
        x = torch.zeros((len(slot_row), m, emb.shape[1]), dtype=emb.dtype, device=dev)
        opened = torch.zeros(len(slot_row), dtype=torch.bool, device=dev)
        for s, v in zip(slots, cond.vectors([rows[slot_row[s]] for s in slots])):
            if v.shape[0] != m:  # runs in lockstep with different m would need a wider vector step
                raise ValueError(f"the static path feeds {m} vectors per state; a row's state has {v.shape[0]}")
            x[s], opened[s] = v.to(emb.dtype), True
        cols = cache.write[:, None] + ar  # (B, m): where each row's slots are written
        block = opened[:, None, None] & (torch.arange(cap, device=dev)[None, None] == cols[:, :, None])  # (B, m, cap)
        see = mask[:, 0] | block.cumsum(1).bool()  # slot i sees the real columns and the block's slots <= i
        hv = fed_step(body, cache, x, next_pos[:, None] + ar, see[:, None])
        mask = mask | block.any(1)[:, None, None]
        step = opened.long() * m
        cache.write.add_(step)
        next_pos = next_pos + step
        return torch.where(opened[:, None], hv, h)

    def draw(h):
        logits = cond.logits(head, h, state, [rows[ri] for ri in slot_row])
        counters = torch.tensor([len(rows[ri].tokens) for ri in slot_row], dtype=torch.int64, device=dev)
        return _pick(logits, params.temperature, params.top_k, keys, counters)

    h = pre.h_last
    if state is not None:  # step 1 opens before the first token: its vectors alone
        h = feed_vectors(h, list(range(n)))
    nxt = draw(h)
    for _ in range(params.max_new_tokens):
        nxt = nxt.cpu()
        slots = [s for s, on in enumerate(live) if on]
        keep, redraw = advance(rows, [slot_row[s] for s in slots], nxt[slots], pre, params, tok)
        if not keep:
            break
        kept = {slots[j] for j in keep}
        live = [s in kept for s in range(len(slot_row))]
        redraw_slots = [slots[keep[k]] for k in redraw]
        order = _bucket_order(kept, len(slot_row))
        if order is not None:
            at = {s: i for i, s in enumerate(order)}
            redraw_slots = [at[s] for s in redraw_slots]
            sel = torch.as_tensor(order, device=dev)
            cache = select_row_cache(cache, lm.config, sel)
            mask, next_pos, keys, nxt = mask[sel].contiguous(), next_pos[sel], keys[sel], nxt[order]
            if state is not None:
                state = state[sel]
            slot_row = [slot_row[s] for s in order]
            live = [s in kept for s in order]
        if redraw_slots:
            state = cond.redraw(params, state, redraw_slots, [rows[slot_row[s]] for s in redraw_slots])
        mask[torch.arange(len(slot_row), device=dev), 0, 0, cache.write] = True
        h = fed_step(body, cache, emb[nxt.to(dev)][:, None], next_pos[:, None], mask)
        cache.write.add_(1)
        next_pos = next_pos + 1
        if redraw_slots:
            h = feed_vectors(h, redraw_slots)
        nxt = draw(h)
    gens = generations(rows, pre.expand, len(prompts), tok, None)
    cond.finish(gens, rows, pre.expand)
    return gens
