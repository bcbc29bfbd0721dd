import pytest
import torch

from ctrls.method.model import CTRLSConfig, CTRLSModel


def test_save_and_reload_identical(tmp_path, tiny_llama):
    d = tiny_llama.hidden_size
    conf = CTRLSConfig(hidden_size=d, n_states=3, requested_states=5, spectral_k=2, spectral_normalize=True,
                       tau=3.0, rank=4, notes=["K reduced"])
    torch.manual_seed(0)
    m = CTRLSModel.build(conf, torch.randn(3, 2 * d), concentration=7.0, L=torch.randn(3, 3))
    torch.nn.init.normal_(m.adapter.up.weight)
    m.save_pretrained(tmp_path / "ckpt")
    r = CTRLSModel.from_pretrained(tmp_path / "ckpt", tiny_llama)
    assert r.config == m.config
    for (n1, p1), (n2, p2) in zip(m.state_dict().items(), r.state_dict().items()):
        assert n1 == n2 and torch.equal(p1, p2)
    h = torch.randn(2, d)
    s = torch.softmax(torch.randn(2, 3), -1)
    torch.testing.assert_close(m.adapt(h, s), r.adapt(h, s), atol=1e-6, rtol=1e-6)  # (memory alignment can move the last bit)
    E = [torch.randn(5, d), torch.randn(2, d)]
    torch.testing.assert_close(m.encode(E), r.encode(E), atol=1e-6, rtol=1e-6)
    with pytest.raises(ValueError, match="hidden size"):
        CTRLSModel.from_pretrained(tmp_path / "ckpt", type("B", (), {"hidden_size": d + 1, "name": "x"})())
