"""The static decode path's inputs to the analytic model (``graph``), counted and timed on a CPU with the
step eager (``SampleParams(decode="static", compile="none")``): the aten ops of one step (the future CUDA
graph's kernel nodes, an upper bound), the eager ops around it, and the host-serial phase at the real
batches. ``StaticProbe`` splits a static decode run into iterations and regions as ``DecodeProbe`` does."""
from __future__ import annotations

import time

import torch
from common import QUESTIONS, random_ctrls

from .decode import decode_ours
from .estimate import rl_runs
from .measure import environment
from .models import TINY, build_backbone, calibrate_newline_bias
from .opcount import DecodeProbe, count_ops

# Not visible on a CPU (``.cpu()`` and ``.to(device)`` of a CPU tensor dispatch no aten op), a kernel or copy
# each on CUDA, per static iteration: the sampled tokens to the host (the sync), the tokens back to the
# device as the step's input, the Gumbel draw's counters (``torch.tensor(..., device=dev)``).
HOST_COPIES = 3


class StaticProbe(DecodeProbe):
    """``DecodeProbe`` for ``ctrls.generate.static_decode.decode_static``. Regions: 'body' and 'layer' (the step's decoder
    body), 'head' (the rest of the step: the CTRLS adapter, the LM head, top-k), 'tokens' (the eager Gumbel-max draw among
    the top k), 'post' (from the end of the draw to the next step: the loop over the rows ``advance``, the
    slot bookkeeping, the mask column, the positions; timed), 'draw' (``draw_states``), 'launch' (the rest:
    the draw's counters, built before it)."""

    def _head(self, *args, **kwargs):
        self.region.append("head")
        try:
            return self._orig_head(*args, **kwargs)
        finally:
            self.region.pop()

    def _tokens(self, *args, **kwargs):
        self.region = ["tokens"]
        out = self._orig_tokens(*args, **kwargs)
        self.region = ["post"]
        self._t_post = time.perf_counter()
        return out

    def __enter__(self):
        import ctrls.generate.static_decode as S

        self._orig_head, self._orig_tokens = S._head_candidates, S.draw_tokens
        S._head_candidates, S.draw_tokens = self._head, self._tokens
        return super().__enter__()

    def __exit__(self, *exc):
        import ctrls.generate.static_decode as S

        S._head_candidates, S.draw_tokens = self._orig_head, self._orig_tokens
        return super().__exit__(*exc)


def run_static(bb, prompts, starts, n: int, new: int, model=None, count: bool = True) -> dict:
    """A static decode (step eager) under a ``StaticProbe``: its summary, with the rows."""
    with torch.no_grad(), StaticProbe(bb, count=count) as p:
        rec = decode_ours(bb, prompts, starts, n, new, model=model, decode="static")
    return {**p.summary(), "rows": rec["rows"], "tokens": new}


def measure_static_inputs(name: str, args, tok, cfg) -> dict:
    """For one backbone: the static step's ops on a 2-layer model of the real width (bf16, the two batch
    structures of ``opcount.measure_analytic_inputs``), and the host-serial phase (timed, not counted) at
    the real batches on a model of tiny width with the profile's prompts and newline rate."""
    from ctrls.data.prompts import encode_prompt

    cpu = torch.device("cpu")
    t0 = time.perf_counter()
    bb = build_backbone(name, tok, cpu, torch.bfloat16, False, num_hidden_layers=2, vocab_size=len(tok))
    short = [tok(q)["input_ids"] for q in QUESTIONS[:2]]
    model = random_ctrls(bb, cfg.states.n_states, cfg.spectral.k, cfg.adapter.rank)
    counts: dict = {"model": f"{name} shape with 2 layers, vocabulary {len(tok)}, bfloat16, CPU, step eager",
                    "tokens": args.count_tokens}
    for batch, ps, n in (("b160", short, 2), ("rl", short[:1], 4)):
        counts[batch] = {"prompts": len(ps), "rows": len(ps) * n}
        for label, m in (("base", None), ("ctrls", model)):
            counts[batch][label] = run_static(bb, ps, [0] * len(ps), n, args.count_tokens, m)
    del bb, model
    print(f"  static step ops at the real width: {time.perf_counter() - t0:.1f} s", flush=True)

    t0 = time.perf_counter()
    bb = build_backbone(name, tok, cpu, torch.float32, True)
    enc = [encode_prompt(tok, q, cfg.prompt.use_chat_template, cfg.prompt.few_shot) for q in QUESTIONS]
    prompts, starts = [e[0] for e in enc], [e[1] for e in enc]
    bias = calibrate_newline_bias(bb, prompts, args.step_tokens)
    n_s, B = cfg.grid.n_samples, cfg.sampling.batch_size
    n_ls = rl_runs(cfg) * cfg.rl.questions_per_step
    batches = {"b160": (prompts[:max(1, B // n_s)], starts[:max(1, B // n_s)], n_s, args.host_tokens),
               "rl": (prompts[:1], starts[:1], cfg.rl.questions_per_step * cfg.rl.group_size, 2 * args.host_tokens),
               "lockstep": ([prompts[i % len(prompts)] for i in range(n_ls)], [starts[i % len(starts)] for i in range(n_ls)],
                            cfg.rl.group_size, args.host_tokens)}
    host = {"model": f"tiny width ({TINY}), vocabulary {len(tok)}, float32, CPU, step eager", "newline_bias": bias,
            "torch_threads": torch.get_num_threads()}
    run_static(bb, prompts[:2], starts[:2], 2, 4, count=False)  # warm-up
    for b, (ps, ss, nn, new) in batches.items():
        host[b] = run_static(bb, ps, ss, nn, new, count=False)  # Base, timed without the counting's overhead
    del bb
    print(f"  static host-serial phase at the real batches: {time.perf_counter() - t0:.1f} s", flush=True)
    return {"counts_real_width": counts, "host": host, "environment": environment(cpu, torch.bfloat16)}


def static_ops(inp: dict, sampler: str, batch: str) -> dict:
    """Ops of one static iteration of the full-depth model: the step's kernel ops (body fixed + per layer x
    layers, and the head: the graph's kernel nodes, an upper bound), the eager kernel ops around it (the
    token draw, the counters, ``HOST_COPIES``) and the post phase's ops (host side: its measured time is
    charged). A lockstep batch has the structure of the batch of 160 (several prompts)."""
    st = inp["static"]
    src = st["counts_real_width"]["b160" if batch == "lockstep" else batch][sampler]
    L, kinds = inp["shape"]["layers"], ("kernel", "sync")
    per_layer = count_ops(src, "layer", kinds) / 2  # 2 layers counted
    body = count_ops(src, "body", kinds) + per_layer * L
    head = count_ops(src, "head", kinds)
    eager = count_ops(src, "tokens", kinds) + count_ops(src, "launch", kinds) + HOST_COPIES
    host = st["host"][batch]
    return {"body_fixed": count_ops(src, "body", kinds), "per_layer": per_layer, "body": body, "head": head,
            "graph_nodes": body + head, "syncs_in_step": count_ops(src, "body", ("sync",)) + count_ops(src, "layer", ("sync",))
            / 2 * L + count_ops(src, "head", ("sync",)),
            "token_draw": count_ops(src, "tokens", kinds), "eager_ops": eager, "host_copies": HOST_COPIES,
            "post_ops": count_ops(src, "post", ("kernel", "sync", "view")),
            "host_serial_measured_s": host["post_s_median"], "host_rows": host["rows"]}
