"""studies/seeds_study.py: each seed's claims from its stored samples (paired by question, the best constant
state chosen on the validation half and compared on the other), pooled over seeds into the schema the book reads."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from tests.studies.harness import load_study, refused


@pytest.fixture(scope="module")
def study():
    return load_study("seeds_study")


# correct samples out of 4 per question, by row: on validation questions state 2 beats state 1, on test ones
# state 1 beats state 2, so a choice made on the test half would pick the other state
RATES = {"Base": (1, 1), "hold s0": (2, 2), "state 1": (1, 4), "state 2": (3, 2), "eps=0.1": (3, 3),
         "ε=0.1, H=0.01": (4, 3), "ε=0.0, H=0.0": (2, 1)}


def synthetic_seed(study, seed: int, shift: int = 0, nq: int = 8) -> pd.DataFrame:
    qids = [f"q{i}" for i in range(nq)]
    split = study.split_of(seed, qids)
    rows = []
    for q in qids:
        half = 0 if split[q] == "validation" else 1
        for config, rate in RATES.items():
            c = min(4, rate[half] + (shift if config == "eps=0.1" else 0) + (q in qids[:2] and config == "Base"))
            for m in range(4):
                rows.append({"data_seed": seed, "source": "rl" if config.startswith("ε") else "exploration",
                             "config": config, "question_id": q, "question": "Ana has 4 cards and gets 6 more.",
                             "sample_index": m, "correct": m < c,
                             "steps": ["Ana has 4 cards.", "4 + 6 = 10", "The answer is 10."],
                             "states": [0, 1, 1], "encoded": [0, 1, 1] if config == "eps=0.1" else [0, 1, 0],
                             "s0": 0, "chains": [[1, 0, 0]] if config == "Base" else [],
                             "chain_eps": [0.1] if config == "Base" else [],
                             "split": split[q]})
    return pd.DataFrame(rows)


def test_one_seeds_claims_are_its_paired_differences(study):
    df = synthetic_seed(study, 100)
    c, info = study.seed_claims(df, {"data_seed": 100, "n_states": 2})
    p1 = df.groupby(["config", "question_id"]).correct.mean().unstack(0)
    val = p1.index[df.drop_duplicates("question_id").set_index("question_id").split.reindex(p1.index) == "validation"]
    test = p1.index.difference(val)
    assert info["states"]["best_constant"] == 2  # chosen on the validation half, where state 2 is better
    assert c["rl_minus_best_constant_pass1"]["estimate"] == pytest.approx((p1["ε=0.1, H=0.01"] - p1["state 2"])[test].mean())
    assert c["rl_minus_best_constant_pass1"]["questions"] == len(test) == 4
    assert c["hold_s0_minus_base_pass1"]["estimate"] == pytest.approx((p1["hold s0"] - p1["Base"]).mean())
    d = (p1["eps=0.1"] - p1["hold s0"]).to_numpy()
    assert c["eps_minus_hold_s0_pass1"]["variance"] == pytest.approx(d.var(ddof=1) / len(d))
    pn = df.groupby(["config", "question_id"]).correct.max().unstack(0).astype(float)
    assert c["eps_minus_base_pass_n"]["estimate"] == pytest.approx((pn["eps=0.1"] - pn["Base"]).mean())
    assert c["rl_minus_pretrained_pass1"]["estimate"] == pytest.approx((p1["ε=0.1, H=0.01"] - p1["eps=0.1"]).mean())
    assert c["kappa"]["estimate"] == pytest.approx(1.0)  # every step follows its state; the null chain never does
    kinds = info["states"]["step_kinds"]
    assert kinds["1"] == {"answer": 0.5, "compute": 0.0, "restate": 0.5, "other": 0.0}  # Base reads steps 1 and 3 as state 1
    assert kinds["2"]["compute"] == 1.0


def test_the_pooled_file_holds_every_claim_over_the_seeds(study, tmp_path, monkeypatch):
    monkeypatch.setattr(study, "OUT", tmp_path)
    monkeypatch.setattr(study, "POOLED", tmp_path / "pooled.json")
    for s, shift in ((100, 0), (101, -1), (102, 1)):
        synthetic_seed(study, s, shift).to_parquet(tmp_path / f"seed_{s}.parquet")
        (tmp_path / f"seed_{s}.json").write_text(json.dumps({"data_seed": s, "n_states": 2, "machine": {"cpu": "x"},
                                                             "pretrained_policy": {}, "rl_policies": {}}))
    res = study.pool()
    saved = json.loads((tmp_path / "pooled.json").read_text())
    assert saved["seeds"] == [100, 101, 102] == res["seeds"]
    for name in study.CLAIMS:
        r = saved["claims"][name]
        assert {"estimate", "lo", "hi", "tau", "i2", "q", "pred_lo", "pred_hi", "n_seeds", "unit"} <= set(r)
        assert r["n_seeds"] == 3 and r["lo"] <= r["estimate"] <= r["hi"]
    e = saved["claims"]["eps_minus_hold_s0_pass1"]
    assert e["estimate"] == pytest.approx(np.average([x["estimate"] for x in e["per_seed"]],
                                                     weights=[1 / (x["se"] ** 2 + e["tau"] ** 2) for x in e["per_seed"]]))
    assert e["tau"] > 0 and e["pred_lo"] < e["lo"]  # the seeds' shifts are a between-run spread


def test_bad_arguments_are_one_line(study):
    assert "twice" in refused(study.main, ["pool", "--seeds", "100,100"])
    assert "integers" in refused(study.main, ["pool", "--seeds", "a"])


def test_a_stored_file_is_written_whole_and_a_nan_writes_nothing(study, tmp_path):
    out = tmp_path / "seed_1.json"
    study.write_json({"a": 1}, out)
    with pytest.raises(ValueError):
        study.write_json({"a": float("nan")}, out)
    assert json.loads(out.read_text()) == {"a": 1} and [p.name for p in tmp_path.iterdir()] == ["seed_1.json"]
