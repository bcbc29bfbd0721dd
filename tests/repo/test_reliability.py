"""Repeated setting keys, YAML 1.1 numbers, over-long names, judge
scales, one-line CLI errors."""
import pytest

from ctrls.config.schema import ConfigError, load_config


def test_a_config_setting_with_a_repeated_key_is_a_config_error():
    with pytest.raises(ConfigError, match=r"rl\.settings\[0\]"):
        load_config("smoke", ['rl.settings=["eps=0.1,eps=0.2"]'])


# ---- numbers as written ----------------------------------------------------------------

@pytest.mark.parametrize("item,key,value", [("pretrain.epochs=010", "pretrain", 10), ("pretrain.epochs=0o10", "pretrain", 8),
                                            ("pretrain.epochs=0x10", "pretrain", 16), ("states.tau=1e-1", "states", 0.1),
                                            ("states.tau=.5", "states", 0.5)])
def test_numbers_are_read_as_written(item, key, value):
    cfg = load_config("smoke", [item])
    k = item.split("=")[0].split(".")[1]
    got = getattr(getattr(cfg, key), k)
    assert got == value and type(got) is type(value)


@pytest.mark.parametrize("item,text", [("pretrain.epochs=1:30", "1:30"), ("states.tau=1:30", "1:30"),
                                       ("pretrain.epochs=1_000", "1_000")])
def test_yaml11_only_numbers_are_refused_naming_key_and_text(item, text):
    key = item.split("=")[0]
    with pytest.raises(ConfigError, match=rf"{key.replace('.', '[.]')}.*'{text}'"):
        load_config("smoke", [item])


def test_a_profile_file_reads_numbers_as_written(tmp_path):
    p = tmp_path / "mine.yaml"
    p.write_text("pretrain:\n  epochs: 010\n")
    assert load_config(str(p)).pretrain.epochs == 10
    p.write_text("pretrain:\n  epochs: 1:30\n")
    with pytest.raises(ConfigError, match=r"pretrain\.epochs.*'1:30'"):
        load_config(str(p))


def test_a_saved_config_reads_back_the_same(tmp_path):
    from ctrls.config.schema import save_config
    cfg = load_config("smoke", ["data.dataset=word_problems", "run_dir='1e3'"])
    save_config(cfg, tmp_path / "c.yaml")
    back = load_config(str(tmp_path / "c.yaml"))
    assert back.run_dir == "1e3" and back.to_dict() == cfg.to_dict()


def test_temperatures_equal_when_printed_are_refused():
    with pytest.raises(ConfigError, match=r"grid\.temperatures.*eta=0\.7 twice"):
        load_config("smoke", ["grid.temperatures=[0.7, 0.7000000000000001]", "rl.temperature=0.7"])


BOMB = ("grid.temperatures=[&a [0.7,0.7,0.7,0.7,0.7,0.7,0.7,0.7,0.7], &b [*a,*a,*a,*a,*a,*a,*a,*a,*a], "
        "&c [*b,*b,*b,*b,*b,*b,*b,*b,*b], &d [*c,*c,*c,*c,*c,*c,*c,*c,*c], &e [*d,*d,*d,*d,*d,*d,*d,*d,*d], "
        "&f [*e,*e,*e,*e,*e,*e,*e,*e,*e], &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]]")


def test_an_alias_bomb_in_an_override_is_a_short_error():
    with pytest.raises(ConfigError, match="alias") as e:
        load_config("smoke", [BOMB])
    assert len(str(e.value)) < 600 and "\n" not in str(e.value)


def test_an_alias_bomb_in_a_profile_is_a_short_error(tmp_path):
    p = tmp_path / "bomb.yaml"
    p.write_text(BOMB.replace("grid.temperatures=", "grid:\n  temperatures: "))
    with pytest.raises(ConfigError, match="more than 100,000 values") as e:
        load_config(str(p))
    assert len(str(e.value)) < 600
    p.write_text("pretrain: &p\n  epochs: 3\nrl: {steps: 2}\n")  # a small alias is still read
    with pytest.raises(ConfigError, match="a recursive YAML alias"):
        p.write_text("grid:\n  temperatures: &a [0.7, *a]\n")
        load_config(str(p))


def test_a_long_wrong_value_is_cut_in_the_message():
    with pytest.raises(ConfigError, match="characters") as e:
        load_config("smoke", ["grid.temperatures=" + "x" * 10000])
    assert len(str(e.value)) < 600


# ---- names too long for the file system ------------------------------------------------

def _dataset_dir(d):
    d.mkdir()
    for split in ("train", "test"):
        (d / f"{split}.jsonl").write_text('{"question": "1+1?", "answer": "#### 2"}\n')
    return str(d)


