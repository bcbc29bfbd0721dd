"""The exploration grid: samples per question, resumable after kill -9, Table 1 from them."""
import shutil

import pandas as pd
import pytest

from conftest import requires_data
from ctrls.config import load_config
from ctrls.exploration import BASE, explore, load_samples, samples_dir, table1
from test_pretrain import OVR, kill_when, run_in_subprocess

pytestmark = [pytest.mark.integration, requires_data]


def test_grid_and_table(smoke_runs):
    _, cfg, _ = smoke_runs
    df = load_samples(cfg)
    g = cfg.grid
    assert len(df) == cfg.data.n_test * g.n_samples * len(g.temperatures) * (1 + len(g.epsilons))
    assert not df.duplicated(["temperature", "config", "question_id", "sample_index"]).any()
    assert set(df.config) == {BASE, *(f"eps={e:g}" for e in g.epsilons)}
    ctrls_rows = df[df.config != BASE]
    assert all(len(s) == len(st) for s, st in zip(ctrls_rows.steps, ctrls_rows.states))  # a state per step
    t = table1(df, n_boot=100)
    assert set(t.config) == set(df.config) and t.questions.eq(cfg.data.n_test).all()
    assert ((t["pass@n lo"] <= t["pass@n"]) & (t["pass@n"] <= t["pass@n hi"])).all()


def test_resume_after_kill_loses_and_duplicates_nothing(smoke_runs, tmp_path):
    ref_dir, cfg, _ = smoke_runs
    shutil.copytree(ref_dir / "smoke" / "pretrain", tmp_path / "smoke" / "pretrain")
    out = samples_dir(load_config("smoke", [*OVR, f"run_dir={tmp_path}"]))

    def some_parts():
        return out.exists() and len(list(out.glob("*.parquet"))) >= 2

    proc = run_in_subprocess(tmp_path, "from ctrls.exploration import explore\n"
                                       "explore(load_config('smoke', %r), progress=False)\n" % [*OVR, f"run_dir={tmp_path}"])
    kill_when(proc, some_parts)
    n_before = len(list(out.glob("*.parquet")))
    assert 2 <= n_before < cfg.data.n_test * 2
    (out / "partial.parquet.tmp").write_bytes(b"PAR1 cut")  # a kill can leave a half-written temp file
    explore(load_config("smoke", [*OVR, f"run_dir={tmp_path}"]), progress=False)
    key = ["temperature", "config", "question_id", "sample_index"]
    a = load_samples(cfg).sort_values(key).reset_index(drop=True)
    b = load_samples(load_config("smoke", [*OVR, f"run_dir={tmp_path}"])).sort_values(key).reset_index(drop=True)
    assert not b.duplicated(key).any()
    pd.testing.assert_frame_equal(a, b)


def test_your_own_dataset_through_the_cli(tmp_path):
    """A directory of train/test JSONL runs pretraining and exploration by the README's override."""
    import subprocess
    import sys

    from conftest import ROOT
    from test_data import write_jsonl

    d = tmp_path / "arith"
    for split, n in (("train", 4), ("test", 3)):
        write_jsonl(d / f"{split}.jsonl",
                    [{"question": f"Tom has {3 + i} apples and buys {4 + 2 * i} more. How many apples does he have?",
                      "answer": 7 + 3 * i, "steps": [f"He has {3 + i} + {4 + 2 * i} = {7 + 3 * i} apples."]}
                     for i in range(n)])
    runs = tmp_path / "runs"
    ovr = [*OVR, f"grid.datasets=[{d}]"]
    r = subprocess.run([sys.executable, "-m", "ctrls", "stage", "pretrain", "exploration", "--profile", "smoke",
                        "--run-dir", str(runs), "-o", *ovr], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    cfg = load_config("smoke", [*ovr, f"run_dir={runs}"])
    assert (runs / "smoke" / "pretrain" / "smollm2-135m-instruct__arith").is_dir()
    df = load_samples(cfg)
    assert set(df.dataset) == {str(d)} and df.question_id.str.startswith("arith-test-").all()
    assert df.question_id.nunique() == 3
    t = table1(df, n_boot=50)
    assert set(t.config) == {BASE, "eps=0.1"} and t.questions.eq(3).all()
