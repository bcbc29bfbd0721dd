"""Timed decode runs of one batch: our sampler (Base or CTRLS), HF ``generate`` and the bare model's decode
loop, each with a synchronised timestamp at the end of every forward of the decoder body (``timeline``)."""
from __future__ import annotations

import contextlib
import time

import torch
from common import forced_params

from ctrls.method.backbone import with_cache


def sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


@contextlib.contextmanager
def measured(dev: torch.device, rec: dict):
    """Wall seconds and peak GPU memory (GiB) of the block, into ``rec``."""
    if dev.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(dev)
    sync(dev)
    t = time.perf_counter()
    yield rec
    sync(dev)
    rec["seconds"] = time.perf_counter() - t
    if dev.type == "cuda":
        rec["peak_gib"] = torch.cuda.max_memory_allocated(dev) / 2**30


@contextlib.contextmanager
def timeline(bb):
    """Seconds from the block's start to the end of every forward of the decoder body (synchronised):
    entry 0 is the prefill, entry i the i-th decode iteration. The sampler and HF ``generate`` both
    synchronise with the host every iteration anyway, so the extra synchronisation costs ~nothing."""
    from ctrls.method.backbone import decoder_body

    marks: list[float] = []
    t0 = time.perf_counter()

    def hook(module, inputs, output):
        sync(bb.device)
        marks.append(time.perf_counter() - t0)

    handle = decoder_body(bb.model).register_forward_hook(hook)
    try:
        yield marks
    finally:
        handle.remove()


