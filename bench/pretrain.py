"""Adapter pretraining (Alg. 1 (f)): relaxed-objective epochs on cached features vs re-running the backbone.

With last-hidden injection (design notes: book/design.md) the frozen backbone's last hidden states do not depend on the
adapter, so pretraining runs the backbone once and trains the adapter on the cache (mode A). The
alternative a user would pick without the cache re-runs the backbone forward (no grad) every epoch
before the same training step (mode B). For reference, input-embedding injection (``inject_at:
input_embeds``) must run the backbone forward and backward every epoch (mode C).

Setup: the embedded SmolLM2-135M-Instruct on CPU in float32; 32 synthetic trajectories of 150
random tokens (a 24-token prompt and 6 steps of 21); random soft states with K = 16 and random
centroids in D = k d (k = 4); adapter rank 64; one Adam step per batch of 8 trajectories. The
modes alternate batch by batch in one process, so they share the machine's load; mode C is timed
on the first ``--input-embeds-batches`` batches and scaled to an epoch (it is the slowest by far).
A and B see the same features and start from the same adapter (both checked). The last line is
a JSON object of the ratios.

    python bench/pretrain.py [--epochs 1] [--trajectories 32] [--input-embeds-batches 2]
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from ctrls.method.adapter import StateAdapter, adapted_logits
from ctrls.method.backbone import decoder_body, load_backbone
from ctrls.method.elbo import relaxed_loss, relaxed_terms
from ctrls.method.policy import kl_to_prior

PROMPT, STEPS, STEP_TOKENS, K, SPECTRAL_K, RANK, BATCH = 24, 6, 21, 16, 4, 64, 8


def make_data(n: int, vocab: int, seed: int = 0) -> dict:
    """Token ids (n, PROMPT + STEPS * STEP_TOKENS), each step's posterior and previous state."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(100, vocab, (n, PROMPT + STEPS * STEP_TOKENS), generator=g)
    s = torch.softmax(3 * torch.randn(n, STEPS + 1, K, generator=g), -1)  # s_0 (prompt), s_1 .. s_T
    return {"ids": ids, "s_post": s[:, 1:], "s_prev": s[:, :-1]}


def predictor_positions() -> tuple[torch.Tensor, torch.Tensor]:
    """The position rule of the design notes (book/design.md): a step at [a, b) is predicted by positions a-1 .. b-2.
    Returns (pos, step)."""
    pos, step = [], []
    for t in range(STEPS):
        a = PROMPT + t * STEP_TOKENS
        pos.append(torch.arange(a - 1, a + STEP_TOKENS - 1))
        step.append(torch.full((STEP_TOKENS,), t))
    return torch.cat(pos), torch.cat(step)


def batch_tensors(hidden: torch.Tensor, ids: torch.Tensor, s_post: torch.Tensor, s_prev: torch.Tensor):
    """Flatten a batch of B trajectories into the relaxed objective's (P, ·) / (S, K) format."""
    pos, step = predictor_positions()
    B = ids.shape[0]
    h = hidden[:, pos].reshape(-1, hidden.shape[-1])
    targets = ids[:, pos + 1].reshape(-1)
    step_index = (step[None] + STEPS * torch.arange(B)[:, None]).reshape(-1)
    return h, targets, step_index, s_post.reshape(-1, K), s_prev.reshape(-1, K)


def train_step(adapter, opt, head, centroids, L, hidden, ids, s_post, s_prev) -> float:
    terms = relaxed_terms(adapter, head, centroids, *batch_tensors(hidden, ids, s_post, s_prev), L)
    loss = relaxed_loss(terms)
    opt.zero_grad()
    loss.backward()
    opt.step()
    return float(loss.detach())


