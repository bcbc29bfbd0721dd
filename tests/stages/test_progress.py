"""The stages' bars relay their state to ``$CTRLS_PROGRESS``; ``watch`` prints it after the stage's name."""
import io
import time

from ctrls.stages import progress as P


def test_a_bar_relays_what_it_counts_and_the_time_left(tmp_path, monkeypatch):
    f = tmp_path / "progress.json"
    monkeypatch.setenv(P.ENV, str(f))
    monkeypatch.setattr(P, "EVERY_S", 0.0)
    bar = P.tqdm(total=10, desc="(f) adapter", unit="epoch", file=io.StringIO())
    for _ in range(4):
        time.sleep(0.01)
        bar.update()
    state = P.read_state(f)
    assert (state["desc"], state["n"], state["total"], state["unit"]) == ("(f) adapter", 4, 10, "epoch")
    assert state["eta_s"] is not None and state["eta_s"] > 0
    line = P.describe(state)
    assert line.startswith("(f) adapter: 4/10 epoch, ") and line.endswith(" left")
    bar.close()
    assert P.read_state(f)["n"] == 4


def test_a_hidden_bar_or_no_file_relays_nothing(tmp_path, monkeypatch):
    f = tmp_path / "progress.json"
    monkeypatch.setenv(P.ENV, str(f))
    for _ in P.tqdm(range(3), disable=True):
        pass
    assert not f.exists()
    monkeypatch.delenv(P.ENV)
    for _ in P.tqdm(range(3), file=io.StringIO()):
        pass
    assert not f.exists()


def test_watch_prints_the_relayed_progress_after_the_stage(tmp_path, monkeypatch):
    out = io.StringIO()
    monkeypatch.setattr(P, "EVERY_S", 0.0)
    f = tmp_path / "progress.json"
    with P.watch(f, "[2/8] pretrain", every_s=0.05, stream=out):
        bar = P.tqdm(total=5, desc="(a) collect CoTs", unit="q", file=io.StringIO())  # as a kernel's bar would
        bar.update(2)
        time.sleep(0.3)
        bar.close()
    assert "[2/8] pretrain (a) collect CoTs: 2/5 q" in out.getvalue()
    assert P.ENV not in __import__("os").environ and not f.exists()  # given back as it was
