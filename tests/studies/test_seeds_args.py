"""studies/seeds.py's arguments: a data seed given twice is refused before any work, and a run whose
exploration has not finished is one line, no traceback."""
from __future__ import annotations

import pytest

from tests.studies.harness import load_study


@pytest.fixture(scope="module")
def seeds():
    return load_study("seeds")


@pytest.mark.parametrize("argv", [["--runs", "1:{d}", "1:{d}"], ["--runs", "1:{d}", "2:{d}", "--dev", "2:{d}"]])
def test_a_data_seed_given_twice_is_refused_before_any_work(seeds, tmp_path, monkeypatch, capsys, argv):
    monkeypatch.setattr(seeds, "one_seed", lambda *a, **k: pytest.fail("seeds.py did work"))
    with pytest.raises(SystemExit) as e:
        seeds.main([a.format(d=tmp_path) for a in argv])
    assert e.value.code == 2 and "given twice" in capsys.readouterr().err


def test_a_run_without_a_finished_exploration_is_one_line(seeds, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        seeds.main(["--profile", "smoke", "--runs", f"1:{tmp_path}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 1 and len(err) == 1 and "Traceback" not in err[0], err
    assert ": error: no exploration samples in " in err[0] and str(tmp_path) in err[0]