def input_embeds_step(model, adapter, opt, centroids, L, ids, s_post, s_prev) -> float:
    """Mode C: the same objective with the adapter on the input embeddings (backprop through the backbone)."""
    pos, step = predictor_positions()
    s_pos = torch.zeros(ids.shape[0], ids.shape[1], K)
    s_pos[:, pos] = s_post[:, step]
    logits = adapted_logits(model, adapter, ids, s_pos, centroids, inject_at="input_embeds")
    rec = torch.log_softmax(logits[:, pos].float(), -1).gather(-1, ids[:, pos + 1, None]).sum()
    loss = -(rec - kl_to_prior(s_post.reshape(-1, K), s_prev.reshape(-1, K), L).sum()) / pos.numel() / ids.shape[0]
    opt.zero_grad()
    loss.backward()
    opt.step()
    return float(loss.detach())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--trajectories", type=int, default=32)
    ap.add_argument("--input-embeds-batches", type=int, default=2,
                    help="batches of mode C timed per epoch; its epoch time is scaled up from them")
    args = ap.parse_args()
    torch.manual_seed(0)
    bb = load_backbone("smollm2-135m-instruct", device="cpu", dtype="float32")
    model, head, d = bb.model, bb.lm_head, bb.hidden_size
    body = decoder_body(model)
    data = make_data(args.trajectories, model.config.vocab_size)
    batches = [slice(i, i + BATCH) for i in range(0, args.trajectories, BATCH)]
    n_c = min(args.input_embeds_batches, len(batches))
    centroids, L = torch.randn(K, SPECTRAL_K * d), torch.randn(K, K)

    def fresh():
        ad = StateAdapter(d, SPECTRAL_K * d, RANK)
        return ad, torch.optim.Adam(ad.parameters(), lr=1e-3)

    def last_hidden(ids: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return body(input_ids=ids, use_cache=False).last_hidden_state

    t0 = time.perf_counter()
    cache = [last_hidden(data["ids"][b]) for b in batches]
    t_cache = time.perf_counter() - t0

    (ad_a, opt_a), (ad_b, opt_b), (ad_c, opt_c) = fresh(), fresh(), fresh()
    modes = ("cached", "rerun", "input_embeds")
    epoch_s: dict[str, list[float]] = {m: [] for m in modes}
    for epoch in range(args.epochs):
        spent = dict.fromkeys(modes, 0.0)
        for i, b in enumerate(batches):  # the modes alternate batch by batch: they share the machine's load
            ids, s_post, s_prev = data["ids"][b], data["s_post"][b], data["s_prev"][b]
            t0 = time.perf_counter()  # mode A: the training step on the cached hidden states
            loss_a = train_step(ad_a, opt_a, head, centroids, L, cache[i], ids, s_post, s_prev)
            t1 = time.perf_counter()  # mode B: re-run the backbone forward, then the same training step
            hidden = last_hidden(ids)
            loss_b = train_step(ad_b, opt_b, head, centroids, L, hidden, ids, s_post, s_prev)
            t2 = time.perf_counter()
            spent["cached"] += t1 - t0
            spent["rerun"] += t2 - t1
            # the two modes train on the same features (up to float32 round-off) with the same objective
            torch.testing.assert_close(hidden, cache[i])
            if epoch == i == 0:  # same initial adapter: the same first loss
                assert abs(loss_a - loss_b) <= 1e-5 * abs(loss_a), (loss_a, loss_b)
            if i < n_c:  # mode C: input-embedding injection, backprop through the backbone
                t0 = time.perf_counter()
                input_embeds_step(model, ad_c, opt_c, centroids, L, ids, s_post, s_prev)
                spent["input_embeds"] += time.perf_counter() - t0
        spent["input_embeds"] *= len(batches) / n_c
        for m in modes:
            epoch_s[m].append(spent[m])
        print(f"epoch {epoch}: " + ", ".join(f"{m} {spent[m]:.2f} s" for m in modes), flush=True)

    med = {m: statistics.median(v) for m, v in epoch_s.items()}
    tokens = args.trajectories * STEPS * STEP_TOKENS
    print(f"{args.trajectories} trajectories of {PROMPT} + {STEPS} x {STEP_TOKENS} tokens ({tokens} targets), "
          f"batches of {BATCH}, {args.epochs} epoch(s), {torch.get_num_threads()} threads; "
          f"one-time cache forward {t_cache:.2f} s")
    for m in modes:
        note = f"  (scaled from {n_c} of {len(batches)} batches)" if m == "input_embeds" and n_c < len(batches) else ""
        print(f"  {m:13s} {med[m]:7.2f} s/epoch  ({tokens / med[m]:6.0f} target tokens/s){note}")
    result = {
        "rerun_over_cached_per_epoch": round(med["rerun"] / med["cached"], 2),
        "input_embeds_over_cached_per_epoch": round(med["input_embeds"] / med["cached"], 2),
        "cached_s_per_epoch": round(med["cached"], 3),
        "rerun_s_per_epoch": round(med["rerun"], 3),
        "input_embeds_s_per_epoch": round(med["input_embeds"], 3),
        "cache_build_s": round(t_cache, 3),
    }
    print(f"re-running the backbone every epoch costs {result['rerun_over_cached_per_epoch']}x the cached epoch; "
          f"the cache pays for itself after {t_cache / (med['rerun'] - med['cached']):.1f} epoch(s)")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
