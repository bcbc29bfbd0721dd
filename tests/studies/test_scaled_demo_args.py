"""studies/scaled_demo.py refuses bad sizes in one line before any stage runs."""
import pytest

from tests.studies.harness import load_study


@pytest.mark.parametrize("argv,words", [(["--samples", "2", "--k", "4"], "--k <= --samples"),
                                        (["--scale", "0"], "--scale >= 1"),
                                        (["--margin", "0"], "--margin"),
                                        (["-o", "data.n_test=-1"], "n_test")])
def test_a_bad_size_is_refused_before_any_work(tmp_path, monkeypatch, capsys, argv, words):
    import ctrls.stages.pretrain

    monkeypatch.setattr(ctrls.stages.pretrain, "pretrain", lambda *a, **k: pytest.fail("a stage ran"))
    with pytest.raises(SystemExit) as e:
        load_study("scaled_demo").main(["--run-dir", str(tmp_path), *argv])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert words in err and "Traceback" not in err
