"""ctrls.method.streams: the counter-based random streams. ``stream_key`` is splitmix64 (the published
outputs of seed 0), chained over its parts; ``stream_uniform`` gives float64 uniforms strictly inside (0, 1)
that depend only on (key, counter, column), never on the batch around them, and are uniform (a KS and a
chi-square test at a fixed seed) and uncorrelated across columns and counters; ``seed_of`` is a fixed CRC."""
import numpy as np
import pytest
import torch
from scipy import stats

from ctrls.method.streams import GOLDEN, MASK, lsr, seed_of, signed, stream_key, stream_subkeys, stream_uniform

# splitmix64 seeded with 0: its first three outputs (Steele, Lea and Flood 2014; Vigna's splitmix64.c)
SPLITMIX64_SEED0 = [0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4, 0x06C45D188009454F]


def splitmix64(state: int) -> int:
    """One output of splitmix64 from the state before its increment, in plain Python integers."""
    z = (state + GOLDEN) & MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def test_stream_key_is_splitmix64_chained_over_its_parts():
    assert [stream_key(i * GOLDEN) & MASK for i in range(3)] == SPLITMIX64_SEED0
    assert [splitmix64(i * GOLDEN & MASK) for i in range(3)] == SPLITMIX64_SEED0  # the reference itself
    for parts in [(5,), (5, 0), (0, 5), (123, -7, 2**63 - 1), (-1, 2**64 + 3)]:
        x = 0
        for p in parts:
            x = splitmix64((x + p) & MASK)
        assert stream_key(*parts) == signed(x), parts
    assert -(2**63) <= stream_key(2**64 - 1) < 2**63  # a signed int64, for int64 tensors
    assert stream_key(1, 2) != stream_key(2, 1)


def test_stream_subkeys_equal_the_scalar_stream_key():
    from ctrls.method.streams import stream_key

    keys, counters = torch.tensor([0, 5, -7, 2**62 + 3]), torch.tensor([0, 3, 9, 1])
    assert stream_subkeys(keys, counters).tolist() == [stream_key(int(k), int(c)) for k, c in zip(keys, counters)]


def test_logical_shift_matches_unsigned_shift():
    x = torch.tensor([-1, -(2**63), 2**63 - 1, 12345, -12345])
    for s in (1, 11, 30, 63):
        assert lsr(x, s).tolist() == [((int(v) & MASK) >> s) for v in x], s


EXTREME = torch.tensor([0, 1, -1, 2**63 - 1, -(2**63)])


def test_uniforms_lie_strictly_inside_the_unit_interval_on_53_bit_grid():
    u = stream_uniform(EXTREME, torch.tensor([0, 2**62, -5, 7, 2**63 - 1]), 4096)
    assert u.shape == (5, 4096) and u.dtype == torch.float64
    assert 0 < u.min() and u.max() < 1
    grid = u * 2.0**53 - 0.5
    assert torch.equal(grid, grid.round())  # (k + 0.5) / 2^53: never 0, never 1


def test_a_row_depends_only_on_its_key_and_counter():
    keys = torch.tensor([stream_key(s) for s in range(8)])
    counters = torch.arange(8) * 3
    batch = stream_uniform(keys, counters, 16)
    for b in range(8):
        alone = stream_uniform(keys[b:b + 1], counters[b:b + 1], 16)
        assert torch.equal(alone[0], batch[b])  # the same alone as in a batch, at any position
    perm = torch.tensor([5, 2, 7, 0, 1, 6, 3, 4])
    assert torch.equal(stream_uniform(keys[perm], counters[perm], 16), batch[perm])
    assert torch.equal(stream_uniform(keys, counters, 5), batch[:, :5])  # column j does not depend on the width
    assert torch.equal(stream_uniform(keys, counters, 16), batch)  # deterministic
    nxt = stream_uniform(keys, counters + 1, 16)
    assert not torch.isclose(nxt, batch).any()  # the next counter draws fresh numbers
    other = stream_uniform(keys + 1, counters, 16)
    assert not torch.isclose(other, batch).any()


def test_uniforms_are_uniform_and_uncorrelated():
    keys = torch.tensor([stream_key(2024, i) for i in range(400)])
    counters = torch.arange(400) % 7
    u = stream_uniform(keys, counters, 100).numpy()
    flat = u.ravel()  # 40,000 draws
    assert stats.kstest(flat, "uniform").pvalue > 1e-3
    counts = np.histogram(flat, bins=20, range=(0, 1))[0]
    assert stats.chisquare(counts).pvalue > 1e-3
    assert abs(flat.mean() - 0.5) < 4 * (1 / 12 / flat.size) ** 0.5
    r_cols = np.corrcoef(u[:, :-1].ravel(), u[:, 1:].ravel())[0, 1]  # neighbouring columns of a row
    same_key = stream_uniform(keys, counters + 1, 100).numpy()
    r_counter = np.corrcoef(flat, same_key.ravel())[0, 1]  # the same key at the next counter
    assert abs(r_cols) < 0.03 and abs(r_counter) < 0.03


def test_a_stream_of_one_key_over_counters_is_uniform():
    c = torch.arange(20000)
    u = stream_uniform(torch.full((20000,), stream_key(7)), c, 1)[:, 0].numpy()
    assert stats.kstest(u, "uniform").pvalue > 1e-3


def test_seed_of_is_a_fixed_32_bit_crc_of_the_values():
    assert seed_of("gsm8k", 3) == 2509957324 and seed_of() == 1580606521 and seed_of(1, "a", 0.5) == 3376533812
    assert seed_of("gsm8k", 3) != seed_of("gsm8k", 4) != seed_of(("gsm8k", 4))
    assert all(0 <= seed_of(i) < 2**32 for i in range(100))


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_subkeys_take_any_integer_tensor(dtype):
    keys, counters = torch.tensor([1, 2, 3], dtype=dtype), torch.tensor([0, 1, 2], dtype=dtype)
    assert stream_subkeys(keys, counters).dtype == torch.int64
    assert stream_subkeys(keys, counters).tolist() == [stream_key(1, 0), stream_key(2, 1), stream_key(3, 2)]
