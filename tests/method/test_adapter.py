import pytest
import torch

from ctrls.method.adapter import StateAdapter, adapted_logits

K, k = 5, 2


def _setup(bb, seed=0):
    torch.manual_seed(seed)
    d = bb.hidden_size
    centroids = torch.randn(K, k * d)
    ids = torch.randint(5, 500, (2, 9))
    s = torch.softmax(torch.randn(2, 9, K), -1)
    return StateAdapter(d, k * d, rank=8), centroids, ids, s


def _perturb(adapter: StateAdapter, std: float = 0.5) -> StateAdapter:
    torch.nn.init.normal_(adapter.up.weight, std=std)
    torch.nn.init.normal_(adapter.up.bias, std=std)
    return adapter


@pytest.mark.parametrize("arch", ["tiny_llama", "tiny_qwen2"])
@pytest.mark.parametrize("inject_at", ["last_hidden", "input_embeds"])
def test_fresh_adapter_leaves_logits_bit_identical(arch, inject_at, request):
    bb = request.getfixturevalue(arch)
    adapter, centroids, ids, s = _setup(bb)
    with torch.no_grad():
        ref = bb.model(input_ids=ids).logits
        got = adapted_logits(bb.model, adapter, ids, s, centroids, inject_at=inject_at)
        dense = adapted_logits(bb.model, adapter, ids, inject_at=inject_at, z=s @ centroids)
    assert torch.equal(got, ref) and torch.equal(dense, ref)


def test_fresh_adapter_is_the_identity_in_bf16():
    torch.manual_seed(0)
    ad = StateAdapter(16, 32, rank=4)
    E = (10 * torch.randn(2, 7, 16)).bfloat16()
    out = ad(E, torch.randn(2, 7, 32).bfloat16())
    assert out.dtype == torch.bfloat16 and torch.equal(out, E)
    assert all(p.dtype == torch.float32 for p in ad.parameters())
    # a non-zero adapter computes in float32 and casts back: same result as a float32 input, rounded
    _perturb(ad)
    z = torch.randn(2, 7, 32)
    torch.testing.assert_close(ad(E, z), ad(E.float(), z).bfloat16())


@pytest.mark.parametrize("inject_at", ["last_hidden", "input_embeds"])
def test_training_moves_only_the_adapter_and_makes_z_matter(tiny_llama, inject_at):
    bb = tiny_llama
    adapter, centroids, ids, s = _setup(bb, seed=1)
    before = {n: p.clone() for n, p in bb.model.named_parameters()}
    adapter_before = {n: p.clone() for n, p in adapter.named_parameters()}
    opt = torch.optim.SGD(adapter.parameters(), lr=0.5)
    for _ in range(4):
        logits = adapted_logits(bb.model, adapter, ids[:, :-1], s[:, :-1], centroids, inject_at=inject_at)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert all(torch.equal(p, before[n]) for n, p in bb.model.named_parameters())
    assert all(p.grad is None for p in bb.model.parameters())
    changed = [n for n, p in adapter.named_parameters() if not torch.equal(p, adapter_before[n])]
    assert sorted(changed) == sorted(adapter_before)
    with torch.no_grad():  # a trained adapter's output depends on the state
        a = adapted_logits(bb.model, adapter, ids, s, centroids, inject_at=inject_at)
        b = adapted_logits(bb.model, adapter, ids, s.flip(-1), centroids, inject_at=inject_at)
    assert not torch.allclose(a, b)


def test_nonzero_adapter_changes_logits_through_z(tiny_qwen2):
    bb = tiny_qwen2
    adapter, centroids, ids, s = _setup(bb, seed=2)
    _perturb(adapter, std=0.05)
    with torch.no_grad():
        ref = bb.model(input_ids=ids).logits
        a = adapted_logits(bb.model, adapter, ids, s, centroids)
        b = adapted_logits(bb.model, adapter, ids, z=torch.randn(1, 1, k * bb.hidden_size))  # one z everywhere
    assert not torch.allclose(a, ref) and not torch.allclose(a, b)


