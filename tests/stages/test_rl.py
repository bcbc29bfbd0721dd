"""The RL stage's phase clock (ctrls.stages.rl.PhaseClock) and the reproduce page's RL profile table."""
from __future__ import annotations

import time

import pytest

from ctrls.stages.rl import PHASES, PhaseClock


def test_phase_clock_sums_calls_per_phase_and_reports_the_rest_as_other():
    clock = PhaseClock()
    t0 = time.perf_counter()
    for _ in range(2):
        with clock("policy update"):
            time.sleep(0.02)
    slow = clock.wrap("grading", lambda x: (time.sleep(0.03), x)[1])
    assert slow(7) == 7  # the wrapped function's value comes back
    time.sleep(0.05)  # in no phase
    total = time.perf_counter() - t0
    assert clock.seconds["policy update"] == pytest.approx(0.04, abs=0.015)
    assert clock.seconds["grading"] == pytest.approx(0.03, abs=0.015)
    rec = clock.record(total + 10.0)  # the record: tenths of a second, the untimed rest as "other"
    assert list(rec) == [*PHASES, "other"]
    assert rec["policy update"] == round(clock.seconds["policy update"], 1) and rec["load"] == 0.0
    assert rec["other"] == pytest.approx(10.05, abs=0.05)


def test_a_phase_that_raises_is_still_timed():
    clock = PhaseClock()
    with pytest.raises(KeyError):
        with clock("load"):
            time.sleep(0.02)
            raise KeyError("x")
    assert clock.seconds["load"] >= 0.015
