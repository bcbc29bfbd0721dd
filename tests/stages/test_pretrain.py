"""Alg. 1 on the smoke profile: end to end, rerun from its stages, reloadable checkpoint (resume after a kill: test_resume.py)."""
import json

import pytest
import torch
from conftest import requires_data

from ctrls.config.schema import load_config
from ctrls.method.elbo import elbo
from ctrls.method.model import CTRLSModel
from ctrls.method.states import fit_states
from ctrls.stages.pretrain import pretrain

OVR: list[str] = []  # the smoke profile as the smoke book runs it (conftest.smoke_runs)

pytestmark = [pytest.mark.integration, requires_data]


def smoke_cfg(run_dir):
    cfg = load_config("smoke", [*OVR, f"run_dir={run_dir}"])
    return cfg.for_pair(*cfg.pairs()[0])


@pytest.fixture(scope="module")
def reference_run(smoke_runs):
    d, _, run = smoke_runs
    return d, run


def test_pretraining_runs_end_to_end(reference_run):
    _, run = reference_run
    s = run.summaries
    assert s["collect"]["questions"] == 4 and s["collect"]["reference"] == 4
    assert s["collect"]["kept"] >= 4 and s["collect"]["sources"] == ["samples", "reference"]
    assert s["states"]["k"] <= 4 and s["spectral"]["dim"] == 2 * 576
    hist = run.bound_history()
    assert list(hist.epoch) == [0, 0, 1, 1, 2, 2] and list(hist.split) == ["train", "heldout"] * 3
    assert hist.mixture_kl_per_step.ge(0).all() and (hist.kl_per_step >= hist.mixture_kl_per_step - 1e-9).all()
    train = hist[hist.split == "train"].set_index("epoch")
    assert train.relaxed_rec_per_token.loc[2] > train.relaxed_rec_per_token.loc[0]  # the adapter learned something
    # a fresh adapter ignores z: the expectation over z_t and the mean-z likelihood agree at epoch 0
    assert train.rec_per_token.loc[0] == pytest.approx(train.relaxed_rec_per_token.loc[0], abs=1e-4)
    # the held-out question's steps stay out of the k-means fit, the transition fit and training
    steps, split = run.steps(), run.split()
    assert len(split["heldout_qids"]) == 1 and set(steps.qid[steps.heldout]) == set(split["heldout_qids"])
    assert s["transitions"]["pairs"] == s["states"]["train_steps"] == int((~steps.heldout).sum())
    assert (hist[hist.split == "heldout"].steps == int(steps.heldout.sum())).all()
    assert (train.steps == s["states"]["train_steps"]).all()
    assert s["adapter"]["trained_on_heldout"] == [] and s["adapter"]["trained_questions"] == split["questions"] - 1
    sp, st = torch.load(run.root / "spectral" / "spectral.pt"), run.states()
    train_only = fit_states(sp["step_e"][~st["heldout"]], s["states"]["k"], seed=0).centroids
    every_step = fit_states(sp["step_e"], s["states"]["k"], seed=0).centroids
    assert torch.allclose(train_only, st["centroids"]) and not torch.allclose(every_step, st["centroids"])
    model = run.model()
    assert model.config.n_states == s["states"]["k"]
    assert len(run.nearest_steps()) > 0 and len(run.trajectory_view(0)) > 0


