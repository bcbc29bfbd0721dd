"""Newcombe's paired interval with the continuity-corrected
phi, and the clustered rate interval's effective size near 0% and 100%, each against an independent
reference (published values, plain Wilson, a coverage simulation)."""
import numpy as np
import pytest

from ctrls.stats.metrics import newcombe_paired, paired_rate_difference, rate_interval, rate_intervals
from ctrls.stats.power import newcombe_interval, wilson_interval


def _arms(both: int, a_only: int, b_only: int, neither: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-question binary outcomes of arms a and b with the given 2x2 table."""
    a = np.array([1] * both + [1] * a_only + [0] * b_only + [0] * neither, float)
    b = np.array([1] * both + [0] * a_only + [1] * b_only + [0] * neither, float)
    return a, b


# ---- Newcombe's paired interval (method 10) with phi* ------------------------------------


def test_paired_interval_matches_the_published_value():
    # Cavo et al. (2012) in Fagerland, Lydersen & Laake's "Statistical analysis of contingency tables"
    # (R package contingencytables, Newcombe_square_and_add_CI_paired_2x2): -0.0621 (95% CI -0.1186 to
    # -0.0046), table (59, 6; 16, 80): AD - BC = 4624 > N/2, so phi* is the corrected one
    d, lo, hi, phi = newcombe_paired(59, 6, 16, 80)
    assert (d, lo, hi) == pytest.approx((-0.0621, -0.1186, -0.0046), abs=6e-5)
    assert phi == pytest.approx((59 * 80 - 6 * 16 - 161 / 2) / np.sqrt(65 * 96 * 75 * 86))


def test_the_exploration_example_reads_41_0_to_1_3():
    # eps = 0.1 (arm a) vs Base (arm b): both 10, eps only 5, Base only 14, neither 11 (N = 40).
    # With the raw phi the interval was [-40.5, -1.9]; with phi* it is [-41.0, -1.3].
    a, b = _arms(10, 5, 14, 11)
    one = np.ones(40)
    r = paired_rate_difference(a, one, b, one)
    assert 100 * r["diff"] == pytest.approx(-22.5)
    assert (round(100 * r["lo"], 1), round(100 * r["hi"], 1)) == (-41.0, -1.3)
    assert r["r"] == pytest.approx((10 * 11 - 5 * 14 - 20) / np.sqrt(15 * 25 * 24 * 16))
    assert (r["diff"], r["lo"], r["hi"], r["r"]) == pytest.approx(newcombe_paired(10, 5, 14, 11))
    # the arms swapped: the mirror image
    s = paired_rate_difference(b, one, a, one)
    assert (s["diff"], s["lo"], s["hi"]) == pytest.approx((-r["diff"], -r["hi"], -r["lo"]))


def test_phi_is_zero_on_0_to_n_half_and_raw_below_zero():
    # 0 <= AD - BC <= N/2: phi* = 0, so the paired interval is the independent one (Newcombe 1998,
    # method 10 of the unpaired paper), an independent reference
    for table in [(6, 5, 5, 5), (1, 1, 7, 12), (5, 5, 5, 5)]:
        A, B, C, D = table
        N = sum(table)
        assert 0 <= A * D - B * C <= N / 2
        d, lo, hi, phi = newcombe_paired(*table)
        assert phi == 0 and (d, lo, hi) == pytest.approx(newcombe_interval(A + B, N, A + C, N))
    # AD - BC < 0: the raw phi, uncorrected
    assert newcombe_paired(2, 10, 8, 2)[3] == pytest.approx((4 - 80) / np.sqrt(12 * 10 * 10 * 12))


def test_identical_arms_never_give_a_zero_width_interval():
    # with the raw phi = 1, two identical binary arms at 50% gave +0.0 [+0.0, +0.0]
    one = np.ones(40)
    for a in (np.r_[np.ones(20), np.zeros(20)], np.r_[np.ones(33), np.zeros(7)]):
        r = paired_rate_difference(a, one, a, one)
        assert r["diff"] == 0 and r["p_value"] == 1.0
        assert r["lo"] <= -0.0005 and r["hi"] >= 0.0005  # at least 0.1 points wide, printed to 0.1
    # identical clustered arms (4 samples per question) too
    m = np.r_[np.full(15, 4.0), np.full(15, 2.0), np.zeros(10)]
    r = paired_rate_difference(m, np.full(40, 4.0), m, np.full(40, 4.0))
    assert r["lo"] <= -0.0005 and r["hi"] >= 0.0005


def test_paired_interval_covers_under_paired_null_cells():
    # cells (both, a only, b only, neither) = (.5, .1, .1, .3) at 40 questions: the true difference
    # is 0. The raw phi covered about 92.5%; phi* about 96%.
    tables = np.random.default_rng(20240533).multinomial(40, [0.5, 0.1, 0.1, 0.3], size=4000)
    d, lo, hi, _ = newcombe_paired(*tables.T)
    assert ((lo <= 0) & (0 <= hi)).mean() >= 0.95
    # the vectorised tables agree with the per-question path
    for t in tables[:5]:
        a, b = _arms(*t)
        r = paired_rate_difference(a, np.ones(40), b, np.ones(40))
        i = np.flatnonzero((tables == t).all(1))[0]
        assert (r["lo"], r["hi"]) == pytest.approx((lo[i], hi[i]))


# ---- the clustered rate interval near 0% and 100% -----------------------------------------


def test_one_failure_does_not_narrow_the_interval():
    # 40 questions x 4 samples: 160/160 gave [91.2, 100] and 159/160 [96.6, 99.9] (n_eff jumped from
    # the 40 questions to the 160 samples). Below 2 x 4 failures n_eff stays at the 40 questions.
    n = np.full(40, 4.0)
    full = rate_interval(n, n)
    assert (round(100 * full["lo"], 1), full["hi"]) == (91.2, 1.0) and full["n_eff"] == 40
    one_off = rate_interval(np.r_[3.0, n[1:]], n)
    assert one_off["n_eff"] == 40 and one_off["lo"] <= full["lo"] and one_off["hi"] <= full["hi"]
    assert (one_off["lo"], one_off["hi"]) == pytest.approx(wilson_interval(40 * 159 / 160, 40))


def _path(q: int, m: int, order: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Successes per question after each of q x m successes is added, question by question in ``order``."""
    steps = np.zeros((len(order) + 1, q))
    for i, j in enumerate(order):
        steps[i + 1] = steps[i]
        steps[i + 1, j] += 1
    return steps, np.full(q, float(m))


@pytest.mark.parametrize("q,m", [(40, 4), (40, 20), (10, 5), (7, 13)])
def test_the_interval_is_monotone_in_the_counts_near_the_ends(q, m):
    """While the minority count is below 2 n_max the interval depends on the counts alone and never
    moves against them, wherever the failures fall (together, spread, at random); concentrated
    failures give a monotone interval over the whole range (no jump where the clustered size starts)."""
    rng = np.random.default_rng(q * m)
    orders = {"together": np.repeat(np.arange(q), m), "spread": np.tile(np.arange(q), m),
              "random": rng.permutation(np.repeat(np.arange(q), m))}
    for name, order in orders.items():
        steps, n = _path(q, m, order)
        r = rate_intervals(steps, n)
        total = steps.sum(1)
        k = np.minimum(total, n.sum() - total)
        near = (k[1:] < 2 * m) & (k[:-1] < 2 * m)
        for key in ("lo", "hi"):
            step = np.diff(r[key])
            assert (step[near] >= 0).all(), f"{name}: {key} falls as a success is added near the ends"
            if name == "together":
                assert (step >= -1e-12).all(), f"{name}: {key} falls as a success is added"
        assert (r["n_eff"][k < 2 * m] == q).all()
        # from 2 n_max on, the size moves to the clustered one step by step, never in one jump
        cross = (np.minimum(k[1:], k[:-1]) <= 2 * m) & (np.maximum(k[1:], k[:-1]) >= 2 * m)
        assert (np.abs(np.diff(r["n_eff"]))[cross] <= (n.sum() - q) / (2 * m) + 1e-9).all()


def test_rate_intervals_equal_rate_interval_row_by_row():
    rng = np.random.default_rng(1)
    m = rng.binomial(6, rng.beta(2, 1, size=(20, 30)))
    many = rate_intervals(m, np.full(30, 6.0))
    for i in range(0, 20, 7):
        one = rate_interval(m[i], np.full(30, 6.0))
        assert [one[k] for k in ("rate", "lo", "hi", "n_eff")] == pytest.approx(
            [many[k][i] for k in ("rate", "lo", "hi", "n_eff")])


@pytest.mark.parametrize("p", [0.95, 0.96, 0.97, 0.98])
def test_rate_interval_covers_clustered_rates_near_100_percent(p):
    """40 questions x 20 samples, beta-binomial (per-question rate ~ Beta with mean p and intra-question
    correlation icc): the paper profile's Succ. range. Coverage was 0.82-0.87 before."""
    rng = np.random.default_rng(int(1000 * p))
    for icc in (0.3, 0.45, 0.6):
        k = (1 - icc) / icc
        m = rng.binomial(20, rng.beta(p * k, (1 - p) * k, size=(2000, 40)))
        r = rate_intervals(m, np.full(40, 20.0))
        assert ((r["lo"] <= p) & (p <= r["hi"])).mean() >= 0.95, f"p = {p}, icc = {icc}"
