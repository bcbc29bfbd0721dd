"""Base pass@1 of the embedded SmolLM2-135M on ``word_problems`` at several difficulties: the
measurement that picks the demo's default difficulty (the one with Base pass@1 in 15-40%).

For each difficulty: ``--questions`` test questions x ``--samples`` samples, with the project's
prompt (chat template, one exemplar as in the demo profile), sampler and grader, at the demo's
temperature (0.7), top-k 50 and ``--max-new-tokens``. pass@1 is the mean correctness over all
samples (Succ.: the mean validity; icc: the intra-question correlation, ``ctrls.stats.sizing``, which
the demo's power calculation starts from); its 95% interval is over questions (a t interval on the per-question rates, clipped to
[0, 1]: the samples of one question are not independent). pass@n is the fraction of questions with
a correct sample, with its Wilson interval. The JSON goes to studies/results/word_problems_difficulty.json.

Usage: python studies/word_problems.py [--questions 48] [--samples 4] [--levels ops1-max10 ...]
"""
import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np
from scipy.stats import t as student_t

from ctrls.data.answers import grade
from ctrls.data.problems import load_problems
from ctrls.data.prompts import encode_prompt
from ctrls.data.word_problems import Difficulty
from ctrls.generate.sampling import SampleParams, sample
from ctrls.method.backbone import cpu_model, git_commit, load_backbone
from ctrls.stats.power import wilson_interval
from ctrls.stats.sizing import icc_from_rates

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))  # bench/common.py
from common import write_result  # noqa: E402

LEVELS = {  # name -> Difficulty
    "ops1-max10-add-w1": Difficulty(n_ops=1, max_value=10, ops=("add",), wordings=1),
    "ops1-max10-w1": Difficulty(n_ops=1, max_value=10, ops=("add", "sub"), wordings=1),
    "ops1-max20-w1": Difficulty(n_ops=1, max_value=20, ops=("add", "sub"), wordings=1),
    "ops1-max10": Difficulty(n_ops=1, max_value=10, ops=("add", "sub")),
    "ops1-max20": Difficulty(n_ops=1, max_value=20, ops=("add", "sub")),
    "ops1-max10-mul": Difficulty(n_ops=1, max_value=10, ops=("add", "sub", "mul")),
    "ops2-max10": Difficulty(n_ops=2, max_value=10, ops=("add", "sub")),
    "ops2-max10-mul": Difficulty(n_ops=2, max_value=10, ops=("add", "sub", "mul")),
    "ops3-max10": Difficulty(n_ops=3, max_value=10, ops=("add", "sub")),
}


def measure(bb, d: Difficulty, n_q: int, n_s: int, max_new: int, seed: int, few_shot: int = 0) -> dict:
    probs = load_problems("word_problems", "test", n=n_q, seed=seed, difficulty=d)
    enc = [encode_prompt(bb.tokenizer, p.question, True, few_shot) for p in probs]
    params = SampleParams(temperature=0.7, top_k=50, max_new_tokens=max_new, max_steps=12, batch_size=128)
    t0 = time.perf_counter()
    gens = sample(bb, [e[0] for e in enc], n_s, params, seeds=[seed * 1000 + i for i in range(n_q)],
                  prompt_starts=[e[1] for e in enc])
    wall = time.perf_counter() - t0
    grades = [[grade(g.text, p.answer) for g in gs] for p, gs in zip(probs, gens)]
    c = np.array([[x.correct for x in gs] for gs in grades], dtype=float)
    v = np.array([[x.valid for x in gs] for gs in grades], dtype=float)
    rates = c.mean(1)
    m, se = rates.mean(), rates.std(ddof=1) / math.sqrt(n_q)
    half = student_t.ppf(0.975, n_q - 1) * se
    k = int((c.max(1) > 0).sum())
    lo_n, hi_n = wilson_interval(k, n_q)
    return {"difficulty": d.tag(), "questions": n_q, "samples": n_s, "pass@1": m,
            "pass@1 95% CI": [max(0.0, m - half), min(1.0, m + half)], f"pass@{n_s}": k / n_q,
            "succ": float(v.mean()), "icc": icc_from_rates(rates, n_s), "icc (succ)": icc_from_rates(v.mean(1), n_s),
            f"pass@{n_s} 95% CI (Wilson)": [lo_n, hi_n], "tokens": int(sum(g.n_tokens for gs in gens for g in gs)),
            "wall_s": round(wall, 1), "example": gens[0][0].text}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--questions", type=int, default=40)
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--levels", nargs="*", default=["ops1-max10-w1", "ops1-max10"])
    ap.add_argument("--few-shot", type=int, default=1, help="exemplars in the prompt (the demo profile: 1)")
    ap.add_argument("--out", default="studies/results/word_problems_difficulty.json")
    a = ap.parse_args()
    bb = load_backbone("smollm2-135m-instruct")
    rows = []
    for name in a.levels:
        r = measure(bb, LEVELS[name], a.questions, a.samples, a.max_new_tokens, a.seed, a.few_shot)
        rows.append({"level": name, **r})
        lo, hi = r["pass@1 95% CI"]
        print(f"{name:16s} pass@1 {100 * r['pass@1']:5.1f}% [{100 * lo:.1f}, {100 * hi:.1f}]  "
              f"pass@{a.samples} {100 * r[f'pass@{a.samples}']:5.1f}%  {r['tokens']} tokens in {r['wall_s']} s", flush=True)
    target = [r["level"] for r in rows if 0.15 <= r["pass@1"] <= 0.40]
    out = {"backbone": "smollm2-135m-instruct", "prompt": f"chat template, {a.few_shot}-shot", "temperature": 0.7, "top_k": 50,
           "max_new_tokens": a.max_new_tokens, "machine": cpu_model(), "commit": git_commit(), "levels": rows,
           "in 15-40%": target}
    write_result(out, a.out)  # whole or not at all, never with a NaN (an ICC of identical rates), naming its field
    print(json.dumps({"in 15-40%": target}))


if __name__ == "__main__":
    main()
