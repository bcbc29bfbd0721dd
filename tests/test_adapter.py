import pytest
import torch

from ctrls.adapter import StateAdapter, adapted_logits

K, k = 5, 2


def _setup(bb, seed=0):
    torch.manual_seed(seed)
    d = bb.hidden_size
    centroids = torch.randn(K, k * d)
    ids = torch.randint(5, 500, (2, 9))
    s = torch.softmax(torch.randn(2, 9, K), -1)
    return StateAdapter(d, k * d, rank=8), centroids, ids, s


@pytest.mark.parametrize("arch", ["tiny_llama", "tiny_qwen2"])
@pytest.mark.parametrize("inject_at", ["last_hidden", "input_embeds"])
def test_fresh_adapter_leaves_logits_bit_identical(arch, inject_at, request):
    bb = request.getfixturevalue(arch)
    adapter, centroids, ids, s = _setup(bb)
    with torch.no_grad():
        ref = bb.model(input_ids=ids).logits
        got = adapted_logits(bb.model, adapter, ids, s, centroids, inject_at=inject_at)
    assert torch.equal(got, ref)


def test_training_moves_only_the_adapter_and_makes_z_matter(tiny_llama):
    bb = tiny_llama
    adapter, centroids, ids, s = _setup(bb, seed=1)
    before = {n: p.clone() for n, p in bb.model.named_parameters()}
    opt = torch.optim.Adam(adapter.parameters(), lr=1e-2)
    for _ in range(5):
        logits = adapted_logits(bb.model, adapter, ids[:, :-1], s[:, :-1], centroids)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert all(torch.equal(p, before[n]) for n, p in bb.model.named_parameters())
    assert all(p.grad is None for p in bb.model.parameters())
    assert adapter.up.weight.abs().sum() > 0
    with torch.no_grad():  # a trained adapter's output depends on the state
        a = adapted_logits(bb.model, adapter, ids, s, centroids)
        b = adapted_logits(bb.model, adapter, ids, s.flip(-1), centroids)
    assert not torch.allclose(a, b)


def test_mixture_path_equals_dense_z():
    torch.manual_seed(2)
    ad = StateAdapter(16, 32, rank=4)
    torch.nn.init.normal_(ad.up.weight)
    E, s, C = torch.randn(3, 7, 16), torch.softmax(torch.randn(3, 7, K), -1), torch.randn(K, 32)
    torch.testing.assert_close(ad.forward_s(E, s, C), ad(E, s @ C), atol=1e-5, rtol=1e-5)
    assert sum(p.numel() for p in ad.parameters()) == StateAdapter.n_params(16, 32, 4)


def test_unknown_injection_point():
    with pytest.raises(ValueError, match="inject_at"):
        ad = StateAdapter(4, 8, 2)
        adapted_logits(torch.nn.Linear(1, 1), ad, torch.zeros(1, 1, dtype=torch.long), torch.ones(1, 1, 2),
                       torch.zeros(2, 8), inject_at="middle")
