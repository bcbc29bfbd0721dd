"""Does a state prompt steer the step? m learned input vectors per state, inserted at each step boundary
(``ctrls.method.state_prompt``), against the run's last-hidden adapter, on one finished demo run
(pretraining and exploration at one data seed).

1. Fit: the vectors are trained through the frozen backbone on the run's pretraining chains, each step
   under its posterior state (the argmax of Q_phi, as pretraining assigned it); Adam, early stopping on
   the held-out questions' log P per step token (the validation split: pretraining's held-out questions).
   The library's fit (``ctrls.method.state_prompt.fit``), as the pretraining stage runs it with
   ``state_prompt.use``; this study adds checkpoints, a fit on a GPU and the paired comparison below.
2. Steer: the run's test questions are sampled by the engine (``grid.n_samples`` each, the profile's
   temperature and top-k, ``StatePromptConditioning``) under chains drawn by the run's policy with
   epsilon = ``grid.epsilons[0]`` from the prompt's s_0; every step is read back by Q_phi from an unadapted
   pass without the vectors. The stored results before this decoder joined the engine drew tokens by
   ``torch.multinomial`` from one generator: rerunning gives the same design, other random numbers.
3. Measure: kappa against the independent-chain null (a second chain drawn by the same policy from the
   same s_0, ``ctrls.stats.agreement``), per step index too; pass@1 and Succ. The adapter's epsilon row
   from the run's exploration samples is measured the same way (``ctrls.stats.agreement.null_steps``) and the
   two are compared on the same questions by a paired test (``kappa_difference``).

Usage (from the repository root, after `ctrls stage pretrain exploration`):
    .venv/bin/python studies/state_prompt.py --run-dir runs --profile demo -o data.seed=1 \\
        --out studies/results/state_prompt_seed1.json
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))  # bench/common.py
from common import machine, write_result  # noqa: E402

from ctrls.config.overrides import parse_overrides  # noqa: E402
from ctrls.config.schema import load_config  # noqa: E402
from ctrls.config.settings import ADAPTER, BASE, row_label  # noqa: E402
from ctrls.data.answers import grade  # noqa: E402
from ctrls.data.prompts import encode_prompt  # noqa: E402
from ctrls.errors import ConfigError  # noqa: E402
from ctrls.generate.controllability import draw_chains  # noqa: E402
from ctrls.method.backbone import load_backbone  # noqa: E402
from ctrls.method.state_prompt import StatePrompt, fit  # noqa: E402
from ctrls.stages.adapter_train import StepData  # noqa: E402
from ctrls.stages.common import problems_from_config  # noqa: E402
from ctrls.stages.exploration import load_samples  # noqa: E402
from ctrls.stages.pretrain import load_pretrained, pretrain_stages  # noqa: E402
from ctrls.stages.state_prompt import prompt_chains  # noqa: E402
from ctrls.stats.agreement import kappa_difference, kappa_vs_null, null_steps  # noqa: E402


def save_vectors(path: str, sp: StatePrompt, fit_info: dict) -> None:
    from safetensors.torch import save_file

    save_file({"vectors": sp.vectors.detach().contiguous()}, path, metadata={"fit": json.dumps(fit_info)})


def load_vectors(path: str, K: int, lm) -> tuple[StatePrompt, dict]:
    """The vectors and fit history a --save-vectors run wrote (safetensors: no code runs on load)."""
    from safetensors import safe_open

    with safe_open(path, "pt") as f:
        v, meta = f.get_tensor("vectors"), f.metadata() or {}
    emb = lm.get_input_embeddings().weight
    if v.ndim != 3 or v.shape[0] != K or v.shape[2] != emb.shape[1] or not torch.isfinite(v).all():
        raise SystemExit(f"{path}: vectors of shape {tuple(v.shape)} (finite: {bool(torch.isfinite(v).all())}) "
                         f"do not fit K = {K} and hidden size {emb.shape[1]}")
    sp = StatePrompt(K, v.shape[1], emb.detach())
    with torch.no_grad():
        sp.vectors.copy_(v)
    return sp, {**json.loads(meta.get("fit", "{}")), "loaded_from": path}


def steer(cfg, bb, model, sp, problems, n: int, eps: float, seed: int, group: int = 16) -> dict:
    """The state prompt's steering on ``problems``: ``n`` samples each, decoded by the engine under the vectors
    (``StatePromptConditioning``: each sample's chain drawn from its question's seed), every step read back
    without them; the null chain is a second draw from the same policy and s_0."""
    from ctrls.generate.conditioning import StatePromptConditioning
    from ctrls.generate.sampling import SampleParams, sample, seeded

    tok = bb.tokenizer
    T = cfg.prompt.max_steps
    params = SampleParams(temperature=cfg.grid.temperatures[0], top_k=cfg.sampling.top_k,
                          max_new_tokens=cfg.sampling.max_new_tokens, max_steps=T, epsilon=eps, batch_size=group * n,
                          stop_at_answer=False)  # every chain runs to T steps or the token limit
    f, nu, q, step_ix, correct, valid = [], [], [], [], [], []
    for g0 in range(0, len(problems), group):  # ``group`` questions' chains decoded side by side
        chunk = problems[g0:g0 + group]
        enc = [encode_prompt(tok, p.question, cfg.prompt.use_chat_template, cfg.prompt.few_shot) for p in chunk]
        seeds = [seed * 1_000_003 + g0 + j for j in range(len(chunk))]  # one stream per question
        cond = StatePromptConditioning(model, sp, layer=cfg.backbone.hidden_layer)
        gens = sample(bb, [ids for ids, _ in enc], n, params, seeds=seeds, prompt_starts=[st for _, st in enc],
                      conditioning=cond, read_states=model)
        for qi, (prob, mine) in enumerate(zip(chunk, gens)):
            indep = draw_chains(model.policy, cond.s0[qi], [T] * n, eps, generator=seeded(seeds[qi] + 1))  # the null
            for gen, ind in zip(mine, indep):
                d = cond.chains[qi, gen.sample_index]
                for t, e in enumerate(gen.encoded):
                    f.append(int(d[t] == e)), nu.append(int(ind[t] == e)), q.append(prob.id), step_ix.append(t)
                gr = grade(gen.text, prob.answer)
                correct.append(gr.correct), valid.append(gr.valid)
    out = kappa_vs_null(f, nu, q, seed=seed)
    step_ix = np.asarray(step_ix)
    by_step = {}
    for lab, sel in (("step 1", step_ix == 0), ("step 2", step_ix == 1), ("steps 3+", step_ix >= 2)):
        if sel.sum() and len({q[i] for i in np.flatnonzero(sel)}) > 1:
            r = kappa_vs_null(np.asarray(f)[sel], np.asarray(nu)[sel], [q[i] for i in np.flatnonzero(sel)], seed=seed)
            by_step[lab] = {k: r[k] for k in ("kappa", "kappa lo", "kappa hi", "follows", "null", "steps", "questions")}
    return {**out, "by_step": by_step, "pass1": float(np.mean(correct)), "succ": float(np.mean(valid)),
            "samples": len(correct), "_triple": (f, nu, q)}


def check_args(args):
    """The config of ``args``, or SystemExit with one line naming the first bad argument (before any work)."""
    def refuse(msg):
        raise SystemExit(f"state_prompt.py: {msg}")

    for name in ("vectors", "epochs", "patience", "batch", "group"):
        if getattr(args, name) < 1:
            refuse(f"--{name} {getattr(args, name)}: give an integer >= 1")
    for name in ("questions", "samples", "max_chains"):
        v = getattr(args, name)
        if v is not None and v < 1:
            refuse(f"--{name.replace('_', '-')} {v}: give an integer >= 1")
    if not 0 < args.lr < 10:
        refuse(f"--lr {args.lr}: give a rate in (0, 10)")
    try:
        dev = torch.device(args.device)
    except (RuntimeError, TypeError):
        refuse(f"--device {args.device}: not a torch device (cpu, cuda, cuda:1, ...)")
    if dev.type == "cuda" and not torch.cuda.is_available():
        refuse(f"--device {args.device}: no CUDA device on this machine")
    if args.load_vectors and not Path(args.load_vectors).is_file():
        refuse(f"--load-vectors {args.load_vectors}: no such file")
    if args.fit_only and not args.save_vectors:
        refuse("--fit-only without --save-vectors would throw the fit away")
    if not Path(args.run_dir).is_dir():
        refuse(f"--run-dir {args.run_dir}: no such directory (run `ctrls stage pretrain exploration` first)")
    try:
        # the run's CTRLS rows are the adapter's (this study compares the state prompt with them), unless overridden
        cfg = load_config(args.profile, {**parse_overrides(ADAPTER), **parse_overrides(args.override), "run_dir": args.run_dir})
    except ConfigError as e:
        refuse(str(e).splitlines()[0])
    if args.questions is not None and args.questions > cfg.data.n_test:
        refuse(f"--questions {args.questions}: the profile has data.n_test = {cfg.data.n_test} test questions")
    fitted = pretrain_stages(cfg)["adapter"]
    if not fitted.is_done():  # the pretraining this study reads (its chains, Q_phi and adapter)
        refuse(f"--run-dir {args.run_dir}: no finished pretraining in {fitted.dir.parent} for these overrides "
               "(run `ctrls stage pretrain exploration` with them first)")
    return cfg


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--run-dir", default="runs")
    ap.add_argument("--profile", default="demo")
    ap.add_argument("-o", "--override", action="append", default=[])
    ap.add_argument("--vectors", type=int, default=2, help="vectors per state (m)")
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--epochs", type=int, default=8, help="at most; early stopping on the held-out questions")
    ap.add_argument("--patience", type=int, default=2)
    ap.add_argument("--batch", type=int, default=8, help="chains per Adam step")
    ap.add_argument("--questions", type=int, default=None, help="test questions (default data.n_test)")
    ap.add_argument("--samples", type=int, default=None, help="samples per question (default grid.n_samples)")
    ap.add_argument("--group", type=int, default=16, help="questions whose chains are decoded side by side")
    ap.add_argument("--max-chains", type=int, default=None, help="at most this many training and held-out chains (a smoke run)")
    ap.add_argument("--device", default="cpu", help="where the backbone runs (cpu, cuda, ...), in float32")
    ap.add_argument("--out", default=None)
    ap.add_argument("--save-vectors", default=None, help="write the fitted vectors and the fit's history here (safetensors), "
                    "also after each epoch that improves the held-out log P")
    ap.add_argument("--load-vectors", default=None, help="skip the fit: the vectors a --save-vectors run wrote")
    ap.add_argument("--fit-only", action="store_true", help="stop after the fit (with --save-vectors)")
    args = ap.parse_args(argv)
    cfg = check_args(args)
    torch.manual_seed(cfg.seed)
    bb = load_backbone(cfg.backbone.name, device=args.device, dtype="float32")
    for p in bb.model.parameters():
        p.requires_grad_(False)
    model = load_pretrained(cfg, bb)
    data = StepData.load(pretrain_stages(cfg))
    K = model.centroids.shape[0]
    train_items, held_items = prompt_chains(cfg, data, bb.tokenizer, "train"), prompt_chains(cfg, data, bb.tokenizer, "heldout")
    if args.max_chains:
        train_items, held_items = train_items[: args.max_chains], held_items[: args.max_chains]
    if args.load_vectors:
        sp, fit_info = load_vectors(args.load_vectors, K, bb.model)
    else:
        on_best = (lambda sp_, info: save_vectors(args.save_vectors, sp_, info)) if args.save_vectors else None
        sp, fit_info = fit(bb.model, train_items, held_items, K, args.vectors, args.lr, args.epochs, args.patience,
                           args.batch, cfg.seed, on_best=on_best, on_epoch=lambda row: print(json.dumps(row), flush=True))
    if args.save_vectors:
        save_vectors(args.save_vectors, sp, fit_info)
    if args.fit_only:
        return {"fit": fit_info}
    problems = problems_from_config(cfg, "test")[: args.questions or cfg.data.n_test]
    n, eps = args.samples or cfg.grid.n_samples, cfg.grid.epsilons[0]
    t0 = time.perf_counter()
    ours = steer(cfg, bb, model, sp, problems, n, eps, cfg.seed, group=args.group)
    ours["seconds"] = time.perf_counter() - t0
    trip = ours.pop("_triple")
    for _ in range(120):  # the exploration stage may still be writing its samples (run side by side)
        try:
            df = load_samples(cfg)
            break
        except FileNotFoundError:
            time.sleep(30)
    else:
        df = load_samples(cfg)
    df = df[df.dataset == cfg.data.dataset]
    qids = {p.id for p in problems}
    base, row = df[(df.config == BASE) & df.question_id.isin(qids)], df[(df.config == row_label(eps)) & df.question_id.isin(qids)]
    adapter_trip = null_steps(row, base, eps)
    adapter = kappa_vs_null(*adapter_trip, seed=cfg.seed)
    adapter["pass1"] = float(row.correct.mean())
    comp = kappa_difference(trip, adapter_trip, seed=cfg.seed)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    res = {"machine": machine(), "commit": commit or "?", "profile": args.profile, "overrides": args.override,
           "data_seed": cfg.data.seed, "n_states": K, "vectors_per_state": args.vectors, "epsilon": eps,
           "questions": len(problems), "samples_per_question": n, "train_chains": len(train_items),
           "heldout_chains": len(held_items), "fit": fit_info, "state_prompt": ours, "adapter": adapter,
           "state_prompt_minus_adapter": comp}
    print(json.dumps({"state_prompt": {k: ours[k] for k in ("kappa", "kappa lo", "kappa hi", "pass1")},
                      "adapter": {k: adapter[k] for k in ("kappa", "kappa lo", "kappa hi")}, "diff": comp}), flush=True)
    if args.out:
        write_result(res, args.out)
    return res


if __name__ == "__main__":
    main()
