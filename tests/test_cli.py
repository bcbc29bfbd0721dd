"""The notebook runner's post-processing of executed notebooks."""
import nbformat
from nbformat.v4 import new_code_cell, new_notebook, new_output

from ctrls.cli import settle_streams


def test_settle_streams_keeps_each_progress_bar_final_state(tmp_path):
    bar = ["\rload:   0%| 0/2", "\rload:  50%| 1/2", "\rload: 100%| 2/2", "\n",
           "\rtrain:   0%| 0/3", "\rtrain: 100%| 3/3   ", "\rtrain: 100%| 3/3", "\n"]
    cell = new_code_cell("x", outputs=[new_output("stream", name="stderr", text=t) for t in bar]
                         + [new_output("stream", name="stdout", text="a\nb\n"),
                            new_output("display_data", data={"text/plain": "table"}),
                            new_output("stream", name="stdout", text="c\r\n"),
                            new_output("stream", name="stdout", text="d\n")])
    path = tmp_path / "nb.ipynb"
    nbformat.write(new_notebook(cells=[cell, new_code_cell("y")]), str(path))

    settle_streams(path)

    outs = nbformat.read(str(path), as_version=4).cells[0].outputs
    assert [o.output_type for o in outs] == ["stream", "stream", "display_data", "stream"]
    assert outs[0].name == "stderr" and outs[0].text == "load: 100%| 2/2\ntrain: 100%| 3/3\n"
    assert outs[1].text == "a\nb\n"  # plain output untouched
    assert outs[2].data["text/plain"] == "table"
    assert outs[3].text == "c\nd\n"  # consecutive outputs of one stream are joined



def test_settle_streams_drops_progress_only_stderr_and_hides_injected_parameters(tmp_path):
    bars = ["\rpretrain:   0%|          | 0/3 [00:00<?, ?it/s]",
            "\rpretrain: 100%|██████████| 3/3 [00:01<00:00,  2.10it/s]", "\n"]
    warn = "UserWarning: something a reader should see\n"
    params = new_code_cell('run_dir = "/tmp/x/runs"', metadata={"tags": ["injected-parameters"]})
    cell = new_code_cell("x", outputs=[new_output("stream", name="stderr", text=t) for t in bars]
                         + [new_output("display_data", data={"text/plain": "table"}),
                            new_output("stream", name="stderr", text=warn)])
    path = tmp_path / "nb.ipynb"
    nbformat.write(new_notebook(cells=[params, cell]), str(path))

    settle_streams(path)

    nb = nbformat.read(str(path), as_version=4)
    assert nb.cells[0].metadata.tags == ["injected-parameters", "remove-cell"]
    outs = nb.cells[1].outputs
    assert [o.output_type for o in outs] == ["display_data", "stream"]  # the bars are gone
    assert outs[1].text == warn

# ---- config errors at the command line, and overrides with spaces ---------------------------

import json  # noqa: E402
import os  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

from ctrls import cli  # noqa: E402
from ctrls.config.schema import load_config  # noqa: E402
from ctrls.report.provenance import notebook_config  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def _env():
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}


def test_stage_config_error_is_one_line_and_status_2(tmp_path):
    r = subprocess.run([sys.executable, "-m", "ctrls", "stage", "pretrain", "--profile", "smoke", "--run-dir",
                        str(tmp_path), "-o", "data.n_test=-1"], capture_output=True, text=True, env=_env(), timeout=300)
    assert r.returncode == 2
    assert "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert lines == ["ctrls stage: config error: config key 'data.n_test': -1 is not allowed; allowed: >= 1"]
    assert not any(tmp_path.iterdir())  # nothing ran


@pytest.mark.parametrize("argv,key", [
    (["reproduce", "--profile", "smoke", "--no-book", "-o", "rl.group_size=0"], "rl.group_size"),
    (["reproduce", "--profile", "smoke", "--no-book", "-o", "grid.epsilons=[0.1,", "1.5]"], r"grid.epsilons[1]"),
    (["reproduce", "--profile", "smoke", "--no-book", "-o", "backbone.hidden_layer=3"], "backbone.hidden_layer"),
    (["stage", "rl", "--profile", "nosuch"], "unknown profile 'nosuch'"),
    (["stage", "exploration", "--profile", "smoke", "-o", "sampling.temperature=0.7"], "sampling.temperature"),
    # -o given twice: both kept (argparse's nargs="*" alone keeps only the last, silently)
    (["stage", "exploration", "--profile", "smoke", "-o", "sampling.temperature=0.7", "-o", "rl.steps=3"],
     "sampling.temperature"),
    (["reproduce", "--profile", "smoke", "--no-book", "-o", "rl.group_size=0", "-o", "rl.steps=3"], "rl.group_size"),
])
def test_config_errors_exit_2_before_anything_runs(argv, key, monkeypatch, capsys, tmp_path):
    ran = []
    monkeypatch.setattr(cli, "run_notebook", lambda *a, **k: ran.append(a))
    with pytest.raises(SystemExit) as e:
        cli.main([*argv[:1], "--run-dir", str(tmp_path), *argv[1:]])
    err = capsys.readouterr().err
    assert e.value.code == 2 and not ran
    assert len(err.strip().splitlines()) == 1 and key in err and "config error" in err


