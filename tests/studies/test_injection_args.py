"""Studies/injection.py checks every argument before any work, and says what is
wrong in one line, without a traceback (``--questions -1`` sliced the problems to all but the last and exited 0)."""
from __future__ import annotations

import pytest

from tests.studies.harness import load_study, refused


@pytest.fixture(scope="module")
def injection():
    return load_study("injection")


@pytest.fixture
def no_work(injection, monkeypatch):
    monkeypatch.setattr(injection, "load_backbone", lambda *a, **k: pytest.fail("injection.py did work"))


@pytest.mark.parametrize("argv,words", [
    (["--questions", "-1"], "--questions"),
    (["--questions", "0"], "--questions"),
    (["--samples", "0"], "--samples"),
    (["--batch", "0"], "--batch"),
    (["--epochs", "-2"], "--epochs"),
    (["--layers", "x"], "--layers"),
    (["--layers", "-3"], "--layers"),
    (["--layers", "20", "20"], "--layers"),
    (["--layers", "last"], "--layers"),
    (["--append"], "--append"),
    (["-o", "pretrain.epochs=-1"], "pretrain.epochs"),
    (["-o", "nosuch=1"], "nosuch"),
    (["--questions", "500"], "data.n_test"),  # more than the profile's test questions: was silently data.n_test
])
def test_injection_refuses_a_bad_argument_before_any_work(injection, no_work, tmp_path, argv, words):
    msg = refused(injection.main, ["--run-dir", str(tmp_path), *argv])
    assert msg.startswith("injection.py: ") and words in msg, msg


def test_injection_refuses_a_run_directory_that_does_not_exist(injection, no_work, tmp_path):
    assert "--run-dir" in refused(injection.main, ["--run-dir", str(tmp_path / "absent")])
