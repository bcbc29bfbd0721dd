"""The static decode path captured as CUDA graphs (``sampling: {decode: static, compile: reduce-overhead}``,
the ``paper`` profile), in the analytic model beside the eager engine (``analytic``). Per decode iteration:

  time = max(bandwidth floor, compute floor, graph-node time) + host-serial time

- bandwidth floor: the weights, and the KV cache at its full capacity (the longest prompt rounded up to
  a multiple of 64, + max_new_tokens + 1 positions: attention reads the whole ``StaticCache``, masked), for the
  slots of the batch: every row of the batch to the batch's end (the static path keeps a finished row in its
  slot until at most half are live, then moves the live ones to a power-of-two bucket, at most 2x the live
  rows: charging the whole batch is an upper bound, and the 'mean' bound's rows end near the mean anyway);
- compute floor: as the engine's, attention over the capacity;
- graph-node time: the step's kernel nodes x a declared GPU-side overhead per node (``node_us``). The nodes
  are the step's eager kernel ops (body + adapter + LM head + top-k, counted on a CPU with the step eager:
  ``staticops``), an upper bound: inductor fuses pointwise ops into fewer kernels;
- host-serial (the GPU idles): one graph launch (``graph_launch_us``), the eager ops after the step (the
  Gumbel-max draw among the top k, the host copies: ``staticops.HOST_COPIES``) and the state redraws'
  ops x the eager per-op overhead, and the post-token loop (``_advance`` and the slot bookkeeping) timed
  on a CPU at the real batch. The draw's launches could overlap the graph's run; they are counted serial.
The prefill stays eager (as in the engine). The bandwidth floor ``bw_floor`` is the hours if every decode
iteration cost only weights + the live KV cache read once at the effective bandwidth."""
from __future__ import annotations

from ctrls.generate.sampling import STATIC_PAD_TO

from .analytic import decode_iteration
from .decode import timed_fields
from .estimate import ACCEPTANCE, MEAN_TOKENS, STEPS_PER_COT, estimate
from .models import BF16
from .opcount import iteration_ops
from .staticops import static_ops

# Declared, assumed (not measured; no spec sheet gives them): a CUDA graph's launch from the host, and the
# GPU-side gap per kernel node inside a replayed graph.
GRAPH = {"graph_launch_us": 10.0, "node_us": 1.5, "node_us_range": [1.0, 3.0],
         "graph_source": "assumed, not measured: a CUDA graph launch costs the host about one kernel launch; "
                         "inside a graph the GPU spends about 1-3 us per kernel node between kernels"}
RUN_KEYS = ("base_b160", "ctrls_b160", "base_rl", "ctrls_rl", "base_lockstep", "ctrls_lockstep")


def static_iteration(sh: dict, c: dict, B: int, capacity: float, nodes: float, host_s: float) -> dict:
    """One static decode iteration of ``B`` slots, attention over ``capacity`` positions."""
    kv = B * capacity * sh["kv_bytes_per_token"]
    nbytes = sh["weight_bytes"] + kv + B * sh["kv_bytes_per_token"] + 2 * B * sh["vocab"] * BF16
    flops = 2 * sh["parameters"] * B + 4 * sh["layers"] * sh["heads"] * sh["head_dim"] * capacity * B
    t = {"t_mem": nbytes / (c["hbm_bytes_per_s"] * c["bw_efficiency"]),
         "t_flop": flops / (c["bf16_dense_flops_per_s"] * c["flops_efficiency"]),
         "t_graph": nodes * c["node_us"] * 1e-6}
    bound = max(t, key=t.get)
    return {"bytes": nbytes, "kv_read_bytes": kv, "flops": flops, **t, "t_host": host_s, "bound": bound[2:],
            "seconds": t[bound] + host_s}


def timeline_record(rows: int, new: int, prefill_s: float, step) -> dict:
    """A run record ``estimate`` reads: ``new`` iterations of ``step(ctx offset i)`` seconds after the prefill."""
    marks = [prefill_s]
    for i in range(1, new):
        marks.append(marks[-1] + step(i))
    rec = {"analytic": True, "rows": rows, "new_tokens": new, "seconds": marks[-1] + step(new)}
    timed_fields(rec, marks, new)
    rec["tokens_per_s"] = rows * new / rec["seconds"]
    return rec


