"""A ragged decode pass: rows of a KV-cached batch feed different numbers of new slots, and the frozen
backbone's linear layers run on the real slots only.

The engine under the state prompt (``ctrls.generate.conditioning.StatePromptConditioning``) feeds one token a
row, and a row that opens a step feeds its token and its state's m vectors in the same pass. Padded to a
rectangle, every row then pays for 1 + m slots: with 128 rows some row opens a step on nearly every
pass, so the padded batch ran the whole model on three times the slots it needed. Here the real slots
are packed into one sequence (1, N) for the projections and the MLPs; only attention sees the
rectangle: each layer scatters the packed queries, keys and values to (B, H, W, D), writes the keys
and values into the cache as the padded pass would (pad slots hold zeros and are masked, as they
hold a padding embedding's keys and are masked there), attends under the padded pass's causal and
padding mask, and gathers the real slots back. The same arithmetic per slot, so the same logits up to
float rounding (the matmuls see another number of rows); ``tests/generate/test_ragged.py`` checks them
against the padded pass, ``bench/state_prompt_decode.py`` times both.
"""
from __future__ import annotations

import contextlib
import contextvars
from dataclasses import dataclass

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward

RAGGED_SDPA = "ctrls_ragged_sdpa"  # registered for attention only: transformers then builds no mask for the pass


@dataclass
class Layout:
    """Where each packed slot sits in the rectangle: row ``row[i]``, column ``col[i]`` of ``width``; ``mask``
    (B, 1, width, S + width), the padded pass's causal and padding mask over the cache after the pass."""

    row: torch.Tensor
    col: torch.Tensor
    width: int
    rows: int
    cache: object
    mask: torch.Tensor


_LAYOUT: contextvars.ContextVar[Layout | None] = contextvars.ContextVar("ctrls_ragged_layout", default=None)


def ragged_sdpa_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None,
                          is_causal=None, **kwargs):
    """Attention of a packed pass (``query`` (1, H, N, D)) over the rows' cache (module docstring);
    outside :func:`ragged_pass`, transformers' SDPA unchanged."""
    lay = _LAYOUT.get()
    if lay is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    if kwargs.get("sliding_window") is not None or kwargs.get("softcap") or kwargs.get("position_bias") is not None:
        raise NotImplementedError("ragged decode pass: sliding-window, soft-capped or biased attention is not supported")

    def square(t: torch.Tensor) -> torch.Tensor:  # (1, h, N, d) -> (B, h, W, d), zeros at the pad slots
        out = t.new_zeros((lay.rows, t.shape[1], lay.width, t.shape[3]))
        out[lay.row, :, lay.col] = t[0].transpose(0, 1)
        return out

    k, v = lay.cache.update(square(key), square(value), module.layer_idx)  # the cache grows by W slots a row
    groups = getattr(module, "num_key_value_groups", 1)
    b, h, w, d = lay.rows, query.shape[1], lay.width, query.shape[3]
    q = square(query).reshape(b, h // groups, groups * w, d)  # query head j g + i on KV head j, as repeat_kv pairs them
    mask = lay.mask[:, :, None].expand(b, 1, groups, w, lay.mask.shape[-1]).reshape(b, 1, groups * w, -1)
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout, scale=scaling)
    out = out.reshape(b, h, w, v.shape[-1])[lay.row, :, lay.col]  # (N, h, d): the real slots, packed again
    return out[None].contiguous(), None


AttentionInterface.register(RAGGED_SDPA, ragged_sdpa_attention)


def supports_ragged(model) -> bool:
    """A model on transformers' ``sdpa`` attention with full (not sliding-window) attention in every layer."""
    cfg = model.config
    return (cfg._attn_implementation == "sdpa" and not getattr(cfg, "use_sliding_window", False)
            and all(t == "full_attention" for t in (getattr(cfg, "layer_types", None) or ["full_attention"])))


@contextlib.contextmanager
def ragged_pass(model, layout: Layout):
    """Within the block, the model's forward is one ragged pass laid out by ``layout``."""
    cfg = model.config
    before, token = cfg._attn_implementation, _LAYOUT.set(layout)
    cfg._attn_implementation = RAGGED_SDPA
    try:
        yield
    finally:
        cfg._attn_implementation = before
        _LAYOUT.reset(token)


def causal_padding_mask(real: torch.Tensor, width: int) -> torch.Tensor:
    """(B, 1, W, S + W) bool: slot j is visible to new slot i of a row when it is real and j <= S + i
    (``real`` (B, S + W): the rows' real cache slots after the pass, the new ones included)."""
    total = real.shape[1]
    i = torch.arange(width, device=real.device)[:, None] + (total - width)
    j = torch.arange(total, device=real.device)[None]
    return (real.bool()[:, None, None, :] & (j <= i)[None, None])


def feed_pass(lm, cache, mask: torch.Tensor, pos: torch.Tensor, slots: list[list[torch.Tensor]]
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One decode pass in which row b feeds the input embeddings ``slots[b]`` (a token's, a state's m vectors,
    or both; at least one) into ``cache``: (the last hidden state (B, d) at each row's last slot, the real-slot
    mask (B, S + W) after the pass, the rows' next positions). Rows are padded to the widest row's W slots,
    masked out of attention and not counted as positions; on ``sdpa`` models only the real slots go through
    the linear layers (module docstring), else the padded rectangle does."""
    from ctrls.method.backbone import decoder_body, with_cache

    emb = lm.get_input_embeddings().weight
    dev, dt = emb.device, emb.dtype
    body = decoder_body(lm)
    B = len(slots)
    n = torch.as_tensor([len(f) for f in slots], device=dev)
    W = int(n.max())
    new = (torch.arange(W, device=dev)[None] < n[:, None]).long()
    pid = pos[:, None] + (new.cumsum(1) - 1).clamp(min=0)  # padding repeats the last real position
    mask = torch.cat([mask, new], 1)
    if supports_ragged(lm):  # one packed sequence of every row's slots; attention on the rectangle
        row = torch.repeat_interleave(torch.arange(B, device=dev), n)
        col = torch.arange(int(n.sum()), device=dev) - (n.cumsum(0) - n)[row]
        ends = n.cumsum(0) - 1  # each row's last slot in the packed sequence
        lay = Layout(row, col, W, B, cache, causal_padding_mask(mask, W))
        with ragged_pass(lm, lay):
            h = body(inputs_embeds=torch.cat([torch.stack(f) for f in slots]).to(dt)[None], position_ids=pid[row, col][None],
                     use_cache=False).last_hidden_state[0, ends]
    else:
        x = torch.zeros((B, W, emb.shape[1]), dtype=dt, device=dev)
        for j, f in enumerate(slots):
            x[j, :len(f)] = torch.stack(f)
        out = body(inputs_embeds=x, attention_mask=mask, position_ids=pid, **with_cache(body, cache),
                   use_cache=True).last_hidden_state
        h = out[torch.arange(B, device=dev), n - 1]
    return h, mask, pos + n


__all__ = ["Layout", "RAGGED_SDPA", "causal_padding_mask", "feed_pass", "ragged_pass", "ragged_sdpa_attention",
           "supports_ragged"]
