"""The exploration grid: samples per question (resume after a kill: test_resume.py), Table 1 from them; the
fixed-s0 ablation, the controllability and diversity tables, and the matrices' completeness check."""
import math

import numpy as np
import pandas as pd
import pytest
from conftest import requires_data

from ctrls.config.schema import load_config
from ctrls.config.settings import BASE, FIXED
from ctrls.report.tables import ablation_table, ablation_view, controllability_table, diversity_table, matrices, table1
from ctrls.stages.exploration import load_samples
from ctrls.stats.metrics import holm


@pytest.mark.integration
@requires_data
def test_grid_and_table(smoke_runs):
    _, cfg, _ = smoke_runs
    df = load_samples(cfg)
    g = cfg.grid
    assert g.fixed_state
    assert len(df) == cfg.data.n_test * g.n_samples * len(g.temperatures) * (2 + len(g.epsilons))
    assert not df.duplicated(["temperature", "config", "question_id", "sample_index"]).any()
    assert set(df.config) == {BASE, FIXED, *(f"eps={e:g}" for e in g.epsilons)}
    ctrls_rows = df[df.config != BASE]
    assert all(len(s) == len(st) for s, st in zip(ctrls_rows.steps, ctrls_rows.states))  # a state per step
    assert all(len(s) == len(e) for s, e in zip(df.steps, df.encoded))  # every step re-encoded, Base too
    fixed = df[df.config == FIXED]
    assert fixed.epsilon.isna().all()
    assert all(len(set(st)) <= 1 for st in fixed.states)  # s_0 repeated, no transition drawn
    base = df[df.config == BASE]
    assert all(len(c) == len(e) for cs, e in zip(base.chains, base.encoded) for c in cs)
    assert all(list(ce) == list(g.epsilons) for ce in base.chain_eps)
    t = table1(df, n_boot=100)
    assert set(t.config) == set(df.config) and t.questions.eq(cfg.data.n_test).all()
    assert list(t.config) == [BASE, FIXED, *(f"eps={e:g}" for e in g.epsilons)] * len(g.temperatures)
    assert ((t["pass@n lo"] <= t["pass@n"]) & (t["pass@n"] <= t["pass@n hi"])).all()
    a = ablation_table(df, n_boot=100)
    assert list(a.comparison) == [f"{FIXED} − {BASE}", *(f"eps={e:g} − {FIXED}" for e in g.epsilons)] * len(g.temperatures)
    c = controllability_table(df, n_boot=100)
    assert set(c.config) == {FIXED, *(f"eps={e:g}" for e in g.epsilons)}
    assert ((c["follows lo"] <= c["follows"]) & (c["follows"] <= c["follows hi"])).all()
    assert c.chance.eq(1 / c.K).all() and c["Base, random states"].between(0, 1).all()
    d = diversity_table(df, n_boot=100)
    assert d["distinct answers"].between(0, g.n_samples).all()


@pytest.mark.integration
@requires_data
def test_reencoding_reproduces_pretraining_states(smoke_runs):
    """Re-encoding the training trajectories with the exploration stage's path gives back the states
    pretraining's Q_phi assigned to their steps (runs/.../states/steps.parquet): the same code path."""
    from ctrls.data.prompts import encode_prompt, newline_token_ids, step_spans
    from ctrls.generate.controllability import encode_generations
    from ctrls.method.backbone import load_backbone
    from ctrls.stages.collect import kept_trajectories
    from ctrls.stages.common import problems_from_config
    from ctrls.stages.pretrain import pretrain_stages

    _, cfg, run = smoke_runs
    pc = cfg.for_pair(*cfg.pairs()[0])
    bb = load_backbone(pc.backbone.name)
    model = run.model(bb)
    steps = run.steps()
    traj = kept_trajectories(pretrain_stages(pc)["collect"].dir)
    by_q = {p.id: p for p in problems_from_config(pc, "train")}
    nl = newline_token_ids(bb.tokenizer)
    checked, seen = 0, set()
    for qid, g in traj.groupby("qid", sort=False):
        ids, start = encode_prompt(bb.tokenizer, by_q[qid].question, pc.prompt.use_chat_template, pc.prompt.few_shot)

        class Gen:
            def __init__(self, s):
                self.token_ids = list(s)
                self.spans = step_spans(self.token_ids, nl, bb.tokenizer, max_steps=pc.prompt.max_steps)

        gens = [Gen(s) for s in g.solution_ids]
        _, states = encode_generations(bb, model, ids, start, gens, layer=pc.backbone.hidden_layer)
        for t, st in enumerate(states):
            ref = steps[(steps.qid == qid) & (steps.trajectory == t)].sort_values("step").state.tolist()
            assert st == ref, (qid, t)
            checked += len(st)
            seen.update(st)
    assert checked == len(steps) and len(seen) == model.config.n_states > 1  # every training step, every state