def static_backbone(b: dict, c: dict, cfg, new: int) -> dict:
    """The static path's and the bandwidth floor's run records and per-iteration tables, for one backbone
    whose eager records (``analytic.analytic_backbone``) are in ``b``."""
    inp = b["inputs"]
    sh = inp["shape"]
    T = sum(inp["prompt_tokens"]) / len(inp["prompt_tokens"])
    cap = cfg.sampling.max_new_tokens
    capacity = -(-max(inp["prompt_tokens"]) // STATIC_PAD_TO) * STATIC_PAD_TO + cap + 1  # as ctrls.generate.sampling pads
    static, floor = {"runs": {}, "iterations": {}}, {"runs": {}}
    for key in RUN_KEYS:
        if key not in b["iterations"]:
            continue
        sampler, batch = key.split("_")
        eager = b["iterations"][key]
        rows, pre = eager["rows"], eager["prefill"]["seconds"]
        ops = static_ops(inp, sampler, batch)
        redraw = iteration_ops(inp, sampler, batch, c["step_tokens"])["redraw_ops"]  # the engine's: same _redraw
        host = {"graph_launch": c["graph_launch_us"] * 1e-6, "eager_ops": ops["eager_ops"] * c["per_op_s"],
                "post_loop": ops["host_serial_measured_s"], "redraws": redraw * c["per_op_s"]}
        it = static_iteration(sh, c, rows, capacity, ops["graph_nodes"], sum(host.values()))
        static["runs"][key] = timeline_record(rows, new, pre, lambda i: it["seconds"])
        static["iterations"][key] = {"rows": rows, "capacity": capacity, "ops": {**ops, "redraw_ops": redraw},
                                     "host": host, "host_s": sum(host.values()), "it": it, "prefill": eager["prefill"],
                                     "gpu_busy_fraction": max(it["t_mem"], it["t_flop"]) / it["seconds"],
                                     "floor_first": decode_iteration(sh, c, rows, T + 1, 0.0)["t_mem"],
                                     "floor_last": decode_iteration(sh, c, rows, T + cap, 0.0)["t_mem"]}
        floor["runs"][key] = timeline_record(rows, new, pre, lambda i: decode_iteration(sh, c, rows, T + i, 0.0)["t_mem"])
    return {"static": static, "bw_floor": floor}


def graph_constants(args) -> dict:
    return {**GRAPH, "graph_launch_us": args.graph_launch_us, "node_us": args.node_us,
            "node_us_range": list(args.node_range)}


def view(data: dict, path: str) -> dict | None:
    """``data``'s backbones with another decode path's runs in place of the eager ones: ``static`` and
    ``bw_floor`` (analytic), or ``graph`` (a measured run's static, CUDA-graph runs: ``graph_<key>``,
    ``decode.engine_vs_graph``); None when some backbone lacks them."""
    out = {}
    for n, b in data["backbones"].items():
        if path == "graph":
            keys = [k for k in ("base_b160", "ctrls_b160", "ctrls_rl") if "static" in b.get(f"graph_{k}", {})]
            runs = {k: b[f"graph_{k}"]["static"] for k in keys} if len(keys) == 3 else None
            if runs and "static" in b.get("graph_ctrls_lockstep", {}):  # RL training's batch, when measured
                runs["ctrls_lockstep"] = b["graph_ctrls_lockstep"]["static"]
        else:
            runs = b.get(path, {}).get("runs")
        if not runs:
            return None
        out[n] = {**b, **runs}
    return {"backbones": out}


def path_estimates(data: dict, cfg, gpus: int) -> dict:
    """The estimates of the other decode paths (the eager one is ``data['estimate']``): ``estimate_static``
    and ``estimate_bw_floor`` (analytic), or ``estimate_graph`` (measured), each on one GPU and (key + ``_<N>gpu``)
    sharded over ``gpus``."""
    out = {}
    for path in ("static", "bw_floor", "graph"):
        v = view(data, path)
        if v is None:
            continue
        est = estimate(cfg, v, MEAN_TOKENS, STEPS_PER_COT, ACCEPTANCE)
        out[f"estimate_{path}"] = est
        if gpus > 1:
            multi = estimate(cfg, v, MEAN_TOKENS, STEPS_PER_COT, ACCEPTANCE, world=gpus)
            multi["linear_wall_hours"] = {k: h / gpus for k, h in est["total_hours"].items()}
            out[f"estimate_{path}_{gpus}gpu"] = multi
    return out


def static_summary(data: dict, goal_hours: float = 10.0) -> dict:
    """Totals (one GPU) of the three paths, and whether the static path stays within a budget of 10 H100-hours."""
    tot = {p: data[k]["total_hours"] for p, k in (("eager", "estimate"), ("static", "estimate_static"),
                                                 ("bw_floor", "estimate_bw_floor")) if k in data}
    s = tot.get("static")
    return {"total_hours": tot, "goal_hours": goal_hours,
            "meets_goal_mean": s["mean"] <= goal_hours if s else None,
            "meets_goal_cap": s["cap"] <= goal_hours if s else None}
