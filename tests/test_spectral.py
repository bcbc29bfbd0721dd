import pytest
import torch

from ctrls.spectral import spectral_embedding, spectral_embeddings


def eigh_reference(E: torch.Tensor, k: int) -> torch.Tensor:
    """Eq. 5 literally: top-k eigenpairs of the d x d Gram matrix E^T E, sqrt(lambda) q, sign fixed,
    zero rows beyond the rank."""
    G = E.double().T @ E.double()
    lam, Q = torch.linalg.eigh(G)
    lam, Q = lam.flip(0), Q.flip(1)  # descending
    rows = []
    for i in range(k):
        if i < min(E.shape) and lam[i] > 1e-9 * lam[0]:
            v = lam[i].sqrt() * Q[:, i]
            rows.append(v * torch.sign(v[v.abs().argmax()]))
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


def test_sign_is_fixed_and_invariant_to_token_order():
    torch.manual_seed(2)
    E = torch.randn(10, 16)
    e = spectral_embedding(E, 3).view(3, 16)
    for row in e:
        assert row[row.abs().argmax()] > 0
    # the Gram matrix ignores token order and the sign of E, so the embedding does too
    torch.testing.assert_close(spectral_embedding(E[torch.randperm(10)], 3).view(3, 16), e, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(spectral_embedding(-E, 3).view(3, 16), e, atol=1e-5, rtol=1e-5)


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
