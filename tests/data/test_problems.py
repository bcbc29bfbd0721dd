"""Benchmark loading: parsing, malformed rows, seeded subsets, data locations, MATH splits.

All rows written here are made-up problems; the real data is only read (integration tests).
"""
import json
import logging
import sys
import types

import pytest
from conftest import SHARED_DATA, requires_data

from ctrls.config.schema import load_config
from ctrls.data import problems as data
from ctrls.data.problems import DataError, gsm8k_solution, last_boxed, load_problems, math_steps
from ctrls.stages.common import problems_from_config


def write_jsonl(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for r in rows:
            f.write((r if isinstance(r, str) else json.dumps(r)) + "\n")


def fake_gsm(n):
    return [{"question": f"Tom has {i} pens and buys 1. How many now?",
             "answer": f"He has {i}+1=<<{i}+1={i + 1}>>{i + 1} pens.\n\n#### {i + 1:,}"} for i in range(n)]


def fake_math(n, offset=0):
    return [{"problem": f"Compute  ${i}+{i}$.", "solution": f"We get $\\boxed{{{2 * i}}}$.", "level": "Level 1",
             "type": "Algebra", "idx": offset + i} for i in range(n)]


@pytest.fixture
def gsm_dir(tmp_path):
    write_jsonl(tmp_path / "gsm8k" / "test.jsonl", fake_gsm(1200))
    return tmp_path


def test_gsm8k_gold_and_steps():
    gold, steps = gsm8k_solution("She has 3*4=<<3*4=12>>12 eggs.\n\nThen 12-2=<<12-2=10>>10.\n#### 1,010")
    assert gold == "1010" and steps == ("She has 3*4=12 eggs.", "Then 12-2=10.")
    with pytest.raises(ValueError, match="####"):
        gsm8k_solution("no final answer")
    with pytest.raises(ValueError, match="empty"):
        gsm8k_solution("steps\n####  ")


def test_gsm8k_rows_from_a_data_dir(gsm_dir):
    probs = load_problems("gsm8k", "test", data_dir=str(gsm_dir))
    p = probs[1005]
    assert len(probs) == 1200 and p.answer == "1006" and p.steps == ("He has 1005+1=1006 pens.",)
    assert (p.id, p.source, p.split) == ("gsm8k-test-1005", "gsm8k", "test")
    assert p.question == "Tom has 1005 pens and buys 1. How many now?" and "####" in p.meta["solution"]


def test_env_var_locates_the_data(gsm_dir, monkeypatch):
    monkeypatch.setenv("CTRLS_DATA_DIR", str(gsm_dir))
    assert data.resolve_data_dir() == gsm_dir
    assert len(load_problems("gsm8k", "test")) == 1200
    monkeypatch.setenv("CTRLS_DATA_DIR", str(gsm_dir / "missing"))
    with pytest.raises(DataError, match="CTRLS_DATA_DIR"):
        load_problems("gsm8k", "test")


def test_default_dirs_beside_the_repo_then_beside_the_cwd(tmp_path, monkeypatch):
    monkeypatch.delenv("CTRLS_DATA_DIR", raising=False)
    (tmp_path / "shared" / "data").mkdir(parents=True)
    (tmp_path / "repo").mkdir()
    monkeypatch.setattr(data, "REPO", tmp_path / "repo")
    assert data.resolve_data_dir() == tmp_path / "shared" / "data"
    monkeypatch.setattr(data, "REPO", tmp_path / "elsewhere" / "x")
    monkeypatch.chdir(tmp_path / "repo")
    assert data.resolve_data_dir() == tmp_path / "shared" / "data"


def test_seeded_subsets_are_deterministic_and_nested(gsm_dir):
    a = load_problems("gsm8k", "test", n=10, seed=3, data_dir=gsm_dir)
    b = load_problems("gsm8k", "test", n=10, seed=3, data_dir=gsm_dir)
    c = load_problems("gsm8k", "test", n=25, seed=3, data_dir=gsm_dir)
    d = load_problems("gsm8k", "test", n=10, seed=4, data_dir=gsm_dir)
    assert [p.id for p in a] == [p.id for p in b] == [p.id for p in c[:10]]
    assert [p.id for p in a] != [p.id for p in d] and len({p.id for p in c}) == 25
    assert [p.id for p in a] != [f"gsm8k-test-{i}" for i in range(10)]  # a shuffle, not the head
    with pytest.raises(DataError, match="only 1200"):
        load_problems("gsm8k", "test", n=1201, data_dir=gsm_dir)


def test_malformed_rows_are_counted_and_thresholded(tmp_path, caplog):
    bad = ["{not json", {"question": "Who?"}, {"question": "How many?", "answer": "no final marker"},
           {"question": "", "answer": "x\n#### 3"}, {"question": "How many?", "answer": "x\n#### 4"}]
    write_jsonl(tmp_path / "gsm8k" / "test.jsonl", fake_gsm(195) + bad)
    with caplog.at_level(logging.WARNING, logger="ctrls.data.problems"):
        probs = load_problems("gsm8k", "test", data_dir=tmp_path, max_bad_fraction=0.05)
    assert len(probs) == 196 and probs[-1].answer == "4"
    assert "1 malformed row(s): not a JSON object" in caplog.text
    assert "2 malformed row(s): missing or empty question/answer" in caplog.text
    assert "1 malformed row(s): no '####' final answer" in caplog.text
    with pytest.raises(DataError, match=r"4 of 200 rows are malformed.*e\.g\. row 195"):
        load_problems("gsm8k", "test", data_dir=tmp_path, max_bad_fraction=0.01)


def test_a_byte_order_mark_does_not_drop_row_0(tmp_path, caplog):
    rows = fake_gsm(5)
    (tmp_path / "gsm8k").mkdir()
    (tmp_path / "gsm8k" / "test.jsonl").write_text("\n".join(json.dumps(r) for r in rows), encoding="utf-8-sig")
    own = tmp_path / "own"
    own.mkdir()
    (own / "test.jsonl").write_text("\n".join(json.dumps(r) for r in own_rows(3, "test")), encoding="utf-8-sig")
    assert (tmp_path / "gsm8k" / "test.jsonl").read_bytes()[:3] == b"\xef\xbb\xbf"
    with caplog.at_level(logging.WARNING, logger="ctrls.data.problems"):
        gsm = load_problems("gsm8k", "test", data_dir=tmp_path, max_bad_fraction=0)
        mine = load_problems(str(own), "test", max_bad_fraction=0)
    assert [p.answer for p in gsm] == ["1", "2", "3", "4", "5"] and gsm[0].id == "gsm8k-test-0"
    assert [p.answer for p in mine] == ["0", "2", "4"] and not caplog.text


def test_a_row_repeated_verbatim_is_skipped_and_counted(tmp_path, caplog):
    rows = fake_gsm(60)
    near = {**rows[3], "question": rows[3]["question"] + " "}  # not verbatim: another row
    write_jsonl(tmp_path / "gsm8k" / "test.jsonl", rows + [rows[7], near, rows[7], "{not json"])
    with caplog.at_level(logging.WARNING, logger="ctrls.data.problems"):
        probs = load_problems("gsm8k", "test", data_dir=tmp_path, max_bad_fraction=0.1)
    assert [p.id for p in probs] == [f"gsm8k-test-{i}" for i in (*range(60), 61)]  # ids stay the row numbers
    assert probs[60].question == rows[3]["question"]  # stripped: the same text, but its row was not a duplicate
    assert "skipped 2 repeated row(s): duplicate of an earlier row (first at row 60)" in caplog.text
    assert "skipped 1 malformed row(s): not a JSON object" in caplog.text
    # counted with the malformed rows against max_bad_fraction
    with pytest.raises(DataError, match=r"3 of 64 rows are malformed or repeated.*2 x duplicate of an earlier row"):
        load_problems("gsm8k", "test", data_dir=tmp_path, max_bad_fraction=0.04)
    # your own dataset: the same, where the repeated row would otherwise get a new id
    d = tmp_path / "own"
    write_jsonl(d / "test.jsonl", [{"question": "What is 1?", "answer": 1}] * 2 + [{"question": "What is 2?", "answer": 2}])
    with caplog.at_level(logging.WARNING, logger="ctrls.data.problems"):
        mine = load_problems(str(d), "test", max_bad_fraction=0.5)
    assert [p.id for p in mine] == ["own-test-0", "own-test-2"]


@pytest.mark.parametrize("gold", ["nan", "NaN", "inf", "-inf", "Infinity", " "])
def test_a_nan_infinite_or_empty_gold_is_malformed(tmp_path, caplog, gold):
    gsm = fake_gsm(30)
    gsm[4]["answer"] = f"He has none.\n#### {gold}"
    write_jsonl(tmp_path / "gsm8k" / "test.jsonl", gsm)
    m500 = [{"problem": f"Compute ${i}+{i}$.", "solution": f"So $\\boxed{{{2 * i}}}$.", "answer": str(2 * i),
             "unique_id": f"u{i}"} for i in range(30)]
    m500[9]["answer"] = gold
    write_jsonl(tmp_path / "math" / "math500_test.jsonl", m500)
    d = tmp_path / "own"
    write_jsonl(d / "test.jsonl", own_rows(30, "test")[:29] + [{"question": "Q?", "answer": gold}])
    with caplog.at_level(logging.WARNING, logger="ctrls.data.problems"):
        got = {"gsm8k": load_problems("gsm8k", "test", data_dir=tmp_path, max_bad_fraction=0.05),
               "math": load_problems("math", "test", data_dir=tmp_path, max_bad_fraction=0.05),
               "own": load_problems(str(d), "test", max_bad_fraction=0.05)}
    assert {k: len(v) for k, v in got.items()} == {"gsm8k": 29, "math": 29, "own": 29}
    assert "gsm8k-test-4" not in {p.id for p in got["gsm8k"]} and "math-u9" not in {p.id for p in got["math"]}
    assert caplog.text.count("skipped 1 malformed row(s)") == 3
    with pytest.raises(DataError, match="1 of 30 rows are malformed"):
        load_problems(str(d), "test", max_bad_fraction=0)


def test_a_json_nan_gold_is_malformed(tmp_path, caplog):
    d = tmp_path / "own"
    write_jsonl(d / "test.jsonl", own_rows(9, "test") + ['{"question": "Q?", "answer": NaN}',
                                                        '{"question": "R?", "answer": -Infinity}'])
    with caplog.at_level(logging.WARNING, logger="ctrls.data.problems"):
        probs = load_problems(str(d), "test", max_bad_fraction=0.2)
    assert len(probs) == 9 and "skipped 2 malformed row(s): gold answer is NaN or infinite" in caplog.text


def test_math_splits_from_a_data_dir(tmp_path, caplog):
    full = fake_math(12)
    full[7]["solution"] = "No box here."  # a train row without \boxed{}: skipped
    m500 = [{"problem": "Compute $3+3$.", "solution": "It is $\\boxed{6}$.", "answer": "6", "subject": "Algebra",
             "level": 1, "unique_id": "test/algebra/3.json"},
            {"problem": "Compute $5+5$.", "solution": "So $\\boxed{10}$.", "answer": "10", "subject": "Algebra",
             "level": 2, "unique_id": "test/algebra/5.json"}]
    write_jsonl(tmp_path / "math" / "math_test_full.jsonl", full)
    write_jsonl(tmp_path / "math" / "math500_test.jsonl", m500)
    test = load_problems("math", "test", data_dir=tmp_path)
    with caplog.at_level(logging.WARNING, logger="ctrls.data.problems"):
        train = load_problems("math", "train", data_dir=tmp_path, max_bad_fraction=0.2)
    assert [p.id for p in test] == ["math-test/algebra/3.json", "math-test/algebra/5.json"]
    assert test[1].answer == "10" and test[1].meta["subject"] == "Algebra" and test[1].meta["level"] == 2
    # 12 - 2 in MATH-500 (matched despite the double space) - 1 without \boxed{}
    assert [p.id for p in train] == [f"math-{i}" for i in (0, 1, 2, 4, 6, 8, 9, 10, 11)]
    assert train[3].answer == "8" and train[3].meta["type"] == "Algebra" and train[3].split == "train"
    assert "no \\boxed{} answer in the solution" in caplog.text


def test_math_steps():
    sol = ("First line.\n[asy]\ndraw((0,0)--(1,1));\n[/asy]\nThen \\begin{align*}\na &= 1 \\\\\nb &= 2\n\\end{align*}"
           "\n$$x\n= 2$$\n" + "We know $x. y$ is fine. " * 12 + "So $\\boxed{3}$.")
    steps = math_steps(sol)
    assert steps[0] == "First line."
    assert steps[1] == "Then \\begin{align*} a &= 1 \\\\ b &= 2 \\end{align*}"
    assert steps[2] == "$$x = 2$$"
    assert steps[3:] == ("We know $x. y$ is fine.",) * 12 + ("So $\\boxed{3}$.",)
    assert not any("\n" in s or "asy" in s for s in steps)


def test_missing_data_names_both_ways(monkeypatch):
    monkeypatch.setattr(data, "resolve_data_dir", lambda d=None: None)
    monkeypatch.setitem(sys.modules, "datasets", None)  # as if not installed
    with pytest.raises(DataError) as e:
        load_problems("gsm8k", "test")
    assert "CTRLS_DATA_DIR" in str(e.value) and "data.data_dir" in str(e.value)
    assert "pip install datasets" in str(e.value) and "not installed" in str(e.value)

    def offline(*args, **kwargs):
        raise ConnectionError("no network")

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=offline))
    with pytest.raises(DataError, match=r"(?s)no network.*CTRLS_DATA_DIR.*pip install datasets"):
        load_problems("math", "test")


