"""``--analytic``: GPU hours computed, not measured, for when no GPU is at hand. Per backbone shape and
decode iteration, on one H100 SXM:

  time = max(bandwidth floor, compute floor, launch bound) + host-serial time

- bandwidth floor: bytes read per iteration (bf16 weights, the KV cache of the batch at the current
  context, the logits) / (declared HBM bandwidth x efficiency);
- compute floor: 2 x parameters x batch + attention FLOPs / (declared dense bf16 FLOP/s x efficiency);
- launch bound: the kernel-launching aten ops of one decode iteration (counted on this CPU on a 2-layer
  model of the real width, scaled to the real depth: ``opcount``) x a declared per-op host overhead (eager
  PyTorch launches while the GPU runs, so this overlaps with the GPU time: hence the max);
- host-serial time: our sampler copies the sampled tokens to the host (a synchronisation) and runs a
  Python loop over the rows before it launches the next forward; the GPU idles meanwhile. Measured on
  this CPU at the real batch (a model of tiny width: the loop does not depend on it), plus the state
  redraws' ops x the per-op overhead for CTRLS. HF ``generate`` has no such loop (0).

The prefill: max(compute, bandwidth, launch) over the distinct prompts (our sampler shares the prefix,
then copies the cache to every row); HF ``generate`` prefills every row.
The work counts and the hours come from ``estimate`` unchanged: the analytic per-iteration times are
laid out as the timeline of a measured run (``t_body``), so ``seconds_at`` reads them as it reads a run.

This is the eager engine's model (``sampling.decode: engine``); the static path captured as CUDA graphs
is in ``graph``, and the run (inputs measured or read back, constants, sensitivity) in ``analytic_run``.
"""
from __future__ import annotations

from .decode import timed_fields
from .estimate import rl_runs
from .models import BF16
from .opcount import iteration_ops

# Declared, not measured here: NVIDIA H100 Tensor Core GPU datasheet, H100 SXM column.
H100_SXM = {"gpu": "NVIDIA H100 SXM (80 GB HBM3)", "hbm_bytes_per_s": 3.35e12, "bf16_dense_flops_per_s": 989e12,
            "source": "NVIDIA H100 Tensor Core GPU datasheet, H100 SXM: GPU memory bandwidth 3.35 TB/s; BF16 Tensor "
                      "Core 1,979 TFLOPS with sparsity, 989 TFLOPS dense"}
# Stage (f), bytes moved per vocabulary entry and token (read from the code, not measured). Training
# (ctrls.method.elbo._FrozenHeadLogprob): bf16 logits written (2), cast to float32 (2 + 4), log-softmax (two reads,
# one write: 12), exp_ and neg_ in place (8 + 8), the gradient's cast to bf16 (4 + 2) and its read by g @ W (2).
# Thm. 5.3's bound (ctrls.method.elbo.state_token_logprobs): bf16 logits written (2), cast to float64 (2 + 8), max (8),
# sub_ and exp_ in place (16 + 16), read by the float64 product with the K + (steps in the chunk) state columns
# (8); that product's 2 V (K + steps) float64 FLOPs per token are not counted.
ADAPTER_LOGIT_BYTES = {"eval": 60, "train": 44}


def decode_iteration(sh: dict, c: dict, B: int, ctx: int, launch_ops: float, host_s: float = 0.0,
                     kv_passes: float = 1.0) -> dict:
    """One decode iteration of ``B`` rows at context ``ctx`` (tokens in the KV cache) on the declared GPU."""
    kv = B * ctx * sh["kv_bytes_per_token"]
    nbytes = (sh["weight_bytes"] + kv_passes * kv + B * sh["kv_bytes_per_token"]  # the new token's K, V
              + 2 * B * sh["vocab"] * BF16)  # the logits, written by the head and read by top-k
    flops = 2 * sh["parameters"] * B + 4 * sh["layers"] * sh["heads"] * sh["head_dim"] * ctx * B
    t = {"t_mem": nbytes / (c["hbm_bytes_per_s"] * c["bw_efficiency"]),
         "t_flop": flops / (c["bf16_dense_flops_per_s"] * c["flops_efficiency"]),
         "t_launch": launch_ops * c["per_op_s"]}
    bound = max(t, key=t.get)
    return {"bytes": nbytes, "kv_bytes": kv, "kv_read_bytes": kv_passes * kv, "flops": flops, **t, "t_host": host_s,
            "bound": bound[2:],
            "seconds": t[bound] + host_s}