def test_notebook_params_carry_overrides_with_spaces(tmp_path):
    items = ["grid.epsilons=[0.1, 0.3]", "rl.steps=3", "data.data_dir=/my data/x", "judge.model='a b'"]
    p = cli.notebook_params("smoke", str(tmp_path), items, False)
    assert isinstance(p["overrides"], str)  # one papermill parameter, as `-p overrides "..."` gives it
    got = notebook_config(p["profile"], p["run_dir"], p["overrides"])
    assert got == load_config("smoke", [*items, f"run_dir={tmp_path.resolve()}"])
    assert got.grid.epsilons == [0.1, 0.3] and got.data.data_dir == "/my data/x" and got.judge.model == "a b"
    # the shell's split of an unquoted list is put back together
    assert notebook_config("smoke", "r", ["grid.epsilons=[0.1,", "0.3]"]).grid.epsilons == [0.1, 0.3]


@pytest.mark.integration
def test_papermill_overrides_parameter_with_spaces(tmp_path):
    """``papermill nb.ipynb out.ipynb -p overrides "grid.epsilons=[0.1, 0.3] rl.steps=3"``, end to end."""
    from nbformat.v4 import new_code_cell, new_notebook

    params = new_code_cell('profile = "demo"\nrun_dir = "runs"\noverrides = ""', metadata={"tags": ["parameters"]})
    body = new_code_cell("import json\nfrom ctrls.report.provenance import notebook_config\n"
                         "cfg = notebook_config(profile, run_dir, overrides)\n"
                         "print(json.dumps([cfg.grid.epsilons, cfg.rl.steps, cfg.profile]))")
    src, out = tmp_path / "in.ipynb", tmp_path / "out.ipynb"
    nbformat.write(new_notebook(cells=[params, body], metadata={"kernelspec": {"name": "python3", "language": "python",
                                                                            "display_name": "Python 3"}}), str(src))
    r = subprocess.run([sys.executable, "-m", "papermill", str(src), str(out), "-k", "python3", "-p", "profile", "smoke",
                        "-p", "overrides", "grid.epsilons=[0.1, 0.3] rl.steps=3", "--cwd", str(ROOT)],
                       capture_output=True, text=True, env=_env(), timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    printed = nbformat.read(str(out), as_version=4).cells[-1].outputs[0].text
    assert json.loads(printed) == [[0.1, 0.3], 3, "smoke"]


def test_reproduce_records_each_notebooks_wall_time(monkeypatch, tmp_path):
    ran = []
    monkeypatch.setattr(cli, "run_notebook", lambda stage, *a, **k: ran.append(stage))
    with pytest.raises(SystemExit) as e:
        cli.main(["reproduce", "--run-dir", str(tmp_path), "--book-dir", str(tmp_path / "book"), "--profile", "smoke",
                  "--no-book", "--only", "pretrain", "rl"])  # its own book directory: the checkout's stays as it is
    assert e.value.code == 0
    rec = json.loads((tmp_path / "smoke" / "reproduce_timings.json").read_text())
    assert ran == ["pretrain", "rl"] and list(rec["seconds"]) == ran
    assert rec["profile"] == "smoke" and rec["commit"] and rec["total_s"] >= sum(rec["seconds"].values())


@pytest.mark.parametrize("argv,what", [(["--dataset", "nosuch"], "unknown dataset 'nosuch'"),
                                       (["--split", "validation"], "unknown split 'validation'")])
def test_verify_references_with_an_unknown_dataset_or_split_is_one_line(argv, what):
    """It printed a traceback."""
    r = subprocess.run([sys.executable, "-m", "ctrls", "verify-references", *argv], capture_output=True, text=True,
                       env=_env(), timeout=300)
    assert r.returncode != 0
    assert "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ctrls verify-references: data error: ") and what in lines[0]


