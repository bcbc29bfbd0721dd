import pytest
import torch

from ctrls.spectral import spectral_embedding, spectral_embeddings


def eigh_reference(E: torch.Tensor, k: int) -> torch.Tensor:
    """Eq. 5 literally: top-k eigenpairs of the d x d Gram matrix, sqrt(lambda) q, sign fixed."""
    G = E.double().T @ E.double()
    lam, Q = torch.linalg.eigh(G)
    lam, Q = lam.flip(0), Q.flip(1)
    rows = []
    for i in range(k):
        if i < min(E.shape) and lam[i] > 1e-9 * lam[0]:
            v = lam[i].clamp(min=0).sqrt() * Q[:, i]
            v = v * torch.sign(v[v.abs().argmax()])
            rows.append(v)
        else:
            rows.append(torch.zeros(E.shape[1], dtype=torch.float64))
    return torch.cat(rows).float()


@pytest.mark.parametrize("n,d,k", [(12, 32, 4), (40, 64, 4), (3, 16, 4), (1, 8, 2), (4, 4, 4), (80, 48, 6)])
def test_equals_gram_eigendecomposition(n, d, k):
    torch.manual_seed(n * d)
    E = torch.randn(n, d)
    got = spectral_embedding(E, k, normalize=False)
    torch.testing.assert_close(got, eigh_reference(E, k), atol=1e-4, rtol=1e-4)
    if n < k:  # rows beyond the rank are zero padding
        assert torch.all(got.view(k, d)[n:] == 0)


def test_normalize_divides_by_sqrt_n():
    torch.manual_seed(0)
    E = torch.randn(9, 20)
    torch.testing.assert_close(spectral_embedding(E, 3, normalize=True), spectral_embedding(E / 3.0, 3, normalize=False))


def test_batched_equals_per_step_and_order_is_kept():
    torch.manual_seed(1)
    steps = [torch.randn(n, 24) for n in (5, 17, 2, 30, 9, 1)]
    batched = spectral_embeddings(steps, 4)
    for i, E in enumerate(steps):
        torch.testing.assert_close(batched[i], spectral_embedding(E, 4), atol=1e-5, rtol=1e-5)


def test_sign_is_fixed_and_invariant_to_token_order():
    torch.manual_seed(2)
    E = torch.randn(10, 16)
    e = spectral_embedding(E, 3).view(3, 16)
    for row in e:
        assert row[row.abs().argmax()] > 0
    # the Gram matrix ignores token order, so the embedding does too
    torch.testing.assert_close(spectral_embedding(E[torch.randperm(10)], 3).view(3, 16), e, atol=1e-5, rtol=1e-5)


def test_nan_is_an_error_naming_the_step():
    E = torch.randn(4, 8)
    E[1, 2] = float("nan")
    with pytest.raises(ValueError, match="q7/s2"):
        spectral_embeddings([torch.randn(3, 8), E], 2, names=["q7/s1", "q7/s2"])
