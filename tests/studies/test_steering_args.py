"""Studies/steering.py checks every argument and every point's config before the
first point runs, and says what is wrong in one line, without a traceback (a bad second point was found after the
first had run for minutes; a bad override was a ConfigError traceback)."""
from __future__ import annotations

import json

import pytest

from tests.studies.harness import load_study, refused


@pytest.fixture(scope="module")
def steering():
    return load_study("steering")


@pytest.fixture
def no_work(steering, monkeypatch):
    monkeypatch.setattr(steering, "point", lambda *a, **k: pytest.fail("steering.py ran a point"))


@pytest.mark.parametrize("argv,words", [
    (["--chains", "0"], "--chains"),
    (["--chains", "75", "-3"], "--chains"),  # a bad second point: found before the first runs
    (["--n-states", "4", "1"], "--n-states"),
    (["--sources", "reference,nonsense"], "--sources"),
    (["--sources", ""], "--sources"),
    (["-o", "adapter.fusion=cubic"], "adapter.fusion"),  # was a ConfigError traceback
    (["-o", "data.n_train=5"], "data.n_train"),  # a key this study sets per point
    (["--chains", "75", "--n-states", "4", "-o", "states.n_states=8"], "states.n_states"),
    (["--append"], "--append"),
])
def test_steering_refuses_a_bad_argument_before_any_point(steering, no_work, argv, words):
    msg = refused(steering.main, argv)
    assert msg.startswith("steering.py: ") and words in msg, msg


def test_steering_checks_every_points_config_before_the_first(steering, no_work):
    # data.n_train=100000 is refused for word_problems at the demo's difficulty only at the large point
    msg = refused(steering.main, ["--chains", "64", "100000000"])
    assert "data.n_train" in msg


def test_steering_refuses_an_unreadable_append_file(steering, no_work, tmp_path):
    out = tmp_path / "r.json"
    out.write_text("{not json")
    assert str(out) in refused(steering.main, ["--out", str(out), "--append"])
    out.write_text(json.dumps({"points": "x"}))
    assert str(out) in refused(steering.main, ["--out", str(out), "--append"])


def test_a_point_is_the_adapters_though_the_demo_decodes_through_the_state_prompt(steering):
    """The demo's CTRLS rows are the state prompt's; the steering study measures the adapter, so every point
    runs with ``ADAPTER``'s overrides (its stored results keep their meaning)."""
    from ctrls.config.schema import load_config

    assert load_config("demo").state_prompt.use
    cfg = load_config("demo", steering.point_overrides(75, "samples", [], "/tmp/point"))
    assert not cfg.state_prompt.use and cfg.grid.position_floor == 0
