"""The measured path (on a CUDA GPU, or ``--tiny`` on a CPU as a check of the script): per backbone, the
decode runs at the paper's batches, pretraining stages (b)-(f) on synthetic CoTs, and the CPU fits of
stages (d) and (e) at the profile's full size; written to the JSON after each measurement."""
from __future__ import annotations

import hashlib
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from types import SimpleNamespace

import torch
from common import QUESTIONS, non_finite, random_ctrls, refuse_non_finite, write_json

from .decode import decode_hf, decode_ours, engine_vs_graph, forward_floor, measured
from .estimate import STEPS_PER_COT, lockstep_batch
from .models import SHAPES, TINY, build_backbone, calibrate_newline_bias, load_tokenizer

ROOT = Path(__file__).resolve().parents[3]


def guarded(results: dict, key: str, fn, *args, **kwargs):
    """Run a measurement; on an error keep going and record the traceback under ``key``. A measurement holding a
    NaN or an infinity is such an error, naming its field: no stored result holds a non-finite number."""
    try:
        results[key] = fn(*args, **kwargs)
        refuse_non_finite(results[key], key)
    except Exception as e:  # noqa: BLE001 - a benchmark reports every failure and goes on
        results[key] = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}
        print(f"  !! {key} failed: {type(e).__name__}: {e}\n{traceback.format_exc()}", flush=True)
    return results[key]


def profiled(fn, top: int = 25) -> str:
    """cProfile of ``fn()``: the ``top`` entries by total and by cumulative time."""
    import cProfile
    import io
    import pstats

    pr = cProfile.Profile()
    pr.enable()
    fn()
    pr.disable()
    buf = io.StringIO()
    st = pstats.Stats(pr, stream=buf)
    st.sort_stats("tottime").print_stats(top)
    st.sort_stats("cumulative").print_stats(top)
    return buf.getvalue()


def synthetic_collect(out: Path, tok, n_q: int, per_q: int, length: int, steps: int, seed: int = 0):
    """Problems and a collect/trajectories.jsonl of ``per_q`` kept CoTs of ``length`` in-vocabulary
    token ids per question, with a newline token closing each of ``steps`` steps."""
    from ctrls.data.problems import Problem
    from ctrls.data.prompts import newline_token_ids
    from ctrls.stages.runs import append_jsonl

    g = torch.Generator().manual_seed(seed)
    nl_ids = sorted(newline_token_ids(tok))
    nl_tok = tok("\n", add_special_tokens=False)["input_ids"][-1]
    nl_set = set(nl_ids)
    problems = [Problem(id=f"synth-{i}", question=QUESTIONS[i % len(QUESTIONS)] + f" (#{i})", answer="1", steps=(),
                        source="gsm8k", split="train") for i in range(n_q)]
    rows = []
    for p in problems:
        for m in range(per_q):
            ids = torch.randint(1000, len(tok), (length,), generator=g).tolist()
            ids = [t if t not in nl_set else 1000 for t in ids]
            for b in torch.linspace(0, length, steps + 1)[1:].long().tolist():
                ids[b - 1] = nl_tok
            rows.append({"qid": p.id, "source": "samples", "sample_index": m, "solution_ids": ids, "steps": [],
                         "valid": True, "correct": True, "pred": "1", "kept": True, "finish": "answer"})
        rows.append({"qid": p.id, "source": "_end", "sample_index": -2})
    out.mkdir(parents=True, exist_ok=True)
    append_jsonl(out / "trajectories.jsonl", rows)
    return problems


