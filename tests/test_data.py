import json
import logging

import pytest

from conftest import SHARED_DATA, requires_data
from ctrls import data
from ctrls.data import DataError, gsm8k_solution, load_problems


def write_gsm(dirpath, rows, split="test"):
    (dirpath / "gsm8k").mkdir(parents=True, exist_ok=True)
    with open(dirpath / "gsm8k" / f"{split}.jsonl", "w") as f:
        for r in rows:
            f.write((r if isinstance(r, str) else json.dumps(r)) + "\n")


def fake_rows(n):
    return [{"question": f"Q{i}: what is {i} plus 1?", "answer": f"We add <<{i}+1={i + 1}>>{i + 1}.\n#### {i + 1:,}"}
            for i in range(n)]


def test_gsm8k_parsing_strips_calculator_annotations():
    gold, steps = gsm8k_solution("She has 3*4=<<3*4=12>>12 eggs.\nThen 12-2=<<12-2=10>>10.\n#### 1,010")
    assert gold == "1010" and steps == ("She has 3*4=12 eggs.", "Then 12-2=10.")
    with pytest.raises(ValueError):
        gsm8k_solution("no final answer")


def test_data_dir_argument_and_env(tmp_path, monkeypatch):
    write_gsm(tmp_path, fake_rows(30))
    probs = load_problems("gsm8k", "test", data_dir=str(tmp_path))
    assert len(probs) == 30 and probs[5].answer == "6" and probs[5].steps == ("We add 6.",)
    assert probs[5].id == "gsm8k-test-5" and probs[5].source == "gsm8k" and probs[5].split == "test"
    monkeypatch.setenv("CTRLS_DATA_DIR", str(tmp_path))
    assert load_problems("gsm8k", "test") == probs


def test_seeded_subsets_are_deterministic_and_nested(tmp_path):
    write_gsm(tmp_path, fake_rows(50))
    a = load_problems("gsm8k", "test", n=10, seed=3, data_dir=str(tmp_path))
    b = load_problems("gsm8k", "test", n=10, seed=3, data_dir=str(tmp_path))
    c = load_problems("gsm8k", "test", n=20, seed=3, data_dir=str(tmp_path))
    d = load_problems("gsm8k", "test", n=10, seed=4, data_dir=str(tmp_path))
    assert a == b and c[:10] == a and a != d
    with pytest.raises(DataError, match="only 50"):
        load_problems("gsm8k", "test", n=51, data_dir=str(tmp_path))


def test_malformed_rows_are_counted_and_thresholded(tmp_path, caplog):
    rows = fake_rows(200) + ["{not json", {"question": "no answer"}, {"question": "q", "answer": "no hashes"}]
    write_gsm(tmp_path, rows)
    with caplog.at_level(logging.WARNING):
        probs = load_problems("gsm8k", "test", data_dir=str(tmp_path), max_bad_fraction=0.05)
    assert len(probs) == 200
    assert "not valid JSON" in caplog.text and "no '####'" in caplog.text
    with pytest.raises(DataError, match="3 of 203 rows are malformed"):
        load_problems("gsm8k", "test", data_dir=str(tmp_path), max_bad_fraction=0.01)


def test_missing_data_names_both_ways(monkeypatch, tmp_path):
    monkeypatch.delenv("CTRLS_DATA_DIR", raising=False)
    monkeypatch.setattr(data, "resolve_data_dir", lambda d=None: None)
    monkeypatch.setitem(__import__("sys").modules, "datasets", None)  # as if not installed
    with pytest.raises(DataError) as e:
        load_problems("gsm8k", "test")
    assert "CTRLS_DATA_DIR" in str(e.value) and "datasets" in str(e.value)


def test_bad_data_dir_and_dataset_names(tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        load_problems("gsm8k", "test", data_dir=str(tmp_path / "nope"))
    with pytest.raises(DataError, match="unknown dataset"):
        load_problems("svamp", "test")


@requires_data
def test_real_splits(monkeypatch):
    monkeypatch.delenv("CTRLS_DATA_DIR", raising=False)
    assert data.resolve_data_dir() == SHARED_DATA
    test = load_problems("math", "test")
    train = load_problems("math", "train")
    assert len(test) == 500 and len(train) == 4500
    assert not {p.question for p in test} & {p.question for p in train}
    assert len(load_problems("gsm8k", "train")) == 7473 and len(load_problems("gsm8k", "test")) == 1319


def test_gsm_symbolic_is_generated_offline():
    probs = load_problems("gsm_symbolic", "test", n=3)
    assert len(probs) == 3 and all(p.source == "gsm_symbolic" and p.answer and p.steps for p in probs)
