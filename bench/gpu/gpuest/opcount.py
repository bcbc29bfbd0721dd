"""Aten ops and host-serial time of a decode iteration, counted on a CPU: ``DecodeProbe`` splits a decode
run into iterations and regions; ``measure_analytic_inputs`` runs it on the backbones' shapes (what the
analytic model needs from this CPU); ``iteration_ops`` scales the counts to the real depth."""
from __future__ import annotations

import contextlib
import time

import torch
from common import QUESTIONS, op_kind, random_ctrls
from torch.utils._python_dispatch import TorchDispatchMode

from .decode import decode_hf, decode_ours
from .estimate import MEAN_TOKENS, STEPS_PER_COT, lockstep_batch
from .measure import cpu_fits_full
from .models import TINY, build_backbone, calibrate_newline_bias, shape_numbers


class DecodeProbe(TorchDispatchMode):
    """Splits a decode run into iterations (one per forward of the decoder body: entry 0 the prefill) and
    records for each the aten ops dispatched (``count=True``) by region and kind (``op_kind``), the seconds
    of our sampler's post-token phase and of its state redraws, and the rows redrawn.

    Regions: 'layer' (inside a decoder layer), 'body' (the rest of the decoder body: embedding, rotary
    tables, attention mask, final norm), 'post' (our sampler: from the end of ``_pick``, when the sampled
    tokens reach the host, to the next body forward: the Python loop over the rows and the bookkeeping),
    'draw' (our sampler's ``_draw_states``), 'launch' (the rest: LM head, top-k and the draw of the
    tokens, the adapter; HF's logits processors, sampling, stopping criteria and input preparation)."""

    def __init__(self, bb, count: bool = True):
        super().__init__()
        self.bb, self.count = bb, count
        self.region = ["launch"]
        self.iters: list[dict] = []
        self._reset()
        self._t_post = None

    def _reset(self):
        self.cur = {}
        self.post_s = self.draw_s = 0.0
        self.rows = self.calls = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        key = f"{self.region[-1]}/{op_kind(func)}"
        self.cur[key] = self.cur.get(key, 0) + 1
        return func(*args, **(kwargs or {}))

    def _body_pre(self, module, args):
        if self._t_post is not None:
            self.post_s += time.perf_counter() - self._t_post
            self._t_post = None
        self.region = ["body"]

    def _body_post(self, module, args, output):
        self.region = ["launch"]
        self.iters.append({"ops": self.cur, "post_s": self.post_s, "draw_s": self.draw_s, "redraw_rows": self.rows,
                           "draw_calls": self.calls})
        self._reset()

    def _push_layer(self, module, args):
        self.region.append("layer")

    def _pop(self, module, args, output):
        self.region.pop()

    def _pick(self, *args, **kwargs):
        out = self._orig_pick(*args, **kwargs)
        self.region = ["post"]
        self._t_post = time.perf_counter()
        return out

    def _draw(self, model, prev, rows, epsilon):
        self.region.append("draw")
        t = time.perf_counter()
        out = self._orig_draw(model, prev, rows, epsilon)
        self.draw_s += time.perf_counter() - t
        self.rows += len(rows)
        self.calls += 1
        self.region.pop()
        return out

    def __enter__(self):
        import ctrls.generate.decoding as D
        import ctrls.generate.sampling as S
        from ctrls.method.backbone import decoder_body

        body = decoder_body(self.bb.model)
        self._handles = [body.register_forward_pre_hook(self._body_pre), body.register_forward_hook(self._body_post)]
        for layer in body.layers:
            self._handles += [layer.register_forward_pre_hook(self._push_layer), layer.register_forward_hook(self._pop)]
        self._orig_pick, self._orig_draw = S._pick, D.draw_states
        S._pick, D.draw_states = self._pick, self._draw
        if self.count:
            super().__enter__()
        return self

    def __exit__(self, *exc):
        import ctrls.generate.decoding as D
        import ctrls.generate.sampling as S

        if self.count:
            super().__exit__(*exc)
        S._pick, D.draw_states = self._orig_pick, self._orig_draw
        for h in self._handles:
            h.remove()
        return False

    def summary(self, skip: int = 2) -> dict:
        """Means over the decode iterations after the first ``skip`` forwards (the prefill, and the first
        iteration, which also holds the first state draw): ops by 'region/kind', seconds, rows redrawn."""
        its = self.iters[skip:]
        if not its:
            raise ValueError(f"only {len(self.iters)} forwards: decode more tokens")
        keys = sorted({k for it in its for k in it["ops"]})
        post = sorted(it["post_s"] - it["draw_s"] for it in its)
        return {"iterations": len(its), "ops": {k: sum(it["ops"].get(k, 0) for it in its) / len(its) for k in keys},
                "post_s_median": post[len(post) // 2], "post_s_min": post[0],
                "draw_s": sum(it["draw_s"] for it in its) / len(its),
                "redraw_rows": sum(it["redraw_rows"] for it in its) / len(its),
                "draw_calls": sum(it.get("draw_calls", 0) for it in its) / len(its)}


def count_ops(s: dict, region: str, kinds=("kernel", "sync")) -> float:
    """Ops of a probe summary in ``region`` ('*': all regions), of the given kinds."""
    return sum(v for k, v in s["ops"].items() if (region == "*" or k.split("/")[0] == region)
               and k.split("/")[1] in kinds)


def measure_analytic_inputs(name: str, args, tok, cfg) -> dict:
    """What the analytic model needs from this CPU for one backbone: its shape, the aten ops of a decode
    iteration (ours Base and CTRLS, HF generate), the host-serial seconds of our sampler at the real
    batches, the prompt lengths, and the CPU stages (c)-(e) at a reduced size."""
    from ctrls.config.schema import override
    from ctrls.data.prompts import encode_prompt
    from ctrls.method.spectral import spectral_embeddings

    cpu, f32 = torch.device("cpu"), torch.float32
    res: dict = {"shape": shape_numbers(name)}
    sh = res["shape"]
    print(f"\n== {name}: {sh['parameters'] / 1e9:.3f} B parameters, {sh['layers']} layers, KV "
          f"{sh['kv_bytes_per_token'] / 1024:.0f} KiB per token", flush=True)
    K, k, r = cfg.states.n_states, cfg.spectral.k, cfg.adapter.rank

    # (1) op counts: the real width and heads, 2 layers, bf16 (its casts are ops), the tokenizer's vocabulary
    # (the number of ops depends on neither the vocabulary nor the width), random weights, short prompts; the
    # two batch structures of the profile: several prompts of different lengths (left padding: an attention
    # mask), as in a batch of 160, and one prompt (no padding), as in an RL step
    t0 = time.perf_counter()
    bb = build_backbone(name, tok, cpu, torch.bfloat16, False, num_hidden_layers=2, vocab_size=len(tok))
    short = [tok(q)["input_ids"] for q in QUESTIONS[:2]]
    model = random_ctrls(bb, K, k, r)
    new = args.count_tokens
    counts = {"model": f"{name} shape with 2 layers, vocabulary {len(tok)}, bfloat16, CPU", "tokens": new,
              "prompt_tokens": [len(p) for p in short]}
    for batch, ps, n in (("b160", short, 2), ("rl", short[:1], 4)):
        probes = {"ours_base": lambda: decode_ours(bb, ps, [0] * len(ps), n, new),
                  "ours_ctrls": lambda: decode_ours(bb, ps, [0] * len(ps), n, new, model=model),
                  "hf_generate": lambda: decode_hf(bb, ps, n, new)}
        counts[batch] = {"prompts": len(ps), "rows": len(ps) * n}
        for key, fn in probes.items():
            with torch.no_grad(), DecodeProbe(bb) as p:
                fn()
            counts[batch][key] = p.summary()
    res["counts_real_width"] = counts
    del bb, model
    print(f"  op counts at the real width: {time.perf_counter() - t0:.1f} s", flush=True)

    # (2) the host-serial phase at the real batches: a model of tiny width (the loop over the rows does not
    # depend on it), the profile's prompts, newlines calibrated to one every --step-tokens tokens
    t0 = time.perf_counter()
    bb = build_backbone(name, tok, cpu, f32, True)
    enc = [encode_prompt(tok, q, cfg.prompt.use_chat_template, cfg.prompt.few_shot) for q in QUESTIONS]
    prompts, starts = [e[0] for e in enc], [e[1] for e in enc]
    res["prompt_tokens"] = [len(p) for p in prompts]
    bias = calibrate_newline_bias(bb, prompts, args.step_tokens)
    model = random_ctrls(bb, K, k, r)
    n_s, B = cfg.grid.n_samples, cfg.sampling.batch_size
    G = cfg.rl.questions_per_step * cfg.rl.group_size
    ls_p, ls_s = lockstep_batch(cfg, prompts, starts)  # lockstep RL: every run's step decodes in one batch
    batches = {"b160": (prompts[:max(1, B // n_s)], starts[:max(1, B // n_s)], n_s, args.host_tokens),
               "rl": (prompts[:1], starts[:1], G, 2 * args.host_tokens),
               "lockstep": (ls_p, ls_s, cfg.rl.group_size, args.host_tokens)}
    host = {"model": f"tiny width ({TINY}), vocabulary {len(tok)}, float32, CPU", "newline_bias": bias,
            "torch_threads": torch.get_num_threads()}
    decode_ours(bb, prompts[:2], starts[:2], 2, 4)  # warm-up
    for b, (ps, ss, nn, new) in batches.items():
        for label, m in (("base", None), ("ctrls", model)):
            with torch.no_grad(), DecodeProbe(bb) as p:  # counted
                rec = decode_ours(bb, ps, ss, nn, new, model=m)
            host[f"{label}_{b}"] = {**p.summary(), "rows": rec["rows"], "tokens": new,
                                    "newline_rate": rec["newline_rate"]}
        with torch.no_grad(), DecodeProbe(bb, count=False) as p:  # timed, without the counting's overhead
            decode_ours(bb, ps, ss, nn, new)
        host[f"base_{b}"]["timed"] = p.summary()
    res["host"] = host
    del bb, model
    print(f"  host-serial phase at the real batches: {time.perf_counter() - t0:.1f} s", flush=True)

    # (3) CPU stages (c)-(e) at a reduced size, this CPU: (c) on random steps, (d) and (e)'s fits on random
    # data (MiniBatchKMeans forced, as at the full size), to be scaled linearly by ``estimate``
    t0 = time.perf_counter()
    n_steps = args.cpu_probe_steps
    tokens = max(1, round(sum(MEAN_TOKENS.values()) / sum(STEPS_PER_COT.values())))
    g = torch.Generator().manual_seed(0)
    steps = [torch.randn(tokens, sh["hidden"], generator=g) for _ in range(n_steps)]
    t = time.perf_counter()
    spectral_embeddings(steps, cfg.spectral.k, cfg.spectral.normalize)
    spectral_s = time.perf_counter() - t
    del steps
    full_steps = min(cfg.data.n_train * cfg.pretrain.samples_per_question * min(STEPS_PER_COT[ds], cfg.prompt.max_steps)
                     for ds in cfg.grid.datasets)
    forced = override(cfg, {"states.minibatch_above": 0}) if full_steps > cfg.states.minibatch_above else cfg
    try:
        from threadpoolctl import threadpool_limits
        limit = threadpool_limits(torch.get_num_threads())
    except ImportError:  # pragma: no cover
        limit = contextlib.nullcontext()
    with limit:
        fits = cpu_fits_full(forced, sh["hidden"], n_steps)
    res["cpu_stages"] = {"spectral": {"seconds": spectral_s, "steps": n_steps, "tokens_per_step": tokens},
                         "fits": {**fits, "scaled_linearly": True,
                                  "minibatch_forced": full_steps > cfg.states.minibatch_above}}
    print(f"  CPU stages at {n_steps} steps: spectral {spectral_s:.1f} s, k-means {fits['fit_states_seconds']:.1f} s, "
          f"transition fit {fits['fit_transitions_seconds']:.1f} s ({time.perf_counter() - t0:.1f} s)", flush=True)
    return res


def iteration_ops(inp: dict, sampler: str, batch: str, step_tokens: float) -> dict:
    """Aten ops of one decode iteration of the full-depth model: the body (fixed + per layer x layers) and
    the launch phase from the real-width count of the batch's structure; the post-token phase from the
    real-batch count; for CTRLS the state redraws' ops (CTRLS's post phase minus Base's, per row redrawn,
    pooled over both batches) at one redraw per row every ``step_tokens`` tokens."""
    L = inp["shape"]["layers"]
    # a lockstep batch has several prompts of different lengths: the structure of the batch of 160
    src = inp["counts_real_width"]["b160" if batch == "lockstep" else batch][
        "hf_generate" if sampler == "hf" else f"ours_{sampler}"]
    n_layers = 2

    def by(kinds):
        return {"body": count_ops(src, "body", kinds) + count_ops(src, "layer", kinds) / n_layers * L,
                "per_layer": count_ops(src, "layer", kinds) / n_layers,
                "body_fixed": count_ops(src, "body", kinds), "launch": count_ops(src, "launch", kinds)}

    out = {"kernel": by(("kernel", "sync")), "all": by(("kernel", "sync", "view"))}
    out["launch_ops"] = out["kernel"]["body"] + out["kernel"]["launch"]
    out["post_ops"] = out["redraw_ops"] = 0.0
    if sampler != "hf":
        h = inp["host"]
        base = h[f"base_{batch}"]
        out["post_ops"] = count_ops(base, "post", ("kernel", "sync", "view"))  # host side: its measured time is charged
        out["host_serial_measured_s"] = base["timed"]["post_s_median"]
        if sampler == "ctrls":
            # the state redraws: one vectorised call (_draw_states) per iteration in which some row redraws,
            # whatever the number of rows; its ops (and _record_states') pooled over the measured batches
            extra = calls = rows = 0.0
            for b in ("b160", "rl", "lockstep"):
                if f"ctrls_{b}" not in h:
                    continue
                ct, bs = h[f"ctrls_{b}"], h[f"base_{b}"]
                extra += ct["iterations"] * (count_ops(ct, "post") + count_ops(ct, "draw")
                                             - count_ops(bs, "post") - count_ops(bs, "draw"))
                calls += ct["iterations"] * ct.get("draw_calls", 0.0)
                rows += ct["iterations"] * ct["redraw_rows"]
            out["redraw_ops_per_call"] = extra / calls if calls else 0.0
            out["redraw_rows_per_call"] = rows / calls if calls else 0.0
            out["redraw_rows_per_iteration"] = base["rows"] / step_tokens
            # P(some row of the batch ends a step in an iteration), each row every step_tokens tokens
            out["redraw_calls_per_iteration"] = 1 - (1 - 1 / step_tokens) ** base["rows"]
            out["redraw_ops"] = out["redraw_ops_per_call"] * out["redraw_calls_per_iteration"]
    out["dispatches_per_iteration"] = out["all"]["body"] + out["all"]["launch"] + out["post_ops"] + out["redraw_ops"]
    out["charged_ops"] = out["launch_ops"] + out["redraw_ops"]  # x the per-op overhead
    return out
