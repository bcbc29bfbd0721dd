"""The KV caches of the two decode paths (``ctrls.generate.sampling``).

- :class:`PreallocatedLayer` (the engine): a ``DynamicCache`` layer that writes into a preallocated
  buffer instead of concatenating, and drops finished rows in place (``fill_holes``).
- :func:`shared_prefix_attention` (the engine, on CPU): a decode step attends to the batch's shared
  prompt prefix once for every row, and to each row's own positions apart.
- :func:`static_cache` (the static path, ``sampling.decode: static``): transformers' ``StaticCache``,
  filled from a prefill's keys and values; :func:`select_rows` moves its live rows to a smaller
  bucket; :func:`packed_decode_attention` makes a compiled step attend over it on the KV heads.
- :func:`row_static_cache` (the static path under the state prompt): the same preallocated buffers, but each
  row writes at its own column (:class:`RowStaticLayer`), since a row that opens a step feeds m vectors more.
"""
from __future__ import annotations

import contextlib
import contextvars
from typing import Sequence

import torch
from transformers import AttentionInterface, DynamicCache, StaticCache
from transformers.cache_utils import DynamicLayer, StaticLayer
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

MIN_SHARED_PREFIX = 32  # tokens: a shorter common prefix is prefilled with the rest of each prompt


def fill_holes(keep: list[int], n_rows: int) -> list[int]:
    """The rows ``keep`` (of ``n_rows``) in the order the cache keeps them in place: a kept row below
    len(keep) stays where it is, and each hole below len(keep) takes a kept row from past it. A
    sample does not depend on its row's position in the batch (its streams are keyed by its own
    seed and index), so the order is free; this one moves only as many rows as finished."""
    n = len(keep)
    kept = set(keep)
    tail = [j for j in keep if j >= n]
    return [i if i in kept else tail.pop() for i in range(n)]


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


def new_cache(model: torch.nn.Module, capacity: int) -> DynamicCache:
    """A ``DynamicCache`` whose full-attention layers are :class:`PreallocatedLayer`."""
    cache = DynamicCache(config=model.config)
    cache.layers = [PreallocatedLayer(capacity) if type(layer) is DynamicLayer else layer for layer in cache.layers]
    return cache


def _new_static(config, n_layers: int, capacity: int) -> StaticCache:
    """An empty ``StaticCache``; an error unless it has ``n_layers`` full-attention layers."""
    cache = StaticCache(config=config, max_cache_len=capacity)
    if len(cache.layers) != n_layers or any(type(layer) is not StaticLayer for layer in cache.layers):
        kinds = sorted({type(layer).__name__ for layer in cache.layers})
        raise ValueError(f"sampling.decode=static supports full-attention layers only; this model's static cache "
                         f"has {kinds} ({len(cache.layers)} layers for {n_layers} in the prefill): use sampling.decode=engine")
    return cache


def static_cache(config, kv: Sequence[tuple[torch.Tensor, torch.Tensor]], length: int, capacity: int) -> StaticCache:
    """A ``StaticCache`` of ``capacity`` positions holding the first ``length`` positions of the keys and
    values ``kv`` (one (B, H, >= length, D) pair per layer), with its write position at ``length``."""
    cache = _new_static(config, len(kv), capacity)
    for layer, (k, v) in zip(cache.layers, kv):
        layer.lazy_initialization(k, v)
        layer.keys[:, :, :length].copy_(k[:, :, :length])
        layer.values[:, :, :length].copy_(v[:, :, :length])
        layer.cumulative_length.fill_(length)
    return cache


def select_rows(cache: StaticCache, config, idx: torch.Tensor, length: int) -> StaticCache:
    """The rows ``idx`` of ``cache`` in a new static cache of the same capacity (a smaller bucket)."""
    cap = cache.layers[0].max_cache_len
    kv = [(layer.keys[idx, :, :length], layer.values[idx, :, :length]) for layer in cache.layers]
    return static_cache(config, kv, length, cap)