@pytest.mark.parametrize("key", ["grid.datasets", "grid.transfer_datasets"])
def test_a_dataset_name_too_long_for_the_file_system_fails_at_load(tmp_path, key):
    from ctrls.data.names import name_max
    long = _dataset_dir(tmp_path / ("d" * 200))  # a legal directory name; the pair's file names are not
    ok = _dataset_dir(tmp_path / "short")
    items = [f"run_dir={tmp_path / 'runs'}", f"grid.datasets=[{ok if key != 'grid.datasets' else long}]"]
    if key == "grid.transfer_datasets":
        items.append(f"grid.transfer_datasets=[{long}]")
    with pytest.raises(ConfigError, match=rf"{key}\[0\].*limit of {name_max(tmp_path)} bytes on a file name") as e:
        load_config("smoke", items)
    assert "\n" not in str(e.value)
    load_config("smoke", [f"run_dir={tmp_path / 'runs'}", f"grid.datasets=[{ok}]"])


# ---- the judge reads a stated scale ------------------------------------------------------

def _scores(reply):
    from ctrls.generate.judge import CRITERIA, parse_scores
    p = parse_scores(reply)
    return [p.scores[k] for k in CRITERIA], "".join(p.per_key[k][0] for k in CRITERIA)


@pytest.mark.parametrize("reply,expect,how", [
    ("Algebra: 7 on a 10-point scale", 7, "r"),
    ("Algebra: 7/10", 7, "r"),
    ("Algebra score: 7 out of 10", 7, "r"),
    ("Algebra: 7 on a scale of 1 to 10", 7, "r"),
    ("Algebra: 3/5", 6, "r"),
    ("Algebra: 3 out of 5", 6, "r"),
    ("Algebra: 4 on a 5-point scale", 8, "r"),
    ("Algebra: 80/100", 8, "r"),
    ("Algebra: 0/5", 1, "c"),
    ('On a 1-5 scale: {"self_reflection": 3, "algebra": 4, "coherence": 5, "hallucination": 5, "overall": 4}', 8, "j"),
    ("Scores on a 5-point scale. Algebra: 4, coherence: 3", 8, "r"),
])
def test_a_score_on_a_stated_scale_is_read_as_the_same_fraction_of_10(reply, expect, how):
    scores, per_key = _scores(reply)
    assert scores[1] == expect and per_key[1] == how


@pytest.mark.parametrize("reply", ["Algebra: 7 out of ten", "Algebra: 7 on a scale", "Algebra: 6/5", "Algebra: 3/0",
                                   "Algebra: 7/x", "On a 1-5 scale, or a 10-point scale: algebra: 4",
                                   '{"algebra": 4} on a 5-point scale or a 1-7 scale'])
def test_a_score_whose_scale_cannot_be_read_is_refused(reply):
    from ctrls.generate.judge import DEFAULT_SCORE
    scores, per_key = _scores(reply)
    assert scores[1] == DEFAULT_SCORE and per_key[1] == "d"


# ---- one-line errors from the CLI --------------------------------------------------------

def _cli(argv, capsys, monkeypatch):
    from ctrls import cli
    monkeypatch.setattr(cli, "run_notebook", lambda *a, **k: pytest.fail("a stage ran"))
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    err = capsys.readouterr().err
    assert e.value.code != 0 and "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return e.value.code, lines[0]


@pytest.mark.parametrize("cmd", [["stage", "pretrain"], ["reproduce", "--no-book"]])
def test_a_run_dir_that_is_a_file_is_one_line(cmd, tmp_path, capsys, monkeypatch):
    f = tmp_path / "file"
    f.write_text("x")
    for bad in (f, f / "sub"):
        code, line = _cli([*cmd, "--profile", "smoke", "--run-dir", str(bad)], capsys, monkeypatch)
        assert code == 2 and line == f"ctrls {cmd[0]}: --run-dir {str(bad)!r} is not a directory"


def test_an_unwritable_run_dir_is_one_line(tmp_path, capsys, monkeypatch):
    import os
    bad = "/proc/ctrls-no-such-dir/runs"  # not writable, even by root
    code, line = _cli(["stage", "rl", "--profile", "smoke", "--run-dir", bad], capsys, monkeypatch)
    assert code == 2 and line.startswith(f"ctrls stage: --run-dir {bad!r} is not a writable directory (")
    if os.geteuid() != 0:
        ro = tmp_path / "ro"
        ro.mkdir(mode=0o500)
        code, line = _cli(["stage", "rl", "--profile", "smoke", "--run-dir", str(ro)], capsys, monkeypatch)
        assert "is not a writable directory (Permission denied)" in line


@pytest.mark.parametrize("level", ["LOUD", "", "10"])
def test_an_unknown_log_level_is_one_line(level, capsys, monkeypatch):
    monkeypatch.setenv("CTRLS_LOG", level)
    code, line = _cli(["profiles"], capsys, monkeypatch)
    assert code == 2 and line == f"ctrls: CTRLS_LOG={level!r} is not a log level; use DEBUG, INFO, WARNING, ERROR or CRITICAL"


