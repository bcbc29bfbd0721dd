"""Nothing runs that a run directory did not write.

Run files are loaded with ``torch.load(weights_only=True)`` (``ctrls.stages.runs.load_torch``): tensors and
plain containers only. A crafted RL checkpoint or feature shard, whose unpickling would execute code
(an object whose ``__reduce__`` writes a marker file), is refused with an error that names the file,
and the marker is never written: not when a run resumes, not when a shard is only checked.
"""

import numpy as np
import pytest
import torch

from ctrls.config.settings import Setting
from ctrls.method.policy import TransitionPolicy
from ctrls.stages.collect import _valid_shard, feature_shards, shard_file
from ctrls.stages.runs import ArtifactError, UnsafeArtifactError, load_torch
from ctrls.stages.trainer import Trainer
from tests.method.test_reinforce import K, cfg_for, mdp_sampler


class Payload:
    """Unpickled by a full unpickler, it runs code: writes ``marker``."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (exec, (f"open({self.marker!r}, 'w').write('code ran')",))


def crafted(path, marker, **plain):
    """A torch file at ``path`` that looks like a run file but holds a code-running payload."""
    torch.save({**plain, "payload": Payload(marker)}, path)
    return path


def test_the_payload_does_run_code_under_the_full_unpickler(tmp_path):
    """The crafted file is a real attack: torch.load(weights_only=False) writes the marker."""
    marker = tmp_path / "marker"
    f = crafted(tmp_path / "f.pt", marker)
    torch.load(f, weights_only=False)
    assert marker.read_text() == "code ran"


def test_load_torch_refuses_a_pickle_that_would_run_code(tmp_path):
    marker = tmp_path / "marker"
    f = crafted(tmp_path / "f.pt", marker, t=torch.ones(2))
    with pytest.raises(UnsafeArtifactError, match=f"{f} is refused.*could run code"):
        load_torch(f)
    with pytest.raises(ValueError, match="weights_only=True only"):
        load_torch(f, weights_only=False)
    assert not marker.exists()
    # an UnsafeArtifactError is an ArtifactError: callers that name bad run files handle it
    assert issubclass(UnsafeArtifactError, ArtifactError)


def test_load_torch_refuses_numpy_objects_too(tmp_path):
    """Anything beyond tensors and plain containers needs the full unpickler: refused, named."""
    f = tmp_path / "np.pt"
    torch.save({"x": np.float64(1.5)}, f)
    with pytest.raises(UnsafeArtifactError, match=str(f)):
        load_torch(f)


# ---- feature shards (ctrls.stages.collect) ------------------------------------------------------


def real_shard(path, qid, n_traj=2):
    """A shard as cache_features writes it."""
    items = [{"hidden": torch.randn(5, 8).half(), "targets": torch.arange(4), "spans": torch.tensor([[0, 2], [2, 4]]),
              "steps": ["a", "b"], "source": "samples", "sample_index": i} for i in range(n_traj)]
    torch.save({"qid": qid, "question_hidden": torch.randn(3, 8).half(), "trajectories": items}, path)
    return path


def test_a_crafted_feature_shard_is_refused_when_it_is_only_checked(tmp_path):
    marker = tmp_path / "marker"
    f = shard_file(tmp_path, "q1")
    crafted(f, marker, qid="q1", trajectories=[{}, {}])
    with pytest.raises(UnsafeArtifactError, match=str(f)):
        _valid_shard(f, "q1", 2)  # the check a resumed features stage makes before reusing a shard
    with pytest.raises(UnsafeArtifactError, match=str(f)):
        feature_shards(tmp_path)
    assert not marker.exists()
    assert f.exists()  # refused, not silently overwritten


def test_a_shard_written_by_the_features_stage_loads_with_weights_only(tmp_path):
    f = real_shard(shard_file(tmp_path, "q1"), "q1")
    assert _valid_shard(f, "q1", 2) and not _valid_shard(f, "q1", 3)
    (shard,) = feature_shards(tmp_path)
    assert shard["qid"] == "q1" and shard["trajectories"][1]["sample_index"] == 1


# ---- the RL checkpoint (ctrls.stages.trainer.Trainer) -------------------------------------------------------


def trainer(out, cfg, evaluate=None):
    pol = TransitionPolicy(K, concentration=5.0)
    return Trainer(pol, cfg, Setting("x", 0.1, 0.01), 0, out, mdp_sampler(pol), 1, evaluate)


def test_a_crafted_rl_checkpoint_is_refused_on_resume(tmp_path):
    marker = tmp_path / "marker"
    out = tmp_path / "run"
    out.mkdir()
    ckpt = crafted(out / "checkpoint.pt", marker, step=3, log=[])
    before = ckpt.read_bytes()
    with pytest.raises(UnsafeArtifactError, match=f"{ckpt} is refused"):
        trainer(out, cfg_for(steps=4))
    assert not marker.exists()
    assert ckpt.read_bytes() == before  # not overwritten by a run from step 0


def test_the_rl_checkpoint_holds_plain_values_and_resumes_with_weights_only(tmp_path):
    """Evaluation rows with numpy values (np.float64, np.int64, arrays) are stored as plain Python:
    the checkpoint loads with weights_only=True and the run resumes where it stopped."""
    cfg = cfg_for(steps=4, checkpoint_every=2, eval_every=2)

    def evaluate(policy, step):
        return {"accuracy": np.float64(0.5), "n": np.int64(step), "by_q": np.array([1, 2])}

    tr = trainer(tmp_path / "run", cfg, evaluate)
    tr.run(2, progress=False)
    state = torch.load(tr.ckpt, weights_only=True)
    assert state["step"] == 2 and type(state["log"][0]["accuracy"]) is float and state["log"][0]["by_q"] == [1, 2]
    again = trainer(tmp_path / "run", cfg, evaluate)
    assert again.step == 2 and again.log == tr.log
    again.run(4, progress=False)
    assert again.step == 4