def prefill_time(sh: dict, c: dict, n_seq: int, T: float, launch_ops: float, expand_rows: int = 0,
                 capacity: float = 0) -> dict:
    """The prefill of ``n_seq`` sequences of ``T`` tokens; ``expand_rows``: the cache (``capacity`` positions,
    ``PreallocatedLayer``) then copied to that many rows (read and write)."""
    flops = (2 * (sh["parameters"] - sh["embedding_parameters"]) * n_seq * T
             + 2 * sh["layers"] * sh["heads"] * sh["head_dim"] * T * T * n_seq)  # causal QK^T and AV
    nbytes = sh["weight_bytes"] + n_seq * T * sh["kv_bytes_per_token"] + 2 * expand_rows * capacity * sh["kv_bytes_per_token"]
    t = {"t_mem": nbytes / (c["hbm_bytes_per_s"] * c["bw_efficiency"]),
         "t_flop": flops / (c["bf16_dense_flops_per_s"] * c["flops_efficiency"]),
         "t_launch": launch_ops * c["per_op_s"]}
    return {"bytes": nbytes, "flops": flops, **t, "seconds": max(t.values())}


def analytic_backbone(inp: dict, c: dict, cfg, step_tokens: float, new: int) -> dict:
    """The run records ``estimate`` reads (``base_b160``, ``ctrls_b160``, ``ctrls_rl``, ...: per-iteration
    timelines of ``new`` tokens), the pretraining rates, and the per-iteration tables, for one backbone."""
    sh = inp["shape"]
    T = sum(inp["prompt_tokens"]) / len(inp["prompt_tokens"])
    cap = cfg.sampling.max_new_tokens
    n_s, B = cfg.grid.n_samples, cfg.sampling.batch_size
    G = cfg.rl.questions_per_step * cfg.rl.group_size
    out: dict = {"prompt_tokens": inp["prompt_tokens"], "iterations": {}}
    structures = [("b160", max(1, B // n_s) * n_s, max(1, B // n_s)), ("rl", G, 1)]
    if "base_lockstep" in inp["host"]:  # lockstep RL: every run of the pair in one batch
        runs = rl_runs(cfg)
        structures.append(("lockstep", runs * G, runs * cfg.rl.questions_per_step))
    for batch, rows, n_prompts in structures:
        for sampler in (("base", "ctrls") if batch == "lockstep" else ("base", "ctrls", "hf")):
            ops = iteration_ops(inp, sampler, batch, step_tokens)
            host_s = 0.0 if sampler == "hf" else ops["host_serial_measured_s"] + ops["redraw_ops"] * c["per_op_s"]
            kv_passes = 3.0 if sampler == "hf" else 1.0  # DynamicLayer's torch.cat reads and rewrites the cache
            it = lambda ctx: decode_iteration(sh, c, rows, ctx, ops["launch_ops"], host_s, kv_passes)  # noqa: E731
            if sampler == "hf":
                pre = prefill_time(sh, c, rows, T, ops["kernel"]["body"])
            else:
                pre = prefill_time(sh, c, n_prompts, T, ops["kernel"]["body"], expand_rows=rows,
                                   capacity=T + cap + 1)
            marks = [pre["seconds"]]
            for i in range(1, new):
                marks.append(marks[-1] + it(T + i)["seconds"])
            rec = {"analytic": True, "rows": rows, "new_tokens": new, "seconds": marks[-1] + it(T + new)["seconds"]}
            timed_fields(rec, marks, new)
            rec["tokens_per_s"] = rows * new / rec["seconds"]
            key = f"{'hf' if sampler == 'hf' else sampler}_{batch}"
            out[key] = rec
            first, last = it(T + 1), it(T + cap)
            out["iterations"][key] = {"rows": rows, "prompts_prefilled": rows if sampler == "hf" else n_prompts,
                                      "ops": ops, "prefill": pre, "first": first, "last": last,
                                      "kv_passes": kv_passes, "host_s": host_s,
                                      # the share of an iteration the GPU has work (its floors over the total)
                                      "gpu_busy_fraction": {"first": max(first["t_mem"], first["t_flop"]) / first["seconds"],
                                                            "last": max(last["t_mem"], last["t_flop"]) / last["seconds"]}}
            if sampler != "hf":  # PreallocatedLayer.batch_select_indices copies the kept rows' live prefix
                out["iterations"][key]["row_drop_copy_s"] = (2 * rows * (T + cap) * sh["kv_bytes_per_token"]
                                                             / (c["hbm_bytes_per_s"] * c["bw_efficiency"]))
    # pretraining (b): one forward per question of samples_per_question CoTs (prompt + CoT), the LM head on
    # every position (Backbone.hidden_states runs the CausalLM), every layer's hidden states kept
    per_q = cfg.pretrain.samples_per_question
    cot = 350
    S = T + cot
    tok = per_q * S
    flops = 2 * sh["parameters"] * tok + 2 * sh["layers"] * sh["heads"] * sh["head_dim"] * S * S * per_q
    nbytes = sh["weight_bytes"] + tok * (sh["vocab"] * BF16 + (sh["layers"] + 1) * sh["hidden"] * BF16
                                         + sh["kv_bytes_per_token"])
    body = iteration_ops(inp, "base", "b160", step_tokens)["kernel"]["body"]
    t_feat = max(flops / (c["bf16_dense_flops_per_s"] * c["flops_efficiency"]),
                 nbytes / (c["hbm_bytes_per_s"] * c["bw_efficiency"]), body * c["per_op_s"])
    # (f): the frozen head (2 V d FLOPs per token, 4 V d with the input gradient) and its float32 logits
    Vd = sh["vocab"] * sh["hidden"]
    rate = {}
    for kind, mult in (("eval", 2), ("train", 4)):
        t = max(mult * Vd / (c["bf16_dense_flops_per_s"] * c["flops_efficiency"]),
                ADAPTER_LOGIT_BYTES[kind] * sh["vocab"] / (c["hbm_bytes_per_s"] * c["bw_efficiency"]))
        rate[kind] = 1.0 / t
    cs = inp["cpu_stages"]
    out["pretrain"] = {
        "analytic": True, "trajectories": 1, "cot_tokens": cot,
        "features": {"tokens_per_s": tok / t_feat, "seconds_per_question": t_feat, "tokens_per_question": tok,
                     "disk_bytes": (cot + 1) * (sh["hidden"] * 2 + 8)},  # float16 hidden state + int64 target
        "spectral": {"seconds": cs["spectral"]["seconds"], "steps": cs["spectral"]["steps"]},
        "states": {"seconds": 0.0}, "transitions": {"seconds": 0.0},  # in cpu_fits_full (the fits)
        "adapter_eval_tokens_per_s": rate["eval"], "adapter_train_tokens_per_s": rate["train"]}
    out["cpu_fits_full"] = cs["fits"]
    return out


def analytic_constants(args) -> dict:
    return {**H100_SXM, "bw_efficiency": args.bw_efficiency, "flops_efficiency": args.flops_efficiency,
            "per_op_s": args.per_op_us * 1e-6, "per_op_us": args.per_op_us, "per_op_us_range": args.per_op_range,
            "step_tokens": args.step_tokens,
            "per_op_source": "assumed, not measured: host overhead of one kernel-launching op in eager PyTorch "
                             "(dispatcher, Python of the modules, CUDA launch) on a modern host CPU",
            "adapter_logit_bytes": ADAPTER_LOGIT_BYTES}
