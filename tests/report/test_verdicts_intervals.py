"""Verdicts that agree with their intervals and
state their direction, one label for inconclusive, values without an interval printed as such."""
import math

import pandas as pd
import pytest

from ctrls.config.settings import BASE, FIXED
from ctrls.report.tables import _fmt, diversity_table, diversity_view
from tests.stages.test_exploration import _samples, _with_states


def test_fmt_prints_a_value_without_interval_as_such():
    assert _fmt(9.0, math.nan, math.nan, scale=1.0, n=1) == "9.00 (n = 1, no interval)"
    assert _fmt(0.5, 0.4, 0.6) == "50 [40, 60]" or "[" in _fmt(0.5, 0.4, 0.6)
    assert "nan" not in _fmt(0.25, math.nan, math.nan)


def test_diversity_view_fixed_s0_drawn_entropy_is_fixed_by_construction():
    n = [False] * 3
    df = _with_states(_samples({BASE: [n] * 4, FIXED: [n] * 4, "eps=0.1": [n] * 4}))
    t = diversity_table(df, n_boot=50)
    v = diversity_view(t).set_index("config")
    fixed = v.loc[FIXED, "drawn-state entropy (bits)"]
    assert "fixed by construction" in fixed and "[" not in fixed
    assert "[" in v.loc["eps=0.1", "drawn-state entropy (bits)"]
    one = diversity_view(diversity_table(df[df.question_id == "q0"], n_boot=50)).set_index("config")
    assert one.loc["eps=0.1", "distinct answers"].endswith("(n = 1, no interval)")


def test_table1_family_interval_and_one_family_per_comparison():
    """Table 1's intervals are at 1 - 0.05/m over its m comparisons with Base (Bonferroni, the footing
    of the Holm verdict); fixed s0 − Base is the ablation's comparison only (one family per page)."""
    import numpy as np

    from ctrls.report.tables import ablation_table, table1, vs_base_view
    from ctrls.stats.metrics import holm, paired_rate_difference

    rng = np.random.default_rng(0)
    draw = lambda p: [[bool(x) for x in rng.random(3) < p] for _ in range(30)]  # noqa: E731
    df = _samples({BASE: draw(0.3), FIXED: draw(0.4), "eps=0.1": draw(0.6), "eps=0.3": draw(0.5)})
    t = table1(df, n_boot=50).set_index("config")
    assert math.isnan(t.loc[FIXED, "p"]) and math.isnan(t.loc[FIXED, "p (Holm)"])
    assert (t.loc[["eps=0.1", "eps=0.3"], "family"] == 2).all()
    assert np.allclose(t.loc[["eps=0.1", "eps=0.3"], "p (Holm)"], holm(t.loc[["eps=0.1", "eps=0.3"], "p"]))
    anyc = lambda c: np.array([any(r) for r in c], float)  # noqa: E731
    by = {c: anyc(df[df.config == c].sort_values(["question_id", "sample_index"]).groupby("question_id").correct
                  .apply(list)) for c in (BASE, "eps=0.1")}
    ones = np.ones(30)
    fam = paired_rate_difference(by["eps=0.1"], ones, by[BASE], ones, alpha=0.025)
    one = paired_rate_difference(by["eps=0.1"], ones, by[BASE], ones)
    assert t.loc["eps=0.1", "Δ lo"] == pytest.approx(fam["lo"]) and t.loc["eps=0.1", "Δ hi"] == pytest.approx(fam["hi"])
    assert fam["lo"] < one["lo"] and fam["hi"] > one["hi"]  # the family interval is the wider one
    assert list(vs_base_view(table1(df, n_boot=50)).config) == ["eps=0.1", "eps=0.3"]
    a = ablation_table(df, n_boot=50)
    assert (a.family == 2 * len(a)).all() and f"{FIXED} − {BASE}" in set(a.comparison)


def test_case_sentences_per_dataset():
    from ctrls.report.verdicts import case_sentences

    rows = []
    for ds, (c_ok, b_ok) in {"gsm8k": ([1, 0], [0, 0]), "word_problems": ([0, 1, 1], [1, 1, 1])}.items():
        for cfg, oks in (("eps=0.1", c_ok), (BASE, b_ok)):
            for q, ok in enumerate(oks):
                rows.append({"dataset": ds, "temperature": 0.7, "config": cfg, "question_id": f"q{q}", "correct": bool(ok)})
    s = case_sentences(pd.DataFrame(rows), "eps=0.1")
    assert s == ["gsm8k, η = 0.7: eps=0.1 solves 1 question that Base misses in its samples, and misses 0 that "
                 "Base solves (of 2); the cases below are drawn from the first kind.",
                 "word_problems, η = 0.7: eps=0.1 solves 0 questions that Base misses in its samples, and misses 1 "
                 "that Base solves (of 3); the cases below are drawn from the first kind."]


