"""studies/seeds.py --against: each seed's paired difference between two variants (kappa and the epsilon
row's pass@1), Holm over the seeds; runs of other seeds are refused before any work."""
from __future__ import annotations

import types

import numpy as np
import pandas as pd
import pytest

from tests.studies.harness import load_study


@pytest.fixture(scope="module")
def seeds():
    return load_study("seeds")


def test_runs_of_other_seeds_are_refused_before_any_work(seeds, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(seeds, "one_seed", lambda *a, **k: pytest.fail("seeds.py did work"))
    with pytest.raises(SystemExit):
        seeds.main(["--runs", f"6:{tmp_path}", f"7:{tmp_path}", "--against", f"7:{tmp_path}", f"6:{tmp_path}"])
    assert "--against takes runs of the same data seeds" in capsys.readouterr().err


def test_each_seeds_differences_are_paired_and_holm_adjusted(seeds, monkeypatch):
    """Variant A's steps follow their state 90% of the time, B's as often as the null (50%): kappa A - B is
    0.8 on every seed; the epsilon rows' pass@1 differ by 0.25 on every question. Holm's p is never below
    the raw one, and the other variant's own kappa is stored."""
    qs = [f"{i}" for i in range(30) for _ in range(10)]

    def trip(rate, seed):
        follows = (np.arange(300) % 10 < rate * 10).astype(int)
        return follows, np.arange(300) % 2, [f"{seed}:{q}" for q in qs]  # the null: every other step

    def rows(p):
        return pd.DataFrame({"question_id": np.repeat(np.arange(30), 4),
                             "correct": np.tile([True] * int(4 * p) + [False] * (4 - int(4 * p)), 30)})

    cfgs = [types.SimpleNamespace(data=types.SimpleNamespace(seed=s), variant="A") for s in (6, 7)]
    others = [types.SimpleNamespace(data=types.SimpleNamespace(seed=s), variant="B") for s in (6, 7)]
    monkeypatch.setattr(seeds, "one_seed", lambda cfg, margin, seed=0: (
        {"kappa": {"kappa": 0.0}, "pass1": {"eps": 0.25}}, trip(0.5, cfg.data.seed)))
    monkeypatch.setattr(seeds, "eps_row", lambda cfg: rows(0.5 if cfg.variant == "A" else 0.25))
    out = seeds.against(cfgs, others, [trip(0.9, s) for s in (6, 7)])
    assert [o["data_seed"] for o in out] == [6, 7]
    for o in out:
        assert o["kappa_diff"]["diff"] == pytest.approx(0.8) and o["kappa_diff"]["lo"] > 0.5
        assert o["eps_pass1_diff"]["diff"] == pytest.approx(0.25)
        assert (o["kappa_diff"]["p_holm"] >= o["kappa_diff"]["p_value"]
                and o["eps_pass1_diff"]["p_holm"] >= o["eps_pass1_diff"]["p"])
        assert o["kappa_other"] == {"kappa": 0.0}


def test_table2_policies_are_paired_with_base_and_the_pretrained_row(seeds, monkeypatch):
    """rl_rows: a Table 2 policy right on 3 of 4 samples of every question, Base on none and the pretrained
    epsilon row on 2: +0.75 and +0.25, paired by question, Holm over the policies; a seed whose RL stage
    has not run has no RL rows."""
    import ctrls.stages.rl as rl
    from ctrls.stages.common import NotRunError

    def rows(config, right, dataset="word_problems"):
        return pd.DataFrame({"dataset": dataset, "config": config, "question_id": np.repeat(np.arange(20), 4),
                             "correct": np.tile([True] * right + [False] * (4 - right), 20)})

    cfg = types.SimpleNamespace(data=types.SimpleNamespace(dataset="word_problems", seed=9),
                                grid=types.SimpleNamespace(epsilons=[0.1]))
    base, pre = rows("Base", 0), rows("eps=0.1", 2)
    monkeypatch.setattr(rl, "load_table2_samples", lambda c: pd.concat(
        [rows("ε=0.0, H=0.0", 3), rows("ε=0.1, H=0.01", 1), rows("ε=0.0, H=0.0", 4, "gsm8k")]))  # another dataset: left out
    out = seeds.rl_rows(cfg, base, pre)
    assert set(out) == {"ε=0.0, H=0.0", "ε=0.1, H=0.01"}
    a = out["ε=0.0, H=0.0"]
    assert (a["pass1"] == 0.75 and a["minus_base"]["diff"] == pytest.approx(0.75)
            and a["minus_pretrained_eps"]["diff"] == pytest.approx(0.25))
    assert out["ε=0.1, H=0.01"]["minus_pretrained_eps"]["diff"] == pytest.approx(-0.25)
    assert all(r[k]["p_holm"] >= r[k]["p"] for r in out.values() for k in ("minus_base", "minus_pretrained_eps"))

    def not_run(c):
        raise NotRunError("no Table 2 samples")

    monkeypatch.setattr(rl, "load_table2_samples", not_run)
    assert seeds.rl_rows(cfg, base, pre) is None
