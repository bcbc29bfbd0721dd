import pytest
import torch

from ctrls.method.spectral import spectral_embedding, spectral_embeddings


def eigh_reference(E: torch.Tensor, k: int) -> torch.Tensor:
    """Eq. 5 literally: top-k eigenpairs of the d x d Gram matrix E^T E, sqrt(lambda) q, each along
    the token sum E^T 1, zero rows beyond the rank."""
    G = E.double().T @ E.double()
    total = E.double().sum(0)
    lam, Q = torch.linalg.eigh(G)
    lam, Q = lam.flip(0), Q.flip(1)  # descending
    rows = []
    for i in range(k):
        if i < min(E.shape) and lam[i] > 1e-9 * lam[0]:
            v = lam[i].sqrt() * Q[:, i]
            rows.append(v * torch.sign(v @ total))
        else:
            rows.append(torch.zeros(E.shape[1], dtype=torch.float64))
    return torch.cat(rows).float()


@pytest.mark.parametrize("n,d,k", [(12, 32, 4), (40, 64, 4), (3, 16, 4), (1, 8, 2), (1, 8, 1), (4, 4, 4), (80, 48, 6)])
def test_equals_top_k_of_the_gram_eigendecomposition(n, d, k):
    torch.manual_seed(n * d + k)
    E = torch.randn(n, d)
    ref = eigh_reference(E, k)
    one = spectral_embedding(E, k, normalize=False)
    many = spectral_embeddings([E], k, normalize=False)[0]
    assert one.shape == many.shape == (k * d,) and one.dtype == torch.float32
    torch.testing.assert_close(one, ref, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(many, ref, atol=1e-4, rtol=1e-4)
    if n < k:  # rows beyond the rank are zero padding
        assert torch.all(one.view(k, d)[n:] == 0) and torch.all(many.view(k, d)[n:] == 0)


def test_rank_deficient_step_gets_zero_rows():
    torch.manual_seed(3)
    E = torch.randn(2, 24).repeat(3, 1)  # 6 tokens, rank 2
    for e in (spectral_embedding(E, 4), spectral_embeddings([E], 4)[0]):
        rows = e.view(4, 24)
        assert rows[:2].abs().amax(-1).min() > 0.1 and torch.all(rows[2:] == 0)


def test_normalize_divides_by_sqrt_n():
    torch.manual_seed(0)
    E = torch.randn(9, 20)
    raw = spectral_embedding(E, 3, normalize=False)
    torch.testing.assert_close(spectral_embedding(E, 3), raw / 3.0)
    torch.testing.assert_close(spectral_embeddings([E], 3)[0], raw / 3.0, atol=1e-5, rtol=1e-5)


def test_batched_equals_per_step_across_chunks_and_keeps_order():
    torch.manual_seed(1)
    lengths = (5, 17, 2, 30, 9, 1, 3, 17, 6)
    steps = [torch.randn(n, 24) for n in lengths]
    batched = spectral_embeddings(steps, 4, batch_size=4)  # chunks pad short steps with zero rows
    assert batched.shape == (len(steps), 4 * 24)
    for i, E in enumerate(steps):
        torch.testing.assert_close(batched[i], spectral_embedding(E, 4), atol=1e-5, rtol=1e-5)


def test_zero_rows_do_not_change_the_embedding():
    torch.manual_seed(4)
    E = torch.randn(7, 16)
    padded = torch.cat([E, torch.zeros(5, 16)])
    torch.testing.assert_close(spectral_embedding(padded, 4, normalize=False),
                               spectral_embedding(E, 4, normalize=False), atol=1e-5, rtol=1e-5)


def test_sign_points_along_the_token_sum_and_ignores_token_order():
    torch.manual_seed(2)
    E = torch.randn(10, 16) + 0.5
    e = spectral_embedding(E, 3).view(3, 16)
    assert torch.all(e @ E.sum(0) > 0)
    torch.testing.assert_close(spectral_embeddings([E], 3)[0].view(3, 16), e, atol=1e-5, rtol=1e-5)
    # the Gram matrix ignores token order, so the embedding does too
    torch.testing.assert_close(spectral_embedding(E[torch.randperm(10)], 3).view(3, 16), e, atol=1e-5, rtol=1e-5)


def _two_peak_steps(n_steps: int = 40, d: int = 32, seed: int = 0) -> list[torch.Tensor]:
    """Steps whose top direction has two near-equal entries of opposite sign (dims 3 and 7, like
    SmolLM2's dims 199 and 17), the tokens sitting on the positive side of that direction."""
    g = torch.Generator().manual_seed(seed)
    u = torch.zeros(d)
    u[3], u[7] = 1.0, -1.0
    steps = []
    for _ in range(n_steps):
        n = int(torch.randint(3, 12, (1,), generator=g))
        E = 0.05 * torch.randn(n, d, generator=g) + (1 + 0.1 * torch.rand(n, 1, generator=g)) * 5 * u
        E[:, 3] += 0.02 * torch.randn(n, generator=g)  # which of the two entries is larger varies by step
        steps.append(E)
    return steps


def test_near_equal_opposite_entries_do_not_flip_steps():
    """The old rule (largest-magnitude entry positive) flipped about half of these steps into a
    mirror cluster; along the token sum every step keeps its side."""
    steps = _two_peak_steps()
    first = spectral_embeddings(steps, 2)[:, :32]
    ref = sum(E.sum(0) for E in steps)
    assert torch.all(first @ ref > 0)
    # the embeddings form one tight group: every step is nearer the others' mean than its own mirror
    centre = first.mean(0)
    assert torch.all((first - centre).norm(dim=-1) < (first + centre).norm(dim=-1) * 0.2)


def test_sign_falls_back_to_the_peak_when_the_token_sum_vanishes():
    E = torch.tensor([[3.0, 1.0, 0.0], [-3.0, -1.0, 0.0]])  # tokens sum to 0
    for e in (spectral_embedding(E, 1, normalize=False), spectral_embeddings([E], 1, normalize=False)[0]):
        assert e[e.abs().argmax()] > 0


def test_half_precision_inputs_are_upcast():
    torch.manual_seed(5)
    E = torch.randn(6, 32).bfloat16()
    torch.testing.assert_close(spectral_embeddings([E], 2)[0], spectral_embedding(E.float(), 2), atol=1e-5, rtol=1e-5)
    assert spectral_embedding(E, 2).dtype == torch.float32


def test_bad_steps_are_errors_naming_the_step():
    E = torch.randn(4, 8)
    E[1, 2] = float("nan")
    with pytest.raises(ValueError, match="q7/s2 has NaN/Inf"):
        spectral_embeddings([torch.randn(3, 8), E], 2, names=["q7/s1", "q7/s2"])
    with pytest.raises(ValueError, match="NaN/Inf"):
        spectral_embedding(E, 2)
    with pytest.raises(ValueError, match="step 1 has no tokens"):
        spectral_embeddings([torch.randn(3, 8), torch.randn(0, 8)], 2)
    with pytest.raises(ValueError, match="step 1 has hidden size 9"):
        spectral_embeddings([torch.randn(3, 8), torch.randn(3, 9)], 2)
