"""Prompts that do not fit are refused, before any decoding.

A prompt plus ``sampling.max_new_tokens`` beyond the model's positions (2,100 tokens on a
2,048-position model) would decode past them without a word, and an empty prompt would fail inside
the decoder. ``ctrls.data.prompts.check_prompts`` refuses both with a
:class:`PromptError` (a config error: one line from the CLI) that names the prompt, its length, the
positions it needs and the keys that fix it; the stages that decode check their prompts first, and so
does ``ctrls.generate.sampling.sample`` (with the state prompt's vectors counted).
"""
import pytest

from ctrls.config.schema import ConfigError, load_config
from ctrls.data.problems import Problem
from ctrls.data.prompts import PromptError, check_prompts, encode_prompt, model_positions


def test_an_empty_prompt_is_refused_by_name():
    with pytest.raises(PromptError, match="prompt 1 is empty"):
        check_prompts([[1, 2], []], 10, 2048)
    with pytest.raises(PromptError, match="question 'q7' is empty"):
        check_prompts([[]], 10, None, ["question 'q7'"])  # also when the model states no positions


def test_a_prompt_past_the_models_positions_is_refused_with_the_numbers():
    with pytest.raises(PromptError, match=r"prompt 0 has 2020 tokens; with sampling.max_new_tokens=80 a decode needs "
                                          r"2100 positions, but the model has 2048.*at most 28"):
        check_prompts([list(range(2020))], 80, 2048)
    check_prompts([list(range(1968))], 80, 2048)  # exactly the model's positions: fits
    check_prompts([list(range(5000))], 80, None)  # no stated limit: not checked
    assert issubclass(PromptError, ConfigError)  # the CLI prints a config error as one line


def test_model_positions_reads_the_model_config():
    class Cfg:
        max_position_embeddings = 2048

    class Model:
        config = Cfg()

    class Backbone:
        model = Model()

    assert model_positions(Model()) == 2048 and model_positions(Backbone()) == 2048
    assert model_positions(object()) is None


class _Tok:
    """A tokenizer stand-in: one token per character, no chat template."""

    chat_template = None

    def __call__(self, text, add_special_tokens=True, return_offsets_mapping=False):
        return {"input_ids": [ord(c) % 256 for c in text], "offset_mapping": [(i, i + 1) for i in range(len(text))]}


@pytest.mark.parametrize("question", ["", "   ", "\n"])
def test_an_empty_question_is_refused_before_it_is_encoded(question):
    with pytest.raises(PromptError, match="empty question"):
        encode_prompt(_Tok(), question, use_chat_template=False, few_shot=0)
    ids, start = encode_prompt(_Tok(), "What is 2 + 2?", use_chat_template=False, few_shot=0)
    assert ids and 0 < start < len(ids)


def test_the_collection_stage_refuses_a_prompt_that_does_not_fit_before_decoding(tmp_path, monkeypatch):
    """Stage (a) on a 2,048-position model with max_new_tokens=2100: refused, naming the question;
    the decoder is never called."""
    import ctrls.generate.sampling as S
    import ctrls.stages.collect as C

    class Cfg:
        max_position_embeddings = 2048

    class Model:
        config = Cfg()

    class Bb:
        model, tokenizer, name = Model(), _Tok(), "stand-in"

    def no_decode(*a, **k):
        raise AssertionError("decoded a prompt that does not fit")

    monkeypatch.setattr(S, "sample", no_decode)  # collect imports the engine when it runs
    cfg = load_config("smoke", [f"run_dir={tmp_path}", "sampling.max_new_tokens=2100", "prompt.use_chat_template=false"])
    p = Problem("q-long", "What is 2 + 2?", "4", ("2 + 2 = 4",), "test", "train")
    with pytest.raises(PromptError, match=r"training question 'q-long' has \d+ tokens; with sampling.max_new_tokens=2100"):
        C.collect(cfg, Bb(), [p], tmp_path, progress=False)
