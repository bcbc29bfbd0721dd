"""The seeds study on the page: the stored pooled result is read through its schema (a seed listed twice, an
estimate outside its interval are refused by name), every claim is a row, and the scorecard's method rows take
the pooled verdict with this build's run beside it."""
from __future__ import annotations

import json

import pytest

from ctrls.report import seeds_study
from ctrls.report.stored import StoredResultError, read
from ctrls.report.verdicts import Claim, Estimate
from tests.studies.harness import load_study
from tests.studies.test_seeds_study_pool import synthetic_seed


@pytest.fixture(scope="module")
def pooled_file(tmp_path_factory):
    study = load_study("seeds_study")
    d = tmp_path_factory.mktemp("seeds")
    study.OUT, study.POOLED = d, d / "studies" / "results" / "seeds_pooled.json"
    study.POOLED.parent.mkdir(parents=True)
    for s, shift in ((100, 0), (101, -1), (102, 1), (103, 0)):
        synthetic_seed(study, s, shift).to_parquet(d / f"seed_{s}.parquet")
        (d / f"seed_{s}.json").write_text(json.dumps({"data_seed": s, "n_states": 2, "machine": {"cpu": "x"},
                                                     "pretrained_policy": {"c": 5.0}, "rl_policies": {}}))
    study.pool()
    return study.POOLED


def test_the_stored_result_is_read_and_every_claim_is_a_row(pooled_file):
    res = read(pooled_file, "seeds_pooled")
    t = seeds_study.claims_frame(res)
    assert list(t.claim) == [m[0] for m in seeds_study.MEANING.values()] and set(t.seeds) == {4}
    n = seeds_study.numbers(res)
    assert n["n_seeds"] == "4" and n["seeds"] == "100, 101, 102, 103" and "[" in n["eps_minus_hold_s0_pass1"]
    assert len(seeds_study.states_frame(res)) == 4 * 2 and len(seeds_study.rl_frame(res)) == 4


@pytest.mark.parametrize("edit, field", [
    (lambda d: d["seeds"].append(d["seeds"][0]), "seeds[4]"),
    (lambda d: d["claims"]["kappa"].update(estimate=d["claims"]["kappa"]["hi"] + 1), "claims.kappa.estimate"),
    (lambda d: d["claims"].pop("rl_minus_best_constant_pass1"), "claims.rl_minus_best_constant_pass1"),
    (lambda d: d["claims"]["kappa"].update(n_seeds=2.5), "claims.kappa.n_seeds"),
])
def test_a_damaged_result_is_refused_naming_the_field(pooled_file, tmp_path, edit, field):
    d = json.loads(pooled_file.read_text())
    edit(d)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(d))
    with pytest.raises(StoredResultError, match=field.replace("[", r"\[").replace("]", r"\]")):
        read(bad, "seeds_pooled")


def test_the_scorecards_method_rows_take_the_pooled_verdict(pooled_file):
    res = read(pooled_file, "seeds_pooled")
    dev = Claim("pass", "Table 1", "dev evidence", "contradicted", "generated/02_exploration",
                estimates=[Estimate("word_problems eps=0.1", -0.2, -0.3, -0.1)])
    other = Claim("other", "x", "y", "supported", "p")
    out = seeds_study.method_claims([dev, other], res, {"pass": "pass"})
    assert out[1] is other
    c = out[0]
    r = res["claims"]["eps_minus_base_pass_n"]
    assert c.page == seeds_study.PAGE and c.estimates[0].d == r["estimate"] and c.beside[0].d == -0.2
    want = "supported" if r["lo"] > 0 else "contradicted" if r["hi"] < 0 else "not supported"
    assert c.label == want and "development seed" in c.evidence
    assert seeds_study.method_claims([dev], None, {"pass": "pass"}) == [dev]