# ---- tables on hand-made samples -------------------------------------------------------------------------


def _samples(correct: dict[str, list[list[bool]]], eta: float = 0.7, **extra) -> pd.DataFrame:
    """Rows of a fake exploration run: ``correct[config][question][sample]``; valid = correct unless
    ``valid`` gives other values the same way."""
    valid = extra.pop("valid", {})
    rows = []
    for cfg_label, by_q in correct.items():
        for qi, samples in enumerate(by_q):
            for m, c in enumerate(samples):
                v = valid.get(cfg_label, by_q)[qi][m] if cfg_label in valid else c
                rows.append({"backbone": "b", "dataset": "d", "temperature": eta, "config": cfg_label,
                             "epsilon": float(cfg_label.split("=")[1]) if cfg_label.startswith("eps=") else math.nan,
                             "question_id": f"q{qi}", "sample_index": m, "correct": c, "valid": v,
                             "pred": str(qi) if c else ("x" if v else None)})
    return pd.DataFrame(rows)


def test_a_missing_sample_is_an_error_naming_config_and_question():
    """A sample missing from a question would enter the pass@n / Succ. matrix as NaN, which bool()
    counts as correct: it is an error naming the (config, question) that is short."""
    df = _samples({"eps=0.1": [[False, False, False], [True, False, False]]})
    assert matrices(df, "correct").tolist() == [[False, False, False], [True, False, False]]
    short = df.drop(index=df[(df.question_id == "q0") & (df.sample_index == 1)].index)
    with pytest.raises(ValueError, match=r"config 'eps=0.1'.*question 'q0' is short.*sample index \[1\]"):
        matrices(short, "correct")
    with pytest.raises(ValueError, match=r"config 'eps=0.1'.*question 'q0' is short"):
        table1(short, n_boot=10)
    with pytest.raises(ValueError, match=r"question 'q1' has sample 2 more than once"):
        matrices(pd.concat([df, df.iloc[[5]]]), "correct")
    nan_value = df.astype({"correct": object})
    nan_value.loc[0, "correct"] = None
    with pytest.raises(ValueError, match="question 'q0' is short"):
        matrices(nan_value, "correct")


def test_table1_pairs_base_by_question():
    """The Δ vs Base is computed on the same questions: same shape, other questions -> no comparison."""
    df = _samples({BASE: [[False, False], [False, False]], "eps=0.1": [[True, False], [False, False]]})
    t = table1(df, n_boot=50)
    assert t.set_index("config").loc["eps=0.1", "Δ pass@n vs Base"] == pytest.approx(0.5)
    other = df.assign(question_id=np.where(df.config == BASE, df.question_id + "x", df.question_id))
    assert math.isnan(table1(other, n_boot=50).set_index("config").loc["eps=0.1", "Δ pass@n vs Base"])