def test_heldout_bound_recomputed_from_the_cached_features(reference_run, smollm):
    """The held-out row of the bound history equals Thm. 5.3's bound recomputed here, trajectory by
    trajectory, from the held-out question's cached features (every token) and the checkpoint."""
    _, run = reference_run
    (qid,) = run.split()["heldout_qids"]
    model, st = run.model(smollm), run.states()
    shards = [torch.load(f, weights_only=False) for f in sorted((run.root / "features").glob("*.pt"))]
    q = next(i for i, sh in enumerate(shards) if sh["qid"] == qid)
    total, steps = 0.0, 0
    for ti, tr in enumerate(shards[q]["trajectories"]):
        rows = [r for r, (qq, tt, _) in enumerate(st["index"].tolist()) if (qq, tt) == (q, ti)]
        s_post = st["s_post"][rows]
        s_prev = torch.cat([st["s0"][q:q + 1], s_post[:-1]])  # s_0 of the prompt, then the previous step's
        spans = tr["spans"].tolist()
        hidden = torch.cat([tr["hidden"][a:b] for a, b in spans]).float()
        targets = torch.cat([tr["targets"][a:b] for a, b in spans])
        step_index = torch.cat([torch.full((b - a,), t) for t, (a, b) in enumerate(spans)])
        b = elbo(model.adapter, smollm.lm_head, model.centroids, hidden, targets, step_index, s_post, s_prev,
                 model.policy.L.detach())
        total, steps = total + float(b.value), steps + len(spans)
    hist = run.bound_history()
    row = hist[(hist.split == "heldout") & (hist.epoch == hist.epoch.max())].iloc[0]
    assert row.steps == steps and row.elbo_per_step == pytest.approx(total / steps, rel=1e-6)


def test_rerun_reuses_every_stage(reference_run):
    d, run = reference_run
    before = {f: f.stat().st_mtime_ns for f in run.root.rglob("*") if f.is_file()}
    again = pretrain(smoke_cfg(d), progress=False)
    assert again.summaries == run.summaries
    after = {f: f.stat().st_mtime_ns for f in run.root.rglob("*") if f.is_file()}
    assert len(before) > 10 and after == before  # no stage rewrote (or added) a file: each was reused


# Resume after a kill mid-collection (a cut line dropped, no question twice, every artifact and the
# "Data collected" counts equal an uninterrupted run's): tests/stages/test_runs_resume.py::
# test_collection_killed_mid_question_counts_nothing_twice.


def test_checkpoint_reload_gives_identical_logits_and_states(reference_run, smollm):
    _, run = reference_run
    m1 = CTRLSModel.from_pretrained(run.checkpoint, smollm)
    m2 = CTRLSModel.from_pretrained(run.checkpoint, smollm)
    assert json.loads((run.checkpoint / "config.json").read_text())["n_states"] == m1.config.n_states
    torch.manual_seed(0)
    h = torch.randn(3, 7, smollm.hidden_size)
    s = torch.softmax(torch.randn(3, m1.config.n_states), -1)
    assert torch.equal(smollm.lm_head(m1.adapt(h, s)), smollm.lm_head(m2.adapt(h, s)))
    steps = [torch.randn(n, smollm.hidden_size) for n in (3, 9)]
    assert torch.equal(m1.encode(steps), m2.encode(steps))


def test_a_full_disk_writing_the_checkpoint_names_its_file(tmp_path, monkeypatch):
    """safetensors reports a full disk in its own error, no OSError: the checkpoint's write is still a RunDirError
    naming the file it could not write."""
    import types

    import ctrls.stages.pretrain as P
    from ctrls.stages.runs import RunDirError

    (tmp_path / "notes.json").write_text("{}")

    def full(path):
        raise RuntimeError("Error while serializing: IoError(Os { code: 28, kind: StorageFull, "
                           'message: "No space left on device" })')

    model = types.SimpleNamespace(adapter=types.SimpleNamespace(load_state_dict=lambda sd: None), save_pretrained=full)
    monkeypatch.setattr(P.torch, "load", lambda *a, **k: {})
    monkeypatch.setattr(P, "build_model", lambda *a, **k: model)
    stages = {"states": types.SimpleNamespace(dir=tmp_path), "transitions": types.SimpleNamespace(dir=tmp_path)}
    ckpt = tmp_path / "ckpt"
    with pytest.raises(RunDirError, match=f"cannot write {ckpt / 'model.safetensors'}: no space left"):
        P._save_checkpoint(None, None, stages, tmp_path, ckpt)
