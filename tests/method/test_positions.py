"""The position mask: its counts against a hand count, the floor, the always-allowed mode, an empty bucket;
a masked Dirichlet draw is the Dirichlet of the allowed coordinates (Monte-Carlo means against
alpha_allowed / sum alpha_allowed); the fixed row holds s0 only where it can occur; masked chains keep to
the mask, and an all-allowed mask draws the unmasked chains."""
from __future__ import annotations

import pytest
import torch

from ctrls.generate.controllability import draw_chains
from ctrls.method.policy import TransitionPolicy, sample_dirichlet_log
from ctrls.method.positions import position_mask

# steps: (index in its chain, state). Bucket 0: states 3,3,3,1 -> 3 x3, 1 x1; bucket 1: 0,0,2; bucket >= 2: 2,2,2,2,0
STEPS = [(0, 3), (0, 3), (0, 3), (0, 1), (1, 0), (1, 0), (1, 2), (2, 2), (3, 2), (4, 2), (2, 2), (5, 0)]


def _mask(floor: float, buckets: int = 3, k: int = 4):
    t, s = zip(*STEPS)
    return position_mask(torch.tensor(t), torch.tensor(s), k, buckets, floor)


def test_counts_floor_and_mode_against_a_hand_count():
    m = _mask(0.3)
    assert m.counts.tolist() == [[0, 1, 0, 3], [2, 0, 1, 0], [1, 0, 4, 0]]
    assert m.mode.tolist() == [3, 0, 2]
    # 0.3 of bucket 0's 4 steps is 1.2: state 1 (1 step) out; bucket 1: 1/3 >= 0.3 in; bucket 2: 1/5 out
    assert m.allowed.int().tolist() == [[0, 0, 0, 1], [1, 0, 1, 0], [0, 0, 1, 0]]
    assert _mask(0.0).allowed.int().tolist() == [[0, 1, 0, 1], [1, 0, 1, 0], [1, 0, 1, 0]]  # never-seen states out
    assert _mask(1.0).allowed.int().tolist() == [[0, 0, 0, 1], [1, 0, 0, 0], [0, 0, 1, 0]]  # the mode stays
    assert [m.bucket(t) for t in range(6)] == [0, 1, 2, 2, 2, 2]


def test_a_bucket_no_chain_reaches_allows_every_state():
    m = _mask(0.3, buckets=8)
    assert m.allowed[6].all() and m.allowed[7].all() and not m.allowed[0].all()


def test_bad_input_is_refused_by_name():
    with pytest.raises(ValueError, match="states"):
        position_mask(torch.tensor([0, 1]), torch.tensor([0, 4]), 4, 3, 0.1)
    with pytest.raises(ValueError, match="floor"):
        position_mask(torch.tensor([0]), torch.tensor([0]), 4, 3, 1.5)
    with pytest.raises(ValueError, match="one length"):
        position_mask(torch.tensor([0, 1]), torch.tensor([0]), 4, 3, 0.1)


def test_the_fixed_row_holds_s0_only_where_it_can_occur():
    m = _mask(0.3)
    assert m.fixed(3, 5) == [3, 0, 2, 2, 2]
    assert m.fixed(2, 4) == [3, 2, 2, 2]


def test_a_masked_dirichlet_is_the_dirichlet_of_the_allowed_coordinates():
    """Aggregation property: (a_i / sum_{j in S} a_j)_{i in S} ~ Dir(alpha_S); its mean is alpha_S / sum alpha_S."""
    m = _mask(0.3)  # bucket 1 allows states 0 and 2
    alpha = torch.tensor([2.0, 5.0, 3.0, 1.0])
    g = torch.Generator().manual_seed(0)
    log_a = sample_dirichlet_log(alpha.expand(40000, 4), g)
    x = m.mask_log(log_a, 1).exp().float()
    assert torch.allclose(x.sum(-1), torch.ones(40000), atol=1e-5)
    assert (x[:, [1, 3]] == 0).all()
    assert torch.allclose(x.mean(0), torch.tensor([0.4, 0.0, 0.6, 0.0]), atol=0.01)


def test_masked_chains_keep_to_the_mask_and_an_open_mask_draws_the_unmasked_chains():
    pol = TransitionPolicy(4, concentration=3.0)
    s0 = torch.tensor([0.0, 0.0, 0.0, 1.0])
    m = _mask(0.3)
    chains = draw_chains(pol, s0, [6] * 200, 0.2, generator=torch.Generator().manual_seed(1), mask=m)
    for c in chains:
        assert all(bool(m.allowed[m.bucket(t), s]) for t, s in enumerate(c))
    assert {c[1] for c in chains} == {0, 2}  # both allowed states of bucket 1 are drawn
    open_ = position_mask(torch.arange(3), torch.tensor([0, 1, 2]), 4, 3, 0.0)
    open_.allowed[:] = True
    a = draw_chains(pol, s0, [6] * 50, 0.2, generator=torch.Generator().manual_seed(2), mask=open_)
    b = draw_chains(pol, s0, [6] * 50, 0.2, generator=torch.Generator().manual_seed(2))
    assert a == b


def test_a_mask_with_a_position_that_allows_no_state_is_refused_when_built():
    import pytest
    import torch

    from ctrls.method.positions import PositionMask

    allowed = torch.tensor([[True, False], [False, False]])
    with pytest.raises(ValueError, match=r"bucket\(s\) \[1\]"):
        PositionMask(allowed, torch.ones(2, 2, dtype=torch.long))
    with pytest.raises(ValueError, match="one shape"):
        PositionMask(torch.ones(2, 2, dtype=torch.bool), torch.ones(3, 2, dtype=torch.long))


def test_a_mask_that_allows_no_state_at_a_position_is_refused_when_built():
    from ctrls.method.positions import PositionMask

    counts = torch.tensor([[3, 1], [0, 0], [2, 2]])
    with pytest.raises(ValueError, match=r"allows no state at position bucket\(s\) \[1\]"):
        PositionMask(torch.tensor([[True, False], [False, False], [True, True]]), counts)
    with pytest.raises(ValueError, match="one shape"):
        PositionMask(torch.ones(3, 2, dtype=torch.bool), torch.ones(2, 2))
    m = PositionMask(torch.tensor([[True, False], [False, True], [True, True]]), counts)
    assert m.buckets == 3 and m.mode.tolist() == [0, 0, 0]