class RowStaticLayer(StaticLayer):
    """A ``StaticLayer`` whose rows write at their own columns: row b's new keys and values go to columns
    ``write[b], write[b] + 1, ...`` (one scatter, static shapes). ``write`` (B,) is shared by every layer and
    advanced by the caller after the pass, by each row's real slots: a row that fed padding leaves its
    pointer where it was, and its next pass overwrites the padding (masked out until then)."""

    def __init__(self, max_cache_len: int, write: torch.Tensor):
        super().__init__(max_cache_len)
        self.write = write

    def update(self, key_states, value_states, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        cols = self.write[:, None] + torch.arange(key_states.shape[-2], device=self.write.device)  # (B, w)
        at = cols[:, None, :, None]
        self.keys.scatter_(2, at.expand_as(key_states), key_states)
        self.values.scatter_(2, at.expand_as(value_states), value_states)
        return self.keys, self.values


def row_static_cache(config, kv: Sequence[tuple[torch.Tensor, torch.Tensor]], length: int | torch.Tensor,
                     capacity: int) -> StaticCache:
    """:func:`static_cache` with :class:`RowStaticLayer` layers: the first ``length`` columns (an int, or one per
    row) of ``kv`` copied in, each row's write pointer (``cache.write``) at its length."""
    cache = _new_static(config, len(kv), capacity)
    b, dev = kv[0][0].shape[0], kv[0][0].device
    write = torch.as_tensor(length, dtype=torch.long, device=dev).expand(b).clone()
    n = min(int(write.max()), kv[0][0].shape[-2])
    layers = []
    for k, v in kv:
        layer = RowStaticLayer(capacity, write)
        layer.lazy_initialization(k, v)
        layer.keys[:, :, :n].copy_(k[:, :, :n])  # columns past a row's length are never read: masked out
        layer.values[:, :, :n].copy_(v[:, :, :n])
        layers.append(layer)
    cache.layers, cache.write = layers, write
    return cache


def select_row_cache(cache: StaticCache, config, idx: torch.Tensor) -> StaticCache:
    """The rows ``idx`` of a :func:`row_static_cache` in a new one of the same capacity (a smaller bucket)."""
    cap = cache.layers[0].max_cache_len
    write = cache.write[idx]
    n = int(write.max())
    return row_static_cache(config, [(layer.keys[idx, :, :n], layer.values[idx, :, :n]) for layer in cache.layers],
                            write, cap)


PACKED_SDPA = "ctrls_packed_sdpa"


def packed_sdpa_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None,
                          is_causal=None, **kwargs):
    """transformers' SDPA attention, except that one query token per row with grouped KV heads
    (GQA) is always packed onto its KV heads: the query (B, H, 1, D) becomes (B, H_kv, H / H_kv, D)
    and attends to the cache's (B, H_kv, L, D) keys and values as they are.

    transformers packs so in eager decoding, but under ``torch.compile`` it repeats the keys and
    values per query head instead (``repeat_kv``). Over a static cache that is a copy of the whole
    cache, H / H_kv times over, twice per layer per token: on an H100 it took 23 of the compiled
    step's 29 ms at 160 rows of a random Qwen2.5-3B (``bench/gpu/graph_profile.py``). The arithmetic is
    the eager path's, so the samples do not change. Anything else (prefill, no grouping, a
    per-head mask, a position bias) goes to ``sdpa_attention_forward`` unchanged."""
    groups = getattr(module, "num_key_value_groups", 1)
    if (query.shape[2] != 1 or groups == 1 or kwargs.get("position_bias") is not None or kwargs.get("softcap")
            or (attention_mask is not None and attention_mask.shape[1] != 1)):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    b, h, _, d = query.shape
    out = torch.nn.functional.scaled_dot_product_attention(
        query.reshape(b, h // groups, groups, d), key, value, attn_mask=attention_mask, dropout_p=dropout,
        scale=scaling, is_causal=False)
    return out.reshape(b, h, 1, value.shape[-1]).transpose(1, 2).contiguous(), None


AttentionInterface.register(PACKED_SDPA, packed_sdpa_attention)
ALL_MASK_ATTENTION_FUNCTIONS.register(PACKED_SDPA, ALL_MASK_ATTENTION_FUNCTIONS["sdpa"])


@contextlib.contextmanager
def packed_decode_attention(model, implementation: str = PACKED_SDPA):
    """Within the block, a model on transformers' ``sdpa`` attention uses :func:`packed_sdpa_attention`
    (or the registered ``implementation``; other attention implementations are left as they are); restored
    on exit."""
    config = model.config
    before = config._attn_implementation
    if before == "sdpa":
        config._attn_implementation = implementation
    try:
        yield
    finally:
        config._attn_implementation = before


PREFIX_SDPA = "ctrls_prefix_sdpa"
_PREFIX = contextvars.ContextVar("ctrls_shared_prefix", default=0)
_flash_cpu = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu


def prefix_sdpa_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None,
                          is_causal=None, **kwargs):
    """:func:`packed_sdpa_attention` with the batch's shared prefix (its first ``L`` positions, the same
    keys and values in every row: ``ctrls.generate.decoding.prefill`` copies them) read once, not once per row.

    A decode step's attention reads every row's whole cache and is bound by memory: at 128 rows of SmolLM2
    with a 206-token few-shot prefix it was 22% of the exploration stage's time. Here all rows' queries
    attend to row 0's prefix in one call, each row to its own positions (left padding, its prompt, its
    tokens) in another, and the two softmaxes are merged by their log-sum-exps: the same attention up to
    float rounding (the sums run in another order). ``bench/prefix_attention.py`` measures it. One query
    token per row on CPU with a (B, 1, 1, L) mask or none; anything else goes to :func:`packed_sdpa_attention`."""
    L = _PREFIX.get()
    groups = getattr(module, "num_key_value_groups", 1)
    if (L <= 0 or query.shape[2] != 1 or query.device.type != "cpu" or key.shape[-2] <= L or dropout
            or kwargs.get("position_bias") is not None or kwargs.get("softcap")
            or (attention_mask is not None and (attention_mask.dim() != 4 or attention_mask.shape[1:3] != (1, 1)))):
        return packed_sdpa_attention(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                     is_causal=is_causal, **kwargs)
    b, h, _, d = query.shape
    hk = h // groups
    qp = query.reshape(b, hk, groups, d)  # query head j*groups + i on KV head j, as repeat_kv pairs them
    # the prefix: every row's queries against row 0's keys, one (1, hk, b*groups, d) query block
    o1, l1 = _flash_cpu(qp.transpose(0, 1).reshape(1, hk, b * groups, d), key[:1, :, :L], value[:1, :, :L], scale=scaling)
    o1, l1 = o1.reshape(hk, b, groups, -1).transpose(0, 1), l1.reshape(hk, b, groups).transpose(0, 1)
    mask = None
    if attention_mask is not None:  # the flash kernel takes an additive mask of the query's dtype
        m = attention_mask[..., L:key.shape[-2]]
        mask = torch.zeros(m.shape, dtype=query.dtype).masked_fill_(~m, float("-inf")) if m.dtype == torch.bool else m
    o2, l2 = _flash_cpu(qp, key[:, :, L:], value[:, :, L:], attn_mask=mask, scale=scaling)  # each row's own positions
    lse = torch.logaddexp(l1, l2)
    out = o1 * (l1 - lse).exp()[..., None] + o2 * (l2 - lse).exp()[..., None]  # softmax over both parts at once
    out = out.to(query.dtype)  # the log-sum-exps are float32 whatever the query's dtype (bfloat16 with dtype=auto)
    return out.reshape(b, h, 1, value.shape[-1]).transpose(1, 2).contiguous(), None


AttentionInterface.register(PREFIX_SDPA, prefix_sdpa_attention)
ALL_MASK_ATTENTION_FUNCTIONS.register(PREFIX_SDPA, ALL_MASK_ATTENTION_FUNCTIONS["sdpa"])


@contextlib.contextmanager
def shared_prefix_attention(model, length: int):
    """Within the block, decode steps of a model on ``sdpa`` attention read the first ``length`` cache
    positions, which every row shares, once (:func:`prefix_sdpa_attention`); ``length`` 0 changes nothing."""
    token = _PREFIX.set(length)
    try:
        with packed_decode_attention(model, PREFIX_SDPA) if length > 0 else contextlib.nullcontext():
            yield
    finally:
        _PREFIX.reset(token)


__all__ = ["MIN_SHARED_PREFIX", "PACKED_SDPA", "PreallocatedLayer", "fill_holes", "new_cache", "packed_decode_attention",
           "packed_sdpa_attention", "prefix_sdpa_attention", "row_static_cache", "RowStaticLayer", "select_row_cache",
           "select_rows",
           "shared_prefix_attention", "static_cache"]
