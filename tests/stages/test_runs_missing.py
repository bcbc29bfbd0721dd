"""A part file that a done marker records but the directory lacks is an error, never a smaller sample.

A deleted exploration part (a question's samples) or synthetic result of a finished stage is refused by
its reader with :class:`UnreadableResultsError` naming the file (the scorecard shows "unreadable: <file>"),
not dropped from the verdicts; a rerun of the stage redoes it (``Stage.is_done`` verifies every recorded
file).
"""
import pandas as pd
import pytest

from ctrls.config.schema import load_config
from ctrls.stages.common import UnreadableResultsError
from ctrls.stages.runs import Stage


def cfg_at(run_dir):
    return load_config("smoke", [f"run_dir={run_dir}"])


def part(cfg, qid):
    from ctrls.stages.exploration import part_file, samples_dir

    return part_file(samples_dir(cfg), cfg.backbone.name, cfg.data.dataset, 0.7, "Base", qid)


def test_a_deleted_exploration_part_is_named_not_dropped(tmp_path):
    import ctrls.stages.exploration as E

    cfg = cfg_at(tmp_path)
    st = E._stage(cfg).begin()
    E.samples_dir(cfg).mkdir(parents=True)
    for qid in ("q1", "q2", "q3"):
        E.write_part(pd.DataFrame({"temperature": [0.7] * 2, "config": ["Base"] * 2, "question_id": [qid] * 2,
                                   "valid": [True, True], "correct": [True, False]}), part(cfg, qid))
    st.finish()
    assert E.load_samples(cfg).question_id.nunique() == 3
    part(cfg, "q2").unlink()
    with pytest.raises(UnreadableResultsError) as e:
        E.load_samples(cfg)  # not the samples of q1 and q3 alone
    assert e.value.path == part(cfg, "q2") and str(part(cfg, "q2")) in str(e.value)


def test_a_deleted_synthetic_result_is_unreadable_not_not_run(tmp_path):
    import ctrls.stages.synthetic as S

    cfg = cfg_at(tmp_path)
    st = Stage(cfg, "synthetic", S.KEYS).begin()
    pd.DataFrame({"a": [1]}).to_parquet(st.dir / "curves.parquet")
    pd.DataFrame({"a": [1]}).to_parquet(st.dir / "recovery.parquet")
    st.finish()
    assert len(S.load_curves(cfg)) == 1
    (st.dir / "recovery.parquet").unlink()
    with pytest.raises(UnreadableResultsError, match="recovery.parquet"):
        S.load_recovery(cfg)
