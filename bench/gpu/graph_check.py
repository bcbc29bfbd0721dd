"""The static decode path captured as CUDA graphs against the engine, on a full-size random-weight
backbone (no weights downloaded; ``gpuest.models``): does it compute the same samples, and where does
an iteration's time go.

1. Equality, in float32 (``--eq-dtype``): 2 prompts x 8 samples x ``--eq-new`` tokens, Base and CTRLS
   (a random CTRLSModel, epsilon 0.1), through ``sample()`` with ``decode="engine"``, ``decode="static"``
   eager, and ``decode="static", compile="reduce-overhead"`` twice (two runs, each with its own fresh
   ``StaticCache``: a graph replayed on the first run's freed buffers would show here). Per pair: the
   fraction of rows whose tokens are all equal and the mean length of the common prefix. In bf16 a
   random model's top-50 logits are near ties, so any rounding difference (the static path pads the
   prompts to a multiple of 64) changes a draw: equality is checked where rounding is small.
2. Timing, in bf16 (``--dtype``), at the paper's batch (8 prompts x 20 samples, every row decoding
   ``--new`` tokens): engine, static + CUDA graphs, engine, static + CUDA graphs (interleaved, so a drift
   of the machine shows as a spread between the two runs of one path). Each run also times, with a
   synchronisation on either side, the decoder body (engine) or the captured step (static): the rest of
   the run is the host loop (sampling bookkeeping, token reads, launches outside the graph).

    python bench/gpu/graph_check.py --out bench/results/graph_check_h100.json   # on a CUDA machine, ~6 min
    python bench/gpu/graph_check.py --device cpu --tiny --out /tmp/graph_check.json  # the script's check (CPU)
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
for p in (HERE.parents[1], HERE.parent, HERE):  # ctrls, bench/ (common), bench/gpu/ (gpuest)
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402
from common import QUESTIONS, random_ctrls, write_json  # noqa: E402
from gpuest.decode import decode_ours, sync, token_agreement  # noqa: E402
from gpuest.measure import environment  # noqa: E402
from gpuest.models import build_backbone, calibrate_newline_bias, load_tokenizer  # noqa: E402


def prompts_for(tok, n_prompts: int, profile: str = "paper"):
    from ctrls.config.schema import load_config
    from ctrls.data.prompts import encode_prompt

    cfg = load_config(profile)
    enc = [encode_prompt(tok, q, cfg.prompt.use_chat_template, cfg.prompt.few_shot) for q in QUESTIONS[:n_prompts]]
    return [e[0] for e in enc], [e[1] for e in enc]


@contextlib.contextmanager
def timed_parts(bb, decode: str):
    """Seconds inside the decoder body (engine: forward hooks) or inside the step (static: ``step_fn``
    wrapped), each with a synchronisation on either side; yields a dict filled on exit."""
    import ctrls.generate.static_decode as sampling  # the static path's step_fn
    from ctrls.method.backbone import decoder_body

    acc = {"inside_s": 0.0, "calls": 0}
    if decode == "engine":
        body = decoder_body(bb.model)
        t0 = [0.0]

        def pre(module, args, kwargs):
            sync(bb.device)
            t0[0] = time.perf_counter()

        def post(module, args, kwargs, out):
            sync(bb.device)
            acc["inside_s"] += time.perf_counter() - t0[0]
            acc["calls"] += 1

        hs = [body.register_forward_pre_hook(pre, with_kwargs=True),
              body.register_forward_hook(post, with_kwargs=True)]
        try:
            yield acc
        finally:
            for h in hs:
                h.remove()
    else:
        real = sampling.step_fn

        def wrapped_step_fn(mode):
            step = real(mode)

            def timed(*a, **k):
                sync(bb.device)
                t = time.perf_counter()
                out = step(*a, **k)
                sync(bb.device)
                acc["inside_s"] += time.perf_counter() - t
                acc["calls"] += 1
                return out
            return timed

        sampling.step_fn = wrapped_step_fn
        try:
            yield acc
        finally:
            sampling.step_fn = real


def run(bb, prompts, starts, n: int, new: int, model, decode: str, compile: str, parts: bool = False) -> tuple:
    """``gpuest.decode.decode_ours`` (its record, and every row's tokens); ``parts``: also the seconds
    inside the body or step (``timed_parts``) and the host loop's rest."""
    ctx = timed_parts(bb, decode) if parts else contextlib.nullcontext({})
    toks: list = []
    with ctx as acc:
        rec = decode_ours(bb, prompts, starts, n, new, model=model, decode=decode, compile=compile, tokens_out=toks)
    if parts:
        rec.update(inside_s=acc["inside_s"], inside_calls=acc["calls"], host_loop_s=rec["seconds"] - acc["inside_s"])
    return rec, toks


def equality(name: str, tok, dev, dtype, tiny: bool, new: int, mode: str) -> dict:
    bb = build_backbone(name, tok, dev, dtype, tiny)
    prompts, starts = prompts_for(tok, 2)
    res: dict = {"dtype": str(dtype).replace("torch.", ""), "prompts": 2, "samples": 8, "new_tokens": new,
                 "newline_bias": calibrate_newline_bias(bb, prompts, 30.0)}
    ctrls_model = random_ctrls(bb, 64, 4, 64)
    for label, model in (("base", None), ("ctrls", ctrls_model)):
        runs = {}
        for key, decode, comp in (("engine", "engine", "none"), ("static", "static", "none"),
                                  ("graph1", "static", mode), ("graph2", "static", mode)):
            t = time.perf_counter()
            runs[key] = run(bb, prompts, starts, 8, new, model, decode, comp)[1]
            print(f"  {label} {key}: {time.perf_counter() - t:.1f} s", flush=True)
        res[label] = {f"{a}_vs_{b}": token_agreement(runs[a], runs[b]) for a, b in
                      (("engine", "static"), ("engine", "graph1"), ("static", "graph1"), ("graph1", "graph2"))}
        print(f"  {label}: " + ", ".join(f"{k} {v['rows_equal_fraction']:.0%} rows equal (prefix "
                                           f"{v['mean_common_prefix']:.1f})" for k, v in res[label].items()), flush=True)
    del bb, ctrls_model
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    return res


def timing(name: str, tok, dev, dtype, tiny: bool, new: int, mode: str) -> dict:
    bb = build_backbone(name, tok, dev, dtype, tiny)
    prompts, starts = prompts_for(tok, 8)
    calibrate_newline_bias(bb, prompts, 30.0)
    res: dict = {"dtype": str(dtype).replace("torch.", ""), "prompts": 8, "samples": 20, "new_tokens": new}
    run(bb, prompts[:2], starts[:2], 2, 4, None, "engine", "none")  # warm-up: kernels, cuBLAS, allocator
    t = time.perf_counter()
    run(bb, prompts, starts, 20, new, None, "static", mode)  # compile and capture
    res["static_first_run_seconds"] = time.perf_counter() - t
    for i in (1, 2):
        for key, decode, comp in (("engine", "engine", "none"), ("graph", "static", mode)):
            rec = run(bb, prompts, starts, 20, new, None, decode, comp, parts=True)[0]
            res[f"{key}{i}"] = rec
            print(f"  {key}{i}: {rec['tokens_per_s']:.0f} tok/s, {1e3 * rec['s_per_iteration']:.1f} ms/iteration, of "
                  f"which inside {1e3 * rec['inside_s'] / new:.1f} ms, host loop {1e3 * rec['host_loop_s'] / new:.1f} ms",
                  flush=True)
    for i in (1, 2):
        res[f"speedup{i}"] = res[f"graph{i}"]["tokens_per_s"] / res[f"engine{i}"]["tokens_per_s"]
    del bb
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    return res


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--backbone", default="Qwen/Qwen2.5-3B-Instruct")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--eq-dtype", default="float32")
    ap.add_argument("--tiny", action="store_true", help="2-layer models: a check of the script, not a measurement")
    ap.add_argument("--eq-new", type=int, default=48)
    ap.add_argument("--new", type=int, default=256)
    ap.add_argument("--skip-timing", action="store_true")
    ap.add_argument("--tokenizer", default=str(HERE.parents[1] / ".cache" / "smollm2-tokenizer"))
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    dev = torch.device(args.device)
    mode = "reduce-overhead" if dev.type == "cuda" else "default"
    tok = load_tokenizer(args.tokenizer)
    data = {"environment": environment(dev, getattr(torch, args.dtype)), "backbone": args.backbone,
            "tiny": args.tiny, "compile": mode, "settings": vars(args)}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    print(json.dumps(data["environment"]), flush=True)
    print(f"== equality ({args.eq_dtype})", flush=True)
    data["equality"] = equality(args.backbone, tok, dev, getattr(torch, args.eq_dtype), args.tiny, args.eq_new, mode)
    write_json(out, data, default=str)  # whole, and a NaN refused naming its field: the timing's failure keeps this
    if not args.skip_timing:
        print(f"== timing ({args.dtype})", flush=True)
        data["timing"] = timing(args.backbone, tok, dev, getattr(torch, args.dtype), args.tiny, args.new, mode)
        write_json(out, data, default=str)
    print(f"wrote {out}")
    return data


if __name__ == "__main__":
    main()
