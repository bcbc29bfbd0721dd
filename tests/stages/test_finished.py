"""``ctrls.load_run``: a finished run's model and conditioning, and ``sample``, which decodes the exploration
stage's own rows: a test question sampled through it gives the stage's stored samples, for the state prompt's
row and for Base."""
from __future__ import annotations

import pytest

from tests.stages.test_state_prompt_stage import sp_run  # noqa: F401  (the fixture: a run with the state prompt)


def test_the_public_face_samples_as_the_stage_does(sp_run, tiny_model_dir):  # noqa: F811
    import ctrls
    from ctrls.config.settings import BASE, row_label
    from ctrls.stages.common import problems_from_config
    from tests.conftest import SMOKE_OVERRIDES, tiny_overrides
    from tests.stages.test_state_prompt_stage import OPTION

    cfg, _, df = sp_run
    run = ctrls.load_run("smoke", cfg.run_dir, [*SMOKE_OVERRIDES, *tiny_overrides(tiny_model_dir), *OPTION])
    assert run.state_prompt is not None and row_label(cfg.grid.epsilons[0]) in run.rows
    probs = problems_from_config(run.cfg, "test")
    eta = cfg.grid.temperatures[0]
    for label in (row_label(cfg.grid.epsilons[0]), BASE):
        gens = run.sample(probs, row=label, temperature=eta)
        for p, gs in zip(probs, gens):
            got = df[(df.config == label) & (df.question_id == p.id) & (df.temperature == eta)].sort_values("sample_index")
            assert [g.text for g in gs] == list(got.text)
            if label != BASE:  # the drawn chain too (Base draws none)
                assert [g.states.argmax(-1).tolist()[1:] for g in gs] == [list(s) for s in got.states]
    with pytest.raises(ValueError, match="not one of this run's rows"):
        run.sample(probs[:1], row="eps=0.9")
    assert {"load_run", "SampleParams", "encode_prompt", "load_samples"} <= set(dir(ctrls))
    assert "importlib" not in dir(ctrls) and "warnings" not in dir(ctrls)