def test_table1_intervals_do_not_collapse_at_0_and_100_percent():
    """40/40 and 0/40 questions: Wilson intervals (the percentile bootstrap gave 100.0 [100.0, 100.0]),
    and a paired Δ that is not a point; its p-value (exact McNemar) is never 0 and Holm-adjusted."""
    yes, no = [[True, True]] * 40, [[False, False]] * 40
    df = _samples({BASE: no, "eps=0.1": yes, "eps=0.3": yes})
    t = table1(df, n_boot=50).set_index("config")
    assert t.loc["eps=0.1", "pass@n"] == 1.0 and t.loc["eps=0.1", "pass@n hi"] == 1.0
    assert t.loc["eps=0.1", "pass@n lo"] == pytest.approx(0.9124, abs=1e-4)  # Wilson, 40/40
    assert t.loc[BASE, "pass@n lo"] == 0.0 and t.loc[BASE, "pass@n hi"] == pytest.approx(0.0876, abs=1e-4)
    assert t.loc["eps=0.1", "succ lo"] < 1.0 and t.loc[BASE, "succ hi"] > 0.0
    assert t.loc["eps=0.1", "Δ lo"] < 1.0 and t.loc["eps=0.1", "Δ hi"] == 1.0
    assert t.loc["eps=0.1", "p"] == pytest.approx(2 * 0.5 ** 40) and t.loc["eps=0.1", "p (Holm)"] == pytest.approx(4 * 0.5 ** 40)
    same = table1(_samples({BASE: yes, "eps=0.1": yes}), n_boot=50).set_index("config").loc["eps=0.1"]
    assert same["Δ lo"] < 0 < same["Δ hi"] and same["p"] == 1.0


def test_ablation_table_known_differences():
    """fixed s0 − Base and CTRLS − fixed s0, in pass@n and Succ., on hand-made samples."""
    n = [False] * 4
    df = _samples({BASE: [n, n, n, n],
                   FIXED: [[True, False, False, False], [True, False, False, False], n, n],
                   "eps=0.1": [[True] * 4, [True] * 4, [True] * 4, n]},
                  valid={BASE: [n, n, n, n], FIXED: [[True] * 4] * 4, "eps=0.1": [[True] * 4] * 4})
    a = ablation_table(df, n_boot=200).set_index("comparison")
    assert list(a.index) == [f"{FIXED} − {BASE}", f"eps=0.1 − {FIXED}"]
    assert a.loc[f"{FIXED} − {BASE}", "Δ pass@n"] == pytest.approx(0.5)
    assert a.loc[f"{FIXED} − {BASE}", "Δ Succ."] == pytest.approx(1.0)
    assert a.loc[f"eps=0.1 − {FIXED}", "Δ pass@n"] == pytest.approx(0.25)
    assert a.loc[f"eps=0.1 − {FIXED}", "Δ Succ."] == pytest.approx(0.0)
    row = a.loc[f"{FIXED} − {BASE}"]
    # 100% vs 0% Succ. on 4 questions: Newcombe's paired interval does not collapse to [1, 1], and the
    # permutation p-value is about 2 / 2^4 (never 0); Holm adjusts over all 4 p-values of the table
    assert row["Δ Succ. hi"] == 1.0 and 0 < row["Δ Succ. lo"] < 0.9
    assert row["p (Succ.)"] == pytest.approx(1 / 8, abs=0.06)
    ps = np.r_[a["p (pass@n)"], a["p (Succ.)"]]
    assert np.allclose(np.r_[a["p (pass@n, Holm)"], a["p (Succ., Holm)"]], holm(ps))
    view = ablation_view(ablation_table(df, n_boot=200))
    assert not view.astype(str).isin(["0", "0.0", "0.000"]).any().any()
    assert all(v in ("higher", "lower") or v.startswith("no detectable difference (the estimate is ")
               for v in view["Succ."])
    assert ablation_table(df[df.config != FIXED], n_boot=10).empty  # no ablation row, no comparison
    with pytest.raises(ValueError, match="same questions"):
        ablation_table(df[~((df.config == BASE) & (df.question_id == "q3"))], n_boot=10)