def test_settle_streams_cuts_bars_and_deprecation_notices_from_mixed_stderr(tmp_path):
    import nbformat
    from nbformat.v4 import new_code_cell, new_notebook, new_output

    text = ("Loading weights: 100%|██████████| 272/272 [00:00<00:00, 7001.10it/s]\n"
            "/tmp/x/site-packages/torch/nn/modules/module.py:1789: FutureWarning: `past_key_values` is deprecated\n"
            "  return forward_call(*args, **kwargs)\n"
            "WARNING ctrls.data.problems: skipped 1 malformed row(s)\n")
    nb = new_notebook(cells=[new_code_cell("x", outputs=[new_output("stream", name="stderr", text=text)])])
    path = tmp_path / "nb.ipynb"
    nbformat.write(nb, str(path))
    settle_streams(path)
    out = nbformat.read(str(path), as_version=4).cells[0].outputs
    assert [o.text.strip() for o in out] == ["WARNING ctrls.data.problems: skipped 1 malformed row(s)"]
    # a notice raised while a bar is drawn: it follows the bar's text on its line, between refreshes
    mid = ("\rpretrain:  50%|#####     | 1/2 [00:01<00:01,  1.20s/it]"
           "/tmp/x/site-packages/torch/nn/modules/module.py:1789: FutureWarning: `past_key_values` is deprecated\n"
           "  return forward_call(*args, **kwargs)\n"
           "\rpretrain: 100%|##########| 2/2 [00:02<00:00,  1.10s/it]\n"
           "kept 3 chains\n")
    nb = new_notebook(cells=[new_code_cell("x", outputs=[new_output("stream", name="stderr", text=mid)])])
    nbformat.write(nb, str(path))
    settle_streams(path)
    out = nbformat.read(str(path), as_version=4).cells[0].outputs
    assert [o.text.strip() for o in out] == ["kept 3 chains"]


def test_timings_page_lists_each_notebook_and_names_the_run(tmp_path):
    import argparse

    from ctrls.cli import STAGES, write_timings_page

    args = argparse.Namespace(profile="demo", override=["rl.steps=5"])
    page = write_timings_page(tmp_path / "generated" / "timings.md", args, {"setup": 32.3, "rl": 470.0})
    text = page.read_text()
    assert f"| {STAGES['setup']} | 32 |" in text and f"| {STAGES['rl']} | 470 |" in text
    assert "**8.4 minutes**" in text and "`demo`" in text and "`rl.steps=5`" in text and "GiB" in text


def test_reproduce_with_a_profile_file_records_its_timings_and_the_machines_rate(tmp_path, monkeypatch):
    """``--profile`` given as a file path (spaces, accents): the timings land under the run directory in the
    profile's own name, with the machine's GEMM rate beside the total."""
    import json
    import shutil

    from ctrls import cli

    prof = tmp_path / "mi perfil é.yaml"
    shutil.copy(cli.ROOT / "ctrls" / "config" / "profiles" / "smoke.yaml", prof)
    for name in ("run_notebook", "write_claims_scorecard", "write_timings_page", "write_rl_profile"):
        monkeypatch.setattr(cli, name, lambda *a, **k: None)
    monkeypatch.setattr("ctrls.report.codeindex.write_code_page", lambda *a, **k: None)
    monkeypatch.setattr(cli, "machine_gemm_gflops", lambda: 61.5)
    runs = tmp_path / "runs"
    with pytest.raises(SystemExit) as e:
        cli.main(["reproduce", "--profile", str(prof), "--run-dir", str(runs), "--no-book", "--only", "setup"])
    assert e.value.code == 0
    rec = json.loads((runs / "mi perfil é" / "reproduce_timings.json").read_text())
    assert rec["gemm_gflops"] == 61.5 and rec["total_s"] >= 0


def test_version_and_a_stage_named_after_overrides(capsys, monkeypatch):
    from ctrls import cli

    with pytest.raises(SystemExit):
        cli.main(["--version"])
    out = capsys.readouterr().out
    assert out.startswith("ctrls 0.") and "(commit " in out
    seen = {}
    monkeypatch.setattr(cli, "cmd_stage", lambda a: seen.update(names=a.names, override=a.override) or 0)
    with pytest.raises(SystemExit):
        cli.main(["stage", "--profile", "smoke", "-o", "rl.steps=2", "rl"])
    assert seen == {"names": ["rl"], "override": ["rl.steps=2"]}
    with pytest.raises(SystemExit) as e:
        cli.main(["stage", "-o", "rl.steps=2"])
    assert e.value.code == 2 and "STAGE must be" in capsys.readouterr().err



