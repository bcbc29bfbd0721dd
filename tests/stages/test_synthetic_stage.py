"""The synthetic study's stage (ctrls.stages.synthetic): its runs in worker processes equal its runs in one."""
import pandas as pd

from ctrls.config.schema import load_config
from ctrls.stages import synthetic as stage


def test_runs_in_two_worker_processes_equal_the_runs_in_one(tmp_path):
    seq = load_config("smoke", [f"run_dir={tmp_path / 'one'}"])
    par = load_config("smoke", [f"run_dir={tmp_path / 'two'}"])
    stage.run_study(seq, progress=False, workers=1)
    stage.run_study(par, progress=False, workers=2)
    a, b = stage.load_curves(seq), stage.load_curves(par)
    assert len(a) and a.groupby(["epsilon", "alpha", "seed"]).ngroups == len(stage.study_runs(seq))
    pd.testing.assert_frame_equal(a, b)  # bit for bit, in study_runs' order
    pd.testing.assert_frame_equal(stage.load_recovery(seq), stage.load_recovery(par))
    done = (tmp_path / "two" / "smoke" / "synthetic" / "done").read_text()
    assert '"workers": 2' in done