def test_paper_tables_by_table_paired_p_range_against_brute_force():
    """The range of exact McNemar p-values a pairing of the questions could give, checked
    against every feasible 2x2 table (scipy's binomial test); Table 1 resolves nothing under any
    pairing (5 questions at most, p >= 0.0625), Table 2's published rates leave 0 to 17 of 32 open."""
    from scipy.stats import binomtest

    from ctrls.stats import power

    def brute(x1, x0, n):
        ps = []
        for both in range(0, n + 1):  # A: solved by both; b = x1 - A, c = x0 - A, neither = n - A - b - c
            b, c = x1 - both, x0 - both
            if b < 0 or c < 0 or both + b + c > n:
                continue
            ps.append(1.0 if b + c == 0 else binomtest(b, b + c, 0.5).pvalue)
        return min(ps), max(ps)

    for x1, x0, n in ((5, 0, 40), (20, 15, 40), (39, 36, 40), (250, 239, 500), (3, 3, 10), (0, 0, 5)):
        assert power.paired_p_range(x1, x0, n) == pytest.approx(brute(x1, x0, n)), (x1, x0, n)
    from ctrls.report import paper_power

    pw = paper_power.paired_p_columns(paper_power.paper_power())
    st = paper_power.table_statements(pw)
    assert "no difference is resolvable under any pairing" in st["Table 1"] and "5 questions" in st["Table 1"]
    assert "≥ 0.0625" in st["Table 1"]
    assert "between 0" in st["Table 2"] and "and 17 (minimal discordance) of the 32" in st["Table 2"]


def test_sizing_simulates_the_pages_own_tests():
    """The simulated tests are the pages' (exact McNemar against scipy's binomial test, the
    swap test against ctrls.stats.metrics'), Holm's family lowers the power, a between-arm correlation
    below 1 lowers it too, and the null rejects at most at the level."""
    import numpy as np
    from scipy.stats import binomtest

    from ctrls.stats import sizing
    from ctrls.stats.metrics import paired_rate_difference

    rng = np.random.default_rng(3)
    x1, x0 = rng.random((50, 40)) < 0.5, rng.random((50, 40)) < 0.35
    ref = [binomtest(int((a & ~b).sum()), int((a ^ b).sum()), 0.5).pvalue if (a ^ b).any() else 1.0
           for a, b in zip(x1, x0)]
    assert np.allclose(sizing._mcnemar_p(x1, x0), ref)
    m1, m0 = rng.binomial(4, 0.6, (1, 40)), rng.binomial(4, 0.45, (1, 40))
    ours = sizing._swap_p((m1 - m0) / 4, 20000, rng)[0]
    page = paired_rate_difference(m1[0], np.full(40, 4.0), m0[0], np.full(40, 4.0), n_perm=20000)["p_value"]
    assert ours == pytest.approx(page, abs=0.01)
    kw = dict(p0=0.25, n_q=40, m=4, icc=0.2, n_sim=600, seed=1)
    assert sizing.simulated_power(delta=0.0, stat="any", test="mcnemar", **kw) <= 0.05 + 0.02
    assert sizing.simulated_power(delta=0.0, stat="mean", test="permutation", n_perm=400, **kw) <= 0.05 + 0.02
    one = sizing.simulated_power(delta=0.25, stat="any", test="mcnemar", **kw)
    four = sizing.simulated_power(delta=0.25, stat="any", test="mcnemar", family=4, **kw)
    loose = sizing.simulated_power(delta=0.25, stat="any", test="mcnemar", rho=0.3, **kw)
    assert four < one - 0.05 and loose < one - 0.05
    with pytest.raises(ValueError, match="McNemar"):
        sizing.simulated_power(delta=0.1, stat="mean", test="mcnemar", **kw)


def test_between_arm_correlation():
    import numpy as np

    from ctrls.stats.sizing import between_arm_correlation

    r = np.linspace(0, 1, 30)
    assert between_arm_correlation(r, r ** 2) == pytest.approx(1.0)
    assert between_arm_correlation(r, r[::-1]) == 0.0  # clipped at 0
    noise = np.random.default_rng(0).random(400)
    assert abs(between_arm_correlation(np.random.default_rng(1).random(400), noise)) < 0.15
    assert between_arm_correlation(np.zeros(5), r[:5]) == 1.0  # no spread: no information, the shift model