def pretrain_stages(bb, cfg, n_q: int, length: int, steps: int) -> dict:
    """Stages (b)-(f) of Alg. 1 on synthetic collected CoTs; seconds and peak memory of each."""
    from ctrls.config.schema import override
    from ctrls.data.prompts import encode_prompt
    from ctrls.stages.collect import cache_features
    from ctrls.stages.pretrain import cluster_states, compute_spectral, fit_transition_model, train_adapter

    per_q = cfg.pretrain.samples_per_question
    res: dict = {"questions": n_q, "trajectories": n_q * per_q, "cot_tokens": length, "steps_per_cot": steps}
    with tempfile.TemporaryDirectory() as tmp:
        d = {k: Path(tmp) / k for k in ("collect", "features", "spectral", "states", "transitions", "adapter0",
                                         "adapter1")}
        for p in d.values():
            p.mkdir(parents=True, exist_ok=True)
        problems = synthetic_collect(d["collect"], bb.tokenizer, n_q, per_q, length, steps)
        prompt_len = len(encode_prompt(bb.tokenizer, problems[0].question, cfg.prompt.use_chat_template,
                                       cfg.prompt.few_shot)[0])
        res["prompt_tokens"] = prompt_len
        res["forward_tokens"] = n_q * per_q * (prompt_len + length)
        with measured(bb.device, rec := {}):
            cache_features(cfg, bb, problems, d["collect"], d["features"], progress=False)
        res["features"] = {**rec, "tokens_per_s": res["forward_tokens"] / rec["seconds"],
                           "disk_bytes": sum(f.stat().st_size for f in d["features"].glob("*.pt"))}
        with measured(bb.device, rec := {}):
            sp = compute_spectral(cfg, d["features"], d["spectral"], progress=False)
        res["spectral"] = {**rec, **sp}
        with measured(bb.device, rec := {}):
            st = cluster_states(cfg, d["spectral"], d["features"], d["states"])
        res["states"] = {**rec, "k": st["k"]}
        with measured(bb.device, rec := {}):
            fit_transition_model(cfg, d["states"], d["transitions"])
        res["transitions"] = rec
        stages = {k: SimpleNamespace(dir=d[k]) for k in ("features", "states", "transitions")}
        with measured(bb.device, rec := {}):
            h0 = train_adapter(override(cfg, {"pretrain.epochs": 0}), bb, stages, d["adapter0"], progress=False)
        tokens = sum(r["tokens"] for r in h0["initial"].values())  # one bound evaluation: both splits, every token
        res["adapter_epoch0"] = {**rec, "tokens": tokens}
        with measured(bb.device, rec := {}):
            h1 = train_adapter(override(cfg, {"pretrain.epochs": 1}), bb, stages, d["adapter1"], progress=False)
        res["adapter_epochs0and1"] = {**rec, "elbo_initial": h1["initial"]["train"]["elbo_per_step"],
                                      "elbo_final": h1["final"]["train"]["elbo_per_step"]}
        # epochs = 1 evaluates the bound twice (after epoch 0 and after epoch 1) around one training epoch
        res["adapter_train_epoch_s"] = max(rec["seconds"] - 2 * res["adapter_epoch0"]["seconds"], 0.0)
        res["adapter_eval_tokens_per_s"] = tokens / res["adapter_epoch0"]["seconds"]
        res["adapter_train_tokens_per_s"] = h0["initial"]["train"]["tokens"] / max(res["adapter_train_epoch_s"], 1e-9)
    return res


