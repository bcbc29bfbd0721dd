"""How many GPU hours the ``paper`` profile needs: rates measured on a GPU, turned into a budget.

No weights are downloaded. The two backbones of the paper are built with random weights from their
transformers configs, in bf16 on CUDA:

- Qwen2.5-3B-Instruct shape: Qwen2Config, hidden 2048, MLP 11008, 36 layers, 16 heads / 2 KV heads,
  vocabulary 151936, tied embeddings, rope_theta 1e6;
- Llama-3.2-3B-Instruct shape: LlamaConfig, hidden 3072, MLP 8192, 28 layers, 24 heads / 8 KV heads,
  vocabulary 128256, tied embeddings (rope scaling left out: it does not change the cost).

Tokenizer: the embedded SmolLM2 tokenizer (49152 tokens), from a saved directory (``--tokenizer``)
or from ``ctrls.method.backbone.load_backbone("smollm2-135m-instruct")``. The models keep their real
vocabularies, so the LM head and the top-k cost what they cost on the real models; sampled ids
above the tokenizer's range are skipped by ``tokenizer.decode`` (no crash, checked), they only
shorten the decoded text. Prompts are the profile's: ``prompts.encode_prompt`` with the chat
template and 4 exemplars (about 600 SmolLM2 tokens; the real tokenizers' chat templates are of the
same order).

Steps: a random model almost never samples a newline, so the CTRLS state redraw at every step
boundary would never run. The LM head gets a bias on the tokenizer's newline ids, calibrated by
bisection on the model's own logits so that a newline is drawn about once every
``--step-tokens`` tokens (default 30, about a CoT line); the steps per CoT actually sampled are
reported. The bias adds nothing measurable to the head's cost.

Measured (per backbone):
1. decode throughput at the paper's batch (160 sequences = 8 prompts x 20 samples, prefix
   shared, ``ignore_eos=True, stop_at_answer=False``, so every row decodes ``--new`` tokens):
   our sampler, Base and CTRLS (a random CTRLSModel, K=64, k=4, rank 64, epsilon 0.1), against
   HF ``model.generate(num_return_sequences=20)`` on the same prompts; and at the RL batch
   (1 prompt x 8 samples): Base, CTRLS and HF generate. Times include the prefill. A forward hook
   on the decoder body timestamps (synchronised) the prefill and every decode iteration, so the
   seconds to decode any L <= ``--new`` tokens are read off one run (``seconds_at``); beyond
   ``--new`` they are extrapolated with the slope of the run's last quarter (the cost of an
   iteration grows with the KV cache). The bare model's decode loop (``floor_*``) is the eager
   model's own limit, for comparison. These runs use the engine (``decode="engine"``).
   Engine against CUDA graphs (``--graph``, on by default; ``decode.engine_vs_graph``): the library's
   ``sample()`` with ``SampleParams(decode="engine")`` and with ``decode="static",
   compile="reduce-overhead"`` on the same prompts and seeds (Base and CTRLS at the batch of 160, CTRLS
   at the RL batch; the static path runs once to compile and capture, then is timed): tokens/s of each,
   their ratio and whether the tokens are equal (``graph_*``); ``estimate_graph`` is the estimate with
   the static runs in place of the engine's (total times: a compiled step gets no per-iteration hooks).
2. pretraining stages (b)-(f) of ``ctrls.pretrain`` run for real (``cache_features``,
   ``compute_spectral``, ``cluster_states``, ``fit_transition_model``, ``train_adapter``) on
   ``--pretrain-questions`` synthetic questions x 8 kept CoTs of ``--pretrain-tokens`` tokens, in a
   temporary run directory; one adapter epoch = time(epochs=1) - time(epochs=0).
   Stages (d) and (e)'s fits (k-means, the transition fit) do not cost in proportion to the steps,
   so they are also timed at the profile's full step count on random data (``--cpu-full``, on by
   default; ``cpu_fits_full``).
3. peak GPU memory of each measurement.

Estimate: the work counts of the profile (``ctrls/config/profiles/paper.yaml``, overridable with
``-o key=value``) times the measured seconds. A batch of the sampler runs until its longest row is
done, and on these models one decode iteration costs about the same at any batch size (measured:
compare the batch-160 and batch-8 seconds per iteration), so two bounds are given:
- "mean": every batch decodes the assumed mean CoT length (optimistic);
- "cap": every batch decodes max_new_tokens (512; one rambling sample in a batch suffices).
Multi-GPU (``--gpus``, default 8; ``accelerate launch --multi_gpu --num_processes N -m ctrls
stage ...``): the estimate is redone with the work sharded as ``ctrls.stages.distributed`` shards it
(collect by training question, exploration / RL evaluation / Table 2 by test question, an RL step
by trajectory slot; pretraining (b)-(f) on rank 0 alone), next to plain linear scaling (1 GPU / N).
Assumed, not measured: mean CoT length (GSM8K 250, MATH 450 tokens), steps per CoT (GSM8K 8,
MATH 12), acceptance rate of sampled CoTs in pretraining (all kept: upper bound), the RL group's
longest CoT (the same two bounds). Not counted: the rubric judge (API-bound, no GPU), model
loading, answer grading, notebook and plot time. Pretraining stages (c)-(e) run on the CPU while
the GPU waits; they are counted as wall time on the GPU machine.

    python bench/gpu/gpu_estimate.py                       # measure (CUDA) and estimate
    python bench/gpu/gpu_estimate.py --new 256 --new-rl 128  # fewer tokens per run, extrapolated
    python bench/gpu/gpu_estimate.py --from-json bench/results/gpu_estimate_measured_h100.json -o rl.eval_questions=100
    python bench/gpu/gpu_estimate.py --from-json a.json b.json --out merged.json   # merge runs (e.g. one per backbone)
    python bench/gpu/gpu_estimate.py --tiny --device cpu --dtype float32 --out /tmp/gpu_tiny.json
        # a check of the script on a CPU (~2 min on 2 cores): 2-layer models with the tokenizer's
        # vocabulary, 16 tokens per run, 2 synthetic questions; its numbers mean nothing

Without a GPU, ``--analytic`` computes the hours instead of measuring them (a few minutes on a CPU,
one thread; the eager model is in ``bench/gpu/gpuest/analytic.py``, the static CUDA-graph one in
``bench/gpu/gpuest/graph.py``). Per backbone shape, one eager decode iteration on one H100 SXM costs
max(bandwidth floor, compute floor, launch bound) + host-serial time, from:
- the shape: parameters counted on the ``meta`` device, bf16 weights, KV bytes per token;
- declared constants: the H100 SXM datasheet's 3.35 TB/s and 989 dense bf16 TFLOP/s, each times an
  efficiency (``--bw-efficiency``, ``--flops-efficiency``, 0.7), and a host overhead per kernel-launching
  op (``--per-op-us`` 10, range 6-20: assumed, not measured);
- aten ops per decode iteration, counted on this CPU (``TorchDispatchMode``) on 2-layer models of the
  real width in bf16, our sampler (Base, CTRLS) and HF ``generate``, scaled to the real depth;
- the sampler's host-serial loop over the rows after each token, timed on this CPU at the real batches;
- the CPU stages (c)-(e), timed here at ``--cpu-probe-steps`` steps and scaled linearly.
The static path (``sampling: {decode: static, compile: reduce-overhead}``, the paper profile's) costs
max(bandwidth floor at the KV cache's full capacity, compute floor, graph nodes x ``--node-us``) +
host-serial time (``--graph-launch-us``, the eager ops after the step x ``--per-op-us``, the post-token
loop timed here, the state redraws), its ops counted here with the step eager (``estimate_static``);
``estimate_bw_floor`` charges every decode iteration only the weights + live KV read at the bandwidth.
The per-iteration times go through ``estimate`` like a measured run's timeline. ``--md`` writes the book
section rendered from the JSON; ``--from-json`` recomputes with other constants without measuring
(except the static path's inputs, about 20 s per backbone, when the saved JSON has none):

    python bench/gpu/gpu_estimate.py --analytic --out bench/results/gpu_estimate_analytic.json \
        --md book/_includes/gpu_estimate_h100.md
    python bench/gpu/gpu_estimate.py --analytic --from-json bench/results/gpu_estimate_analytic.json --per-op-us 15 \
        --out /tmp/other.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
for p in (ROOT, HERE.parent, HERE):  # ctrls, and bench/ (gpuest, common) when imported from elsewhere
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from common import replace_file, write_json  # noqa: E402
from gpuest.analytic_run import analytic_data, analytic_sensitivity  # noqa: E402
from gpuest.estimate import ACCEPTANCE, MEAN_TOKENS, STEPS_PER_COT, estimate, print_estimate  # noqa: E402
from gpuest.graph import path_estimates, static_summary  # noqa: E402
from gpuest.measure import measured_data  # noqa: E402
from gpuest.render import analytic_markdown  # noqa: E402


def merged_data(files: list[str]) -> dict:
    """Saved measurements (``--from-json``), several files (e.g. one per backbone) merged into the first."""
    parts = [json.loads(Path(f).read_text()) for f in files]
    data = parts[0]
    if len(parts) > 1:
        data["merged_from"] = [{"file": f, "environment": d.get("environment"), "settings": d.get("settings")}
                               for f, d in zip(files, parts)]
        for d in parts[1:]:  # a backbone measured in several files (``--only``): its keys merged, later files win
            for name, b in d["backbones"].items():
                data["backbones"].setdefault(name, {}).update(
                    {k: v for k, v in b.items() if not (isinstance(v, dict) and "error" in v)})
    for name, b in data["backbones"].items():
        if "ctrls_lockstep" not in b and "tokens_per_s" in b.get("ctrls_b160", {}):
            # measured before the lockstep run existed: the 160-row CTRLS batch times it (more rows than the
            # lockstep batch of rl_runs x group_size; the engine's host loop grows with the rows: an upper bound)
            b["ctrls_lockstep"] = {**b["ctrls_b160"], "proxy_of": "ctrls_b160"}
            print(f"{name}: no lockstep run measured; the 160-row CTRLS batch stands in for it", flush=True)
    for key in [k for k in data if k.startswith("estimate")]:
        del data[key]
    return data


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--profile", default="paper")
    ap.add_argument("-o", "--override", action="append", default=[], help="config key=value for the estimate")
    ap.add_argument("--from-json", nargs="+", help="recompute the estimate from saved measurements (no GPU); several "
                    "files (e.g. one per backbone) are merged, and written to --out when it is given")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--tiny", action="store_true", help="tiny random models (a check of the script, not a measurement)")
    ap.add_argument("--backbones", nargs="*", help="subset of the profile's backbones to measure")
    ap.add_argument("--tokenizer", default=str(ROOT / ".cache" / "smollm2-tokenizer"))
    ap.add_argument("--new", type=int, default=None,
                    help="decoded tokens per batch-160 run (default max_new_tokens; 16 with --tiny)")
    ap.add_argument("--new-rl", type=int, default=None,
                    help="decoded tokens per RL-batch run (default max_new_tokens; 16 with --tiny)")
    ap.add_argument("--skip-hf", action="store_true")
    ap.add_argument("--only", nargs="+", default=None, help="measure only these keys (e.g. graph_ctrls_lockstep), "
                    "to merge into an earlier file with --from-json (the build and warm-up still run)")
    ap.add_argument("--floor-iters", type=int, default=None, help="iterations of the bare-model decode loop (64; 8 with --tiny)")
    ap.add_argument("--graph", action=argparse.BooleanOptionalAction, default=True,
                    help="also time the library's sample() with decode=engine against decode=static, "
                         "compile=reduce-overhead (CUDA graphs) on the same prompts and seeds, and compare the tokens")
    ap.add_argument("--profile-tokens", type=int, default=0, help="cProfile a CTRLS RL-batch run of this many tokens")
    ap.add_argument("--step-tokens", type=float, default=30.0, help="tokens per CoT step the newline bias aims at")
    ap.add_argument("--pretrain-questions", type=int, default=None,
                    help="synthetic questions for stages (b)-(f) (16; 2 with --tiny)")
    ap.add_argument("--pretrain-tokens", type=int, default=None, help="tokens per synthetic CoT (350; 120 with --tiny)")
    ap.add_argument("--pretrain-steps", type=int, default=None, help="steps per synthetic CoT (10; 4 with --tiny)")
    ap.add_argument("--cpu-full", action=argparse.BooleanOptionalAction, default=None,
                    help="also time the k-means and transition fits at the profile's full size, on random data "
                         "(default: on; off with --tiny)")
    ap.add_argument("--gpus", type=int, default=8, help="data-parallel processes for the multi-GPU estimate")
    ap.add_argument("--out", default=None, help="where the JSON goes (default bench/results/gpu_estimate_measured_<gpu>.json; "
                    "with --analytic bench/results/gpu_estimate_analytic.json)")
    an = ap.add_argument_group("--analytic: hours computed without a GPU (module docstring)")
    an.add_argument("--analytic", action="store_true", help="compute the hours from the shapes, op counts measured on "
                    "this CPU and declared H100 SXM constants (no GPU); with --from-json, recompute from a saved "
                    "analytic JSON without measuring again")
    an.add_argument("--bw-efficiency", type=float, default=0.7, help="fraction of the 3.35 TB/s HBM bandwidth reached")
    an.add_argument("--flops-efficiency", type=float, default=0.7, help="fraction of the 989 TFLOP/s dense bf16 reached")
    an.add_argument("--per-op-us", type=float, default=10.0, help="host overhead per kernel-launching op (assumed)")
    an.add_argument("--per-op-range", type=float, nargs=2, default=[6.0, 20.0], help="its plausible range (sensitivity)")
    an.add_argument("--graph-launch-us", type=float, default=10.0, help="host cost of one CUDA graph launch (assumed)")
    an.add_argument("--node-us", type=float, default=1.5, help="GPU-side overhead per kernel node in a graph (assumed)")
    an.add_argument("--node-range", type=float, nargs=2, default=[1.0, 3.0], help="its plausible range (sensitivity)")
    an.add_argument("--count-tokens", type=int, default=8, help="tokens decoded by the op-count runs")
    an.add_argument("--host-tokens", type=int, default=24, help="tokens decoded by the batch-160 host-loop runs "
                    "(2x at the RL batch)")
    an.add_argument("--cpu-probe-steps", type=int, default=2048, help="steps of the CPU stages' timing (scaled linearly)")
    an.add_argument("--threads", type=int, default=1, help="CPU threads of the analytic measurements")
    an.add_argument("--md", default=None, help="also write the book section (markdown) rendered from the JSON here")
    args = ap.parse_args(argv)

    from ctrls.config.schema import load_config

    cfg = load_config(args.profile, args.override)
    for key, full, tiny in (("new", cfg.sampling.max_new_tokens, 16), ("new_rl", cfg.sampling.max_new_tokens, 16),
                            ("floor_iters", 64, 8), ("pretrain_questions", 16, 2), ("pretrain_tokens", 350, 120),
                            ("pretrain_steps", 10, 4), ("cpu_full", True, False)):
        if getattr(args, key) is None:
            setattr(args, key, tiny if args.tiny else full)
    if args.analytic:
        args.out = args.out or str(ROOT / "bench" / "results" / "gpu_estimate_analytic.json")
        data = analytic_data(args, cfg)
    elif args.from_json:
        data = merged_data(args.from_json)
    else:
        data = measured_data(args, cfg)
        if not args.out:  # e.g. bench/results/gpu_estimate_measured_nvidia_h100_80gb_hbm3.json
            import re

            gpu = re.sub(r"[^a-z0-9]+", "_", str(data["environment"].get("gpu") or args.device).lower()).strip("_")
            args.out = str(ROOT / "bench" / "results" / f"gpu_estimate_measured_{gpu}.json")
    try:
        est = estimate(cfg, data, MEAN_TOKENS, STEPS_PER_COT, ACCEPTANCE)
        print_estimate(est)
        data["estimate"] = {"profile": args.profile, "overrides": args.override, **est}
        if args.gpus > 1:
            multi = estimate(cfg, data, MEAN_TOKENS, STEPS_PER_COT, ACCEPTANCE, world=args.gpus)
            multi["linear_wall_hours"] = {b: h / args.gpus for b, h in est["total_hours"].items()}
            print_estimate(multi)
            data[f"estimate_{args.gpus}gpu"] = {"profile": args.profile, "overrides": args.override, **multi}
        for key, other in path_estimates(data, cfg, args.gpus).items():  # the static (CUDA-graph) path, the floor
            print(f"\n-- {key}")
            print_estimate(other)
            data[key] = {"profile": args.profile, "overrides": args.override, **other}
        data["static_summary"] = static_summary(data)
    except (KeyError, TypeError, ZeroDivisionError) as e:
        print(f"no estimate: {type(e).__name__}: {e}", flush=True)
    if args.analytic and "estimate" in data:
        data["sensitivity"] = analytic_sensitivity(data, cfg, args, cfg.sampling.max_new_tokens)
        multi = data.get(f"estimate_{args.gpus}gpu")
        if multi:  # the RL runs are independent: side by side, one per GPU (not how ctrls schedules them)
            multi["rl_runs_side_by_side_wall_hours"] = {b: h / args.gpus for b, h in
                                                        data["estimate"]["rl_training_sequential_hours"].items()}
    if args.out:
        write_json(args.out, data, default=str)  # whole or not at all, a NaN refused naming its field
        print(f"\nwrote {args.out}")
    if args.md:
        if not (args.analytic and args.out):
            sys.exit("--md renders an --analytic JSON: give --analytic")
        out = Path(args.out).resolve()
        shown = str(out.relative_to(ROOT)) if out.is_relative_to(ROOT) else str(out)
        replace_file(args.md, analytic_markdown(json.loads(out.read_text()), shown))
        print(f"wrote {args.md}")
    return data


if __name__ == "__main__":
    main()