def test_hub_is_used_when_there_is_no_data_dir(monkeypatch):
    monkeypatch.setattr(data, "resolve_data_dir", lambda d=None: None)
    calls = []

    def load_dataset(name, config, split):
        calls.append((name, config, split))
        return fake_gsm(3)

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    probs = load_problems("gsm8k", "train")
    assert calls == [("openai/gsm8k", "main", "train")] and [p.answer for p in probs] == ["1", "2", "3"]


def test_bad_names_and_files(tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        load_problems("gsm8k", "test", data_dir=tmp_path / "nope")
    with pytest.raises(DataError, match=r"built-in one \(gsm8k, math, gsm_symbolic, word_problems\) nor a directory"):
        load_problems("svamp", "test")
    with pytest.raises(DataError, match="unknown split 'dev'"):
        load_problems("gsm8k", "dev")
    with pytest.raises(DataError, match="math500_test.jsonl not found"):
        load_problems("math", "test", data_dir=tmp_path)


def own_rows(n, split):
    return [{"question": f"What is {i} + {i}?", "answer": 2 * i, "steps": [f"{i} + {i} = {2 * i}."]} if i % 2 else
            {"question": f"What is {i} + {i}?", "answer": str(2 * i), "solution": f"Add.\n\n{i} + {i} = {2 * i}.",
             "id": f"{split[:2]}{i}"}
            for i in range(n)]


def test_your_own_dataset_directory(tmp_path, caplog):
    d = tmp_path / "arith"
    write_jsonl(d / "train.jsonl", own_rows(30, "train"))
    bad = [{"question": "Q?", "answer": True}, {"question": "Q?", "answer": "1", "steps": "one string"},
           {"question": "Q?", "answer": "1", "steps": ["two\nlines"]}, {"answer": "1"}]
    write_jsonl(d / "test.jsonl", own_rows(40, "test") + [{"question": "What is 1?", "answer": 1}] + bad)
    train = load_problems(str(d), "train")
    assert len(train) == 30 and {p.source for p in train} == {"arith"} and {p.split for p in train} == {"train"}
    odd, even = train[3], train[4]
    assert odd.id == "arith-train-3" and odd.answer == "6" and odd.steps == ("3 + 3 = 6.",)
    assert even.id == "arith-train-tr4" and even.answer == "8" and even.steps == ("Add.", "4 + 4 = 8.")
    with caplog.at_level(logging.WARNING, logger="ctrls.data.problems"):
        test = load_problems(str(d), "test", max_bad_fraction=0.1)
    assert len(test) == 41 and test[-1].steps == () and test[-1].answer == "1"
    for reason in ("missing or empty answer", "steps is not a list of strings", "a step contains a newline",
                   "missing or empty question"):
        assert f"1 malformed row(s): {reason}" in caplog.text
    with pytest.raises(DataError, match="4 of 45 rows are malformed"):
        load_problems(str(d), "test", max_bad_fraction=0.01)
    # seeded subsets are nested, as for the built-in datasets
    assert load_problems(str(d), "test", n=5, seed=2, max_bad_fraction=0.1) == \
        load_problems(str(d), "test", n=9, seed=2, max_bad_fraction=0.1)[:5]
    # the config names the directory; run directories use its name
    cfg = load_config("smoke", {"data.dataset": str(d), "data.n_train": 4})
    assert [p.id for p in problems_from_config(cfg, "train")] == [p.id for p in load_problems(str(d), "train", n=4)]
    from ctrls.stages.runs import pair_slug
    assert pair_slug("smollm2-135m-instruct", str(d)) == "smollm2-135m-instruct__arith"


def test_your_own_dataset_errors(tmp_path):
    d = tmp_path / "arith"
    write_jsonl(d / "train.jsonl", own_rows(4, "train"))
    with pytest.raises(DataError, match="test.jsonl not found: a dataset directory holds train.jsonl and test.jsonl"):
        load_problems(str(d), "test")
    write_jsonl(d / "test.jsonl", [{"question": "A?", "answer": 1, "id": 7}, {"question": "B?", "answer": 2, "id": 7}])
    with pytest.raises(DataError, match=r"1 problem id\(s\) occur more than once, e.g. \['arith-test-7'\]"):
        load_problems(str(d), "test")


def test_problems_from_config(gsm_dir):
    cfg = load_config("smoke", {"data.dataset": "gsm8k", "data.data_dir": str(gsm_dir), "data.n_test": 7,
                                "data.seed": 5})
    probs = problems_from_config(cfg, "test")
    assert [p.id for p in probs] == [p.id for p in load_problems("gsm8k", "test", n=7, seed=5, data_dir=gsm_dir)]


def test_gsm_symbolic_is_generated_offline():
    a = load_problems("gsm_symbolic", "test", n=3, seed=1)
    b = load_problems("gsm_symbolic", "test", n=6, seed=1)
    train = load_problems("gsm_symbolic", "train", n=6, seed=1)
    assert a == b[:3] and [p.id for p in a] == ["gsm_symbolic-test-s1-0", "gsm_symbolic-test-s1-1", "gsm_symbolic-test-s1-2"]
    assert all(p.source == "gsm_symbolic" and p.answer and p.steps and "####" not in "".join(p.steps) for p in b)
    assert not {p.question for p in b} & {p.question for p in train}


@requires_data
@pytest.mark.integration
def test_real_splits(monkeypatch):
    monkeypatch.delenv("CTRLS_DATA_DIR", raising=False)
    assert data.resolve_data_dir() == SHARED_DATA
    test, train = load_problems("math", "test"), load_problems("math", "train")
    assert len(test) == 500 and len(train) == 4500
    assert len({p.id for p in test + train}) == 5000
    assert not {" ".join(p.question.split()) for p in test} & {" ".join(p.question.split()) for p in train}
    assert all(p.answer == last_boxed(p.meta["solution"]) and p.steps for p in train)
    assert len(load_problems("gsm8k", "train")) == 7473 and len(load_problems("gsm8k", "test")) == 1319


@requires_data
@pytest.mark.integration
def test_setup_page_lists_your_own_dataset(tmp_path):
    from ctrls.report import setup_check

    d = tmp_path / "arith"
    write_jsonl(d / "train.jsonl", own_rows(6, "train"))
    write_jsonl(d / "test.jsonl", own_rows(5, "test"))
    cfg = load_config("smoke", {"grid.datasets": [str(d)], "data.n_test": 3})
    t = setup_check.dataset_table(cfg).set_index(["dataset", "split"])
    assert t.loc[(str(d), "test"), "problems"] == 5 and t.loc[(str(d), "test"), "used by this profile"] == 3
    assert t.loc[("gsm8k", "test"), "used by this profile"] == "not used"  # not "0"
    ids = setup_check.example_problems(cfg).id
    assert ids.str.startswith("arith-train-").sum() == 2 and ids.str.startswith("arith-test-").sum() == 2


# ---- injective run-file names, gradable golds, invalid UTF-8, NaN thresholds ----------


def test_ids_differing_in_punctuation_get_distinct_run_file_names(tmp_path):
    """"a b", "a_b" and "a?b" shared one exploration part and one feature shard."""
    from ctrls.data.names import file_name

    d = tmp_path / "punct"
    ids = ["a b", "a_b", "a?b", "A_B", "a/b", "..", "x" * 300]
    write_jsonl(d / "test.jsonl", [{"question": f"Q{i}?", "answer": i, "id": x} for i, x in enumerate(ids)])
    probs = load_problems(str(d), "test", max_bad_fraction=0)
    names = [file_name(p.id) for p in probs]
    assert len({n.casefold() for n in names}) == len(ids)  # distinct, also on a case-insensitive file system
    assert all("/" not in n and n not in (".", "..") and len(n) < 100 for n in names)
    assert file_name("gsm8k-test-12") == "gsm8k-test-12"  # plain ids keep their name


def test_ids_whose_file_names_still_collide_are_refused(tmp_path):
    from ctrls.data.names import file_name

    d = tmp_path / "clash"
    imitation = file_name("clash-test-a b")  # a plain id spelled like another id's slug and hash
    write_jsonl(d / "test.jsonl", [{"question": "Q?", "answer": 1, "id": "a b"},
                                   {"question": "R?", "answer": 2, "id": imitation[len("clash-test-"):]}])
    with pytest.raises(DataError, match="would share one run file name"):
        load_problems(str(d), "test")


def test_numeric_json_golds_are_gradable(tmp_path):
    """1e-05 was stored as "1e-05" and never graded correct."""
    from ctrls.data.answers import grade

    d = tmp_path / "floats"
    write_jsonl(d / "test.jsonl", ['{"question": "Q1?", "answer": 1e-05}', '{"question": "Q2?", "answer": 1e16}',
                                   '{"question": "Q3?", "answer": 2.50}', '{"question": "Q4?", "answer": 7}'])
    probs = load_problems(str(d), "test", max_bad_fraction=0)
    assert [p.answer for p in probs] == ["0.00001", "10000000000000000", "2.5", "7"]
    for p, written in zip(probs, ["0.00001", "10,000,000,000,000,000", "2.50", "7"]):
        assert grade(f"The answer is {written}.", p.answer).correct


@pytest.mark.parametrize("gold", ["$", "%", "\\%", "€"])
def test_a_gold_that_can_never_be_matched_is_refused_at_load(tmp_path, caplog, gold):
    d = tmp_path / "symbols"
    write_jsonl(d / "test.jsonl", own_rows(9, "test") + [{"question": "Q?", "answer": gold}])
    with caplog.at_level(logging.WARNING, logger="ctrls.data.problems"):
        probs = load_problems(str(d), "test", max_bad_fraction=0.2)
    assert len(probs) == 9 and "gold answer is empty once units" in caplog.text
    with pytest.raises(DataError, match="1 of 10 rows are malformed"):
        load_problems(str(d), "test", max_bad_fraction=0)


def test_invalid_utf8_is_a_malformed_row_named_by_file_and_line(tmp_path, caplog):
    """A bare UnicodeDecodeError, naming neither file nor line."""
    d = tmp_path / "latin"
    d.mkdir()
    good = [json.dumps(r).encode() for r in own_rows(9, "test")]
    (d / "test.jsonl").write_bytes(b"\n".join(good[:4] + ['{"question": "Caf\xe9?", "answer": 1}'.encode("latin-1")]
                                              + good[4:]) + b"\n")
    with caplog.at_level(logging.WARNING, logger="ctrls.data.problems"):
        probs = load_problems(str(d), "test", max_bad_fraction=0.2)
    assert len(probs) == 9
    assert f"{d / 'test.jsonl'}, line 5: not valid UTF-8" in caplog.text
    assert "skipped 1 malformed row(s): not valid UTF-8" in caplog.text
    with pytest.raises(DataError, match="not valid UTF-8"):
        load_problems(str(d), "test", max_bad_fraction=0)


@pytest.mark.parametrize("bad", [float("nan"), -0.1, 1.5, "0.1", None])
def test_max_bad_fraction_must_be_a_fraction(tmp_path, bad):
    d = tmp_path / "own"
    write_jsonl(d / "test.jsonl", own_rows(3, "test"))
    with pytest.raises(DataError, match="max_bad_fraction must be a number in"):
        load_problems(str(d), "test", max_bad_fraction=bad)
