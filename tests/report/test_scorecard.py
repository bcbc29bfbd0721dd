"""ctrls.report.scorecard: one verdict per claim from its rows (supported, contradicted, mixed, or not supported
with the estimates' directions counted), each claim's state named when it has no verdict (not run, no
comparison in this profile), Eq. 8 judged on kappa against the independent-chain null, the pilot read at the
profile's difficulty, the demo's MDDs quoted once per claim, and the paper's own differences counted by hand."""
import math

import pandas as pd

from ctrls.config.settings import FIXED
from ctrls.report import scorecard as sc
from ctrls.report.scorecard import _combine
from ctrls.report.verdicts import Claim
from tests.repo.test_reliability import _cfg, _finished_exploration, _samples


def test_combined_verdict_of_a_family():
    ns = "not supported: the estimate is in the claimed direction (+3.0 points)"
    opp = "not supported: the estimate is in the opposite direction (−22.5 points)"
    assert _combine([ns, "supported"]) == "supported"
    assert _combine(["contradicted", opp]) == "contradicted"
    assert _combine(["supported", "contradicted"]) == "mixed"
    assert _combine([opp]) == opp  # one row: its own sentence, with its direction
    assert _combine([opp, opp]) == "not supported: every estimate is in the opposite direction"
    assert _combine([ns, opp]) == "not supported: 1 of 2 estimates in the claimed direction, 1 in the opposite"
    zero = "not supported: the estimate is zero (+0.0 points)"
    assert _combine([zero, zero]) == "not supported: every estimate is zero"
    assert _combine([ns, zero]) == "not supported: 1 of 2 estimates in the claimed direction, 0 in the opposite, 1 zero"


def test_pilot_is_read_at_the_profiles_difficulty(tmp_path):
    import json

    from ctrls.config.schema import load_config
    from ctrls.report.scorecard import pilot

    cfg = load_config("demo")
    tag = cfg.data.word_problems.difficulty().tag()
    f = tmp_path / "pilot.json"
    level = {"questions": 40, "samples": 4, "pass@1 95% CI": [0.1, 0.95], "succ": 0.9, "icc": 0.1}  # what the pages read
    f.write_text(json.dumps({"levels": [{**level, "difficulty": "other", "pass@1": 0.9},
                                        {**level, "difficulty": tag, "pass@1": 0.2}]}))
    assert pilot(cfg, f)["pass@1"] == 0.2
    assert pilot(load_config("demo", ["data.word_problems.n_ops=3"]), f) is None  # not measured at that difficulty
    assert pilot(load_config("smoke"), f) is None  # not the word problems


def test_the_scorecard_says_not_run_for_a_stage_that_did_not_run(tmp_path):
    from ctrls.report.scorecard import demo_claims, synthetic_claims
    claims = demo_claims(_cfg(tmp_path)) + synthetic_claims(_cfg(tmp_path))
    assert [c.verdict for c in claims] == ["not run"] * 3
    assert "has not run" in claims[0].evidence


def test_a_grid_with_nothing_to_compare_is_no_comparison_not_a_verdict(tmp_path):
    from ctrls.report.scorecard import demo_claims
    cfg = _cfg(tmp_path, "grid.epsilons=[]", "grid.fixed_state=false")
    _finished_exploration(cfg, _samples(2))  # Base only, and run
    claims = {c.claim: c for c in demo_claims(cfg)}
    exploration = [c for c in claims.values() if c.page.endswith("02_exploration")]
    assert len(exploration) == 3
    assert all(c.verdict == "no comparison in this profile" and "grid.epsilons is empty" in c.evidence
               for c in exploration)


def test_the_combined_verdict_of_no_rows_is_not_a_direction():
    from ctrls.report.scorecard import _combine
    assert _combine([]) == "not computed"


def test_scorecard_judges_controllability_on_kappa_against_the_independent_chain_null():
    """Eq. 8 is judged on the epsilon rows' kappa against the independent-chain null (Holm over those
    rows); the fixed-s0 row has no kappa, is reported beside, and cannot change the verdict."""
    from ctrls.report.scorecard import controllability_claim

    row = dict(dataset="wp", K=4, follows=0.5, steps=200, questions=20, **{"Base, random states": 0.25})
    nan = float("nan")
    ct = pd.DataFrame([{**row, "config": FIXED, "Δ vs Base": 0.6, "Δ lo": 0.4, "Δ hi": 0.8, "p (Holm)": 0.001,
                        "null": nan, "κ": nan, "κ lo": nan, "κ hi": nan, "p (κ, Holm)": nan},
                       {**row, "config": "eps=0.1", "Δ vs Base": 0.25, "Δ lo": 0.1, "Δ hi": 0.4, "p (Holm)": 0.001,
                        "null": 0.45, "κ": 0.09, "κ lo": -0.05, "κ hi": 0.2, "p (κ, Holm)": 0.3}])
    c = controllability_claim(ct, {"controllability": 12.0}, "p")
    assert c.verdict.startswith("not supported: the estimate is in the claimed direction")  # Δ vs Base would say supported
    assert "independent chain" in c.evidence and "κ 0.09 [-0.05, 0.20]" in c.evidence
    assert [e.label for e in c.beside] == ["wp fixed s0 − Base steps in s0"]
    assert controllability_claim(ct[ct.config == FIXED], {}, "p") is None  # fixed s0 alone is not the claim's test
    ct.loc[1, ["κ", "κ lo", "κ hi", "p (κ, Holm)"]] = 0.2, 0.05, 0.35, 0.01
    assert controllability_claim(ct, {"controllability": 12.0}, "p").verdict == "supported"