def cpu_fits_full(cfg, d: int, n_steps: int, threads: int | None = None) -> dict:
    """Stages (d) and (e)'s fits at the profile's size, on random data (their cost is not linear in the
    number of steps: k-means++ initialisation on a fixed subsample, MiniBatchKMeans' early stopping,
    300 Adam steps of the transition fit): ``fit_states`` on (n_steps, k*d) Gaussian embeddings and
    ``fit_transitions`` on n_steps Dirichlet state pairs. Random data, not the real embeddings:
    k-means may stop earlier or later on those."""
    from ctrls.method.policy import fit_transitions
    from ctrls.method.states import fit_states

    g = torch.Generator().manual_seed(0)
    D, K = cfg.spectral.k * d, cfg.states.n_states
    res: dict = {"steps": n_steps, "dim": D, "k": K, "torch_threads": torch.get_num_threads()}
    X = torch.randn(n_steps, D, generator=g)
    t = time.perf_counter()
    space = fit_states(X, K, seed=cfg.seed, minibatch_above=cfg.states.minibatch_above, tau=cfg.states.tau,
                       reduce_k=cfg.states.reduce_k)
    res["fit_states_seconds"] = time.perf_counter() - t
    res["k_used"] = space.k
    del X
    s_prev = torch.distributions.Dirichlet(torch.full((K,), 0.2)).sample((n_steps,))
    s_next = torch.distributions.Dirichlet(torch.full((K,), 0.2)).sample((n_steps,))
    t = time.perf_counter()
    fit_transitions(s_prev, s_next, K, steps=cfg.policy.fit_steps, lr=cfg.policy.fit_lr,
                    smoothing=cfg.policy.count_smoothing, method=cfg.policy.fit)
    res["fit_transitions_seconds"] = time.perf_counter() - t
    return res


