"""``sample`` itself refuses an empty prompt and one that, with the new tokens,
runs past the model's positions, naming the prompt's index, before any decoding."""
import pytest

from ctrls.generate import sampling
from ctrls.generate.sampling import SampleParams, sample


@pytest.fixture
def no_decode(monkeypatch):
    monkeypatch.setattr(sampling, "_decode", lambda *a, **k: pytest.fail("decoded"))
    monkeypatch.setattr(sampling, "decode_static", lambda *a, **k: pytest.fail("decoded"))


def test_an_empty_prompt_is_refused_naming_its_index(tiny_llama, no_decode):
    with pytest.raises(ValueError, match="prompt 1 is empty"):
        sample(tiny_llama, [[1, 2, 3], []], n=1, params=SampleParams(max_new_tokens=4), seeds=[0, 1])


def test_a_prompt_beyond_the_context_is_refused_naming_its_index(tiny_llama, no_decode):
    positions = tiny_llama.model.config.max_position_embeddings
    long = [5] * (positions - 3)
    with pytest.raises(ValueError, match=f"prompt 2 has {positions - 3} tokens.*the model has {positions}"):
        sample(tiny_llama, [[1, 2], [3], long], n=2, params=SampleParams(max_new_tokens=4), seeds=[0, 1, 2])
    for decode in ("engine", "static"):
        with pytest.raises(ValueError, match="prompt 0 has"):
            sample(tiny_llama, [[1] * (positions + 1)], params=SampleParams(max_new_tokens=1, decode=decode), seeds=[0])


def test_a_prompt_start_outside_its_prompt_is_refused(tiny_llama, no_decode):
    with pytest.raises(ValueError, match=r"prompt 1: prompt_starts\[1\] = 2 is not among its 2 tokens"):
        sample(tiny_llama, [[1, 2, 3], [4, 5]], prompt_starts=[0, 2], seeds=[0, 1])
    with pytest.raises(ValueError, match="1 prompt_starts for 2 prompts"):
        sample(tiny_llama, [[1, 2, 3], [4, 5]], prompt_starts=[0], seeds=[0, 1])