def test_a_known_log_level_in_any_case_is_taken(capsys, monkeypatch):
    from ctrls import cli
    monkeypatch.setenv("CTRLS_LOG", "warning")
    assert cli.log_level("warning") == 30
    with pytest.raises(SystemExit) as e:
        cli.main(["profiles"])
    assert e.value.code == 0 and "smoke" in capsys.readouterr().out


def test_a_table_given_no_samples_is_one_line(tmp_path, capsys, monkeypatch):
    import pandas as pd
    import papermill as pm

    from ctrls import cli
    from ctrls.report.tables import matrix_frame

    with pytest.raises(ValueError) as empty:
        matrix_frame(pd.DataFrame(), "correct")

    def execute(src, out, **kw):  # the summary notebook's table cell raises as the table does
        raise pm.PapermillExecutionError(3, 3, "table1(samples)", "ValueError", str(empty.value),
                                         ["Traceback (most recent call last):", "  ...", f"ValueError: {empty.value}"])

    monkeypatch.setattr(pm, "execute_notebook", execute)
    monkeypatch.setattr(cli, "BOOK", tmp_path / "book")
    with pytest.raises(SystemExit) as e:
        cli.main(["reproduce", "--profile", "smoke", "--run-dir", str(tmp_path / "runs"), "--no-book", "--only", "summary"])
    lines = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 1 and len(lines) == 1
    assert lines[0].startswith("ctrls reproduce: stage 'summary' failed in cell 3: ValueError: no samples for 'correct'")
    assert "see the executed notebook" in lines[0]


# ---- results of another config are never read as this one's -------------------------------

def _cfg(tmp_path, *items):
    return load_config("smoke", [f"run_dir={tmp_path}", *items])


def _samples(n, correct=True, qid="q1"):
    import pandas as pd
    return pd.DataFrame([{"backbone": "b", "dataset": "d", "temperature": 0.7, "config": "Base", "epsilon": float("nan"),
                          "question_id": qid, "sample_index": i, "valid": True, "correct": correct} for i in range(n)])


def _finished_exploration(cfg, df, finish=True):
    from ctrls.stages import exploration as E
    stage = E._stage(cfg)
    stage.begin()
    out = E.samples_dir(cfg)
    out.mkdir(parents=True, exist_ok=True)
    E.write_part(df, out / "part.parquet")
    if finish:
        stage.finish(samples=len(df))
    else:
        stage.release()
    return out / "part.parquet"


def test_exploration_samples_of_another_config_are_never_scored(tmp_path):
    from ctrls.report.scorecard import demo_claims
    from ctrls.stages.common import NotRunError
    from ctrls.stages.exploration import load_samples
    two, four = _cfg(tmp_path, "grid.n_samples=2"), _cfg(tmp_path, "grid.n_samples=4")
    _finished_exploration(two, _samples(2))
    assert len(load_samples(two)) == 2  # the run of its own config is read
    with pytest.raises(NotRunError, match=r"exploration@.*the exploration stage has not run"):  # its own slot, beside
        load_samples(four)
    claim = demo_claims(four)[0]
    assert claim.verdict == "not run" and "has not run" in claim.evidence


def test_only_the_parts_the_finished_stage_recorded_are_read(tmp_path):
    from ctrls.stages.exploration import load_samples, samples_dir, write_part
    cfg = _cfg(tmp_path)
    _finished_exploration(cfg, _samples(2))
    write_part(_samples(2, qid="q-stray"), samples_dir(cfg) / "stray.parquet")  # written after the stage finished
    assert set(load_samples(cfg).question_id) == {"q1"}


def test_an_unfinished_exploration_is_not_scored(tmp_path):
    from ctrls.stages.common import NotRunError
    from ctrls.stages.exploration import load_samples
    cfg = _cfg(tmp_path)
    _finished_exploration(cfg, _samples(2), finish=False)
    with pytest.raises(NotRunError, match="has not finished"):
        load_samples(cfg)
    assert len(load_samples(cfg, unfinished=True)) == 2  # the stage itself reads its parts before it finishes


def _rl_curve(cfg, accuracy_ok=True):
    import pandas as pd

    from ctrls.stages.rl import rl_stage
    stage = rl_stage(cfg)
    stage.begin()
    f = stage.dir / "b__d" / "eps_0.1__seed0" / "curve.parquet"
    f.parent.mkdir(parents=True)
    cbq = [[1, 0, 1], [1, 1, 1] if accuracy_ok else [1, float("nan"), 1]]
    pd.DataFrame({"step": [0, 5], "kind": ["eval", "eval"], "correct_by_question": cbq,
                  "samples_per_question": [1.0, 1.0], "setting": "eps=0.1", "seed": 0}).to_parquet(f)
    stage.finish()
    return f