def test_one_mdd_per_claim_and_the_pages_families(monkeypatch):
    """The scorecard quotes the summary page's MDDs (one number per claim); each comparison is sized
    with its page's test and family, Succ. with its own correlation, controllability against its
    reference."""
    from ctrls.config.schema import load_config
    from ctrls.report import scorecard as sc
    from ctrls.stats.sizing import demo_comparisons, families

    cfg = load_config("demo")
    monkeypatch.setattr(sc, "N_SIM", 60)
    table, mdds = sc.demo_power_table(cfg), sc.demo_mdds(cfg)
    assert len(table) == 6 and set(mdds) == {"pass@n", "succ", "ablation", "ablation design", "rl", "controllability"}
    for name, mdd in zip(table.comparison, table["MDD at 80% power (pts)"]):
        key = {c.name: c.key for c in demo_comparisons(cfg, 0.2)}[name]
        assert (math.isnan(mdd) and math.isnan(mdds[key])) or mdds[key] == mdd
    fam = families(cfg)
    cs = {c.key: c for c in demo_comparisons(cfg, 0.2, succ0=0.9, icc_succ=0.01, reference=0.3)}
    assert cs["pass@n"].test == "mcnemar" and cs["pass@n"].family == fam["table1"]
    assert cs["succ"].test == "permutation" and cs["succ"].icc == 0.01 and cs["succ"].family == fam["ablation"]
    assert cs["controllability"].p0 == 0.3 and cs["rl"].family == fam["rl"]
    n = cfg.grid.n_samples  # the design beside the ablation: twice the samples, the unbiased pass@n, permuted
    d = cs["ablation design"]
    assert (d.m, d.stat, d.test, d.family) == (2 * n, f"pass@{n}", "permutation", fam["ablation"])
    g = cfg.grid
    assert fam["table1"] == len(g.backbones) * (len(g.datasets) * len(g.temperatures) * len(g.epsilons)
                                                 + len(g.transfer_datasets))


def test_an_interval_cell_reads_back_as_two_numbers():
    assert sc._interval("[0.1, 0.3]") == (0.1, 0.3) and sc._interval(" [-1.5,2] ") == (-1.5, 2.0)


def test_the_mdd_note_stands_beside_an_unresolved_verdict_only():
    note = sc._mdd_note({"pass@n": 31.4}, "pass@n", "not supported: the estimate is zero (+0.0 points)")
    assert note == " (the demo detects about 31 points at 80% power with the page's test and Holm)"
    assert sc._mdd_note({"pass@n": 31.4}, "pass@n", "supported") == ""
    assert sc._mdd_note({"pass@n": math.nan}, "pass@n") == sc._mdd_note({}, "pass@n") == ""


def _cfg_like(**grid):
    from types import SimpleNamespace

    return SimpleNamespace(grid=SimpleNamespace(**grid))


def test_the_grids_missing_comparisons_are_named():
    gaps = sc._exploration_gaps(_cfg_like(epsilons=[], fixed_state=False))
    assert gaps["eps"] == ("the grid has no CTRLS(ε) row (grid.epsilons is empty) and no fixed-s0 row "
                           "(grid.fixed_state is false): Base only")
    assert gaps["ablation"].endswith(gaps["eps"])
    only_eps = sc._exploration_gaps(_cfg_like(epsilons=[0.1], fixed_state=False))
    assert set(only_eps) == {"ablation"} and only_eps["ablation"].endswith("grid.fixed_state is false")
    assert sc._exploration_gaps(_cfg_like(epsilons=[0.1], fixed_state=True)) == {}


def test_the_papers_differences_are_counted_by_hand():
    pw = pd.DataFrame({"table": ["T1"] * 3 + ["T2"] * 2, "n": [40] * 3 + [500] * 2,
                       "diff (pp)": [5.0, -7.5, 0.0, 2.0, 3.0], "excludes 0": [False, True, False, False, False],
                       "below MDD": [True, False, True, True, True], "MDD up (pp)": [20.0, 25.0, math.nan, 6.0, 8.0],
                       "p, minimal discordance": [0.2, 0.01, 1.0, 0.04, 0.03],
                       "p, maximal discordance": [1.0, 0.3, 1.0, 0.5, 0.02]})
    c = sc.paper_power_counts(pw)
    assert {k: c[k] for k in ("n", "up", "down", "zero", "excluding 0", "below MDD", "largest")} == \
        {"n": 5, "up": 3, "down": 1, "zero": 1, "excluding 0": 1, "below MDD": 4, "largest": -7.5}
    assert c["tables"] == {"T1": {"n": 40, "differences": 3, "best": 1, "worst": 0, "median MDD up": 22.5},
                           "T2": {"n": 500, "differences": 2, "best": 2, "worst": 1, "median MDD up": 7.0}}


def test_the_scorecard_is_written_with_the_run_it_comes_from(tmp_path):
    cfg = _cfg(tmp_path)
    claim = Claim(sc.PASS_CLAIM, "Table 1", "ev", "not run", "generated/02_exploration", claimed=sc.PASS_DIR)
    path = sc.write_scorecard(cfg, tmp_path / "book" / "generated" / "scorecard.md", [claim])
    text = path.read_text()
    assert path.parent.is_dir() and "Generated from the `smoke` profile's runs" in text
    assert sc.PASS_CLAIM in text and "not run" in text
