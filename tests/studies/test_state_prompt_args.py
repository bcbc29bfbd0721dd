"""studies/state_prompt.py checks every argument before any work and says what is wrong in one line; its
saved vectors load back as they were, and a file that does not fit the run is refused by name."""
from __future__ import annotations

import pytest
import torch

from tests.studies.harness import load_study, refused


@pytest.fixture(scope="module")
def state_prompt():
    return load_study("state_prompt")


@pytest.fixture
def no_work(state_prompt, monkeypatch):
    monkeypatch.setattr(state_prompt, "load_backbone", lambda *a, **k: pytest.fail("state_prompt.py did work"))


@pytest.mark.parametrize("argv,words", [
    (["--group", "0"], "--group"),
    (["--vectors", "0"], "--vectors"),
    (["--questions", "-1"], "--questions"),
    (["--max-chains", "0"], "--max-chains"),
    (["--lr", "0"], "--lr"),
    (["--device", "nosuch"], "--device"),
    (["--load-vectors", "absent.safetensors"], "--load-vectors"),
    (["--fit-only"], "--save-vectors"),
    (["-o", "nosuch=1"], "nosuch"),
    (["--questions", "500"], "data.n_test"),
])
def test_a_bad_argument_is_refused_before_any_work(state_prompt, no_work, tmp_path, argv, words):
    msg = refused(state_prompt.main, ["--run-dir", str(tmp_path), *argv])
    assert msg.startswith("state_prompt.py: ") and words in msg, msg


def test_a_run_directory_that_does_not_exist_is_refused(state_prompt, no_work, tmp_path):
    assert "--run-dir" in refused(state_prompt.main, ["--run-dir", str(tmp_path / "absent")])


def test_saved_vectors_load_back_and_a_misfit_is_refused_by_name(state_prompt, tmp_path):
    from ctrls.method.state_prompt import StatePrompt

    class LM:  # only the input embeddings' shape matters to the loader
        def get_input_embeddings(self):
            return torch.nn.Embedding(10, 8)

    sp = StatePrompt(3, 2, torch.randn(10, 8), seed=1)
    path = tmp_path / "sp.safetensors"
    state_prompt.save_vectors(str(path), sp, {"kept_epoch": 2})
    back, info = state_prompt.load_vectors(str(path), 3, LM())
    assert torch.equal(back.vectors, sp.vectors) and info["kept_epoch"] == 2
    with pytest.raises(SystemExit, match="sp.safetensors.*K = 4"):
        state_prompt.load_vectors(str(path), 4, LM())
    with torch.no_grad():
        sp.vectors[0, 0, 0] = float("nan")
    state_prompt.save_vectors(str(path), sp, {})
    with pytest.raises(SystemExit, match="finite: False"):
        state_prompt.load_vectors(str(path), 3, LM())


def test_a_run_directory_without_a_finished_pretraining_is_refused_before_any_work(state_prompt, no_work, tmp_path):
    msg = refused(state_prompt.main, ["--run-dir", str(tmp_path)])
    assert msg.startswith(f"state_prompt.py: --run-dir {tmp_path}: no finished pretraining in {tmp_path}"), msg
