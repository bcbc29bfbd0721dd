import numpy as np
import pytest
import torch
from sklearn.metrics import adjusted_rand_score

from ctrls.method.states import StateSpace, fit_states


def blobs(k=4, per=50, dim=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    centers = torch.randn(k, dim, generator=g) * 10
    X = torch.cat([c + 0.3 * torch.randn(per, dim, generator=g) for c in centers])
    return X, torch.arange(k).repeat_interleave(per)


@pytest.mark.parametrize("minibatch_above", [20000, 100])  # KMeans, then MiniBatchKMeans
def test_recovers_blobs_and_soft_assignment_agrees(minibatch_above):
    X, y = blobs()
    space = fit_states(X, 4, seed=0, minibatch_above=minibatch_above)
    hard = space.hard(X)
    assert adjusted_rand_score(y.numpy(), hard.numpy()) == pytest.approx(1.0)
    s = space.assign(X)
    assert s.shape == (200, 4)
    torch.testing.assert_close(s.sum(-1), torch.ones(len(X)))
    assert torch.equal(s.argmax(-1), hard)
    assert space.k == space.requested_k == 4 and space.notes == []


def test_soft_assignment_is_the_tempered_softmax_of_distances():
    space = StateSpace(centroids=torch.tensor([[0.0, 0.0], [2.0, 0.0]]), tau=2.0, requested_k=2)
    s = space.assign(torch.tensor([[1.0, 1.0], [0.0, 0.0]]))
    # equidistant point: 1/2 each; the origin: distances 0 and 4 -> weights 1 : e^-2
    torch.testing.assert_close(s, torch.tensor([[0.5, 0.5], [1 / (1 + np.exp(-2)), np.exp(-2) / (1 + np.exp(-2))]]),
                               check_dtype=False)


def test_tau_is_the_median_squared_distance_to_the_nearest_centroid():
    X, _ = blobs(per=25, seed=1)  # 100 rows: an even count, the median averages the middle two
    space = fit_states(X, 4, seed=0)
    Xn, C = X.double().numpy(), space.centroids.double().numpy()
    nearest = sorted(min(float(((x - c) ** 2).sum()) for c in C) for x in Xn)
    assert space.tau == pytest.approx((nearest[49] + nearest[50]) / 2, rel=1e-4)
    assert fit_states(X, 4, tau=2.5).tau == 2.5
    with pytest.raises(ValueError, match="tau must be positive"):
        fit_states(X, 4, tau=0.0)


def test_zero_median_distance_falls_back_and_is_recorded():
    X = torch.tensor([[0.0, 0.0]] * 5 + [[10.0, 0.0]] * 5 + [[0.0, 10.0], [0.0, 11.0]])  # 3 clusters, 10 exact hits
    space = fit_states(X, 3)
    nonzero = space.sq_dists(X).min(1).values
    assert space.tau == pytest.approx(float(nonzero[nonzero > 0].mean()), rel=1e-5) and space.tau > 0
    assert "median squared distance" in space.notes[-1]


def test_z_is_the_mixture_of_centroids():
    X, _ = blobs(seed=2)
    space = fit_states(X, 4)
    s = torch.softmax(torch.randn(5, 4), -1)
    torch.testing.assert_close(space.z(s), sum(s[:, j:j + 1] * space.centroids[j] for j in range(4)))
    assert space.z(s[0]).shape == (6,)


def test_fewer_distinct_steps_than_k_is_recorded_or_refused():
    X = torch.tensor([[0.0, 1.0], [0.0, 1.0], [5.0, 5.0], [9.0, 0.0], [-0.0, 1.0]])
    space = fit_states(X, 8)
    assert space.k == 3 and space.requested_k == 8
    assert "K was reduced to 3" in space.notes[0] and "8 requested" in space.notes[0]
    h = space.hard(X).tolist()
    assert h[0] == h[1] == h[4] and len({h[0], h[2], h[3]}) == 3  # -0.0 and 0.0 are the same step
    with pytest.raises(ValueError, match="3 distinct steps cannot make 8 states"):
        fit_states(X, 8, reduce_k=False)


def test_state_dict_round_trip():
    X, _ = blobs(seed=3)
    space = fit_states(X, 4)
    space.notes.append("a note")
    state = space.state_dict()
    assert isinstance(state["tau"], float) and isinstance(state["requested_k"], int)
    back = StateSpace.from_state_dict(state)
    assert torch.equal(back.centroids, space.centroids) and back.tau == space.tau and back.notes == ["a note"]
    torch.testing.assert_close(back.assign(X), space.assign(X))
    with pytest.raises(ValueError, match="missing"):
        StateSpace.from_state_dict({"centroids": space.centroids})


def test_nan_feature_names_the_step():
    X, _ = blobs()
    X[17, 3] = float("inf")
    ids = [f"q{i // 10}/s{i % 10}" for i in range(len(X))]
    with pytest.raises(ValueError, match="q1/s7"):
        fit_states(X, 4, ids=ids)
    with pytest.raises(ValueError, match="row 17"):
        fit_states(X, 4)
    space = fit_states(X[:10], 2)
    with pytest.raises(ValueError, match="row 7"):
        space.assign(X[10:20])


def test_huge_finite_features_are_refused_not_turned_into_nan():
    X = torch.randn(40, 6) * 1e20  # finite, but squared distances overflow float32
    with pytest.raises(ValueError, match="overflow"):
        fit_states(X, 3, seed=0)
    from ctrls.method.states import soft_assign
    with pytest.raises(ValueError, match="overflow"):
        soft_assign(torch.tensor([[float("inf"), 1.0]]), 1.0)
    with pytest.raises(ValueError, match="tau"):
        soft_assign(torch.tensor([[2.0, 1.0]]), float("inf"))


def test_a_near_zero_tau_is_recorded():
    g = torch.Generator().manual_seed(0)
    centers = torch.tensor([[0.0, 0.0], [100.0, 0.0], [0.0, 100.0]])
    X = torch.cat([c + 1e-3 * torch.randn(30, 2, generator=g) for c in centers])  # tight clusters far apart
    space = fit_states(X, 3, seed=0)
    assert any("one-hot" in n for n in space.notes)
    s = space.assign(X)
    assert torch.isfinite(s).all() and float(s.max(-1).values.min()) > 0.999
    wide = fit_states(torch.randn(90, 2, generator=g), 3, seed=0)
    assert not any("one-hot" in n for n in wide.notes)
