"""Every stage gives its lock back when it fails or is interrupted.

A stage interrupted in a notebook kernel (where the traceback keeps the stage object alive) that kept its
lock would leave "stage ... is being written" for every other process until the kernel restarted. Each stage here is
interrupted right after it began (KeyboardInterrupt, and an ordinary exception), while the test
still holds the traceback; another holder (another open file description, as another process has)
must then get the lock.
"""
import pytest

import ctrls.stages.runs as R
from ctrls.config.schema import load_config
from tests.stages.test_locks import free


def cfg_at(run_dir):
    return load_config("smoke", [f"run_dir={run_dir}"])


class Interrupted(KeyboardInterrupt):
    pass


def pretrain_case(cfg, monkeypatch, exc):
    import ctrls.stages.pretrain as P

    def boom(*a, **k):
        raise exc

    monkeypatch.setattr(P, "problems_from_config", boom)  # right after the collect stage began
    return (lambda: P.pretrain(cfg.for_pair(*cfg.pairs()[0]), progress=False),
            lambda: P.pretrain_stages(cfg.for_pair(*cfg.pairs()[0]))["collect"])


def exploration_case(cfg, monkeypatch, exc):
    import ctrls.stages.exploration as E

    def boom(*a, **k):
        raise exc

    monkeypatch.setattr(E, "check_fitted", lambda *a: None)  # a run without fits is refused before it begins
    monkeypatch.setattr(E, "backbone_for", boom)
    return lambda: E.explore(cfg, progress=False), lambda: E._stage(cfg)


def synthetic_case(cfg, monkeypatch, exc):
    import ctrls.stages.synthetic as S

    def boom(*a, **k):
        raise exc

    monkeypatch.setattr(S, "study_mdp", boom)
    return lambda: S.run_study(cfg, progress=False), lambda: R.Stage(cfg, "synthetic", S.KEYS)


def judge_case(cfg, monkeypatch, exc):
    import ctrls.stages.judge as J

    def boom(*a, **k):
        raise exc

    monkeypatch.setattr(J, "judged_configs", boom)  # right after the judge stage began
    backend = J.make_backend(cfg.judge)
    return (lambda: J.run_judge(cfg, progress=False),
            lambda: R.Stage(cfg, "judge", ("judge", "seed", "grid", "rl", "data"), upstream=(backend.name, backend.model)))


@pytest.mark.parametrize("exc", [Interrupted("^C"), RuntimeError("out of memory")], ids=["interrupt", "error"])
@pytest.mark.parametrize("case", [pretrain_case, exploration_case, synthetic_case, judge_case],
                         ids=["pretrain", "exploration", "synthetic", "judge"])
def test_an_interrupted_stage_gives_its_lock_back(tmp_path, monkeypatch, case, exc):
    cfg = cfg_at(tmp_path)
    run, stage = case(cfg, monkeypatch, exc)
    with pytest.raises(type(exc)) as info:
        run()
    st = stage()
    assert st.dir.is_dir()  # it had begun (and written its key) before it was interrupted
    assert free(st.lock_file), f"{st.lock_file} is still held after {info.value!r}"
    assert info.value is exc  # the traceback (and the stage object in it) is still alive here