def test_rl_curves_of_another_config_are_never_scored(tmp_path):
    from ctrls.stages.common import NotRunError
    from ctrls.stages.rl import load_curves
    _rl_curve(_cfg(tmp_path, "rl.steps=5"))
    assert len(load_curves(_cfg(tmp_path, "rl.steps=5"))) == 2
    with pytest.raises(NotRunError, match=r"rl@.*the rl stage has not run"):  # its own slot, beside: empty
        load_curves(_cfg(tmp_path, "rl.steps=6"))


# ---- results holding NaN are unreadable, naming the file ----------------------------------

def test_exploration_results_holding_nan_are_unreadable_naming_the_file(tmp_path):
    from ctrls.report.scorecard import demo_claims
    from ctrls.stages.common import UnreadableResultsError
    from ctrls.stages.exploration import load_samples
    cfg = _cfg(tmp_path)
    part = _finished_exploration(cfg, _samples(2, correct=float("nan")))
    with pytest.raises(UnreadableResultsError, match=r"part\.parquet.*NaN in column 'correct'"):
        load_samples(cfg)
    assert demo_claims(cfg)[0].verdict == f"unreadable: {part}"


def test_rl_curves_holding_nan_are_unreadable_naming_the_file(tmp_path):
    from ctrls.report.scorecard import demo_claims
    cfg = _cfg(tmp_path, "rl.steps=5")
    f = _rl_curve(cfg, accuracy_ok=False)
    rl = [c for c in demo_claims(cfg) if c.page.endswith("03_rl")][0]
    assert rl.verdict == f"unreadable: {f}" and "NaN in column 'correct_by_question'" in rl.evidence


# ---- answers, decided by the policy (ctrls/data/answers.py) -----------------------------------

@pytest.mark.parametrize("text,gold,correct", [
    ("The answer is –5.", "-5", True), ("#### -5", "–5", True), ("#### 2 – x", "2-x", True),  # a sign: a minus
    ("The answer is 3–5.", "3", False), ("The answer is 3 – 5.", "-2", False),  # between numbers: a range, no number
    ("The answer is 3–5.", "3–5", True)])
def test_an_en_dash_is_a_minus_except_between_two_numbers(text, gold, correct):
    from ctrls.data.answers import grade
    assert grade(text, gold).correct is correct


@pytest.mark.parametrize("text,gold,correct", [
    ("The answer is 12 345.", "12345", True), ("#### 1 000 000", "1000000", True), ("#### 12\u00a0345", "12345", True),
    ("#### 12\u202f345.5", "12345.5", True), ("#### 12 345 dollars", "12345", True), ("#### 12345", "12 345", True),
    ("#### 1 2", "12", False), ("#### 12 34", "1234", False), ("#### 1 0000", "10000", False)])
def test_a_space_separates_thousands_only_in_groups_of_three(text, gold, correct):
    from ctrls.data.answers import grade
    assert grade(text, gold).correct is correct


@pytest.mark.parametrize("pred,gold,correct", [
    ("0.5", "0.50", True), ("18.0", "18", True), ("+5", "5", True),  # the same decimal, however many zeros
    ("2.5000001", "2.5", False), ("2.0000001", "2", False), ("3.14159", "3.14", False), ("3.1", "3.14", False)])
def test_decimals_are_equal_as_written_to_the_golds_last_digit(pred, gold, correct):
    from ctrls.data.answers import verify
    assert verify(gold, pred) is correct


@pytest.mark.parametrize("text", ["#### 42 ####", "#### #### 42", "########42", "#### 42 ####\n", "The answer is 42 ####"])
def test_a_doubled_marker_is_not_part_of_the_answer(text):
    from ctrls.data.answers import extract_answer
    assert extract_answer(text) == "42"


def test_a_gold_holding_the_marker_is_refused():
    from ctrls.data.answers import gold_problem
    assert "####" in gold_problem("#### 42") and gold_problem("42") is None


def test_a_lone_surrogate_is_a_lost_character_never_an_answer_or_a_crash(tmp_path):
    import pandas as pd

    from ctrls.data.answers import gold_problem, grade
    g = grade("The answer is 5\ud800", "5")
    assert (g.pred, g.valid, g.correct) == (None, False, False)  # the answer lost a character: no answer
    assert grade("#### 7\n\ud800 The answer is 5\ud800", "7").correct  # the marker before it answers
    assert grade("\ud83d text. The answer is 5.", "5").correct  # a lost character outside the answer is harmless
    for text in ("The answer is 5\ud800", "#### 5\ud800 6"):  # the stage writes pred: never a surrogate in it
        pd.DataFrame({"pred": [grade(text, "5").pred]}).to_parquet(tmp_path / "p.parquet")
    assert "surrogate" in gold_problem("5\ud800")
