"""The demo's task at a larger size (``studies/scaled_demo.py``, stored from a GPU), beside this build's run.

Both columns are computed by :func:`run_numbers` from a samples frame of the exploration stage: pass@1 of
Base, fixed s0 and CTRLS(epsilon); the fixed-s0 harm against Base; the exploration claim with the adapter
held fixed (epsilon - fixed s0, in pass@1 and in the unbiased pass@k of Chen et al. 2021 from the m samples
of each question, k = min(4, m)); epsilon - Base in the same pass@k; and kappa of the epsilon row's steps
against the independent-chain null (``ctrls.report.mechanism.null_steps``). Differences are paired by
question: the mean per-question difference, a question-bootstrap 95% interval and the sign-flip
permutation p (under H0 a question's two arms are exchangeable, so its difference is as likely negative).
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from ctrls.config.settings import BASE, FIXED
from ctrls.report.mechanism import checked_count, checked_interval, checked_kappa, checked_number, results_dir
from ctrls.report.stored import read as read_stored
from ctrls.report.words import say
from ctrls.stages.sample_tables import PASS_K, run_numbers  # noqa: F401 (re-exported: the pages read them here)
from ctrls.stats.metrics import format_p
from ctrls.stats.paired import paired_pass

SCALED_RESULT = "studies/results/scaled_demo_h200.json"


def _minus(s: str) -> str:
    return s.replace("-", "−")


def _pts(x: dict) -> str:
    """A difference in points with its interval: "+1.2 [−0.3, +2.7]"."""
    return _minus(f"{100 * x['diff']:+.1f} [{100 * x['lo']:+.1f}, {100 * x['hi']:+.1f}]")


def table_markdown(t: pd.DataFrame) -> str:
    """A Markdown table of ``t`` (rows: the index), or "" when it has no column."""
    if t.empty or not len(t.columns):
        return ""
    lines = ["| | " + " | ".join(t.columns) + " |", "|---|" + "---:|" * len(t.columns)]
    lines += [f"| {i} | " + " | ".join(str(v) for v in row) + " |" for i, row in zip(t.index, t.to_numpy())]
    return "\n".join(lines) + "\n"


def _diff(d: dict, key: str, path) -> tuple[float, float, float]:
    v = d.get(key)
    if not isinstance(v, dict):
        raise ValueError(f"{path}: field {key!r} is missing")
    return checked_interval(v, "diff", "lo", "hi", path)


def _column(r: dict, path) -> dict:
    """One column of the table from :func:`run_numbers`' dict (checked: finite numbers, intervals holding
    their estimates), keyed by row name."""
    m = checked_count(r, "samples_per_question", path)
    k = min(PASS_K, m)
    kap = checked_kappa(r.get("kappa") or {}, path)
    checked_number(r.get(f"eps_minus_fixed_pass{k}") or {}, "p", path, 0, 1)  # the claim's sign-flip p, in the sentence
    p1 = r.get("pass1")
    if not isinstance(p1, dict) or len(p1) != 3:
        raise ValueError(f"{path}: field 'pass1' must hold the three rows' pass@1")
    eps = next(c for c in p1 if c not in (BASE, FIXED))
    ci = lambda t: _pts(dict(zip(("diff", "lo", "hi"), t)))  # noqa: E731
    return {
        "questions × samples": f"{checked_count(r, 'questions', path)} × {m}",
        "pass@1 Base / fixed s₀ / " + "ε (%)": " / ".join(f"{100 * checked_number(p1, c, path, 0, 1):.1f}"
                                                          for c in (BASE, FIXED, eps)),
        "fixed s₀ − Base, pass@1": ci(_diff(r, "harm_fixed_minus_base_pass1", path)),
        "ε − fixed s₀, pass@1 (the claim)": ci(_diff(r, "eps_minus_fixed_pass1", path)),
        "k of the unbiased pass@k": str(k),
        "ε − fixed s₀, pass@k (the claim)": ci(_diff(r, f"eps_minus_fixed_pass{k}", path)),
        "ε − Base, pass@k": ci(_diff(r, f"eps_minus_base_pass{k}", path)),
        "κ, ε row vs independent chains (steps)": _minus(f"{kap['kappa']:.2f} [{kap['kappa lo']:.2f}, "
                                                         f"{kap['kappa hi']:.2f}]") + f" ({kap['steps']:,})",
    }


def stored_scaled(path: str | Path | None = None) -> dict | None:
    """The stored scaled run (its ``result``, ``machine``, ``commit``, ``overrides``, ``seconds``), or None
    when the file is absent; a malformed file is a ValueError naming the field."""
    path = Path(path) if path else results_dir() / SCALED_RESULT
    if not path.is_file():
        return None
    d = read_stored(path, "scaled")  # its one validating reader (ctrls.report.stored)
    _column(d["result"], path)  # every shown field checked here, before a page uses it
    return d


def claim_sentence(path: str | Path | None = None) -> str:
    """Finding 2's sentence on the stored scaled run (epsilon - fixed s0 in the unbiased pass@k), or ""."""
    d = stored_scaled(path)
    if d is None:
        return ""
    r = d["result"]
    m = int(r["samples_per_question"])
    k = min(PASS_K, m)
    return say("scaled", "claim", questions=r["questions"], samples=m, gpu=d["machine"].get("gpu", "?"), k=k,
               diff=_pts(r["eps_minus_fixed_pass" + str(k)]))


