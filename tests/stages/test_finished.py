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


def test_ctrls_sample_decodes_a_loaded_run_under_its_own_conditioning_and_a_backbone_as_given(monkeypatch):
    import ctrls
    from ctrls.generate import sampling
    from ctrls.stages.finished import LoadedRun

    calls = []
    monkeypatch.setattr(LoadedRun, "sample", lambda self, *a, **k: calls.append(("run", a, k)) or "the run's")
    monkeypatch.setattr(sampling, "sample", lambda *a, **k: calls.append(("backbone", a, k)) or "the backbone's")
    run = LoadedRun(cfg=None, backbone=None, model=None, state_prompt=None, mask=None)
    assert ctrls.sample(run, ["q"], row="Base") == "the run's"
    assert ctrls.sample("bb", [[1, 2]], 3) == "the backbone's"
    assert calls == [("run", (["q"],), {"row": "Base"}), ("backbone", ("bb", [[1, 2]], 3), {})]
    assert {"SampleParams", "encode_prompt", "load_samples", "load_run"} <= set(dir(ctrls))
    assert not {"importlib", "warnings"} & set(dir(ctrls)) and ctrls.Config.__doc__
