"""``sample`` itself refuses an empty prompt and one that, with the new tokens,
runs past the model's positions (the state prompt's vectors counted), naming the prompt's index, before any decoding."""
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
    with pytest.raises(ValueError, match=r"prompt 0: prompt_starts\[0\] = -1 is not among its 3 tokens"):
        sample(tiny_llama, [[1, 2, 3], [4, 5]], prompt_starts=[-1, 0], seeds=[0, 1])  # not "the last token"
    with pytest.raises(ValueError, match="1 prompt_starts for 2 prompts"):
        sample(tiny_llama, [[1, 2, 3], [4, 5]], prompt_starts=[0], seeds=[0, 1])


def test_a_prompt_with_room_for_its_tokens_but_not_the_state_prompts_vectors_is_refused(tiny_llama, no_decode):
    """Under the state prompt a row needs prompt + max_new_tokens + T x m positions (T steps, m vectors each)."""
    from ctrls.generate.conditioning import StatePromptConditioning
    from ctrls.method.model import CTRLSModel
    from ctrls.method.state_prompt import StatePrompt

    positions = tiny_llama.model.config.max_position_embeddings
    model = CTRLSModel.random(tiny_llama.hidden_size, 4, 2, 8)
    sp = StatePrompt(4, 3, tiny_llama.model.get_input_embeddings().weight.detach())
    params = SampleParams(max_new_tokens=4, max_steps=5)
    prompt = [5] * (positions - 4 - 14)  # 15 positions short of the 4 + 5 x 3 the row needs: one too many
    with pytest.raises(ValueError, match=r"prompt 1 has .*state prompt's vectors \(15 positions"):
        sample(tiny_llama, [[1, 2], prompt], params=params, seeds=[0, 1], conditioning=StatePromptConditioning(model, sp))
    with pytest.raises(pytest.fail.Exception, match="decoded"):  # without the vectors it fits: it would decode
        sample(tiny_llama, [[1, 2], prompt], params=params, seeds=[0, 1])
