"""The KV cache when rows finish: in-place compaction (``fill_holes`` + ``PreallocatedLayer._compact``)
against the previous path, a fresh buffer per finished row (``PreallocatedLayer._reindex``), side by
side in one run on the embedded SmolLM2-135M, with natural stopping (rows finish at different steps,
as in every stage; ``bench/sampling.py`` forces every row to the same length, so it never compacts).

Prints tokens/s of both, their ratio, whether the generated tokens are identical, and the machine.
Usage: python bench/compaction.py [--questions 32] [--samples 4]
"""
import argparse
import json
import time

import torch

from ctrls.data.problems import load_problems
from ctrls.data.prompts import encode_prompt
from ctrls.generate.sampling import PreallocatedLayer, SampleParams, sample
from ctrls.method.backbone import load_backbone
from ctrls.report.provenance import cpu_model


def run(bb, enc, n_s: int, old: bool) -> tuple[float, list]:
    compact = PreallocatedLayer.batch_select_indices
    if old:
        PreallocatedLayer.batch_select_indices = lambda self, indices: self._reindex(indices)
    try:
        params = SampleParams(temperature=0.7, top_k=50, max_new_tokens=80, max_steps=8, batch_size=128)
        t0 = time.perf_counter()
        gens = sample(bb, [e[0] for e in enc], n_s, params, seeds=list(range(len(enc))),
                      prompt_starts=[e[1] for e in enc])
        wall = time.perf_counter() - t0
    finally:
        PreallocatedLayer.batch_select_indices = compact
    toks = [g.token_ids for gs in gens for g in gs]
    return sum(map(len, toks)) / wall, toks


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--questions", type=int, default=32)
    ap.add_argument("--samples", type=int, default=4)
    a = ap.parse_args()
    torch.manual_seed(0)
    bb = load_backbone("smollm2-135m-instruct")
    probs = load_problems("word_problems", "test", n=a.questions)
    enc = [encode_prompt(bb.tokenizer, p.question, True, 1) for p in probs]
    new_tps, new_toks = run(bb, enc, a.samples, old=False)
    old_tps, old_toks = run(bb, enc, a.samples, old=True)
    out = {"machine": cpu_model(), "threads": torch.get_num_threads(), "rows": a.questions * a.samples,
           "tokens/s in place": round(new_tps, 1), "tokens/s fresh buffer": round(old_tps, 1),
           "ratio": round(new_tps / old_tps, 2), "identical tokens": new_toks == old_toks}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
