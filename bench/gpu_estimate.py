"""How many GPU hours the ``paper`` profile needs: rates measured on a GPU, turned into a budget.

No weights are downloaded. The two backbones of the paper are built with random weights from their
transformers configs, in bf16 on CUDA:

- Qwen2.5-3B-Instruct shape: Qwen2Config, hidden 2048, MLP 11008, 36 layers, 16 heads / 2 KV heads,
  vocabulary 151936, tied embeddings, rope_theta 1e6;
- Llama-3.2-3B-Instruct shape: LlamaConfig, hidden 3072, MLP 8192, 28 layers, 24 heads / 8 KV heads,
  vocabulary 128256, tied embeddings (rope scaling left out: it does not change the cost).

Tokenizer: the embedded SmolLM2 tokenizer (49152 tokens), from a saved directory (``--tokenizer``)
or from ``ctrls.backbone.load_backbone("smollm2-135m-instruct")``. The models keep their real
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
   model's own limit, for comparison.
2. pretraining stages (b)-(f) of ``ctrls.pretrain`` run for real (``cache_features``,
   ``compute_spectral``, ``cluster_states``, ``fit_transition_model``, ``train_adapter``) on
   ``--pretrain-questions`` synthetic questions x 8 kept CoTs of ``--pretrain-tokens`` tokens, in a
   temporary run directory; one adapter epoch = time(epochs=1) - time(epochs=0).
   Stages (d) and (e)'s fits (k-means, the transition fit) do not cost in proportion to the steps,
   so they are also timed at the profile's full step count on random data (``--cpu-full``, on by
   default; ``cpu_fits_full``).
3. peak GPU memory of each measurement.

Estimate: the work counts of the profile (``ctrls/profiles/paper.yaml``, overridable with
``-o key=value``) times the measured seconds. A batch of the sampler runs until its longest row is
done, and on these models one decode iteration costs about the same at any batch size (measured:
compare the batch-160 and batch-8 seconds per iteration), so two bounds are given:
- "mean": every batch decodes the assumed mean CoT length (optimistic);
- "cap": every batch decodes max_new_tokens (512; one rambling sample in a batch suffices).
Multi-GPU (``--gpus``, default 8; ``accelerate launch --multi_gpu --num_processes N -m ctrls
stage ...``): the estimate is redone with the work sharded as ``ctrls.distributed`` shards it
(collect by training question, exploration / RL evaluation / Table 2 by test question, an RL step
by trajectory slot; pretraining (b)-(f) on rank 0 alone), next to plain linear scaling (1 GPU / N).
Assumed, not measured: mean CoT length (GSM8K 250, MATH 450 tokens), steps per CoT (GSM8K 8,
MATH 12), acceptance rate of sampled CoTs in pretraining (all kept: upper bound), the RL group's
longest CoT (the same two bounds). Not counted: the rubric judge (API-bound, no GPU), model
loading, answer grading, notebook and plot time. Pretraining stages (c)-(e) run on the CPU while
the GPU waits; they are counted as wall time on the GPU machine.

    python bench/gpu_estimate.py                       # measure (CUDA) and estimate
    python bench/gpu_estimate.py --new 256 --new-rl 128  # fewer tokens per run, extrapolated
    python bench/gpu_estimate.py --from-json bench/results/gpu_estimate_h100.json -o rl.eval_questions=100
    python bench/gpu_estimate.py --from-json a.json b.json --out merged.json   # merge runs (e.g. one per backbone)
    python bench/gpu_estimate.py --tiny --device cpu --dtype float32 --out /tmp/gpu_tiny.json
        # a check of the script on a CPU (~2 min on 2 cores): 2-layer models with the tokenizer's
        # vocabulary, 16 tokens per run, 2 synthetic questions; its numbers mean nothing

Without a GPU, ``--analytic`` computes the hours instead of measuring them (a few minutes on a CPU,
one thread; see the comment above ``H100_SXM`` for the model). Per backbone shape, one decode iteration
on one H100 SXM costs max(bandwidth floor, compute floor, launch bound) + host-serial time, from:
- the shape: parameters counted on the ``meta`` device, bf16 weights, KV bytes per token;
- declared constants: the H100 SXM datasheet's 3.35 TB/s and 989 dense bf16 TFLOP/s, each times an
  efficiency (``--bw-efficiency``, ``--flops-efficiency``, 0.7), and a host overhead per kernel-launching
  op (``--per-op-us`` 10, range 6-20: assumed, not measured);
- aten ops per decode iteration, counted on this CPU (``TorchDispatchMode``) on 2-layer models of the
  real width in bf16, our sampler (Base, CTRLS) and HF ``generate``, scaled to the real depth;
- the sampler's host-serial loop over the rows after each token, timed on this CPU at the real batches;
- the CPU stages (c)-(e), timed here at ``--cpu-probe-steps`` steps and scaled linearly.
The per-iteration times go through ``estimate`` like a measured run's timeline. ``--md`` writes the book
section rendered from the JSON; ``--from-json`` recomputes with other constants without measuring:

    python bench/gpu_estimate.py --analytic --out bench/results/gpu_estimate_analytic.json \
        --md book/_includes/gpu_estimate_h100.md
    python bench/gpu_estimate.py --analytic --from-json bench/results/gpu_estimate_analytic.json --per-op-us 15 \
        --out /tmp/other.json
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

SHAPES = {
    "Qwen/Qwen2.5-3B-Instruct": dict(arch="qwen2", hidden_size=2048, intermediate_size=11008, num_hidden_layers=36,
                                      num_attention_heads=16, num_key_value_heads=2, vocab_size=151936,
                                      rope_theta=1e6, max_position_embeddings=32768),
    "meta-llama/Llama-3.2-3B-Instruct": dict(arch="llama", hidden_size=3072, intermediate_size=8192,
                                             num_hidden_layers=28, num_attention_heads=24, num_key_value_heads=8,
                                             vocab_size=128256, rope_theta=5e5, max_position_embeddings=131072),
}
TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)

QUESTIONS = [
    "A farmer has 17 sheep and buys 3 times as many goats. How many animals does he have?",
    "A book costs $12 and a pen costs $3. How much do 4 books and 5 pens cost?",
    "Sam reads 25 pages a day. How many days does he need for a 300-page book?",
    "A tank holds 120 liters and leaks 4 liters an hour. How much is left after 9 hours?",
    "Lena has 48 stickers and gives a quarter of them to her brother. How many does she keep?",
    "A bus carries 42 people. 15 get off and 9 get on. How many people are on the bus now?",
    "A shirt costs $25 and is on sale for 20% off. What is the sale price?",
    "Tom runs 3 km every weekday and 5 km each weekend day. How far does he run in a week?",
]

# assumptions (not measured), per dataset
MEAN_TOKENS = {"gsm8k": 250, "math": 450}
STEPS_PER_COT = {"gsm8k": 8, "math": 12}
ACCEPTANCE = {"gsm8k": 1.0, "math": 1.0}  # fraction of sampled CoTs kept for pretraining (1.0: upper bound)


# ---- helpers --------------------------------------------------------------------------------------


def sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


@contextlib.contextmanager
def measured(dev: torch.device, rec: dict):
    """Wall seconds and peak GPU memory (GiB) of the block, into ``rec``."""
    if dev.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(dev)
    sync(dev)
    t = time.perf_counter()
    yield rec
    sync(dev)
    rec["seconds"] = time.perf_counter() - t
    if dev.type == "cuda":
        rec["peak_gib"] = torch.cuda.max_memory_allocated(dev) / 2**30


def guarded(results: dict, key: str, fn, *args, **kwargs):
    """Run a measurement; on an error keep going and record the traceback under ``key``."""
    try:
        results[key] = fn(*args, **kwargs)
    except Exception as e:  # noqa: BLE001 - a benchmark reports every failure and goes on
        results[key] = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}
        print(f"  !! {key} failed: {type(e).__name__}: {e}\n{traceback.format_exc()}", flush=True)
    return results[key]


def load_tokenizer(path: str | None):
    from transformers import AutoTokenizer

    if path and Path(path).exists():
        tok = AutoTokenizer.from_pretrained(path)
    else:
        from ctrls.backbone import load_backbone

        tok = load_backbone("smollm2-135m-instruct", device="cpu").tokenizer
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


def backbone_config(name: str, tok=None, tiny: bool = False, **changes):
    """The transformers config of the backbone's shape (``SHAPES``); ``tiny``: small layers and the
    tokenizer's vocabulary (a check of the script); ``changes`` override entries (e.g. the depth)."""
    from transformers import LlamaConfig, Qwen2Config

    shape = dict(SHAPES[name])
    arch = shape.pop("arch")
    if tiny:
        shape.update(TINY, vocab_size=len(tok))
    shape.update(changes)
    ids = {} if tok is None else dict(eos_token_id=tok.eos_token_id, bos_token_id=tok.bos_token_id,
                                      pad_token_id=tok.pad_token_id)
    return {"qwen2": Qwen2Config, "llama": LlamaConfig}[arch](**shape, tie_word_embeddings=True, **ids)