def test_a_full_disk_writing_the_timings_is_one_line_naming_the_file_and_keeps_the_old_one(tmp_path, monkeypatch, capsys):
    import errno
    import json
    from pathlib import Path

    from ctrls import cli

    for name in ("run_notebook", "write_claims_scorecard", "write_timings_page", "write_rl_profile"):
        monkeypatch.setattr(cli, name, lambda *a, **k: None)
    monkeypatch.setattr("ctrls.report.codeindex.write_code_page", lambda *a, **k: None)
    monkeypatch.setattr(cli, "machine_gemm_gflops", lambda: 61.5)
    runs = tmp_path / "runs"
    (runs / "smoke").mkdir(parents=True)
    (runs / "smoke" / "reproduce_timings.json").write_text('{"total_s": 1.0}')

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Path, "write_text", full)
    with pytest.raises(SystemExit) as e:
        cli.main(["reproduce", "--profile", "smoke", "--run-dir", str(runs), "--no-book", "--only", "setup"])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1
    assert f"cannot write {runs / 'smoke' / 'reproduce_timings.json'}: no space left" in err[0]
    assert json.loads((runs / "smoke" / "reproduce_timings.json").read_text()) == {"total_s": 1.0}


@pytest.mark.parametrize("quiet", [False, True])
def test_reproduce_relays_the_stages_own_progress_unless_quiet(quiet, tmp_path, monkeypatch, capsys):
    import time

    from ctrls import cli
    from ctrls.stages import progress

    monkeypatch.setattr(progress, "EVERY_S", 0.0)

    def a_kernel(stage, *a, progress=True, **k):  # a notebook's cell: a stage's bar, in the kernel papermill starts
        assert progress is False  # papermill's still cell bar is off: the stage's own is shown instead
        bar = __import__("ctrls.stages.progress", fromlist=["tqdm"]).tqdm(total=8, desc="(f) adapter", unit="epoch")
        bar.update(3)
        time.sleep(1.5)
        bar.close()

    monkeypatch.setattr(cli, "run_notebook", a_kernel)
    for name in ("write_claims_scorecard", "write_timings_page", "write_rl_profile"):
        monkeypatch.setattr(cli, name, lambda *a, **k: None)
    monkeypatch.setattr("ctrls.report.codeindex.write_code_page", lambda *a, **k: None)
    monkeypatch.setattr(cli, "machine_gemm_gflops", lambda: 1.0)
    argv = ["reproduce", "--profile", "smoke", "--run-dir", str(tmp_path), "--no-book", "--only", "setup"]
    with pytest.raises(SystemExit) as e:
        cli.main(argv + (["--quiet"] if quiet else []))
    out = capsys.readouterr().out
    assert e.value.code == 0 and "[1/1] setup" in out
    assert ("[1/1] setup (f) adapter: 3/8 epoch" in out) is not quiet


def test_every_option_of_every_command_has_help(monkeypatch):
    import argparse

    from ctrls import cli

    seen = {}

    def capture(self, args=None, namespace=None):
        seen["parser"] = self
        raise SystemExit(0)

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", capture)
    with pytest.raises(SystemExit):
        cli.main(["profiles"])
    missing, todo = [], [("ctrls", seen["parser"])]
    while todo:
        name, p = todo.pop()
        for a in p._actions:
            if isinstance(a, argparse._SubParsersAction):
                todo += [(f"{name} {n}", sp) for n, sp in a.choices.items()]
            elif a.help is None:
                missing.append(f"{name} {'/'.join(a.option_strings) or a.dest}")
    assert not missing


@pytest.mark.parametrize("argv,level", [
    (["--log-level", "ERROR", "profiles"], "ERROR"),  # before the command: not erased by the command's own option
    (["profiles", "--log-level", "DEBUG"], "DEBUG"),
    (["config", "--explain", "rl.lr", "--quiet"], "WARNING"),
    (["runs", "--quiet", "--log-level", "ERROR"], "ERROR"),  # an explicit level wins over --quiet
    (["stage", "rl", "--log-level", "WARNING"], "WARNING"),
])
def test_every_command_takes_log_level_and_quiet_after_its_name(argv, level, monkeypatch):
    import logging

    from ctrls import cli

    seen = {}
    for name in ("cmd_profiles", "cmd_config", "cmd_runs", "cmd_stage"):
        monkeypatch.setattr(cli, name, lambda a: seen.update(level=logging.getLogger().level) or 0)
    old = logging.getLogger().level
    try:
        with pytest.raises(SystemExit) as e:
            cli.main(argv)
        assert e.value.code == 0 and logging.getLevelName(seen["level"]) == level
    finally:
        logging.getLogger().setLevel(old)