def _with_states(df: pd.DataFrame, K: int = 4) -> pd.DataFrame:
    """Add the controllability columns: CTRLS rows follow their drawn states exactly on q0 and q1 and
    never on q2, q3; Base steps are encoded as state 0, and Base's chains are all state 1 (eps=0.1)."""
    rows = []
    for r in df.to_dict("records"):
        q = int(r["question_id"][1:])
        T = 3
        if r["config"] == BASE:
            r.update(states=[], encoded=[0] * T, chains=[[1] * T], chain_eps=[0.1])
        elif r["config"] == FIXED:
            r.update(states=[2] * T, encoded=[2] * T if q < 2 else [0] * T, chains=[], chain_eps=[])
        else:
            drawn = [(q + t) % K for t in range(T)]
            r.update(states=drawn, encoded=drawn if q < 2 else [(s + 1) % K for s in drawn], chains=[], chain_eps=[])
        r.update(s0=2 if q % 2 == 0 else 0, n_states=K)
        rows.append(r)
    return pd.DataFrame(rows)


def test_controllability_table_known_rates():
    n = [False] * 2
    df = _with_states(_samples({BASE: [n] * 4, FIXED: [n] * 4, "eps=0.1": [n] * 4}))
    c = controllability_table(df, n_boot=200).set_index("config")
    assert list(c.index) == [FIXED, "eps=0.1"]
    for label in (FIXED, "eps=0.1"):
        assert c.loc[label, "follows"] == pytest.approx(0.5)  # q0, q1 follow; q2, q3 do not
        assert c.loc[label, "steps"] == 4 * 2 * 3 and c.loc[label, "K"] == 4 and c.loc[label, "chance"] == 0.25
    # Base steps (all state 0) against the eps=0.1 chains (all state 1): never; against s_0: q1, q3 (s_0 = 0)
    assert c.loc["eps=0.1", "Base, random states"] == 0.0
    assert c.loc[FIXED, "Base, random states"] == pytest.approx(0.5)
    assert c.loc["eps=0.1", "Δ vs Base"] == pytest.approx(0.5)
    assert c.loc[FIXED, "Δ vs Base"] == pytest.approx(0.0)
    with pytest.raises(ValueError, match="no state chain drawn with epsilon 0.1"):
        controllability_table(df.assign(chain_eps=[[0.3] if c == BASE else [] for c in df.config]), n_boot=10)
    with pytest.raises(ValueError, match="rerun the exploration stage"):
        controllability_table(df.drop(columns="encoded"), n_boot=10)


def test_diversity_table_known_values():
    df = _with_states(_samples({BASE: [[True, False, False]] * 2, "eps=0.1": [[True, True, True]] * 2},
                               valid={BASE: [[True, True, False]] * 2, "eps=0.1": [[True] * 3] * 2}))
    d = diversity_table(df, n_boot=100).set_index("config")
    # Base: answers "q", "x", None -> 2 distinct; eps=0.1: three times the same answer -> 1
    assert d.loc[BASE, "distinct answers"] == 2.0 and d.loc["eps=0.1", "distinct answers"] == 1.0
    assert d.loc[BASE, "encoded-state entropy (bits)"] == 0.0  # every Base step encoded as state 0
    # eps=0.1 on q0: drawn states 0,1,2 three times -> log2(3) bits; the same on q1 (1,2,3)
    assert d.loc["eps=0.1", "drawn-state entropy (bits)"] == pytest.approx(math.log2(3))
    assert math.isnan(d.loc[BASE, "drawn-state entropy (bits)"])


# Resume after a kill mid-grid (the samples equal an uninterrupted run's, none duplicated, a half-written
# temp file ignored): tests/stages/test_runs_resume.py::test_exploration_killed_mid_grid_gives_the_same_samples.


