"""The case studies' samples: the paper's two MATH case questions (Figs. 6 and 7), found in the MATH data by
their text, and n Base and n CTRLS(epsilon) samples of each, decoded as the exploration rows are (the
state prompt and its position mask with ``state_prompt.use``, else the adapter), written to
``runs/<profile>/cases/samples.parquet`` for the case-study page to read, one file for every backbone.
"""
from __future__ import annotations

import pandas as pd

from ctrls.config.schema import Config
from ctrls.config.settings import BASE
from ctrls.data.problems import load_problems
from ctrls.data.prompts import encode_prompt
from ctrls.method.streams import seed_of
from ctrls.stages.common import backbone_for, sample_params, save_parquet
from ctrls.stages.exploration import generation_rows
from ctrls.stages.pretrain import check_fitted, fitted_stages, load_pretrained, pretrain_stages
from ctrls.stages.runs import Stage
from ctrls.stages.state_prompt import ctrls_conditioning, pair_state_prompt

PAPER_CASES = {
    "arithmetic sequence a4/a2 = 3 (Fig. 6)": ("arithmetic sequence", "\\frac{a_4}{a_2} = 3"),
    "sqrt(63 - sqrt(x)) (Fig. 7)": ("\\sqrt{63-\\sqrt{x}}",),
}

SAMPLES = "samples.parquet"


def find_paper_cases(cfg) -> dict[str, "object"]:
    """The paper's two MATH case questions, looked up by text in the MATH data (both splits)."""
    pool = load_problems("math", "test", data_dir=cfg.data.data_dir) + load_problems("math", "train", data_dir=cfg.data.data_dir)
    found = {}
    for name, fragments in PAPER_CASES.items():
        squash = [f.replace(" ", "") for f in fragments]
        hits = [p for p in pool if all(f in p.question.replace(" ", "") for f in squash)]
        if hits:
            found[name] = hits[0]
    return found


def sample_paper_cases(cfg, n: int = 4, backbone: str | None = None, cases: dict | None = None) -> pd.DataFrame:
    """Base and CTRLS samples for the paper's MATH case questions with one backbone (default: the
    first) and its checkpoint: the MATH one if the profile trains it, else its first dataset's. CTRLS
    is conditioned as the exploration rows are: under the state prompt (and its position mask) with
    ``state_prompt.use``, else through the adapter.
    ``cases``: :func:`find_paper_cases`'s result, when the caller has it (reading MATH takes seconds)."""
    from ctrls.generate.sampling import sample, seeded  # here: the page that reads the stored cases skips torch's models

    bname = backbone or cfg.pairs()[0][0]
    mine = [d for b, d in cfg.pairs() if b == bname]
    if not mine:
        raise ValueError(f"backbone {bname!r} is not in grid.backbones {cfg.grid.backbones}")
    ds = "math" if "math" in mine else mine[0]
    pc = cfg.for_pair(bname, ds)
    bb = backbone_for(pc, bname)
    model = load_pretrained(pc, bb)
    cases = find_paper_cases(cfg) if cases is None else cases
    probs = list(cases.values())
    if not probs:
        return pd.DataFrame()
    enc = [encode_prompt(bb.tokenizer, p.question, pc.prompt.use_chat_template, pc.prompt.few_shot) for p in probs]
    eta = cfg.grid.temperatures[-1]
    eps = cfg.grid.epsilons[0]
    rows = []
    sp, mask = pair_state_prompt(pc, bb, model, pretrain_stages(pc))
    for label, m, e in ((BASE, None, 0.0), (f"eps={eps:g}", model, eps)):
        params = sample_params(pc, eta, epsilon=e)
        if m is not None and sp is not None:  # one seed per case question, as the exploration rows draw theirs
            seeds = [seed_of(cfg.seed + 7, bname, "math", eta, label, p.id) for p in probs]
            gens = sample(bb, [x[0] for x in enc], n, params, conditioning=ctrls_conditioning(pc, bb, model, sp, mask),
                          seeds=seeds, prompt_starts=[x[1] for x in enc], read_states=model)
        else:
            gens = sample(bb, [x[0] for x in enc], n, params, model=m, generator=seeded(cfg.seed + 7, bb.device),
                          prompt_starts=[x[1] for x in enc])
        meta = {"backbone": bname, "dataset": "math", "temperature": eta, "config": label,
                "epsilon": float("nan") if m is None else e, "checkpoint": f"{bname} · {ds}"}
        for (name, p), gs in zip(cases.items(), gens):
            rows += [{**r, "case": name} for r in generation_rows(gs, p, meta)]
    return pd.DataFrame(rows)


def case_samples_per_backbone(cfg: Config) -> int:
    """The samples of each side of a case: 2 on the smoke profile, else 4."""
    return 2 if cfg.profile == "smoke" else 4


def run_cases(cfg: Config, force: bool = False, progress: bool = True) -> tuple[dict, pd.DataFrame]:
    """(the case questions found, every backbone's case samples): read from ``runs/<profile>/cases/`` when this
    config's stage is done, else decoded and written there first (keyed by the sampling config and the
    pretrained checkpoints it decodes with)."""
    fitted = fitted_stages(cfg)
    keys = ("seed", "data", "prompt", "sampling", "grid") + (("state_prompt",) if cfg.state_prompt.use else ())
    stage = Stage(cfg, "cases", keys, upstream=tuple(a.key for a in fitted), inputs=fitted)
    out = stage.dir / SAMPLES
    found = find_paper_cases(cfg)
    if stage.is_done() and not force and out.exists():
        return found, pd.read_parquet(out)
    with stage.begin(force=force, check=lambda: check_fitted(cfg, "cases")):  # refused before any clearing
        n = case_samples_per_backbone(cfg)
        parts = [sample_paper_cases(cfg, n=n, backbone=b, cases=found).assign(backbone=b) for b in cfg.grid.backbones]
        df = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()
        save_parquet(df, out)
        stage.finish(rows=len(df), cases=sorted(found))
    return found, df


__all__ = ["PAPER_CASES", "find_paper_cases", "run_cases", "sample_paper_cases"]