def build_backbone(name: str, tok, dev: torch.device, dtype: torch.dtype, tiny: bool, **changes):
    """A random-weight model of the backbone's shape, frozen, with a (zero) bias on the LM head."""
    from transformers import AutoModelForCausalLM

    from ctrls.backbone import freeze

    cfg = backbone_config(name, tok, tiny, **changes)
    torch.manual_seed(0)
    with torch.device(dev):
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    model.eval()
    old = model.get_output_embeddings()
    head = torch.nn.Linear(old.in_features, old.out_features, bias=True, device=dev, dtype=dtype)
    head.weight = old.weight  # still tied to the input embeddings
    torch.nn.init.zeros_(head.bias)
    model.set_output_embeddings(head)
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight
    return freeze(model, tok, name)


@torch.no_grad()
def calibrate_newline_bias(bb, prompts, step_tokens: float, temperature: float = 0.7, top_k: int = 50) -> dict:
    """Set the LM-head bias on newline ids so that P(newline) is about 1 / step_tokens per token."""
    from ctrls.prompts import newline_token_ids
    from ctrls.backbone import decoder_body

    head, dev = bb.lm_head, bb.device
    V = head.out_features
    nl = torch.zeros(V, dtype=torch.bool, device=dev)
    nl[[i for i in newline_token_ids(bb.tokenizer) if i < V]] = True
    hs = [decoder_body(bb.model)(input_ids=torch.as_tensor([p], device=dev)).last_hidden_state[0] for p in prompts[:2]]
    h = torch.cat(hs)[:: max(1, sum(len(x) for x in hs) // 512)][:512]
    logits = torch.cat([head(h[a:a + 128]).float() for a in range(0, len(h), 128)])
    target = 1.0 / step_tokens

    def p_newline(b: float) -> float:
        v, i = (logits + b * nl).topk(top_k, dim=-1)
        return float(((v / temperature).softmax(-1) * nl[i]).sum(-1).mean())

    lo, hi = 0.0, 1.0
    while p_newline(hi) < target and hi < 1e4:
        hi *= 2
    for _ in range(40):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if p_newline(mid) < target else (lo, mid)
    b = (lo + hi) / 2
    head.bias[nl] = b
    return {"bias": b, "target_newline_rate": target, "calibrated_rate": p_newline(b), "newline_ids": int(nl.sum())}


def random_ctrls(bb, K: int = 64, k: int = 4, rank: int = 64):
    from ctrls.model import CTRLSConfig, CTRLSModel

    torch.manual_seed(0)
    d = bb.hidden_size
    conf = CTRLSConfig(hidden_size=d, n_states=K, requested_states=K, spectral_k=k, spectral_normalize=True,
                       tau=50.0, rank=rank)
    m = CTRLSModel.build(conf, torch.randn(K, k * d), L=torch.randn(K, K))
    torch.nn.init.normal_(m.adapter.up.weight, std=0.01)
    return m.to(bb.device)


@contextlib.contextmanager
def timeline(bb):
    """Seconds from the block's start to the end of every forward of the decoder body (synchronised):
    entry 0 is the prefill, entry i the i-th decode iteration. The sampler and HF ``generate`` both
    synchronise with the host every iteration anyway, so the extra synchronisation costs ~nothing."""
    from ctrls.backbone import decoder_body

    marks: list[float] = []
    t0 = time.perf_counter()

    def hook(module, inputs, output):
        sync(bb.device)
        marks.append(time.perf_counter() - t0)

    handle = decoder_body(bb.model).register_forward_hook(hook)
    try:
        yield marks
    finally:
        handle.remove()


def timed_fields(rec: dict, marks: list[float], new: int) -> dict:
    """Per-iteration fields of a decode run of ``new`` tokens per row, from its body timeline."""
    rec["t_body"] = [round(x, 5) for x in marks]
    rec["prefill_s"] = marks[0] if marks else None
    n_dec = len(marks) - 1
    rec["s_per_iteration"] = rec["seconds"] / new  # prefill included (the old definition)
    if n_dec >= 1:
        rec["decode_s_per_iteration"] = (marks[-1] - marks[0]) / n_dec
        q = max(1, n_dec // 4)
        rec["decode_s_per_iteration_first_quarter"] = (marks[q] - marks[0]) / q
        rec["decode_s_per_iteration_last_quarter"] = (marks[-1] - marks[-1 - q]) / q
    return rec


def seconds_at(rec: dict, length: float) -> float:
    """Seconds one batch of the measured shape takes to decode ``length`` tokens per row, prefill
    included: read off the run's body timeline (token L is sampled after decode forward L-1) where
    length <= the tokens measured, else extrapolated with the slope of the run's last quarter (the
    KV cache, and so the cost of an iteration, grows with the context)."""
    t, total, new = rec.get("t_body"), rec["seconds"], rec["new_tokens"]
    if not t or len(t) < 2:
        return total * length / new
    tail = max(total - t[-1], 0.0)  # the last token's sampling and the bookkeeping after the last forward
    n_dec = len(t) - 1
    i = max(int(math.ceil(length)) - 1, 0)
    if i <= n_dec:
        return t[i] + tail
    q = max(1, n_dec // 4)
    slope = (t[-1] - t[-1 - q]) / q
    return t[-1] + tail + (length - 1 - n_dec) * slope


def decode_ours(bb, prompts, starts, n: int, new: int, model=None, epsilon: float = 0.1) -> dict:
    from ctrls.prompts import newline_token_ids
    from ctrls.sampling import SampleParams, sample

    p = SampleParams(temperature=0.7, top_k=50, max_new_tokens=new, max_steps=10**6, stop_at_answer=False,
                     ignore_eos=True, batch_size=len(prompts) * n, epsilon=epsilon)
    rec: dict = {"rows": len(prompts) * n, "new_tokens": new}
    with measured(bb.device, rec), timeline(bb) as marks:
        # one seed per prompt, as the pipeline passes them (collect, exploration, RL)
        gens = sample(bb, prompts, n, p, model=model, seeds=list(range(len(prompts))), prompt_starts=starts)
    flat = [g for gs in gens for g in gs]
    nl = newline_token_ids(bb.tokenizer)
    tokens = sum(g.n_tokens for g in flat)
    timed_fields(rec, marks, new)
    rec.update(tokens=tokens, tokens_per_s=tokens / rec["seconds"],
               steps_per_cot=sum(len(g.spans) for g in flat) / len(flat),
               newline_rate=sum(t in nl for g in flat for t in g.token_ids) / max(tokens, 1),
               all_full_length=all(g.n_tokens == new for g in flat),
               finishes=sorted({g.finish for g in flat}))
    if model is not None:
        ok = [g.states is not None and g.states.shape == (len(g.spans) + 1, model.config.n_states) for g in flat]
        rec["states_ok"] = all(ok)
        rec["states_finite"] = all(bool(torch.isfinite(g.states).all()) for g in flat if g.states is not None)
    return rec


def decode_hf(bb, prompts, n: int, new: int) -> dict:
    tok = bb.tokenizer
    tok.padding_side = "left"
    enc = tok.pad({"input_ids": [list(p) for p in prompts]}, return_tensors="pt").to(bb.device)
    rec: dict = {"rows": len(prompts) * n, "new_tokens": new}
    with measured(bb.device, rec), timeline(bb) as marks:
        out = bb.model.generate(**enc, max_new_tokens=new, min_new_tokens=new, do_sample=True, top_k=50,
                                temperature=0.7, num_return_sequences=n, pad_token_id=tok.pad_token_id)
    gen = out.shape[1] - enc["input_ids"].shape[1]
    tokens = out.shape[0] * gen
    timed_fields(rec, marks, new)
    rec.update(tokens=tokens, tokens_per_s=tokens / rec["seconds"], all_full_length=gen == new)
    return rec


@torch.no_grad()
def forward_floor(bb, prompts, n: int, iters: int) -> dict:
    """Seconds per decode iteration of the bare model: body + LM head + top-k on the sampler's cache,
    with no sampling bookkeeping and no host synchronisation (the eager model's own limit)."""
    from ctrls.backbone import decoder_body
    from ctrls.sampling import new_cache

    dev, body, head = bb.device, decoder_body(bb.model), bb.lm_head
    width = max(len(p) for p in prompts)
    ids = torch.zeros((len(prompts), width), dtype=torch.long)
    attn = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.as_tensor(list(p))
        attn[i, width - len(p):] = 1
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    rec: dict = {"rows": len(prompts) * n, "iterations": iters}
    with measured(dev, rec):
        cache = new_cache(bb.model, width + iters + 1)
        h = body(input_ids=ids.to(dev), attention_mask=attn.to(dev), position_ids=pos.to(dev), past_key_values=cache,
                 use_cache=True).last_hidden_state
        expand = torch.arange(len(prompts)).repeat_interleave(n)
        cache.batch_select_indices(expand.to(dev))
        attn, next_pos, h_last = attn[expand].to(dev), pos[expand, -1].to(dev) + 1, h[expand.to(dev), -1]
        sync(dev)
        t = time.perf_counter()
        for _ in range(iters):
            nxt = head(h_last[:, None])[:, 0].topk(50, dim=-1).indices[:, 0]
            attn = torch.cat([attn, attn.new_ones((attn.shape[0], 1))], dim=1)
            h_last = body(input_ids=nxt[:, None], attention_mask=attn, position_ids=next_pos[:, None],
                          past_key_values=cache, use_cache=True).last_hidden_state[:, -1]
            next_pos = next_pos + 1
        sync(dev)
        rec["s_per_iteration"] = (time.perf_counter() - t) / iters
    return rec


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
    from ctrls.data import Problem
    from ctrls.prompts import newline_token_ids
    from ctrls.runs import append_jsonl

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
    from ctrls.config import override
    from ctrls.stages.collect import cache_features
    from ctrls.stages.pretrain import cluster_states, compute_spectral, fit_transition_model, train_adapter
    from ctrls.prompts import encode_prompt

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
    from ctrls.policy import fit_transitions
    from ctrls.states import fit_states

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
                    smoothing=cfg.policy.count_smoothing)
    res["fit_transitions_seconds"] = time.perf_counter() - t
    return res


# ---- measurement -------------------------------------------------------------------------------


def measure_backbone(name: str, args, tok, dev, dtype, cfg, res: dict, save) -> dict:
    """Every measurement of one backbone into ``res``; ``save()`` after each."""
    from ctrls.prompts import encode_prompt

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
    # warm-up (kernels, cuBLAS handles, allocator)
    decode_ours(bb, big_p[:2], big_s[:2], 2, 4)
    decode_ours(bb, big_p[:2], big_s[:2], 2, 4, model=model)
    if not args.skip_hf:
        decode_hf(bb, big_p[:2], 2, 4)
    runs = [("base_b160", lambda: decode_ours(bb, big_p, big_s, n, args.new)),
            ("ctrls_b160", lambda: decode_ours(bb, big_p, big_s, n, args.new, model=model)),
            ("base_rl", lambda: decode_ours(bb, prompts[:1], starts[:1], G, args.new_rl)),
            ("ctrls_rl", lambda: decode_ours(bb, prompts[:1], starts[:1], G, args.new_rl, model=model)),
            ("floor_b160", lambda: forward_floor(bb, big_p, n, args.floor_iters)),
            ("floor_rl", lambda: forward_floor(bb, prompts[:1], G, args.floor_iters))]
    if not args.skip_hf:
        runs.append(("hf_rl", lambda: decode_hf(bb, prompts[:1], G, args.new_rl)))
        runs.append(("hf_b160", lambda: decode_hf(bb, big_p, n, args.new)))
    for key, fn in runs:
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
    r = guarded(res, "pretrain", pretrain_stages, bb, cfg, args.pretrain_questions, args.pretrain_tokens,
                args.pretrain_steps)
    save()
    if "error" not in r:
        print(f"  features {r['features']['tokens_per_s']:.0f} forward tok/s; spectral {r['spectral']['seconds']:.1f} s, "
              f"states {r['states']['seconds']:.1f} s, transitions {r['transitions']['seconds']:.1f} s "
              f"for {r['spectral']['steps']} steps; adapter: eval pass {r['adapter_eval_tokens_per_s']:.0f} tok/s, "
              f"train epoch {r['adapter_train_tokens_per_s']:.0f} tok/s", flush=True)
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
    env["sampling_py_sha256"] = hashlib.sha256((ROOT / "ctrls" / "sampling.py").read_bytes()).hexdigest()[:16]
    return env


# ---- estimate ---------------------------------------------------------------------------------


def rl_runs(cfg) -> int:
    """Distinct RL trainings per pair, as ``rl.run_rl`` dedups them (a Table 2 row equal to a curve
    setting reuses its run)."""
    from ctrls.settings import parse_setting

    runs = set()
    for s in cfg.rl.settings:
        st = parse_setting(s, cfg)
        runs |= {(st.epsilon, st.alpha, seed) for seed in cfg.rl.seeds}
    for s in cfg.rl.table2:
        st = parse_setting(s, cfg)
        runs.add((st.epsilon, st.alpha, cfg.rl.seeds[0]))
    return len(runs)


def estimate(cfg, measured_: dict, mean_tokens: dict, steps_per_cot: dict, acceptance: dict, world: int = 1) -> dict:
    """Hours per stage and pair, with the 'mean' and 'cap' bounds (module docstring).

    ``world`` data-parallel processes (``accelerate launch --multi_gpu --num_processes N``), sharded as
    ``ctrls.distributed`` shards them: collect by training question, exploration, RL evaluation and
    Table 2 by test question, an RL step by trajectory slot; pretraining stages (b)-(f) run on rank 0
    alone. A stage's wall time is its largest shard's batches x the seconds of one batch; a batch with
    fewer rows is charged the measured batch's seconds (one iteration costs about the same at any
    batch size: an upper bound). ``stages_hours`` is wall-clock hours; GPU-hours are ``world`` times
    that (``total_gpu_hours``)."""
    B, cap = cfg.sampling.batch_size, cfg.sampling.max_new_tokens
    n_evals = 1 + cfg.rl.steps // cfg.rl.eval_every + (1 if cfg.rl.steps % cfg.rl.eval_every else 0)
    runs = rl_runs(cfg)
    shard = lambda n: -(-n // world)  # noqa: E731 - the largest block of World.shard
    rows, disk, seq_hours = [], {}, {}
    for bname, ds in cfg.pairs():
        m = measured_["backbones"].get(bname)
        if m is None:
            raise KeyError(f"no measurement for backbone {bname!r}")
        runs_m = {k: m[k] for k in ("base_b160", "ctrls_b160", "ctrls_rl", "ctrls_lockstep") if k in m}
        pt = m["pretrain"]
        L = mean_tokens[ds]
        kept = cfg.data.n_train * cfg.pretrain.samples_per_question * acceptance[ds]
        steps = kept * min(steps_per_cot[ds], cfg.prompt.max_steps)
        prompt_tokens = sum(m["prompt_tokens"]) / len(m["prompt_tokens"])
        pt_steps = pt["spectral"]["steps"]
        batches = lambda questions, n: math.ceil(shard(questions) / max(1, B // n))  # noqa: E731
        test_q = cfg.data.n_test
        eval_q = min(cfg.rl.eval_questions, test_q)  # rl.run_rl evaluates the first min(eval_questions, n_test)

        def sampling(label, kind, n_batches, detail):
            for bound, length in (("mean", L), ("cap", cap)):
                rows.append({"backbone": bname, "dataset": ds, "stage": label, "bound": bound,
                             "seconds": n_batches * seconds_at(runs_m[kind], length),
                             "batch_seconds": seconds_at(runs_m[kind], length), "batches": n_batches,
                             "tokens_per_row": length, "detail": detail})

        def fixed(label, seconds, detail):
            for bound in ("mean", "cap"):
                rows.append({"backbone": bname, "dataset": ds, "stage": label, "bound": bound, "seconds": seconds,
                             "detail": detail})

        per = f" per rank ({world} ranks)" if world > 1 else ""
        nb = batches(cfg.data.n_train, cfg.pretrain.samples_per_question)
        sampling("pretrain (a) collect", "base_b160", nb,
                 f"{cfg.data.n_train} q x {cfg.pretrain.samples_per_question} CoTs: {nb} batches{per}, Base")
        rank0 = " (rank 0 alone)" if world > 1 else ""
        fixed("pretrain (b) features", kept * (prompt_tokens + L) / pt["features"]["tokens_per_s"],
              f"{kept:.0f} kept CoTs x {prompt_tokens + L:.0f} tokens, one forward{rank0}")
        full = m.get("cpu_fits_full")
        if full and "error" not in full:
            # spectral and the states stage's I/O linear in the steps; k-means and the transition fit at full
            # size (measured at the largest dataset's step count, scaled down linearly: an upper bound)
            # (--analytic times the fits at a reduced size, "scaled_linearly": scaled up as well as down)
            scale = steps / full["steps"] if full.get("scaled_linearly") else min(1.0, steps / full["steps"])
            cpu_s = ((pt["spectral"]["seconds"] + pt["states"]["seconds"]) * steps / pt_steps + pt["transitions"]["seconds"]
                     + (full["fit_states_seconds"] + full["fit_transitions_seconds"]) * scale)
            how = (f"{steps:.0f} steps: (c) and (d) scaled linearly, k-means and L fit "
                   + ("timed at" if full.get("scaled_linearly") else "measured at") + f" {full['steps']} steps"
                   + (" and scaled linearly" if full.get("scaled_linearly") else ""))
        else:  # the transition fit is mostly its fixed 300 Adam steps: not scaled
            cpu_s = (pt["spectral"]["seconds"] + pt["states"]["seconds"]) * steps / pt_steps + pt["transitions"]["seconds"]
            how = f"{steps:.0f} steps: (c) and (d) scaled linearly, (e) as measured"
        fixed("pretrain (c-e) spectral, states, transitions (CPU)", cpu_s, how + rank0)
        tok = kept * L
        per_token = pt["features"]["disk_bytes"] / (pt["trajectories"] * (pt["cot_tokens"] + 1))
        disk[f"{bname} / {ds}"] = kept * (L + 1) * per_token / 2**30
        n_eval = len({*range(0, cfg.pretrain.epochs + 1, cfg.pretrain.bound_every), cfg.pretrain.epochs})
        fixed("pretrain (f) adapter", n_eval * tok / pt["adapter_eval_tokens_per_s"]
              + cfg.pretrain.epochs * tok / pt["adapter_train_tokens_per_s"],
              f"{cfg.pretrain.epochs} epochs + {n_eval} bound evaluations over {tok / 1e6:.1f} M tokens{rank0}")
        rows_cfg = 1 + len(cfg.grid.epsilons)
        nb = batches(test_q, cfg.grid.n_samples)
        T = len(cfg.grid.temperatures)
        sampling("exploration Base", "base_b160", T * nb,
                 f"{T} eta x {test_q} q x {cfg.grid.n_samples}: {T * nb} batches{per}")
        sampling("exploration CTRLS", "ctrls_b160", T * (rows_cfg - 1) * nb,
                 f"{T} eta x {rows_cfg - 1} eps x {test_q} q x {cfg.grid.n_samples}: "
                 f"{T * (rows_cfg - 1) * nb} batches{per}")
        G = cfg.rl.questions_per_step * cfg.rl.group_size
        for bound, length in (("mean", L), ("cap", cap)):  # for comparison: one run after another
            seq_hours.setdefault(bound, 0.0)
            seq_hours[bound] += runs * cfg.rl.steps * seconds_at(runs_m["ctrls_rl"], length) / 3600
        if "ctrls_lockstep" in runs_m:  # lockstep: every run's step in one decode batch
            sampling("RL training", "ctrls_lockstep", cfg.rl.steps,
                     f"{cfg.rl.steps} lockstep steps, each one batch of {runs} runs x {G} trajectories "
                     f"({shard(runs * G)} rows{per})")
        else:
            sampling("RL training", "ctrls_rl", runs * cfg.rl.steps,
                     f"{runs} runs x {cfg.rl.steps} steps, {shard(G)} of the step's {G} trajectories{per}")
        nb = batches(eval_q, cfg.rl.eval_samples)
        sampling("RL evaluation", "ctrls_b160", runs * n_evals * nb,
                 f"{runs} runs x {n_evals} evals x {eval_q} q x {cfg.rl.eval_samples}: {nb} batches each{per}")
        nb = batches(test_q, cfg.grid.n_samples)
        sampling("RL Table 2 samples", "ctrls_b160", len(cfg.rl.table2) * nb,
                 f"{len(cfg.rl.table2)} policies x {test_q} q x {cfg.grid.n_samples}: {nb} batches each{per}")
    stages: dict[str, dict[str, float]] = {}
    pairs: dict[str, dict[str, float]] = {}
    for r in rows:
        stages.setdefault(r["stage"], {"mean": 0.0, "cap": 0.0})[r["bound"]] += r["seconds"] / 3600
        pairs.setdefault(f"{r['backbone']} / {r['dataset']}", {"mean": 0.0, "cap": 0.0})[r["bound"]] += r["seconds"] / 3600
    total = {b: sum(s[b] for s in stages.values()) for b in ("mean", "cap")}
    return {"world_size": world, "rows": rows, "stages_hours": stages, "pairs_hours": pairs, "total_hours": total,
            "total_gpu_hours": {b: world * h for b, h in total.items()},
            "rl_runs_per_pair": runs, "rl_evals_per_run": n_evals, "rl_eval_questions_used": eval_q,
            "rl_lockstep": all("ctrls_lockstep" in measured_["backbones"][b] for b, _ in cfg.pairs()),
            "rl_training_sequential_hours": seq_hours,
            "features_disk_gib": disk,
            "assumptions": {"mean_tokens": mean_tokens, "steps_per_cot": steps_per_cot, "acceptance": acceptance,
                            "cap_tokens": cap, "judge": "excluded (API-bound)"}}


def print_estimate(est: dict) -> None:
    W = est["world_size"]
    what = "GPU hours on one GPU" if W == 1 else f"wall-clock hours on {W} GPUs (data parallel, sharded as ctrls does)"
    print(f"\n{what} (mean: batches decode the assumed mean CoT length; cap: max_new_tokens)")
    w = max(len(s) for s in est["stages_hours"])
    print(f"  {'stage':{w}s}  {'mean':>8s}  {'cap':>8s}")
    for s, h in est["stages_hours"].items():
        print(f"  {s:{w}s}  {h['mean']:8.1f}  {h['cap']:8.1f}")
    print(f"  {'total':{w}s}  {est['total_hours']['mean']:8.1f}  {est['total_hours']['cap']:8.1f}")
    if W > 1:
        print(f"  {'GPU-hours (x ' + str(W) + ')':{w}s}  {est['total_gpu_hours']['mean']:8.1f}  "
              f"{est['total_gpu_hours']['cap']:8.1f}")
        if "linear_wall_hours" in est:
            print(f"  {'linear scaling (1 GPU / ' + str(W) + ')':{w}s}  {est['linear_wall_hours']['mean']:8.1f}  "
                  f"{est['linear_wall_hours']['cap']:8.1f}")
        return
    print("  per pair:")
    for p, h in est["pairs_hours"].items():
        print(f"    {p:{w - 2}s}  {h['mean']:8.1f}  {h['cap']:8.1f}")
    print(f"  RL: {est['rl_runs_per_pair']} runs per pair, {est['rl_evals_per_run']} evaluations per run on "
          f"{est['rl_eval_questions_used']} questions; judge excluded (API-bound)")


# ---- analytic estimate (no GPU) -----------------------------------------------------------------
#
# ``--analytic``: GPU hours computed, not measured, for when no GPU is at hand. Per backbone shape and
# decode iteration, on one H100 SXM:
#   time = max(bandwidth floor, compute floor, launch bound) + host-serial time
# - bandwidth floor: bytes read per iteration (bf16 weights, the KV cache of the batch at the current
#   context, the logits) / (declared HBM bandwidth x efficiency);
# - compute floor: 2 x parameters x batch + attention FLOPs / (declared dense bf16 FLOP/s x efficiency);
# - launch bound: the kernel-launching aten ops of one decode iteration (counted on this CPU on a 2-layer
#   model of the real width, scaled to the real depth) x a declared per-op host overhead (eager PyTorch
#   launches while the GPU runs, so this overlaps with the GPU time: hence the max);
# - host-serial time: our sampler copies the sampled tokens to the host (a synchronisation) and runs a
#   Python loop over the rows before it launches the next forward; the GPU idles meanwhile. Measured on
#   this CPU at the real batch (a model of tiny width: the loop does not depend on it), plus the state
#   redraws' ops x the per-op overhead for CTRLS. HF ``generate`` has no such loop (0).
# The prefill: max(compute, bandwidth, launch) over the distinct prompts (our sampler shares the prefix,
# then copies the cache to every row); HF ``generate`` prefills every row.
# The work counts and the hours come from ``estimate`` unchanged: the analytic per-iteration times are
# laid out as the timeline of a measured run (``t_body``), so ``seconds_at`` reads them as it reads a run.

# Declared, not measured here: NVIDIA H100 Tensor Core GPU datasheet, H100 SXM column.
H100_SXM = {"gpu": "NVIDIA H100 SXM (80 GB HBM3)", "hbm_bytes_per_s": 3.35e12, "bf16_dense_flops_per_s": 989e12,
            "source": "NVIDIA H100 Tensor Core GPU datasheet, H100 SXM: GPU memory bandwidth 3.35 TB/s; BF16 Tensor "
                      "Core 1,979 TFLOPS with sparsity, 989 TFLOPS dense"}
BF16 = 2  # bytes per weight, KV entry and logit
# Stage (f), bytes moved per vocabulary entry and token (read from the code, not measured). Training
# (ctrls.elbo._FrozenHeadLogprob): bf16 logits written (2), cast to float32 (2 + 4), log-softmax (two reads,
# one write: 12), exp_ and neg_ in place (8 + 8), the gradient's cast to bf16 (4 + 2) and its read by g @ W (2).
# Thm. 5.3's bound (ctrls.elbo.state_token_logprobs): bf16 logits written (2), cast to float64 (2 + 8), max (8),
# sub_ and exp_ in place (16 + 16), read by the float64 product with the K + (steps in the chunk) state columns
# (8); that product's 2 V (K + steps) float64 FLOPs per token are not counted.
ADAPTER_LOGIT_BYTES = {"eval": 60, "train": 44}
_NO_KERNEL = {"aten::lift_fresh", "aten::detach", "aten::alias", "aten::empty", "aten::empty_strided",
              "aten::new_empty", "aten::new_empty_strided"}


def op_kind(func) -> str:
    """'sync' (a tensor read by the host: a device-to-host copy and a synchronisation on CUDA), 'view'
    (metadata only: views, allocations; no kernel on CUDA) or 'kernel' (launches a kernel on CUDA)."""
    name = func._schema.name
    if name == "aten::_local_scalar_dense":
        return "sync"
    if getattr(func, "is_view", False) or name in _NO_KERNEL:
        return "view"
    return "kernel"


try:
    from torch.utils._python_dispatch import TorchDispatchMode
except ImportError:  # pragma: no cover - old torch
    TorchDispatchMode = object


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
        import ctrls.sampling as S
        from ctrls.backbone import decoder_body

        body = decoder_body(self.bb.model)
        self._handles = [body.register_forward_pre_hook(self._body_pre), body.register_forward_hook(self._body_post)]
        for layer in body.layers:
            self._handles += [layer.register_forward_pre_hook(self._push_layer), layer.register_forward_hook(self._pop)]
        self._orig_pick, self._orig_draw = S._pick, S._draw_states
        S._pick, S._draw_states = self._pick, self._draw
        if self.count:
            super().__enter__()
        return self

    def __exit__(self, *exc):
        import ctrls.sampling as S

        if self.count:
            super().__exit__(*exc)
        S._pick, S._draw_states = self._orig_pick, self._orig_draw
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


def _ops(s: dict, region: str, kinds=("kernel", "sync")) -> float:
    """Ops of a probe summary in ``region`` ('*': all regions), of the given kinds."""
    return sum(v for k, v in s["ops"].items() if (region == "*" or k.split("/")[0] == region)
               and k.split("/")[1] in kinds)


def shape_numbers(name: str) -> dict:
    """Parameters and bytes of the backbone's shape: instantiated on the ``meta`` device (no memory, no
    weights) from its config, the parameter count checked against the closed form."""
    from transformers import AutoModelForCausalLM

    cfg = backbone_config(name)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg)
    params = sum(p.numel() for p in model.parameters())  # the tied embedding counted once
    d, inter, L, V = cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers, cfg.vocab_size
    H, KV = cfg.num_attention_heads, cfg.num_key_value_heads
    hd = getattr(cfg, "head_dim", None) or d // H
    qkv_bias = (H + 2 * KV) * hd if SHAPES[name]["arch"] == "qwen2" else 0  # Qwen2 has q, k, v biases
    per_layer = d * H * hd + 2 * d * KV * hd + H * hd * d + qkv_bias + 3 * d * inter + 2 * d
    closed = V * d + L * per_layer + d
    if closed != params:
        raise AssertionError(f"{name}: {params} parameters on the meta device, {closed} by the closed form")
    return {"parameters": params, "embedding_parameters": V * d, "layers": L, "hidden": d, "intermediate": inter,
            "heads": H, "kv_heads": KV, "head_dim": hd, "vocab": V,
            "weight_bytes": BF16 * (params + V),  # bf16, with the LM-head bias this script adds
            "kv_bytes_per_token": L * 2 * KV * hd * BF16}


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


def measure_analytic_inputs(name: str, args, tok, cfg) -> dict:
    """What the analytic model needs from this CPU for one backbone: its shape, the aten ops of a decode
    iteration (ours Base and CTRLS, HF generate), the host-serial seconds of our sampler at the real
    batches, the prompt lengths, and the CPU stages (c)-(e) at a reduced size."""
    from ctrls.config import override
    from ctrls.prompts import encode_prompt
    from ctrls.spectral import spectral_embeddings

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
    runs = rl_runs(cfg)  # lockstep RL: every run's step decodes in one batch (runs x questions_per_step prompts)
    n_ls = runs * cfg.rl.questions_per_step
    batches = {"b160": (prompts[:max(1, B // n_s)], starts[:max(1, B // n_s)], n_s, args.host_tokens),
               "rl": (prompts[:1], starts[:1], G, 2 * args.host_tokens),
               "lockstep": ([prompts[i % len(prompts)] for i in range(n_ls)], [starts[i % len(starts)] for i in range(n_ls)],
                            cfg.rl.group_size, args.host_tokens)}
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
    src = inp["counts_real_width"]["b160" if batch == "lockstep" else batch]["hf_generate" if sampler == "hf" else f"ours_{sampler}"]
    n_layers = 2

    def by(kinds):
        return {"body": _ops(src, "body", kinds) + _ops(src, "layer", kinds) / n_layers * L,
                "per_layer": _ops(src, "layer", kinds) / n_layers, "body_fixed": _ops(src, "body", kinds),
                "launch": _ops(src, "launch", kinds)}

    out = {"kernel": by(("kernel", "sync")), "all": by(("kernel", "sync", "view"))}
    out["launch_ops"] = out["kernel"]["body"] + out["kernel"]["launch"]
    out["post_ops"] = out["redraw_ops"] = 0.0
    if sampler != "hf":
        h = inp["host"]
        base = h[f"base_{batch}"]
        out["post_ops"] = _ops(base, "post", ("kernel", "sync", "view"))  # host side: its measured time is charged
        out["host_serial_measured_s"] = base["timed"]["post_s_median"]
        if sampler == "ctrls":
            # the state redraws: one vectorised call (_draw_states) per iteration in which some row redraws,
            # whatever the number of rows; its ops (and _record_states') pooled over the measured batches
            extra = calls = rows = 0.0
            for b in ("b160", "rl", "lockstep"):
                if f"ctrls_{b}" not in h:
                    continue
                ct, bs = h[f"ctrls_{b}"], h[f"base_{b}"]
                extra += ct["iterations"] * (_ops(ct, "post") + _ops(ct, "draw") - _ops(bs, "post") - _ops(bs, "draw"))
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


def build_analytic(data: dict, cfg, c: dict, new: int) -> None:
    """Fill ``data['backbones'][name]`` with the analytic records from the measured inputs and constants."""
    for name, b in data["backbones"].items():
        keep = {"inputs": b["inputs"]}
        b.clear()
        b.update(keep)
        b.update(analytic_backbone(b["inputs"], c, cfg, c["step_tokens"], new))
    data["constants"] = c


def analytic_sensitivity(data: dict, cfg, args, new: int) -> list[dict]:
    """Total GPU hours (one GPU) with one declared constant changed at a time."""
    out = []
    lo, hi = args.per_op_range
    for change in ({"per_op_us": lo}, {"per_op_us": hi}, {"bw_efficiency": 0.5}, {"bw_efficiency": 0.9}):
        a = argparse.Namespace(**{**vars(args), **change})
        c = analytic_constants(a)
        d = json.loads(json.dumps({"backbones": {n: {"inputs": b["inputs"]} for n, b in data["backbones"].items()}}))
        build_analytic(d, cfg, c, new)
        est = estimate(cfg, d, MEAN_TOKENS, STEPS_PER_COT, ACCEPTANCE)
        out.append({"change": change, "total_hours": est["total_hours"], "stages_hours": est["stages_hours"]})
    return out


def _f(x: float, nd: int = 1) -> str:
    return f"{x:,.{nd}f}"


def analytic_markdown(data: dict, json_path: str) -> str:
    """The book section for an analytic JSON (every number below is read from ``data``)."""
    c, est, est_n = data["constants"], data["estimate"], None
    multi = [k for k in data if k.startswith("estimate_") and k.endswith("gpu")]
    if multi:
        est_n = data[multi[0]]
    names = list(data["backbones"])
    env = data["environment"]
    its0 = data["backbones"][names[0]]["iterations"]
    b160_rows, rl_rows, cap = its0["ctrls_b160"]["rows"], its0["ctrls_rl"]["rows"], est["assumptions"]["cap_tokens"]
    lines = ["### GPU hours for the paper profile (analytic estimate)", "",
             "**No GPU was available to this project's session, so nothing on this page was measured on a GPU.** "
             "The hours are computed by `bench/gpu_estimate.py --analytic` from four things: the two backbones' "
             "shapes (transformers `Qwen2Config` and `LlamaConfig` with the real sizes; parameters counted on the "
             "`meta` device, no weights), the work counts of the `paper` profile (the same `estimate` code the "
             "measured path uses), aten op counts of a decode iteration measured on this machine's CPU, and "
             "declared hardware constants. They are a budget to plan with, not a measurement: replace them with "
             "the measured path's numbers as soon as a GPU is at hand (last paragraph). "
             f"Written to `{json_path}` (torch {env['torch']}, transformers {env['transformers']}, "
             f"{env.get('cpu_model') or 'CPU'}, {env['cpu_count']} cores).", ""]
    # constants
    lo, hi = c["per_op_us_range"]
    lines += ["**Declared constants** (one H100 SXM):", "",
              "| constant | value | source |", "| --- | --- | --- |",
              f"| HBM bandwidth | {c['hbm_bytes_per_s'] / 1e12:.2f} TB/s x efficiency {c['bw_efficiency']:.2f} | "
              f"{c['source'].split(':')[0]} (spec); efficiency assumed |",
              f"| dense bf16 tensor throughput | {c['bf16_dense_flops_per_s'] / 1e12:.0f} TFLOP/s x efficiency "
              f"{c['flops_efficiency']:.2f} | same datasheet (1,979 TFLOP/s is with sparsity); efficiency assumed |",
              f"| host overhead per kernel-launching op | {c['per_op_us']:g} us (range {lo:g}-{hi:g} us) | "
              "assumed, **not measured**: typical of eager PyTorch on a modern host CPU (dispatcher, module "
              "Python, CUDA launch); view ops are counted but not charged, their cost is folded into this figure |",
              f"| one CoT step every | {c['step_tokens']:g} tokens | assumed (a CTRLS state redraw per step) |",
              f"| mean CoT length | GSM8K {est['assumptions']['mean_tokens']['gsm8k']}, MATH "
              f"{est['assumptions']['mean_tokens']['math']} tokens; cap {est['assumptions']['cap_tokens']} | "
              "assumed (the script's `MEAN_TOKENS`) |", ""]
    lines += ["**Model.** One decode iteration of a batch costs max(bandwidth floor, compute floor, launch bound) "
              "+ host-serial time:",
              "- bandwidth floor: bytes read (bf16 weights once; the batch's KV cache at the current context, "
              "layers x 2 x KV heads x head dim x 2 bytes x tokens x rows; the logits) / effective bandwidth;",
              "- compute floor: (2 x parameters x rows + attention) FLOPs / effective bf16 throughput;",
              "- launch bound: the kernel-launching aten ops of one iteration x the per-op overhead; eager "
              "PyTorch launches while the GPU works, so this overlaps with the floors (hence the max);",
              "- host-serial: our sampler copies the sampled tokens to the host and loops over the rows in "
              "Python before launching the next forward, while the GPU idles. That loop's time is measured on "
              "this CPU at the real batch (a model of tiny width, profile prompts, a newline about every "
              f"{c['step_tokens']:g} tokens); CTRLS adds its state redraws' ops x the per-op overhead. HF "
              "`generate` has no such loop (0).",
              "The prefill is max(compute, bandwidth, launch): our sampler prefills each distinct prompt once and "
              "copies its cache to the prompt's samples; HF `generate` prefills every row. The per-iteration "
              "times are laid out as the timeline of a run and go through the measured path's `estimate` "
              "unchanged (the 'mean' and 'cap' bounds below).", ""]
    # op counts
    first = data["backbones"][names[0]]
    cw = first["inputs"]["counts_real_width"]
    lines += ["**Op counts per decode iteration**, counted with a `TorchDispatchMode` on this CPU on models of "
              f"each backbone's shape with 2 layers ({cw['model'].split(', ', 1)[1]}, random weights; neither the "
              "vocabulary nor the width changes the number of ops), decoding "
              f"{cw['tokens']} tokens from short prompts in the two batch structures of the profile: "
              f"{cw['b160']['prompts']} prompts of different lengths x {cw['b160']['rows'] // cw['b160']['prompts']} "
              f"samples (left padding, as in a batch of {b160_rows}; also used for the lockstep RL batch) and 1 prompt x "
              f"{cw['rl']['rows']} samples (as in a sequential RL step). Scaled to the real depth as fixed + per layer x "
              "layers. The post-token loop is counted and timed at the real batch on a model of tiny width. 'kernel' "
              "ops launch a kernel on CUDA (host reads of a device tensor, which synchronise, included); 'all' adds "
              "views and allocations. CTRLS's state redraws are one vectorised call (`_draw_states`) for all the rows "
              "that end a step in an iteration: its ops per call x the probability that some row of the batch ends a "
              f"step (each row once every {c['step_tokens']:g} tokens).", "",
              "| backbone | sampler | batch | body: fixed + per layer x layers (kernel) | LM head, sampling, "
              "adapter (kernel) | post-token loop (all, host) | state redraws (kernel) | all dispatches | "
              "kernel ops charged |", "| --- | --- | ---: | --- | ---: | ---: | ---: | ---: | ---: |"]
    for name in names:
        b = data["backbones"][name]
        L = b["inputs"]["shape"]["layers"]
        for key, label in (("base_b160", "ours, Base"), ("ctrls_b160", "ours, CTRLS"), ("hf_b160", "HF generate"),
                           ("base_rl", "ours, Base"), ("ctrls_rl", "ours, CTRLS"), ("hf_rl", "HF generate"),
                           ("base_lockstep", "ours, Base, lockstep RL"), ("ctrls_lockstep", "ours, CTRLS, lockstep RL")):
            if key not in b["iterations"]:
                continue
            it = b["iterations"][key]
            o = it["ops"]
            k = o["kernel"]
            red = o["redraw_ops"]
            lines.append(f"| {name} | {label} | {it['rows']} | {k['body_fixed']:.0f} + {k['per_layer']:.0f} x {L} = "
                         f"{k['body']:.0f} | {k['launch']:.0f} | {o['post_ops']:.0f} | "
                         + (f"{red:.0f} ({o['redraw_ops_per_call']:.0f} per call x {o['redraw_calls_per_iteration']:.2f})"
                            if "redraw_ops_per_call" in o else "-")
                         + f" | {o['dispatches_per_iteration']:.0f} | {o['charged_ops']:.0f} |")
    lines.append("")
    # per-iteration costs
    lines += ["**Per-iteration cost** (milliseconds; first -> last decode iteration, the KV cache growing from "
              f"the prompt to the prompt + {cap} tokens):", "",
              "| backbone | sampler | rows | weights + KV read (GB) | bandwidth floor | compute floor | launch bound "
              "| host-serial | iteration | bound by | prefill |",
              "| --- | --- | ---: | --- | --- | --- | ---: | ---: | --- | --- | ---: |"]
    for name in names:
        b = data["backbones"][name]
        for key, label in (("base_b160", "ours, Base"), ("ctrls_b160", "ours, CTRLS"), ("hf_b160", "HF generate"),
                           ("base_rl", "ours, Base"), ("ctrls_rl", "ours, CTRLS"), ("hf_rl", "HF generate"),
                           ("base_lockstep", "ours, Base, lockstep RL"), ("ctrls_lockstep", "ours, CTRLS, lockstep RL")):
            if key not in b["iterations"]:
                continue
            it = b["iterations"][key]
            f0, f1 = it["first"], it["last"]
            sh = b["inputs"]["shape"]
            ms = lambda x: f"{1e3 * x:.2f}"  # noqa: E731
            lines.append(f"| {name} | {label} | {it['rows']} | {sh['weight_bytes'] / 1e9:.2f} + "
                         f"{f0['kv_read_bytes'] / 1e9:.2f} -> {f1['kv_read_bytes'] / 1e9:.2f} | "
                         f"{ms(f0['t_mem'])} -> {ms(f1['t_mem'])} | {ms(f0['t_flop'])} -> {ms(f1['t_flop'])} | "
                         f"{ms(f0['t_launch'])} | {ms(it['host_s'])} | {ms(f0['seconds'])} -> {ms(f1['seconds'])} | "
                         f"{f0['bound']} -> {f1['bound']} | {ms(it['prefill']['seconds'])} |")
    lines += ["", "HF `generate`'s KV traffic is counted 3 times (its `DynamicLayer` concatenates: the cache is read "
              "and rewritten every token, then read by attention); its prefill runs every row. "
              f"Prompt: {min(first['inputs']['prompt_tokens'])}-{max(first['inputs']['prompt_tokens'])} tokens "
              "(the profile's 4-shot chat prompt, SmolLM2 tokenizer; the real tokenizers' are of the same order).", ""]
    # hours
    W = est_n["world_size"] if est_n else 1
    lines += ["**GPU hours** (one H100; 'mean': every batch decodes the assumed mean CoT length, optimistic; "
              f"'cap': every batch decodes {cap} tokens, since a batch runs until its longest row ends)"
              + (f", and wall-clock hours on {W} GPUs (data parallel, sharded as `ctrls.distributed` shards)" if est_n
                 else "") + ":", "",
              "| stage | 1 GPU, mean | 1 GPU, cap |" + (f" {W} GPUs wall, mean | {W} GPUs wall, cap |" if est_n else ""),
              "| --- | ---: | ---: |" + (" ---: | ---: |" if est_n else "")]
    for s, h in est["stages_hours"].items():
        row = f"| {s} | {_f(h['mean'], 2)} | {_f(h['cap'], 2)} |"
        if est_n:
            hn = est_n["stages_hours"][s]
            row += f" {_f(hn['mean'], 2)} | {_f(hn['cap'], 2)} |"
        lines.append(row)
    t = est["total_hours"]
    row = f"| **total** | **{_f(t['mean'])}** | **{_f(t['cap'])}** |"
    if est_n:
        row += f" **{_f(est_n['total_hours']['mean'])}** | **{_f(est_n['total_hours']['cap'])}** |"
    lines.append(row)
    if est_n:
        g, lin = est_n["total_gpu_hours"], est_n["linear_wall_hours"]
        lines.append(f"| GPU-hours on {W} GPUs (wall x {W}) | | | {_f(g['mean'])} | {_f(g['cap'])} |")
        lines.append(f"| linear scaling (1 GPU / {W}), for comparison | | | {_f(lin['mean'])} | {_f(lin['cap'])} |")
    lines += ["", "Per backbone x dataset pair (1 GPU): "
              + "; ".join(f"{p} {_f(h['mean'])}-{_f(h['cap'])} h" for p, h in est["pairs_hours"].items()) + ".", ""]
    if est_n:
        lines += [f"On {W} GPUs the hours do not divide by {W}: pretraining (b)-(f) runs on rank 0 alone, the "
                  f"{data['estimate']['rl_eval_questions_used']} test questions leave small batches, and an RL "
                  "step's trajectories split across the ranks, which saves little when an iteration costs "
                  "about the same at any batch size. For comparison, sequential (not lockstep) RL runs placed one per "
                  f"GPU would take about {_f(est_n['rl_runs_side_by_side_wall_hours']['mean'])}-"
                  f"{_f(est_n['rl_runs_side_by_side_wall_hours']['cap'])} h of wall time on {W} GPUs.", ""]
    b0 = data["backbones"][names[0]]["iterations"]
    ours_bounds = {it[e]["bound"] for b in data["backbones"].values() for k, it in b["iterations"].items()
                   if not k.startswith("hf") for e in ("first", "last")}
    ls = "ctrls_lockstep" in b0
    seq = est.get("rl_training_sequential_hours") or {}
    lines += ["**Lockstep RL.** "
              + (f"Every RL run of a pair ({est['rl_runs_per_pair']} runs: settings x seeds, with the Table 2 "
                 f"runs) takes its step in one shared decode batch of {b0['ctrls_lockstep']['rows']} rows "
                 f"({est['rl_runs_per_pair']} runs x {rl_rows} trajectories), with per-row policies: one batch "
                 f"per RL step instead of {est['rl_runs_per_pair']} sequential batches of {rl_rows} rows. "
                 f"RL training: {_f(est['stages_hours']['RL training']['mean'])}-"
                 f"{_f(est['stages_hours']['RL training']['cap'])} h lockstep, against "
                 f"{_f(seq.get('mean', float('nan')))}-{_f(seq.get('cap', float('nan')))} h run after run "
                 "(the same model and constants). RL evaluation and the Table 2 samples already fill batches "
                 f"of {b160_rows} rows, so batching the runs together leaves their count unchanged."
                 if ls else "not modelled (the inputs have no lockstep batch)."), ""]
    lines += ["**Where the time goes.** "
              + ("In this model every decode iteration of our sampler is launch-bound" if ours_bounds == {"launch"}
                 else "Our sampler's iterations are bound by " + " or ".join(sorted(ours_bounds)) + " (table above)")
              + ": at the RL batch the GPU has work for "
              + ", ".join(f"{100 * data['backbones'][n]['iterations']['ctrls_rl']['gpu_busy_fraction']['first']:.0f}%"
                          for n in names)
              + f" of an iteration ({', '.join(names)})"
              + (", at the lockstep batch for "
                 + ", ".join(f"{100 * data['backbones'][n]['iterations']['ctrls_lockstep']['gpu_busy_fraction']['first']:.0f}%"
                             for n in names) if ls else "")
              + ", so the hours scale with the per-op overhead (sensitivity below) and hardly with the bandwidth. "
              "After lockstep RL, "
              + ", ".join(f"{s_} {_f(h['mean'])}-{_f(h['cap'])} h" for s_, h in
                          sorted(est["stages_hours"].items(), key=lambda kv: -kv[1]["cap"])[:2])
              + " are the largest stages. Two costs of our sampler that HF `generate` does not have: "
              "the per-row Python loop after each token (the post-token ops above, host-serial), and CTRLS's state "
              "redraws (`_draw_states`: one vectorised counter-based Dirichlet draw for all the rows that redraw, "
              f"{b0['ctrls_b160']['ops']['redraw_ops_per_call']:.0f} ops per call, with a host synchronisation per "
              "input check and one per 4 rejection rounds). Not in the hours (both bounds keep every row to the "
              "batch's end): when rows end early, `PreallocatedLayer.batch_select_indices` copies the kept rows' "
              "live prefix of the KV cache, at most "
              + ", ".join(f"{1e3 * data['backbones'][n]['iterations']['ctrls_b160']['row_drop_copy_s']:.1f} ms"
                          for n in names)
              + f" at {b160_rows} rows, once per iteration in which some row ends.", ""]
    # work counts
    rows = [r for r in est["rows"] if r["backbone"] == names[0] and r["bound"] == "mean"]
    ds = list(dict.fromkeys(r["dataset"] for r in rows))
    lines += [f"**Work counted** per pair (from `ctrls/profiles/paper.yaml` and the code paths; {names[0]}):", "",
              "| stage | " + " | ".join(ds) + " |", "| --- |" + " --- |" * len(ds)]
    for s in est["stages_hours"]:
        lines.append(f"| {s} | " + " | ".join(next(r["detail"] for r in rows if r["stage"] == s and r["dataset"] == d)
                                               for d in ds) + " |")
    lines += ["", f"RL: {est['rl_runs_per_pair']} runs per pair, {est['rl_evals_per_run']} evaluations per run on "
              f"{est['rl_eval_questions_used']} questions. Stages (c)-(e) run on the CPU: timed on this machine "
              f"({data['backbones'][names[0]]['cpu_fits_full']['torch_threads']} thread) at "
              f"{data['backbones'][names[0]]['cpu_fits_full']['steps']} random steps and scaled linearly (rough). "
              "Not counted: the rubric judge (API-bound), model loading, grading, notebooks and plots, reading the "
              "cached features from disk.", ""]
    # sensitivity
    if data.get("sensitivity"):
        lines += ["**Sensitivity** (total, 1 GPU, mean - cap hours, one constant changed at a time): "
                  + "; ".join(", ".join(f"{k} = {v:g}" for k, v in s["change"].items())
                              + f": {_f(s['total_hours']['mean'])}-{_f(s['total_hours']['cap'])}"
                              for s in data["sensitivity"]) + ".", ""]
    lines += ["**Replace with measurements** on a CUDA GPU (no weights are downloaded; one run per backbone, then "
              "merged; the merged JSON's `estimate` replaces the tables above; these commands have not been run on "
              "a GPU yet):", "",
              "```",
              "python bench/gpu_estimate.py --backbones Qwen/Qwen2.5-3B-Instruct --tokenizer .cache/smollm2-tokenizer \\",
              "    --new 512 --new-rl 512 --pretrain-questions 32 --profile-tokens 64 --out qwen.json",
              "python bench/gpu_estimate.py --backbones meta-llama/Llama-3.2-3B-Instruct --tokenizer .cache/smollm2-tokenizer \\",
              "    --new 512 --new-rl 512 --pretrain-questions 32 --profile-tokens 64 --out llama.json",
              "python bench/gpu_estimate.py --from-json qwen.json llama.json --out bench/results/gpu_estimate_h100.json",
              "```", "",
              "This page is regenerated (on a CPU, a few minutes) by", "", "```",
              f"python bench/gpu_estimate.py --analytic --out {json_path} --md book/_includes/gpu_estimate_h100.md",
              "```", "",
              "and with other constants, without measuring again, by `python bench/gpu_estimate.py --analytic "
              f"--from-json {json_path} --per-op-us 15 --out other.json`.", ""]
    return "\n".join(lines)


def cpu_model() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def analytic_data(args, cfg) -> dict:
    """``--analytic``: measure the inputs on this CPU (or read them from ``--from-json``), then compute."""
    torch.set_num_threads(args.threads)
    if args.from_json:
        data = json.loads(Path(args.from_json[0]).read_text())
        if not data.get("analytic") or not all("inputs" in b for b in data["backbones"].values()):
            sys.exit(f"{args.from_json[0]} is not an --analytic JSON")
        for key in [k for k in data if k.startswith("estimate") or k == "sensitivity"]:
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
    c = analytic_constants(args)
    build_analytic(data, cfg, c, cfg.sampling.max_new_tokens)
    print(f"\nper decode iteration on one H100 SXM (analytic; bandwidth x {c['bw_efficiency']}, bf16 x "
          f"{c['flops_efficiency']}, {c['per_op_us']:g} us per op), first -> last iteration, ms:")
    for name, b in data["backbones"].items():
        for key, it in b["iterations"].items():
            f0, f1 = it["first"], it["last"]
            print(f"  {name:34s} {key:11s} {it['rows']:4d} rows: mem {1e3 * f0['t_mem']:6.2f} -> {1e3 * f1['t_mem']:6.2f}, "
                  f"flop {1e3 * f0['t_flop']:5.2f}, launch {1e3 * f0['t_launch']:5.2f} ({it['ops']['launch_ops']:.0f} ops), "
                  f"host {1e3 * it['host_s']:5.2f}: {1e3 * f0['seconds']:6.2f} -> {1e3 * f1['seconds']:6.2f}", flush=True)
    return data


# ---- main ---------------------------------------------------------------------------------------


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
    ap.add_argument("--floor-iters", type=int, default=None, help="iterations of the bare-model decode loop (64; 8 with --tiny)")
    ap.add_argument("--profile-tokens", type=int, default=0, help="cProfile a CTRLS RL-batch run of this many tokens")
    ap.add_argument("--step-tokens", type=float, default=30.0, help="tokens per CoT step the newline bias aims at")
    ap.add_argument("--pretrain-questions", type=int, default=None, help="synthetic questions for stages (b)-(f) (16; 2 with --tiny)")
    ap.add_argument("--pretrain-tokens", type=int, default=None, help="tokens per synthetic CoT (350; 120 with --tiny)")
    ap.add_argument("--pretrain-steps", type=int, default=None, help="steps per synthetic CoT (10; 4 with --tiny)")
    ap.add_argument("--cpu-full", action=argparse.BooleanOptionalAction, default=None,
                    help="also time the k-means and transition fits at the profile's full size, on random data "
                         "(default: on; off with --tiny)")
    ap.add_argument("--gpus", type=int, default=8, help="data-parallel processes for the multi-GPU estimate")
    ap.add_argument("--out", default=None, help="where the JSON goes (default bench/results/gpu_estimate.json; "
                    "with --analytic bench/results/gpu_estimate_analytic.json)")
    an = ap.add_argument_group("--analytic: hours computed without a GPU (module docstring)")
    an.add_argument("--analytic", action="store_true", help="compute the hours from the shapes, op counts measured on "
                    "this CPU and declared H100 SXM constants (no GPU); with --from-json, recompute from a saved "
                    "analytic JSON without measuring again")
    an.add_argument("--bw-efficiency", type=float, default=0.7, help="fraction of the 3.35 TB/s HBM bandwidth reached")
    an.add_argument("--flops-efficiency", type=float, default=0.7, help="fraction of the 989 TFLOP/s dense bf16 reached")
    an.add_argument("--per-op-us", type=float, default=10.0, help="host overhead per kernel-launching op (assumed)")
    an.add_argument("--per-op-range", type=float, nargs=2, default=[6.0, 20.0], help="its plausible range (sensitivity)")
    an.add_argument("--count-tokens", type=int, default=8, help="tokens decoded by the op-count runs")
    an.add_argument("--host-tokens", type=int, default=24, help="tokens decoded by the batch-160 host-loop runs "
                    "(4x at the RL batch)")
    an.add_argument("--cpu-probe-steps", type=int, default=2048, help="steps of the CPU stages' timing (scaled linearly)")
    an.add_argument("--threads", type=int, default=1, help="CPU threads of the analytic measurements")
    an.add_argument("--md", default=None, help="also write the book section (markdown) rendered from the JSON here")
    args = ap.parse_args(argv)

    from ctrls.config import load_config

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
        parts = [json.loads(Path(f).read_text()) for f in args.from_json]
        data = parts[0]
        if len(parts) > 1:
            data["merged_from"] = [{"file": f, "environment": d.get("environment"), "settings": d.get("settings")}
                                   for f, d in zip(args.from_json, parts)]
            for d in parts[1:]:
                data["backbones"].update(d["backbones"])
        for key in [k for k in data if k.startswith("estimate")]:
            del data[key]
    else:
        args.out = args.out or str(ROOT / "bench" / "results" / "gpu_estimate.json")
        dev, dtype = torch.device(args.device), getattr(torch, args.dtype)
        if dev.type == "cuda" and not torch.cuda.is_available():
            sys.exit("no CUDA device: use a GPU machine, or --device cpu --tiny to check the script")
        tok = load_tokenizer(args.tokenizer)
        data = {"environment": environment(dev, dtype), "tiny": args.tiny, "profile": args.profile,
                "settings": {k: v for k, v in vars(args).items() if k not in ("from_json",)}, "backbones": {}}
        print(json.dumps(data["environment"]), flush=True)
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        def save():
            out.write_text(json.dumps(data, indent=1, default=str))

        for name in args.backbones or cfg.grid.backbones:
            res = data["backbones"][name] = {}
            try:
                measure_backbone(name, args, tok, dev, dtype, cfg, res, save)
            except Exception as e:  # noqa: BLE001
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
    try:
        est = estimate(cfg, data, MEAN_TOKENS, STEPS_PER_COT, ACCEPTANCE)
        print_estimate(est)
        data["estimate"] = {"profile": args.profile, "overrides": args.override, **est}
        if args.gpus > 1:
            multi = estimate(cfg, data, MEAN_TOKENS, STEPS_PER_COT, ACCEPTANCE, world=args.gpus)
            multi["linear_wall_hours"] = {b: h / args.gpus for b, h in est["total_hours"].items()}
            print_estimate(multi)
            data[f"estimate_{args.gpus}gpu"] = {"profile": args.profile, "overrides": args.override, **multi}
    except (KeyError, TypeError, ZeroDivisionError) as e:
        print(f"no estimate: {type(e).__name__}: {e}", flush=True)
    if args.analytic and "estimate" in data:
        data["sensitivity"] = analytic_sensitivity(data, cfg, args, cfg.sampling.max_new_tokens)
        multi = data.get(f"estimate_{args.gpus}gpu")
        if multi:  # the RL runs are independent: side by side, one per GPU (not how ctrls schedules them)
            multi["rl_runs_side_by_side_wall_hours"] = {b: h / args.gpus for b, h in
                                                        data["estimate"]["rl_training_sequential_hours"].items()}
    if args.out:
        Path(args.out).write_text(json.dumps(data, indent=1, default=str))
        print(f"\nwrote {args.out}")
    if args.md:
        if not (args.analytic and args.out):
            sys.exit("--md renders an --analytic JSON: give --analytic")
        out = Path(args.out).resolve()
        shown = str(out.relative_to(ROOT)) if out.is_relative_to(ROOT) else str(out)
        Path(args.md).write_text(analytic_markdown(json.loads(out.read_text()), shown))
        print(f"wrote {args.md}")
    return data


if __name__ == "__main__":
    main()