def scaled_frame(build: pd.DataFrame | None, epsilon: float, path: str | Path | None = None,
                 build_label: str = "this build", stored: dict | None = None) -> pd.DataFrame:
    """The table: this build's column (from its exploration samples ``build``, when given) and the stored
    scaled run's; empty when neither is there."""
    cols = {}
    if build is not None and not build.empty:
        cols[build_label] = _column(run_numbers(build, epsilon), "this build's samples")
    d = stored if stored is not None else stored_scaled(path)  # the record a caller already read and checked
    if d is not None:
        o = d.get("overrides") or {}
        cols[f"{d['machine'].get('gpu', 'stored run')} (profile {d.get('profile', '?')}, "
             f"data seed {o.get('data.seed', '?')})"] = _column(d["result"], path)
    return pd.DataFrame(cols)


def scaled_markdown(build: pd.DataFrame | None, epsilon: float, path: str | Path | None = None,
                    build_label: str = "this build") -> str:
    """The first page's section: a sentence on each column's claim, the table, and where the stored run
    comes from; a sentence saying it is not stored when it is not."""
    d = stored_scaled(path)
    if d is None:
        return say("scaled", "absent", file=SCALED_RESULT) + "\n"
    r, o, mach = d["result"], d.get("overrides") or {}, d["machine"]
    m = int(r["samples_per_question"])
    k = min(PASS_K, m)
    claim, beside = r[f"eps_minus_fixed_pass{k}"], r[f"eps_minus_base_pass{k}"]
    kap = checked_kappa(r["kappa"], path)

    def word(x):
        return say("scaled", "word.above" if x["lo"] > 0 else "word.below" if x["hi"] < 0 else "word.level")

    def num(x):
        return _minus(format(x, ".2f"))
    steer = say("scaled", "steer.weak") if kap["kappa hi"] < 0.2 else ""
    harm = r["harm_fixed_minus_base_pass1"]
    lines = [say("scaled", "section", gpu=mach.get("gpu", "?"), seconds=format(sum((d.get("seconds") or {}).values()), ".0f"),
                 commit=d.get("commit", "?"), n_train=o.get("data.n_train", "?"), questions=r["questions"], samples=m,
                 seed=o.get("data.seed", "?"), word=word(claim), k=k, claim=_pts(claim), p=format_p(claim["p"]),
                 beside=_pts(beside), harm=_pts(harm), kappa=num(kap["kappa"]), lo=num(kap["kappa lo"]),
                 hi=num(kap["kappa hi"]), steps=format(kap["steps"], ","), steer=steer, file=SCALED_RESULT,
                 table=table_markdown(scaled_frame(build, epsilon, path, build_label, stored=d)))]
    return "\n".join(lines) + "\n"


__all__ = ["PASS_K", "SCALED_RESULT", "claim_sentence", "paired_pass", "run_numbers", "scaled_frame", "scaled_markdown",
           "stored_scaled", "table_markdown"]