@pytest.mark.integration
@requires_data
def test_your_own_dataset_through_the_cli(tmp_path, tiny_model_dir):
    """A directory of train/test JSONL runs pretraining and exploration by the README's override."""
    import subprocess
    import sys

    from conftest import ROOT, tiny_overrides

    from tests.data.test_problems import write_jsonl

    d = tmp_path / "arith"
    for split, n in (("train", 4), ("test", 3)):
        write_jsonl(d / f"{split}.jsonl",
                    [{"question": f"Tom has {3 + i} apples and buys {4 + 2 * i} more. How many apples does he have?",
                      "answer": 7 + 3 * i, "steps": [f"He has {3 + i} + {4 + 2 * i} = {7 + 3 * i} apples."]}
                     for i in range(n)])
    runs = tmp_path / "runs"
    # the plumbing of a user's dataset, not the stages' sizes or the model: one epoch, short chains, 2 of the 3
    # test questions, on the tiny random-weight model (conftest.tiny_model_dir)
    ovr = [f"grid.datasets=[{d}]", "pretrain.epochs=1", "pretrain.samples_per_question=1", "sampling.max_new_tokens=16",
           "data.n_test=2", *tiny_overrides(tiny_model_dir)]
    r = subprocess.run([sys.executable, "-m", "ctrls", "stage", "pretrain", "exploration", "--profile", "smoke",
                        "--run-dir", str(runs), "-o", *ovr], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    cfg = load_config("smoke", [*ovr, f"run_dir={runs}"])
    assert (runs / "smoke" / "pretrain" / f"{tiny_model_dir.name}__arith").is_dir()
    df = load_samples(cfg)
    assert set(df.dataset) == {str(d)} and df.question_id.str.startswith("arith-test-").all()
    assert df.question_id.nunique() == 2  # data.n_test of the file's 3
    t = table1(df, n_boot=50)
    assert set(t.config) == {BASE, FIXED, "eps=0.1"} and t.questions.eq(2).all()


def test_beside_paper_names_the_papers_runs_only_for_its_datasets():
    from ctrls.report.beside_paper import _beside_paper

    row = {"backbone": "smollm2-135m-instruct", "config": "Base", "questions": 8, "samples": 4,
           "pass@n": 0.5, "pass@n lo": 0.2, "pass@n hi": 0.8, "succ": 0.9, "succ lo": 0.7, "succ hi": 1.0}
    ours = pd.DataFrame([{**row, "dataset": "gsm8k"}, {**row, "dataset": "word_problems"}])
    paper = pd.DataFrame([{"backbone": "Qwen2.5-3B-Instruct", "dataset": "gsm8k", "config": "Base",
                           "paper pass@20": 64.2, "paper Succ.": 91.8}])
    out = _beside_paper(ours, paper, ["config"])
    assert list(out) == ["ours: smollm2-135m-instruct × gsm8k; paper: Qwen2.5 × gsm8k",
                         "ours: smollm2-135m-instruct × word_problems; the paper has no run on word_problems"]
    assert out[next(iter(out))]["Qwen2.5 pass@20"].tolist() == [64.2]


def test_transfer_questions_join_the_pairs_chunks_and_keep_their_rows_and_temperatures():
    """Every (temperature, row, question) a source samples is one job's, once; a chunk holds at most
    ``per_chunk`` questions of all sources together; a row runs only on the sources that have it."""
    from collections import Counter

    from ctrls.stages.exploration import Questions, _jobs, grid_rows

    cfg = load_config("smoke", ["grid.epsilons=[0.1]", "grid.fixed_state=true"])
    base, fixed, eps = grid_rows(cfg)
    main = Questions(list("abc"), "word_problems", [base, fixed, eps], [0.5, 0.7])
    transfer = Questions(list("xy"), "gsm8k", [base, eps], [0.7], trained_on="word_problems")
    jobs = _jobs([main, transfer], [[0, 1, 2], [0, 1]], per_chunk=4)
    want = Counter((t, r.label, (k, j)) for k, s in enumerate([main, transfer]) for t in s.temperatures
                   for r in s.rows for j in range(len(s.problems)))
    assert Counter((t, r.label, q) for t, r, qs in jobs for q in qs) == want
    assert max(len(qs) for _, _, qs in jobs) == 4
    at = {(t, r.label): qs for t, r, qs in jobs if (0, 0) in qs}  # the first chunk at each temperature
    assert at[0.7, BASE] == [(0, 0), (0, 1), (0, 2), (1, 0)] and at[0.7, FIXED] == [(0, 0), (0, 1), (0, 2)]
    assert at[0.5, BASE] == [(0, 0), (0, 1), (0, 2)]  # the transfer questions are sampled at 0.7 only
    assert len(jobs) == 3 + 3 + 2  # eta 0.5: three rows; eta 0.7: three rows, then Base and eps on question y
    assert transfer.where == "gsm8k-from-word_problems" and main.where == "word_problems"


def test_a_missing_fit_is_refused_before_the_stage_clears_anything(tiny_runs, tmp_path):
    """The run holds a finished exploration without the state prompt and no state-prompt fit: asking for the
    state prompt's exploration (or RL) is refused with one PretrainError naming the fit, and every sample stays."""
    import shutil

    import pytest

    from ctrls.config.schema import override
    from ctrls.stages.collect import PretrainError
    from ctrls.stages.exploration import explore, samples_dir
    from ctrls.stages.rl import run_rl

    d, cfg, _ = tiny_runs
    copy = tmp_path / "runs"
    shutil.copytree(d, copy)
    c = override(cfg, {"run_dir": str(copy)})
    before = sorted(p.name for p in samples_dir(c).iterdir())
    sp = override(c, {"state_prompt.use": True})
    with pytest.raises(PretrainError, match=r"state prompt fit .* \(nothing was removed\)"):
        explore(sp, progress=False)  # its key changed: it would clear the adapter's samples, so it checks first
    with pytest.raises(PretrainError, match="state prompt fit"):
        run_rl(sp, progress=False)
    assert sorted(p.name for p in samples_dir(c).iterdir()) == before and before


def test_pandas_reads_the_whole_samples_directory(tiny_runs):
    """Every part has one schema (a Base row's empty chains, a sample without an answer typed, not null), so
    ``pd.read_parquet`` reads the directory as the stage's own reader does."""
    import pandas as pd

    from ctrls.stages.exploration import load_samples, samples_dir

    _, cfg, _ = tiny_runs
    df = pd.read_parquet(samples_dir(cfg))
    assert len(df) == len(load_samples(cfg)) and {"states", "chains", "pred"} <= set(df.columns)


def test_a_run_without_its_fits_is_refused_before_its_directory_or_a_backbone(tmp_path, monkeypatch):
    """A fresh run directory: exploration and RL each refuse with one PretrainError naming the fit, before
    they create their directory or load a backbone."""
    import pytest

    import ctrls.stages.exploration as ex
    import ctrls.stages.rl as rl
    from ctrls.config.schema import load_config
    from ctrls.stages.collect import PretrainError

    monkeypatch.setattr(ex, "_sample_pairs", lambda *a, **k: pytest.fail("sampled without a fit"))
    monkeypatch.setattr(rl, "_train_and_sample", lambda *a, **k: pytest.fail("trained without a fit"))
    for over in ({}, {"state_prompt.use": True}):
        cfg = load_config("smoke", {"run_dir": str(tmp_path), **over})
        with pytest.raises(PretrainError, match=r"needs a finished .* \(nothing was removed\)"):
            ex.explore(cfg, progress=False)
        with pytest.raises(PretrainError, match="RL stage needs a finished"):
            rl.run_rl(cfg, progress=False)
        assert not cfg.stage_dir("exploration").exists() and not cfg.stage_dir("rl").exists()
