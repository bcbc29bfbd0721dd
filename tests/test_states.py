import numpy as np
import pytest
import torch

from ctrls.states import fit_states


def blobs(k=4, per=50, dim=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    centers = torch.randn(k, dim, generator=g) * 10
    X = torch.cat([c + 0.3 * torch.randn(per, dim, generator=g) for c in centers])
    return X, torch.arange(k).repeat_interleave(per)


def test_recovers_blobs_and_soft_assignment_agrees():
    X, y = blobs()
    space = fit_states(X, 4, seed=0)
    hard = space.hard(X)
    # the same partition up to a relabelling
    pairs = set(zip(y.tolist(), hard.tolist()))
    assert len(pairs) == 4 and len({a for a, _ in pairs}) == 4 and len({b for _, b in pairs}) == 4
    s = space.assign(X)
    torch.testing.assert_close(s.sum(-1), torch.ones(len(X)))
    assert torch.equal(s.argmax(-1), hard)


def test_tau_is_the_median_squared_distance_to_the_nearest_centroid():
    X, _ = blobs(seed=1)
    space = fit_states(X, 4, seed=0)
    d2 = ((X[:, None, :] - space.centroids[None]) ** 2).sum(-1).min(1).values
    assert space.tau == pytest.approx(float(np.median(d2.numpy())), rel=1e-4)
    fixed = fit_states(X, 4, tau=2.5)
    assert fixed.tau == 2.5


def test_z_is_the_mixture_of_centroids():
    X, _ = blobs(seed=2)
    space = fit_states(X, 4)
    s = torch.softmax(torch.randn(5, 4), -1)
    torch.testing.assert_close(space.z(s), sum(s[:, j:j + 1] * space.centroids[j] for j in range(4)))


def test_fewer_distinct_steps_than_k_is_recorded_or_refused():
    X = torch.tensor([[0.0, 1.0], [0.0, 1.0], [5.0, 5.0], [9.0, 0.0]])
    space = fit_states(X, 8)
    assert space.k == 3 and space.requested_k == 8 and "reduced" in space.notes[0]
    with pytest.raises(ValueError, match="3 distinct steps"):
        fit_states(X, 8, reduce_k=False)


def test_nan_feature_names_the_step():
    X, _ = blobs()
    X[17, 3] = float("inf")
    ids = [f"q{i // 10}/s{i % 10}" for i in range(len(X))]
    with pytest.raises(ValueError, match="q1/s7"):
        fit_states(X, 4, ids=ids)
