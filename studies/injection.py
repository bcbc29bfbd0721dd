"""Does a context-interacting injection steer the step? Eq. 8's adapter inside the frozen backbone, against
the last-hidden adapter the stages train, on one finished pretraining run.

At the last hidden state with a linear F_u, E' = A(E) + u(z) separates: the state adds one logit bias per
state to every token of its step (``ctrls.method.elbo.state_token_logprobs``), and cannot interact with the
context. Injected at the output of a middle decoder layer (``--layers``; the paper's Alg. 1 injects into
the input embeddings, layer 0), the same adapter feeds the layers above it, so the state's effect
passes through attention and the MLPs and depends on the context.

For each injection layer this script
1. trains a fresh adapter (Eq. 8, the profile's rank and fusion; F_u zero-initialised, so it starts as
   the backbone) with a forward hook on the decoder layer, through the frozen layers above it: the
   relaxed objective's reconstruction term (Eq. 11 at z_t = s_t Gamma, the posterior mixture), on the
   run's training chains, each whole chain in one forward, positions a-1 .. b-2 of step t carrying z_t
   (the design notes' position rule); Adam at ``pretrain.lr``, early stopping on the held-out
   questions' log-likelihood (patience ``pretrain.patience``);
2. the controls on the held-out steps (``ctrls.method.controls``' conditions that need no generation): log P
   per token over the backbone alone under the posterior state, shuffled states (the held-out steps'
   posteriors permuted) and a uniformly random state;
3. steering: the test questions are sampled (``grid.n_samples`` each, the profile's temperature and
   top-k, ``sampling.max_new_tokens``) under state chains drawn by the run's transition policy with
   epsilon = ``grid.epsilons[0]`` (``ctrls.generate.controllability.draw_chains``), the state switched at each
   step boundary as the sampler does; every step is read back with Q_phi from an unadapted pass
   (``ctrls.generate.controllability.encode_generations``), and "follows" is the fraction of steps whose
   read-back state is the drawn one, beside its coincidence reference (the Base row's steps paired with
   chains drawn the same way); pass@1 and Succ. of each row.

The last-hidden row uses the run's own adapter (the stage's) in the same harness (a hook on the final
norm), so every row is measured by the same code. CPU, fp32; the run directory is only read.

Usage (from the repository root, after the demo's pretraining stage):
    .venv/bin/python studies/injection.py --run-dir runs/demo --layers 20 0 --out studies/results/injection.json
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))  # bench/common.py
from common import machine, write_result  # noqa: E402

from ctrls.config.schema import load_config  # noqa: E402
from ctrls.data.answers import grade  # noqa: E402
from ctrls.data.prompts import encode_prompt, newline_token_ids, step_spans  # noqa: E402
from ctrls.generate.controllability import draw_chains, encode_generations, match_rate  # noqa: E402
from ctrls.method.adapter import StateAdapter  # noqa: E402
from ctrls.method.backbone import load_backbone, with_cache  # noqa: E402
from ctrls.stages.adapter_train import StepData, prompted_trajectories  # noqa: E402
from ctrls.stages.common import problems_from_config
from ctrls.stages.pretrain import load_pretrained, pretrain_stages  # noqa: E402


class Injection:
    """A forward hook that rewrites one module's output hidden states with the adapter (Eq. 8) at the
    positions given a state code; ``code`` (B, S, r) and ``mask`` (B, S) are set before each forward
    (None: the module is left as it is)."""

    def __init__(self, module: torch.nn.Module, adapter: StateAdapter):
        self.adapter, self.code, self.mask = adapter, None, None
        self.handle = module.register_forward_hook(self._hook)

    def _hook(self, mod, args, out):
        if self.code is None:
            return None
        h = out[0] if isinstance(out, tuple) else out
        new = self.adapter.fuse(h, self.code)  # Eq. 8 at this layer
        new = torch.where(self.mask[..., None], new, h)
        return (new, *out[1:]) if isinstance(out, tuple) else new

    def remove(self):
        self.handle.remove()


def target_module(lm, layer: int | str):
    """The module whose output is rewritten: decoder layer ``layer`` - 1's output (0: the input embeddings),
    or the final norm (``"last"``, the stages' last_hidden injection)."""
    body = lm.get_decoder() if hasattr(lm, "get_decoder") else lm.model
    if layer == "last":
        return body.norm
    return body.embed_tokens if int(layer) == 0 else body.layers[int(layer) - 1]


# ---- training data: whole chains, each position's state -----------------------------------------------------
def chains(cfg, data: StepData, tok, split: str) -> list[dict]:
    out = []
    for qi, ti, qid, tr, ids in prompted_trajectories(cfg, data, tok, split):
        P, y = len(ids), tr["targets"].tolist()
        rows = torch.full((P + len(y),), -1, dtype=torch.long)  # the step row (of data.post) each position carries
        for t, (a, b) in enumerate(tr["spans"].tolist()):
            rows[P - 1 + a: P - 1 + b] = data.row_of[(qi, ti, t)]  # positions a-1 .. b-2 carry z_t
        out.append({"ids": torch.as_tensor(ids + y), "rows": rows, "qid": qid, "P": P})
    return out


class PromptCache:
    """The backbone's KV cache of each question's prompt but its last token (unadapted: no position of it
    carries a state), computed once; a training or evaluation forward then runs over the last prompt
    token and the chain only (the last prompt position carries z_1)."""

    def __init__(self, lm):
        self.lm, self.caches = lm, {}

    def __call__(self, item: dict):
        q = item["qid"]
        if q not in self.caches:
            from transformers import DynamicCache

            kv = DynamicCache(config=self.lm.config)
            with torch.no_grad():
                body = self.lm.get_decoder()
                body(input_ids=item["ids"][None, : item["P"] - 1], **with_cache(body, kv), use_cache=True)
            self.caches[q] = kv
        return self.caches[q]


def groups(items: list[dict]) -> list[list[dict]]:
    """The chains of each question together (they share the prompt's cache), questions in order."""
    out: dict = {}
    for c in items:
        out.setdefault(c["qid"], []).append(c)
    return list(out.values())


def batch(items: list[dict], s_rows: torch.Tensor, adapter: StateAdapter, centroids: torch.Tensor, pad: int):
    """Right-padded ids, attention mask, the state code per position, the mask of adapted positions."""
    W = max(len(c["ids"]) for c in items)
    ids = torch.full((len(items), W), pad, dtype=torch.long)
    attn = torch.zeros((len(items), W), dtype=torch.long)
    rows = torch.full((len(items), W), -1, dtype=torch.long)
    for i, c in enumerate(items):
        n = len(c["ids"])
        ids[i, :n], attn[i, :n], rows[i, :n] = c["ids"], 1, c["rows"]
    on = rows >= 0
    s = torch.zeros((*rows.shape, s_rows.shape[1]))
    s[on] = s_rows[rows[on]]
    return ids, attn, adapter.mixture_code(s, centroids), on


def nll(lm, inj: Injection | None, items, s_rows, adapter, centroids, pad, prompts: PromptCache, grad: bool = False):
    """Summed NLL (nats) of the step tokens of one question's chains and their count; the state of each
    position from ``s_rows``. The prompt comes from its cache; the LM head runs on the step tokens only."""
    import copy

    P, n = items[0]["P"], len(items)
    segs = [{"ids": c["ids"][P - 1:], "rows": c["rows"][P - 1:]} for c in items]
    ids, attn, code, on = batch(segs, s_rows, adapter, centroids, pad)
    kv = copy.deepcopy(prompts(items[0]))
    if n > 1:
        kv.batch_repeat_interleave(n)
    full = torch.cat([torch.ones((n, P - 1), dtype=torch.long), attn], 1)
    pos = torch.arange(P - 1, P - 1 + ids.shape[1])[None].expand(n, -1)
    if inj is not None:
        inj.code, inj.mask = code, on
    try:
        with torch.set_grad_enabled(grad):
            body = lm.get_decoder()
            h = body(input_ids=ids, attention_mask=full, position_ids=pos, **with_cache(body, kv),
                                 use_cache=True).last_hidden_state
            want = on[:, :-1]  # a position carrying a state predicts a step token
            logits = lm.get_output_embeddings()(h[:, :-1][want])
            lp = F.cross_entropy(logits.float(), ids[:, 1:][want], reduction="sum")
    finally:
        if inj is not None:
            inj.code = inj.mask = None
    return lp, int(want.sum())


def evaluate(lm, inj, items, s_rows, adapter, centroids, pad, prompts) -> float:
    tot, n = 0.0, 0
    for g in groups(items):
        lp, k = nll(lm, inj, g, s_rows, adapter, centroids, pad, prompts)
        tot, n = tot + float(lp), n + k
    return -tot / max(n, 1)  # log P per token


def train(cfg, lm, layer, train_items, held_items, post, centroids, pad, prompts, epochs: int, bs: int, seed: int):
    d, D = lm.config.hidden_size, centroids.shape[1]
    torch.manual_seed(seed)
    adapter = StateAdapter(d, D, cfg.adapter.rank, cfg.adapter.fusion)
    inj = Injection(target_module(lm, layer), adapter)
    opt = torch.optim.Adam(adapter.parameters(), lr=cfg.pretrain.lr)
    best = (evaluate(lm, inj, held_items, post, adapter, centroids, pad, prompts), 0,
            {k: v.clone() for k, v in adapter.state_dict().items()})
    hist = [{"epoch": 0, "heldout_logp_per_token": best[0]}]
    g = torch.Generator().manual_seed(seed)
    steps, t0 = 0, time.perf_counter()
    qs = groups(train_items)
    for ep in range(1, epochs + 1):
        order = torch.randperm(len(qs), generator=g).tolist()
        opt.zero_grad()
        k_sum, chains_ = 0, 0
        for j, qi in enumerate(order):  # one Adam step per ``bs`` chains (whole questions)
            lp, k = nll(lm, inj, qs[qi], post, adapter, centroids, pad, prompts, grad=True)
            lp.backward()
            k_sum, chains_ = k_sum + k, chains_ + len(qs[qi])
            if chains_ >= bs or j == len(order) - 1:
                for p_ in adapter.parameters():  # the mean over the batch's tokens
                    if p_.grad is not None:
                        p_.grad /= max(k_sum, 1)
                opt.step()
                opt.zero_grad()
                steps, k_sum, chains_ = steps + 1, 0, 0
        v = evaluate(lm, inj, held_items, post, adapter, centroids, pad, prompts)
        hist.append({"epoch": ep, "heldout_logp_per_token": v, "optimizer_steps": steps,
                     "seconds": time.perf_counter() - t0})
        print(json.dumps({"layer": layer, **hist[-1]}), flush=True)
        if v > best[0]:
            best = (v, ep, {k: t.clone() for k, t in adapter.state_dict().items()})
        elif cfg.pretrain.patience and ep - best[1] >= cfg.pretrain.patience:
            break
    adapter.load_state_dict(best[2])
    return adapter, inj, {"history": hist, "kept_epoch": best[1], "optimizer_steps": steps,
                          "train_seconds": time.perf_counter() - t0}


def controls(lm, inj, held_items, post, adapter, centroids, pad, prompts, K: int, seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    rows = sorted({int(r) for c in held_items for r in c["rows"].tolist() if r >= 0})
    shuffled, rnd = post.clone(), post.clone()
    perm = torch.as_tensor(rows)[torch.randperm(len(rows), generator=g)]
    shuffled[torch.as_tensor(rows)] = post[perm]
    rnd[torch.as_tensor(rows)] = F.one_hot(torch.randint(0, K, (len(rows),), generator=g), K).float()
    base = evaluate(lm, None, held_items, post, adapter, centroids, pad, prompts)
    out = {"no adapter": base}
    for name, s in (("posterior", post), ("shuffled states", shuffled), ("random state", rnd)):
        out[name] = evaluate(lm, inj, held_items, s, adapter, centroids, pad, prompts)
    return {"logp_per_token": out, "gain_over_backbone": {k: v - base for k, v in out.items()},
            "heldout_steps": len(rows)}


# ---- steering: sampling under drawn states ----------------------------------------------------------------
class StepSwitch:
    """A pre-hook on the LM: before each forward, the state code of each row's current step (the drawn
    chain), switched when the token fed ends a non-blank step (the newline opens the next step's
    prediction: the position rule); the prompt's last position carries the first step's state."""

    def __init__(self, lm, inj: Injection, codes: torch.Tensor, nl: frozenset, tok, prompt_len: int):
        self.inj, self.codes, self.nl, self.tok, self.P = inj, codes, nl, tok, prompt_len  # codes (B, T, r)
        self.step = torch.zeros(codes.shape[0], dtype=torch.long)
        self.content = torch.zeros(codes.shape[0], dtype=torch.bool)  # the current step has a non-blank token
        self.handle = lm.register_forward_pre_hook(self._pre, with_kwargs=True)

    def _pre(self, mod, args, kwargs):
        ids = kwargs.get("input_ids")
        B, S = ids.shape
        T = self.codes.shape[1]
        if S > 1:  # the prefill: only the last prompt position carries a state (z_1)
            mask = torch.zeros((B, S), dtype=torch.bool)
            mask[:, -1] = True
            code = torch.zeros((B, S, self.codes.shape[2]))
            code[:, -1] = self.codes[:, 0]
        else:
            last = ids[:, 0].tolist()
            for i, t in enumerate(last):
                if t in self.nl:
                    if self.content[i]:
                        self.step[i] = min(int(self.step[i]) + 1, T - 1)
                        self.content[i] = False
                elif self.tok.decode([t]).strip():
                    self.content[i] = True
            mask = torch.ones((B, 1), dtype=torch.bool)
            code = self.codes[torch.arange(B), self.step][:, None]
        self.inj.code, self.inj.mask = code, mask
        return None

    def remove(self):
        self.handle.remove()
        self.inj.code = self.inj.mask = None


class _Gen:
    def __init__(self, token_ids, spans):
        self.token_ids, self.spans = token_ids, spans


@torch.no_grad()
def generate(cfg, bb, model, prob, n: int, chains_, adapter=None, inj=None, seed: int = 0):
    """``n`` samples of one question; under the drawn ``chains_`` (n lists of states) when an injection is
    given, else the backbone alone. Returns the generations (ids, spans) and their grades."""
    tok, lm = bb.tokenizer, bb.model
    ids, start = encode_prompt(tok, prob.question, cfg.prompt.use_chat_template, cfg.prompt.few_shot)
    nl = newline_token_ids(tok)
    sw = None
    if inj is not None:
        T = cfg.prompt.max_steps
        hard = torch.as_tensor([c + [c[-1]] * (T - len(c)) for c in chains_])  # (n, T)
        codes = adapter.mixture_code(F.one_hot(hard, model.centroids.shape[0]).float(), model.centroids)
        sw = StepSwitch(lm, inj, codes, nl, tok, len(ids))
    torch.manual_seed(seed)
    try:
        out = lm.generate(input_ids=torch.as_tensor([ids]).expand(n, -1), attention_mask=torch.ones((n, len(ids)),
                          dtype=torch.long), do_sample=True, temperature=cfg.grid.temperatures[0],
                          top_k=cfg.sampling.top_k, max_new_tokens=cfg.sampling.max_new_tokens,
                          pad_token_id=tok.pad_token_id or tok.eos_token_id)
    finally:
        if sw is not None:
            sw.remove()
    eos = {tok.eos_token_id} | ({tok.pad_token_id} if tok.pad_token_id is not None else set())
    gens, grades = [], []
    for row in out[:, len(ids):].tolist():
        k = next((i for i, t in enumerate(row) if t in eos), len(row))
        row = row[:k]
        gens.append(_Gen(row, step_spans(row, nl, tok, max_steps=cfg.prompt.max_steps)))
        grades.append(grade(tok.decode(row), prob.answer))
    return ids, start, gens, grades


def steering(cfg, bb, model, problems, adapter, inj, base, n: int, seed: int) -> dict:
    """Follows-its-state, pass@1 and Succ. of one injection over ``problems``; ``base``: the Base row's
    (per question) read-back states, for the coincidence reference."""
    eps = cfg.grid.epsilons[0] if cfg.grid.epsilons else 0.1
    g = torch.Generator().manual_seed(seed)
    tgt, enc, qs, correct, valid = [], [], [], [], []
    ref_t, ref_e, ref_q = [], [], []
    for qi, prob in enumerate(problems):
        ids, start = encode_prompt(bb.tokenizer, prob.question, cfg.prompt.use_chat_template, cfg.prompt.few_shot)
        s0, _ = encode_generations(bb, model, ids, start, [], layer=cfg.backbone.hidden_layer)
        drawn = draw_chains(model.policy, s0, [cfg.prompt.max_steps] * n, eps, generator=g)
        _, _, gens, grades = generate(cfg, bb, model, prob, n, drawn, adapter, inj, seed=seed + qi)
        _, states = encode_generations(bb, model, ids, start, gens, layer=cfg.backbone.hidden_layer)
        for ch, st in zip(drawn, states):
            tgt += ch[:len(st)]
            enc += st[:len(ch)]
            qs += [prob.id] * min(len(ch), len(st))
        correct += [gr.correct for gr in grades]
        valid += [gr.valid for gr in grades]
        if base is not None:  # Base steps paired with independently drawn chains
            ref = draw_chains(model.policy, s0, [cfg.prompt.max_steps] * len(base[prob.id]), eps, generator=g)
            for ch, st in zip(ref, base[prob.id]):
                ref_t += ch[:len(st)]
                ref_e += st[:len(ch)]
                ref_q += [prob.id] * min(len(ch), len(st))
    out = {"follows": match_rate(np.array(tgt), np.array(enc), qs) if tgt else None,
           "pass1": float(np.mean(correct)), "succ": float(np.mean(valid)), "samples": len(correct)}
    if ref_t:
        out["coincidence"] = match_rate(np.array(ref_t), np.array(ref_e), ref_q)
    return out


def base_row(cfg, bb, model, problems, n: int, seed: int):
    states, correct, valid = {}, [], []
    for qi, prob in enumerate(problems):
        ids, start, gens, grades = generate(cfg, bb, model, prob, n, None, seed=seed + qi)
        _, st = encode_generations(bb, model, ids, start, gens, layer=cfg.backbone.hidden_layer)
        states[prob.id] = st
        correct += [gr.correct for gr in grades]
        valid += [gr.valid for gr in grades]
    return states, {"pass1": float(np.mean(correct)), "succ": float(np.mean(valid)), "samples": len(correct)}


def check_args(args):
    """The config of ``args``, or SystemExit with one line naming the first bad argument (checked before any work:
    ``--questions -1`` sliced the problems to all but the last and exited 0)."""
    def refuse(msg):
        raise SystemExit(f"injection.py: {msg}")

    for name in ("questions", "samples", "batch", "epochs"):
        v, low = getattr(args, name), 0 if name == "epochs" else 1
        if v is not None and v < low:
            refuse(f"--{name} {v}: give an integer >= {low}")
    bad = [x for x in args.layers if not x.isdigit()]  # "last" is always measured: the stages' own adapter
    if bad or len(set(map(int, args.layers))) < len(args.layers):
        refuse(f"--layers {' '.join(args.layers)}: give distinct decoder layers, integers >= 0 (0: the input "
               f"embeddings; the last hidden state is always measured)")
    if args.append and not args.out:
        refuse("--append needs --out (the result to add rows to)")
    if not Path(args.run_dir).is_dir():
        refuse(f"--run-dir {args.run_dir}: no such directory (run the profile's pretraining stage there first)")
    try:
        cfg = load_config(args.profile, [*args.override, f"run_dir={args.run_dir}"])
    except ValueError as e:  # ConfigError: an unknown key, a bad value, a key given twice
        refuse(str(e))
    if args.questions is not None and args.questions > cfg.data.n_test:
        refuse(f"--questions {args.questions}: more than the profile's data.n_test = {cfg.data.n_test} test questions "
               f"(raise it with -o data.n_test={args.questions})")
    return cfg


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--run-dir", default="runs/demo")
    ap.add_argument("--profile", default="demo")
    ap.add_argument("-o", "--override", action="append", default=[])
    ap.add_argument("--layers", nargs="+", default=["20"], help="decoder layers whose output is rewritten (0: input embeddings)")
    ap.add_argument("--epochs", type=int, default=None, help="at most (default pretrain.epochs)")
    ap.add_argument("--batch", type=int, default=8, help="chains per Adam step")
    ap.add_argument("--questions", type=int, default=None, help="test questions for steering (default data.n_test)")
    ap.add_argument("--samples", type=int, default=None, help="samples per question (default grid.n_samples)")
    ap.add_argument("--out", default=None)
    ap.add_argument("--append", action="store_true",
                    help="keep the rows already in --out (same run directory and sizes; the Base row must come out equal) "
                         "and skip the last-hidden row when it is there")
    args = ap.parse_args(argv)
    cfg = check_args(args)  # every argument, before any work: one line each, never a traceback
    torch.set_num_threads(max(1, torch.get_num_threads()))
    bb = load_backbone(cfg.backbone.name, device="cpu", dtype="float32")
    n_layers = bb.model.config.num_hidden_layers
    if any(int(x) > n_layers for x in args.layers):
        raise SystemExit(f"injection.py: --layers {' '.join(args.layers)}: {cfg.backbone.name} has decoder layers 0..{n_layers}")
    for p in bb.model.parameters():
        p.requires_grad_(False)
    model = load_pretrained(cfg, bb)
    data = StepData.load(pretrain_stages(cfg))
    tok = bb.tokenizer
    pad = tok.pad_token_id or 0
    train_items, held_items = chains(cfg, data, tok, "train"), chains(cfg, data, tok, "heldout")
    post, centroids, K = data.post.float(), model.centroids.float(), model.centroids.shape[0]
    prompts = PromptCache(bb.model)
    problems = problems_from_config(cfg, "test")[: args.questions or cfg.data.n_test]
    n = args.samples or cfg.grid.n_samples
    import subprocess

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    res = {"machine": machine(), "commit": commit or "?", "n_layers": bb.model.config.num_hidden_layers, "n_states": K,
           "profile": args.profile, "overrides": args.override, "run_dir": args.run_dir,
           "train_chains": len(train_items), "heldout_chains": len(held_items), "questions": len(problems),
           "samples_per_question": n, "epsilon": cfg.grid.epsilons[0] if cfg.grid.epsilons else 0.1, "rows": {}}
    t = time.perf_counter()
    base_states, res["base"] = base_row(cfg, bb, model, problems, n, cfg.seed)
    res["base"]["seconds"] = time.perf_counter() - t
    print(json.dumps({"base": res["base"]}), flush=True)
    if args.append and args.out and Path(args.out).exists():
        old = json.loads(Path(args.out).read_text())
        same = ("run_dir", "overrides", "questions", "samples_per_question", "n_states")
        if any(old.get(k) != res[k] for k in same) or \
                any(old["base"][k] != res["base"][k] for k in ("pass1", "succ", "samples")):
            raise SystemExit(f"--append: {args.out} was measured on another run, size or Base sample; not merged")
        res["rows"] = {k: v for k, v in old["rows"].items() if k not in args.layers}
    for layer in [*(["last"] if "last" not in res["rows"] else []), *args.layers]:
        t = time.perf_counter()
        if layer == "last":  # the stages' adapter, trained on the cached last hidden states
            adapter = model.adapter
            inj = Injection(target_module(bb.model, "last"), adapter)
            fit = {"source": "the run's pretraining stage (last_hidden)"}
        else:
            adapter, inj, fit = train(cfg, bb.model, layer, train_items, held_items, post, centroids, pad, prompts,
                                      cfg.pretrain.epochs if args.epochs is None else args.epochs, args.batch, cfg.seed)
        row = {"fit": fit, "controls": controls(bb.model, inj, held_items, post, adapter, centroids, pad, prompts, K,
                                                cfg.seed)}
        row["steering"] = steering(cfg, bb, model, problems, adapter, inj, base_states, n, cfg.seed)
        row["seconds"] = time.perf_counter() - t
        inj.remove()
        res["rows"][str(layer)] = row
        print(json.dumps({"layer": layer, "controls": row["controls"]["gain_over_backbone"],
                          "steering": row["steering"]}, default=float), flush=True)
    if args.out:
        write_result(res, args.out)
    return res


if __name__ == "__main__":
    main()
