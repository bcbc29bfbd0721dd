"""``--analytic``, the run: the inputs measured on this CPU (``opcount``, ``staticops``) or read back from a
saved analytic JSON, the eager model (``analytic``) and the static CUDA-graph model (``graph``) computed
from them and the declared constants, and the sensitivity of the totals to those constants."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from ctrls.report.provenance import cpu_model

from .analytic import analytic_backbone, analytic_constants
from .estimate import ACCEPTANCE, MEAN_TOKENS, STEPS_PER_COT, estimate
from .graph import graph_constants, path_estimates, static_backbone
from .measure import environment
from .models import load_tokenizer
from .opcount import measure_analytic_inputs
from .staticops import measure_static_inputs


def all_constants(args) -> dict:
    return {**analytic_constants(args), **graph_constants(args)}


def build_analytic(data: dict, cfg, c: dict, new: int) -> None:
    """Fill ``data['backbones'][name]`` with the analytic records (eager, then static and the bandwidth
    floor) from the measured inputs and the constants."""
    for name, b in data["backbones"].items():
        keep = {"inputs": b["inputs"]}
        b.clear()
        b.update(keep)
        b.update(analytic_backbone(b["inputs"], c, cfg, c["step_tokens"], new))
        b.update(static_backbone(b, c, cfg, new))
    data["constants"] = c


def analytic_sensitivity(data: dict, cfg, args, new: int) -> list[dict]:
    """Total GPU hours (one GPU), eager and static, with one declared constant changed at a time."""
    out = []
    lo, hi = args.per_op_range
    n_lo, n_hi = args.node_range
    for change in ({"per_op_us": lo}, {"per_op_us": hi}, {"node_us": n_lo}, {"node_us": n_hi},
                   {"bw_efficiency": 0.5}, {"bw_efficiency": 0.9}):
        a = argparse.Namespace(**{**vars(args), **change})
        c = all_constants(a)
        d = json.loads(json.dumps({"backbones": {n: {"inputs": b["inputs"]} for n, b in data["backbones"].items()}}))
        build_analytic(d, cfg, c, new)
        est = estimate(cfg, d, MEAN_TOKENS, STEPS_PER_COT, ACCEPTANCE)
        static = path_estimates(d, cfg, 1)["estimate_static"]
        out.append({"change": change, "total_hours": est["total_hours"], "static_total_hours": static["total_hours"]})
    return out


def analytic_data(args, cfg) -> dict:
    """``--analytic``: measure the inputs on this CPU (or read them from ``--from-json``; the static path's
    inputs are measured when the saved JSON has none, about 20 s per backbone), then compute."""
    torch.set_num_threads(args.threads)
    tok = None
    if args.from_json:
        data = json.loads(Path(args.from_json[0]).read_text())
        if not data.get("analytic") or not all("inputs" in b for b in data["backbones"].values()):
            sys.exit(f"{args.from_json[0]} is not an --analytic JSON")
        for key in [k for k in data if k.startswith("estimate") or k in ("sensitivity", "static_summary")]:
            del data[key]
    else:
        tok = load_tokenizer(args.tokenizer)
        env = environment(torch.device("cpu"), torch.float32)
        env.update(cpu_model=cpu_model(), torch_threads=torch.get_num_threads())
        data = {"analytic": True, "environment": env, "profile": args.profile,
                "settings": {k: v for k, v in vars(args).items() if k not in ("from_json",)}, "backbones": {}}
        print(json.dumps(env), flush=True)
        for name in args.backbones or cfg.grid.backbones:
            data["backbones"][name] = {"inputs": measure_analytic_inputs(name, args, tok, cfg)}
    for name, b in data["backbones"].items():
        if "static" not in b["inputs"]:
            print(f"\n== {name}: the static path's inputs", flush=True)
            tok = tok or load_tokenizer(args.tokenizer)
            b["inputs"]["static"] = measure_static_inputs(name, args, tok, cfg)
    c = all_constants(args)
    build_analytic(data, cfg, c, cfg.sampling.max_new_tokens)
    print(f"\nper decode iteration on one H100 SXM (analytic; bandwidth x {c['bw_efficiency']}, bf16 x "
          f"{c['flops_efficiency']}, {c['per_op_us']:g} us per eager op, {c['node_us']:g} us per graph node), ms:")
    for name, b in data["backbones"].items():
        for key, it in b["iterations"].items():
            f0, f1 = it["first"], it["last"]
            print(f"  {name:34s} {key:14s} {it['rows']:4d} rows, eager: mem {1e3 * f0['t_mem']:6.2f} -> "
                  f"{1e3 * f1['t_mem']:6.2f}, flop {1e3 * f0['t_flop']:5.2f}, launch {1e3 * f0['t_launch']:5.2f} "
                  f"({it['ops']['launch_ops']:.0f} ops), host {1e3 * it['host_s']:5.2f}: {1e3 * f0['seconds']:6.2f} -> "
                  f"{1e3 * f1['seconds']:6.2f}", flush=True)
            s = b["static"]["iterations"].get(key)
            if s:
                t = s["it"]
                print(f"  {'':34s} {'':14s} {'':4s}       static: mem {1e3 * t['t_mem']:6.2f}, flop {1e3 * t['t_flop']:5.2f}, "
                      f"graph {1e3 * t['t_graph']:5.2f} ({s['ops']['graph_nodes']:.0f} nodes), host "
                      f"{1e3 * s['host_s']:5.2f}: {1e3 * t['seconds']:6.2f}", flush=True)
    return data
