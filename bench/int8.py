"""Int8 dynamic quantization of the frozen backbone's linear layers against fp32, side by side in one run.

The cheaper pass a CPU without bfloat16 instructions has (``torch.ao.quantization.quantize_dynamic``: int8
weights, activations quantized per pass; the decoder layers, the lm head in fp32). Two batch sizes, the ones
the stages decode at: 24 rows (one RL run's training decode alone: 6 questions x 4 samples) and 128 rows (an
exploration chunk, and what the seeds' decodes fill in lockstep: ``sampling.batch_size``). The engine's Base
decode of the demo's word problems (SmolLM2-135M-Instruct, the demo's prompt, eta = 0.7, top-k, token and step
limits), one warm-up per model, the models alternating over ``--rounds`` rounds, the best round of each. At
128 rows the samples are graded and Base pass@1 compared, int8 minus fp32, paired by question (bootstrap over
questions).

The state-prompt fit needs the gradient through every layer to the input vectors: whether it reaches them
through the quantized layers is recorded (``fit_backward_through_int8``). Whether int8 is kept: at least 1.3x
faster at the batch the stages decode at in lockstep, and no verdict changed.
Usage: python bench/int8.py [--rounds 2] [--out bench/results/int8.json]
"""
from __future__ import annotations

import argparse
import copy
import dataclasses
import time
import warnings

import numpy as np
import torch
from common import machine, write_result

ROWS = (24, 128)  # one RL run's decode alone; an exploration chunk, and the seeds' decodes in lockstep


def quantized(bb):
    """A copy of the backbone with every ``nn.Linear`` of its decoder layers int8 dynamically quantized; the lm head
    stays fp32 (the engine reads its weight: top-k over the vocabulary, the state prompt's embeddings)."""
    q = copy.deepcopy(bb.model)
    with warnings.catch_warnings():  # torch's eager-mode quantization announces its move to torchao
        warnings.simplefilter("ignore")
        q.model = torch.ao.quantization.quantize_dynamic(q.model, {torch.nn.Linear}, dtype=torch.qint8)
    return dataclasses.replace(bb, model=q)


def decode(bb, prompts, params) -> tuple[float, list]:
    """(seconds, generations per prompt) of one Base decode, 4 samples per prompt, seeded by index."""
    from ctrls.generate.sampling import sample

    t = time.perf_counter()
    gens = sample(bb, prompts, 4, params, seeds=list(range(len(prompts))))
    return time.perf_counter() - t, gens


def backward_supported(bb) -> str:
    """Whether a loss reaches input embeddings through the model (the state-prompt fit's gradient)."""
    x = bb.model.get_input_embeddings()(torch.tensor([[1, 2, 3]])).detach().requires_grad_(True)
    try:
        bb.model(inputs_embeds=x).logits.sum().backward()
    except (RuntimeError, NotImplementedError) as e:
        return f"no: {str(e).splitlines()[0][:160]}"
    return "yes" if x.grad is not None and bool(torch.isfinite(x.grad).all()) else "no gradient"


def main():
    from ctrls.config.schema import load_config
    from ctrls.data.answers import grade
    from ctrls.data.problems import load_problems
    from ctrls.data.prompts import prompt_ids
    from ctrls.generate.sampling import SampleParams
    from ctrls.method.backbone import gemm_gflops, load_backbone
    from ctrls.stats.metrics import paired_bootstrap

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    gemm = gemm_gflops()
    cfg = load_config("demo")
    fp32 = load_backbone("smollm2-135m-instruct", device="cpu", dtype="float32")
    models = {"float32": fp32, "int8": quantized(fp32)}
    probs = load_problems("word_problems", "test", max(ROWS) // 4, seed=0, difficulty=cfg.data.word_problems.difficulty())
    prompts = [prompt_ids(fp32.tokenizer, q.question, True, cfg.prompt.few_shot) for q in probs]
    params = SampleParams(temperature=0.7, top_k=cfg.sampling.top_k, max_new_tokens=cfg.sampling.max_new_tokens,
                          max_steps=cfg.prompt.max_steps, batch_size=cfg.sampling.batch_size)
    res: dict = {"rows": {}}
    with torch.no_grad():
        for bb in models.values():
            decode(bb, prompts[:2], params)  # warm-up: threads, allocator, the prompts' template
        for rows in ROWS:
            ps = prompts[:rows // 4]
            times: dict = {k: [] for k in models}
            tokens: dict = {k: 0 for k in models}
            gens: dict = {}
            for r in range(args.rounds):
                for name in (list(models) if r % 2 == 0 else list(models)[::-1]):  # alternate which runs first
                    s, gens[name] = decode(models[name], ps, params)
                    times[name].append(s)
                    tokens[name] = sum(len(g.token_ids) for gs in gens[name] for g in gs)
            tok_s = {k: tokens[k] / min(v) for k, v in times.items()}
            row = {"seconds": times, "tokens": tokens, "tok_s": tok_s, "int8_speedup": tok_s["int8"] / tok_s["float32"]}
            if rows == max(ROWS):
                correct = {k: np.array([[grade(g.text, q.answer).correct for g in gs] for q, gs in zip(probs, v)], float)
                           for k, v in gens.items()}
                d = paired_bootstrap(correct["int8"], correct["float32"], lambda m: m.mean())
                row["base_pass1"] = {k: float(v.mean()) for k, v in correct.items()}
                row["base_pass1_int8_minus_fp32"] = {**d, "questions": len(probs), "samples": 4,
                                                     "interval": "paired bootstrap over questions, 95%"}
            res["rows"][str(rows)] = row
            print(f"{rows} rows: fp32 {tok_s['float32']:.1f} tok/s, int8 {tok_s['int8']:.1f} tok/s "
                  f"({row['int8_speedup']:.2f}x)", flush=True)
    lock = res["rows"][str(max(ROWS))]["int8_speedup"]
    res.update({"fit_backward_through_int8": backward_supported(models["int8"]), "gemm_gflops": gemm,
                "kept": bool(lock >= 1.3), "criterion": "int8_speedup >= 1.3 at 128 rows, and no verdict changed",
                "decode": {"backbone": "smollm2-135m-instruct", "max_new_tokens": params.max_new_tokens,
                           "max_steps": params.max_steps, "rounds": args.rounds},
                "machine": machine(), "command": "python bench/int8.py --out bench/results/int8.json"})
    write_result(res, args.out)


if __name__ == "__main__":
    main()