def timed_fields(rec: dict, marks: list[float], new: int) -> dict:
    """Per-iteration fields of a decode run of ``new`` tokens per row, from its body timeline."""
    rec["t_body"] = [round(x, 5) for x in marks]
    rec["prefill_s"] = marks[0] if marks else None
    n_dec = len(marks) - 1
    rec["s_per_iteration"] = rec["seconds"] / new  # prefill included (the old definition)
    if n_dec >= 1:
        rec["decode_s_per_iteration"] = (marks[-1] - marks[0]) / n_dec
        q = max(1, n_dec // 4)
        rec["decode_s_per_iteration_first_quarter"] = (marks[q] - marks[0]) / q
        rec["decode_s_per_iteration_last_quarter"] = (marks[-1] - marks[-1 - q]) / q
    return rec


def decode_ours(bb, prompts, starts, n: int, new: int, model=None, epsilon: float = 0.1, decode: str = "engine",
                compile: str = "none", tokens_out: list | None = None) -> dict:
    """Our sampler on one batch (``decode``/``compile``: ``SampleParams``' path). A compiled step gets no
    timeline: a forward hook on the body would be traced into the graph (its synchronisation breaks it),
    so only the total time is recorded. ``tokens_out``: receives every row's token ids."""
    from dataclasses import replace

    from ctrls.data.prompts import newline_token_ids
    from ctrls.generate.sampling import sample

    p = replace(forced_params(len(prompts) * n, new, epsilon), decode=decode, compile=compile)
    rec: dict = {"rows": len(prompts) * n, "new_tokens": new, "decode": decode, "compile": compile}
    hooked = timeline(bb) if compile == "none" else contextlib.nullcontext([])
    with measured(bb.device, rec), hooked as marks:
        # one seed per prompt, as the pipeline passes them (collect, exploration, RL)
        gens = sample(bb, prompts, n, p, model=model, seeds=list(range(len(prompts))), prompt_starts=starts)
    flat = [g for gs in gens for g in gs]
    if tokens_out is not None:
        tokens_out.extend(g.token_ids for g in flat)
    nl = newline_token_ids(bb.tokenizer)
    tokens = sum(g.n_tokens for g in flat)
    timed_fields(rec, marks, new)
    rec.update(tokens=tokens, tokens_per_s=tokens / rec["seconds"],
               steps_per_cot=sum(len(g.spans) for g in flat) / len(flat),
               newline_rate=sum(t in nl for g in flat for t in g.token_ids) / max(tokens, 1),
               all_full_length=all(g.n_tokens == new for g in flat),
               finishes=sorted({g.finish for g in flat}))
    if model is not None:
        ok = [g.states is not None and g.states.shape == (len(g.spans) + 1, model.config.n_states) for g in flat]
        rec["states_ok"] = all(ok)
        rec["states_finite"] = all(bool(torch.isfinite(g.states).all()) for g in flat if g.states is not None)
    return rec


def engine_vs_graph(bb, prompts, starts, n: int, new: int, model=None) -> dict:
    """The library's two decode paths on the same prompts and seeds: ``SampleParams(decode="engine")``
    against ``decode="static"`` with ``compile="reduce-overhead"`` (CUDA graphs; ``none`` off CUDA, where
    the graphs do not exist). The static path runs twice: the first run compiles and captures its one
    shape (every row decodes ``new`` tokens: no bucket move), the second is the timed one. Tokens/s of
    each, and whether the tokens are equal (bf16 on a GPU: floating-point batch effects may flip a few)."""
    import torch._dynamo

    mode = "reduce-overhead" if bb.device.type == "cuda" else "none"
    eng, first, graph = [], [], []
    engine = decode_ours(bb, prompts, starts, n, new, model=model, tokens_out=eng)
    torch._dynamo.reset()  # a fresh compile: earlier shapes do not count towards dynamo's recompile limit
    warm = decode_ours(bb, prompts, starts, n, new, model=model, decode="static", compile=mode, tokens_out=first)
    static = decode_ours(bb, prompts, starts, n, new, model=model, decode="static", compile=mode, tokens_out=graph)

    agree = token_agreement(eng, graph)
    return {"rows": engine["rows"], "new_tokens": new, "compile": mode, "engine": engine, "static": static,
            "static_first_run_seconds": warm["seconds"],  # compile + capture + one run
            "tokens_equal": agree["all_equal"], "rows_equal_fraction": agree["rows_equal_fraction"],
            "mean_common_prefix": agree["mean_common_prefix"], "static_runs_repeat": first == graph,
            "speedup": static["tokens_per_s"] / engine["tokens_per_s"]}


def token_agreement(a: list, b: list) -> dict:
    """How far two runs' token lists (one per row) agree: whether all are equal, the fraction of rows
    equal throughout, and the mean length of the rows' common prefix."""
    def prefix(x, y):
        return next((i for i, (u, v) in enumerate(zip(x, y)) if u != v), min(len(x), len(y)))

    same = [x == y for x, y in zip(a, b)]
    return {"all_equal": all(same) and len(a) == len(b), "rows_equal_fraction": sum(same) / max(len(same), 1),
            "mean_common_prefix": sum(prefix(x, y) for x, y in zip(a, b)) / max(len(same), 1)}


def decode_hf(bb, prompts, n: int, new: int) -> dict:
    tok = bb.tokenizer
    tok.padding_side = "left"
    enc = tok.pad({"input_ids": [list(p) for p in prompts]}, return_tensors="pt").to(bb.device)
    rec: dict = {"rows": len(prompts) * n, "new_tokens": new}
    with measured(bb.device, rec), timeline(bb) as marks:
        out = bb.model.generate(**enc, max_new_tokens=new, min_new_tokens=new, do_sample=True, top_k=50,
                                temperature=0.7, num_return_sequences=n, pad_token_id=tok.pad_token_id)
    gen = out.shape[1] - enc["input_ids"].shape[1]
    tokens = out.shape[0] * gen
    timed_fields(rec, marks, new)
    rec.update(tokens=tokens, tokens_per_s=tokens / rec["seconds"], all_full_length=gen == new)
    return rec


@torch.no_grad()
def forward_floor(bb, prompts, n: int, iters: int) -> dict:
    """Seconds per decode iteration of the bare model: body + LM head + top-k on the sampler's cache,
    with no sampling bookkeeping and no host synchronisation (the eager model's own limit)."""
    from ctrls.generate.sampling import new_cache
    from ctrls.method.backbone import decoder_body

    dev, body, head = bb.device, decoder_body(bb.model), bb.lm_head
    width = max(len(p) for p in prompts)
    ids = torch.zeros((len(prompts), width), dtype=torch.long)
    attn = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.as_tensor(list(p))
        attn[i, width - len(p):] = 1
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    rec: dict = {"rows": len(prompts) * n, "iterations": iters}
    with measured(dev, rec):
        cache = new_cache(bb.model, width + iters + 1)
        h = body(input_ids=ids.to(dev), attention_mask=attn.to(dev), position_ids=pos.to(dev), **with_cache(body, cache),
                 use_cache=True).last_hidden_state
        expand = torch.arange(len(prompts)).repeat_interleave(n)
        cache.batch_select_indices(expand.to(dev))
        attn, next_pos, h_last = attn[expand].to(dev), pos[expand, -1].to(dev) + 1, h[expand.to(dev), -1]
        sync(dev)
        t = time.perf_counter()
        for _ in range(iters):
            nxt = head(h_last[:, None])[:, 0].topk(50, dim=-1).indices[:, 0]
            attn = torch.cat([attn, attn.new_ones((attn.shape[0], 1))], dim=1)
            h_last = body(input_ids=nxt[:, None], attention_mask=attn, position_ids=next_pos[:, None],
                          **with_cache(body, cache), use_cache=True).last_hidden_state[:, -1]
            next_pos = next_pos + 1
        sync(dev)
        rec["s_per_iteration"] = (time.perf_counter() - t) / iters
    return rec