def measure_backbone(name: str, args, tok, dev, dtype, cfg, res: dict, save) -> dict:
    """Every measurement of one backbone into ``res``; ``save()`` after each."""
    from ctrls.data.prompts import encode_prompt

    print(f"\n== {name} ({'tiny' if args.tiny else 'full size'}, {dtype}, {dev})", flush=True)
    with measured(dev, rec := {}):
        bb = build_backbone(name, tok, dev, dtype, args.tiny)
    res["build"] = {**rec, "parameters": sum(p.numel() for p in bb.model.parameters()),
                    "attn_implementation": getattr(bb.model.config, "_attn_implementation", None)}
    print(f"  built: {res['build']['parameters'] / 1e9:.2f} B parameters in {rec['seconds']:.1f} s", flush=True)
    enc = [encode_prompt(tok, q, cfg.prompt.use_chat_template, cfg.prompt.few_shot) for q in QUESTIONS]
    prompts, starts = [e[0] for e in enc], [e[1] for e in enc]
    res["prompt_tokens"] = [len(p) for p in prompts]
    res["newline_bias"] = calibrate_newline_bias(bb, prompts, args.step_tokens)
    model = random_ctrls(bb, cfg.states.n_states, cfg.spectral.k, cfg.adapter.rank)
    n, B = cfg.grid.n_samples, cfg.sampling.batch_size
    n_prompts = max(1, B // n)
    big_p, big_s = prompts[:n_prompts], starts[:n_prompts]
    G = cfg.rl.questions_per_step * cfg.rl.group_size
    ls_p, ls_s = lockstep_batch(cfg, prompts, starts)  # lockstep RL: every run's step in one batch
    # warm-up (kernels, cuBLAS handles, allocator)
    decode_ours(bb, big_p[:2], big_s[:2], 2, 4)
    decode_ours(bb, big_p[:2], big_s[:2], 2, 4, model=model)
    if not args.skip_hf:
        decode_hf(bb, big_p[:2], 2, 4)
    runs = [("base_b160", lambda: decode_ours(bb, big_p, big_s, n, args.new)),
            ("ctrls_b160", lambda: decode_ours(bb, big_p, big_s, n, args.new, model=model)),
            ("base_rl", lambda: decode_ours(bb, prompts[:1], starts[:1], G, args.new_rl)),
            ("ctrls_rl", lambda: decode_ours(bb, prompts[:1], starts[:1], G, args.new_rl, model=model)),
            ("ctrls_lockstep", lambda: decode_ours(bb, ls_p, ls_s, cfg.rl.group_size, args.new_rl, model=model)),
            ("floor_b160", lambda: forward_floor(bb, big_p, n, args.floor_iters)),
            ("floor_rl", lambda: forward_floor(bb, prompts[:1], G, args.floor_iters))]
    if not args.skip_hf:
        runs.append(("hf_rl", lambda: decode_hf(bb, prompts[:1], G, args.new_rl)))
        runs.append(("hf_b160", lambda: decode_hf(bb, big_p, n, args.new)))
    only = set(getattr(args, "only", None) or ())  # --only: measure these keys alone (e.g. a second lease)
    for key, fn in [(k, f) for k, f in runs if not only or k in only]:
        r = guarded(res, key, fn)
        save()
        if "error" not in r:
            print(f"  {key:11s} {r['rows']:4d} rows x {r.get('new_tokens', r.get('iterations'))} tokens: "
                  f"{r.get('tokens_per_s', float('nan')):9.1f} tok/s, "
                  f"{1e3 * r['s_per_iteration']:6.1f} ms/iteration"
                  + (f" (prefill {1e3 * r['prefill_s']:.0f} ms, decode {1e3 * r['decode_s_per_iteration_first_quarter']:.1f}"
                     f" -> {1e3 * r['decode_s_per_iteration_last_quarter']:.1f} ms)" if r.get("prefill_s") is not None
                     and "decode_s_per_iteration_first_quarter" in r else "")
                  + f", peak {r.get('peak_gib', 0):.1f} GiB"
                  + (f", {r['steps_per_cot']:.1f} steps/CoT" if "steps_per_cot" in r else ""), flush=True)
    if args.profile_tokens:  # where the host time of a CTRLS run goes (cProfile slows it: not a measurement)
        for key, fn in (("cprofile_ctrls_rl", lambda: decode_ours(bb, prompts[:1], starts[:1], G, args.profile_tokens,
                                                                   model=model)),
                        ("cprofile_ctrls_b160", lambda: decode_ours(bb, big_p, big_s, n, args.profile_tokens,
                                                                     model=model))):
            guarded(res, key, profiled, fn, 12)
            print(f"  -- {key}\n" + "\n".join(str(res[key]).splitlines()[:40]), flush=True)
    for a, b in (("base_b160", "hf_b160"), ("ctrls_b160", "hf_b160"), ("ctrls_b160", "base_b160"),
                 ("ctrls_rl", "hf_rl"), ("base_rl", "hf_rl"), ("ctrls_rl", "base_rl")):
        if "tokens_per_s" in res.get(a, {}) and "tokens_per_s" in res.get(b, {}):
            res[f"ratio_{a}_over_{b}"] = res[a]["tokens_per_s"] / res[b]["tokens_per_s"]
            print(f"  {a} / {b} = {res[f'ratio_{a}_over_{b}']:.2f}x", flush=True)
    # pretraining before the CUDA-graph runs: their compile time is the part a time limit may cut short
    r = (guarded(res, "pretrain", pretrain_stages, bb, cfg, args.pretrain_questions, args.pretrain_tokens,
                 args.pretrain_steps) if not only or "pretrain" in only else {"error": "not asked for (--only)"})
    save()
    if "error" not in r:
        print(f"  features {r['features']['tokens_per_s']:.0f} forward tok/s; spectral {r['spectral']['seconds']:.1f} s, "
              f"states {r['states']['seconds']:.1f} s, transitions {r['transitions']['seconds']:.1f} s "
              f"for {r['spectral']['steps']} steps; adapter: eval pass {r['adapter_eval_tokens_per_s']:.0f} tok/s, "
              f"train epoch {r['adapter_train_tokens_per_s']:.0f} tok/s", flush=True)
    for key, ps, ss, nn, new, m in (("graph_base_b160", big_p, big_s, n, args.new, None),  # engine vs CUDA graphs
                                    ("graph_ctrls_b160", big_p, big_s, n, args.new, model),
                                    ("graph_ctrls_rl", prompts[:1], starts[:1], G, args.new_rl, model),
                                    # the lockstep RL batch (every run's step at once), what RL training decodes
                                    ("graph_ctrls_lockstep", ls_p, ls_s, cfg.rl.group_size, args.new_rl, model),
                                    )[:4 * args.graph]:
        if only and key not in only:
            continue
        r = guarded(res, key, engine_vs_graph, bb, ps, ss, nn, new, m)
        save()
        if "error" not in r:
            print(f"  {key}: engine {r['engine']['tokens_per_s']:.0f} tok/s, static ({r['compile']}) "
                  f"{r['static']['tokens_per_s']:.0f} tok/s ({r['speedup']:.2f}x); tokens equal: {r['tokens_equal']} "
                  f"({r['rows_equal_fraction']:.0%} of rows)", flush=True)
    del bb, model
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    return res


def environment(dev: torch.device, dtype: torch.dtype) -> dict:
    import transformers

    env = {"torch": torch.__version__, "transformers": transformers.__version__, "python": platform.python_version(),
           "dtype": str(dtype).replace("torch.", ""), "device": str(dev), "cpu_count": os.cpu_count()}
    if dev.type == "cuda":
        env["gpu"] = torch.cuda.get_device_name(dev)
        env["cuda"] = torch.version.cuda
        env["gpu_memory_gib"] = torch.cuda.get_device_properties(dev).total_memory / 2**30
    try:
        env["git_commit"] = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                                           timeout=10).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        env["git_commit"] = None
    # a copy of the tree sent to a GPU machine may carry a stale .git: CTRLS_GIT_COMMIT names its commit
    env["git_commit"] = os.environ.get("CTRLS_GIT_COMMIT") or env["git_commit"]
    env["sampling_py_sha256"] = hashlib.sha256((ROOT / "ctrls" / "sampling.py").read_bytes()).hexdigest()[:16]
    return env