def test_mixture_path_equals_dense_z():
    torch.manual_seed(2)
    ad = _perturb(StateAdapter(16, 32, rank=4))
    E, s, C = torch.randn(3, 7, 16), torch.softmax(torch.randn(3, 7, K), -1), torch.randn(K, 32)
    torch.testing.assert_close(ad.forward_s(E, s, C), ad(E, s @ C), atol=1e-5, rtol=1e-5)
    # one state per sequence broadcasts over positions
    s1 = s[:, :1]
    torch.testing.assert_close(ad.forward_s(E, s1, C), ad(E, (s1 @ C).expand(-1, 7, -1)), atol=1e-5, rtol=1e-5)


def test_mixture_path_equals_dense_z_in_adapted_logits(tiny_llama):
    bb = tiny_llama
    adapter, centroids, ids, s = _setup(bb, seed=3)
    _perturb(adapter, std=0.05)
    with torch.no_grad():
        for inject_at in ("last_hidden", "input_embeds"):
            torch.testing.assert_close(adapted_logits(bb.model, adapter, ids, s, centroids, inject_at=inject_at),
                                       adapted_logits(bb.model, adapter, ids, inject_at=inject_at, z=s @ centroids),
                                       atol=1e-4, rtol=1e-4)


def test_parameter_count():
    ad = StateAdapter(16, 32, rank=4)
    assert sum(p.numel() for p in ad.parameters()) == StateAdapter.n_params(16, 32, 4) == 4 * 17 + 4 * 32 + 8 * 16 + 16
    assert StateAdapter.n_params(576, 4 * 576, 64) == 258_688  # SmolLM2-135M, as the module docstring says
    from ctrls.config.schema import load_config

    demo = load_config("demo")  # the demo's row of the method page's table: k = 1, rank 32
    assert (demo.spectral.k, demo.adapter.rank) == (1, 32) and StateAdapter.n_params(576, 576, 32) == 74_336
    assert round(100 * 74_336 / 134_515_008, 2) == 0.06  # SmolLM2-135M's 134,515,008 parameters
    assert StateAdapter.n_params(2048, 4 * 2048, 64) == 919_616  # Qwen2.5-3B


def test_bad_inputs_name_the_problem():
    ad = StateAdapter(4, 8, 2)
    with pytest.raises(ValueError, match="inject_at"):
        adapted_logits(torch.nn.Linear(1, 1), ad, torch.zeros(1, 1, dtype=torch.long), torch.ones(1, 1, 2),
                       torch.zeros(2, 8), inject_at="middle")
    with pytest.raises(ValueError, match="either z"):
        adapted_logits(torch.nn.Linear(1, 1), ad, torch.zeros(1, 1, dtype=torch.long), torch.ones(1, 1, 2))
    with pytest.raises(ValueError, match="either z"):
        adapted_logits(torch.nn.Linear(1, 1), ad, torch.zeros(1, 1, dtype=torch.long), torch.ones(1, 1, 2),
                       torch.zeros(2, 8), z=torch.zeros(1, 1, 8))
    with pytest.raises(ValueError, match="D = 8"):
        ad(torch.zeros(3, 4), torch.zeros(3, 6))
    with pytest.raises(ValueError, match="d = 4"):
        ad(torch.zeros(3, 5), torch.zeros(3, 8))
    with pytest.raises(ValueError, match="K = 2"):
        ad.forward_s(torch.zeros(3, 4), torch.ones(3, 3), torch.zeros(2, 8))
    with pytest.raises(ValueError, match="broadcast"):
        ad(torch.zeros(3, 4), torch.zeros(2, 8))


@pytest.mark.parametrize("fusion", ["linear", "mlp"])
def test_only_the_mlp_fusion_lets_the_state_effect_depend_on_the_token(fusion):
    """Linear F_u: E'(E, z1) - E'(E, z2) is the same vector for every token (one bias per state);
    mlp F_u: it depends on the token. A fresh adapter of either kind is the identity."""
    torch.manual_seed(0)
    ad = StateAdapter(16, 32, rank=4, fusion=fusion)
    E, z1, z2 = torch.randn(5, 16), torch.randn(1, 32), torch.randn(1, 32)
    assert torch.equal(ad(E, z1), E)
    torch.nn.init.normal_(ad.up.weight, std=0.5)
    shift = ad(E, z1) - ad(E, z2)  # (5, 16): the state's effect at each token
    spread = (shift - shift[:1]).abs().max()
    assert (spread < 1e-5) if fusion == "linear" else (spread > 1e-2)
    assert StateAdapter.n_params(16, 32, 4, fusion) == sum(p.numel() for p in ad.parameters())
    assert ad.separable == (fusion == "linear")