def measured_data(args, cfg) -> dict:
    """Measure every backbone of ``args.backbones`` (default: the profile's) into a dict, saved to
    ``args.out`` after each measurement."""
    dev, dtype = torch.device(args.device), getattr(torch, args.dtype)
    if dev.type == "cuda" and not torch.cuda.is_available():
        sys.exit("no CUDA device: use a GPU machine, or --device cpu --tiny to check the script")
    tok = load_tokenizer(args.tokenizer)
    data = {"environment": environment(dev, dtype), "tiny": args.tiny, "profile": args.profile,
            "settings": {k: v for k, v in vars(args).items() if k not in ("from_json",)}, "backbones": {}}
    print(json.dumps(data["environment"]), flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)

    def save():  # after each measurement: a kill midway keeps the last whole file; a NaN is refused naming its field
        write_json(out, data, default=str)

    for name in args.backbones or cfg.grid.backbones:
        res = data["backbones"][name] = {}
        try:
            measure_backbone(name, args, tok, dev, dtype, cfg, res, save)
        except Exception as e:  # noqa: BLE001
            if non_finite(res) is not None:  # a NaN outside a guarded measurement: only the error is kept
                res.clear()
            res["error"] = f"{type(e).__name__}: {e}"
            res["traceback"] = traceback.format_exc()
            print(res["traceback"], flush=True)
        save()
    if args.cpu_full:
        n_full = max(cfg.data.n_train * cfg.pretrain.samples_per_question * min(STEPS_PER_COT[ds], cfg.prompt.max_steps)
                     for ds in cfg.grid.datasets)
        if args.tiny:
            n_full = min(n_full, 2000)
        for name in args.backbones or cfg.grid.backbones:
            d = (TINY if args.tiny else SHAPES[name])["hidden_size"]
            print(f"\n== full-size fits of stages (d), (e) for {name}: {n_full} steps x {cfg.spectral.k * d}",
                  flush=True)
            r = guarded(data["backbones"][name], "cpu_fits_full", cpu_fits_full, cfg, d, n_full)
            save()
            if "error" not in r:
                print(f"  fit_states {r['fit_states_seconds']:.1f} s, fit_transitions "
                      f"{r['fit_transitions_seconds']:.1f} s", flush=True)
    return data
