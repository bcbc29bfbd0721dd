"""Prompts x_0 and reasoning steps x_1..x_T (Sec. 4 and App. F of the paper).

A step is one non-empty line of the model's output (design notes: book/design.md). The prompt asks for one step per
line and a final line "The answer is X." Chat models get their own chat template; models without
one get few-shot chain-of-thought exemplars in the style of Wei et al. (2022). The exemplars below
are our own, not benchmark items.

Token spans: a step's tokens are its text and the newline token that ends it, so with step t at
positions a..b-1 the last token of step t-1 (its newline, or the last prompt token for t = 1) sits
at a-1. That position's hidden state predicts step t's first token and carries z_t.
"""
from __future__ import annotations

import functools
import re
from typing import Sequence

from ctrls.errors import ConfigError

INSTRUCTION = (
    "Solve the following math problem step by step. Write each reasoning step on its own line. "
    "End with a final line of the form \"The answer is X.\" where X is the final answer only.")

# (question, steps) — made up for this project, in the format we ask for.
EXEMPLARS: list[tuple[str, list[str]]] = [
    ("A baker makes 24 rolls in the morning and 18 in the afternoon. He sells 30 of them. "
     "How many rolls are left?",
     ["The baker makes 24 + 18 = 42 rolls in total.",
      "After selling 30, he has 42 - 30 = 12 rolls left.",
      "The answer is 12."]),
    ("A train travels at 60 miles per hour for 2.5 hours. How far does it travel?",
     ["Distance is speed times time.",
      "The train travels 60 * 2.5 = 150 miles.",
      "The answer is 150."]),
    ("Maria buys 3 notebooks at $4 each and a pen for $2. She pays with a $20 bill. "
     "How much change does she get?",
     ["The notebooks cost 3 * 4 = 12 dollars.",
      "With the pen, she spends 12 + 2 = 14 dollars.",
      "Her change is 20 - 14 = 6 dollars.",
      "The answer is 6."]),
    ("What is the value of x if 3x + 7 = 22?",
     ["Subtract 7 from both sides: 3x = 15.",
      "Divide both sides by 3: x = 5.",
      "The answer is 5."]),
    ("A rectangle has a perimeter of 30 cm and a width of 5 cm. What is its area?",
     ["The perimeter is 2 * (length + width) = 30, so length + width = 15.",
      "The length is 15 - 5 = 10 cm.",
      "The area is 10 * 5 = 50 square cm.",
      "The answer is 50."]),
]

ANSWER_LINE = re.compile(r"the (final )?answer is|####|\\boxed\{", re.IGNORECASE)


def final_answer_line(answer: str) -> str:
    return f"The answer is {answer}."


def build_prompt(tokenizer, question: str, use_chat_template: bool = True, few_shot: int = 4) -> str:
    """The prompt text x_0 for ``question`` (chat template when the tokenizer has one)."""
    shots = EXEMPLARS[:few_shot]
    if use_chat_template and getattr(tokenizer, "chat_template", None):
        messages = []
        for q, steps in shots:
            messages += [{"role": "user", "content": f"{INSTRUCTION}\n\nProblem: {q}"},
                         {"role": "assistant", "content": "\n".join(steps)}]
        messages.append({"role": "user", "content": f"{INSTRUCTION}\n\nProblem: {question}"})
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    parts = [INSTRUCTION, ""]
    for q, steps in shots:
        parts += [f"Problem: {q}", "Solution:", *steps, ""]
    parts += [f"Problem: {question}", "Solution:", ""]
    return "\n".join(parts)


def prompt_ids(tokenizer, question: str, use_chat_template: bool = True, few_shot: int = 4) -> list[int]:
    return encode_prompt(tokenizer, question, use_chat_template, few_shot)[0]


class PromptError(ConfigError):
    """A prompt that cannot be decoded: empty, or with ``max_new_tokens`` longer than the model's
    positions. A config error: the remedy is a key (``prompt.few_shot``, ``sampling.max_new_tokens``)."""


def model_positions(model) -> int | None:
    """The positions a model (or a ``Backbone``) was built for: its config's ``max_position_embeddings``
    (or ``n_positions``, ``n_ctx``, ``seq_length``); None when it states none."""
    model = getattr(model, "model", model)  # a Backbone holds the model
    cfg = getattr(model, "config", None)
    for key in ("max_position_embeddings", "n_positions", "n_ctx", "seq_length"):
        v = getattr(cfg, key, None)
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return v
    return None


def check_prompts(prompts: Sequence[Sequence[int]], max_new_tokens: int, positions: int | None,
                  names: Sequence[str] | None = None, extra: int = 0, extra_why: str = "") -> None:
    """Refuse, before any decoding, a prompt that is empty or that with ``max_new_tokens`` new tokens (and
    ``extra`` positions more: the state prompt's T x m vectors, ``extra_why`` says so) would run past the model's
    ``positions`` (None: not checked). ``names[i]`` says which prompt (default "prompt i") in the :class:`PromptError`."""
    for i, p in enumerate(prompts):
        name = names[i] if names is not None else f"prompt {i}"
        n = len(p)
        if n == 0:
            raise PromptError(f"{name} is empty (0 tokens): a decode starts from at least one token")
        need = n + max_new_tokens + extra
        if positions is not None and need > positions:
            more = f" and {extra} for {extra_why}" if extra else ""
            raise PromptError(
                f"{name} has {n} tokens; with sampling.max_new_tokens={max_new_tokens}{more} a decode needs {need} "
                f"positions, but the model has {positions}: lower sampling.max_new_tokens (at most "
                f"{positions - n - extra} for this prompt), use fewer exemplars (prompt.few_shot) or a shorter question")


def encode_prompt(tokenizer, question: str, use_chat_template: bool = True, few_shot: int = 4) -> tuple[list[int], int]:
    """Token ids of the prompt x_0, and the index of the first token of the question in it.

    The tokens from that index on (the question and what follows it) are the ones whose hidden
    states encode s_0 = Q_phi(x_0): the exemplars and instructions shared by every prompt are left
    out, so that s_0 tells questions apart. An empty (or blank) question is a :class:`PromptError`:
    it has no tokens of its own to encode s_0 from.
    """
    if not isinstance(question, str) or not question.strip():
        raise PromptError(f"an empty question ({question!r}) cannot be prompted: it has no tokens to encode s_0 from")
    text = build_prompt(tokenizer, question, use_chat_template, few_shot)
    # the chat template already holds the special tokens it needs
    add_special = not (use_chat_template and getattr(tokenizer, "chat_template", None))
    enc = tokenizer(text, add_special_tokens=add_special, return_offsets_mapping=True)
    q_char = text.rfind(question)
    start = next((i for i, (a, b) in enumerate(enc["offset_mapping"]) if b > q_char), 0)
    return enc["input_ids"], start


def split_steps(text: str, max_steps: int = 12) -> list[str]:
    """Non-empty lines of ``text``, stripped; lines beyond the cap T are merged into step T."""
    lines = [ln.strip() for ln in text.split("\n") if ln.strip()]
    if len(lines) > max_steps:
        lines = lines[: max_steps - 1] + [" ".join(lines[max_steps - 1:])]
    return lines


@functools.lru_cache(maxsize=8)
def _newline_ids(tokenizer) -> frozenset[int]:
    vocab = len(tokenizer)
    texts = tokenizer.batch_decode([[i] for i in range(vocab)])
    return frozenset(i for i, t in enumerate(texts) if "\n" in t)


def newline_token_ids(tokenizer) -> frozenset[int]:
    """Ids of every token whose text contains a newline (each ends a step)."""
    return _newline_ids(tokenizer)


def join_blank_tail(ids: Sequence[int], spans: list[tuple[int, int]], tokenizer) -> list[tuple[int, int]]:
    """``spans`` with a blank last span joined to the step before it: at the end of a sequence a blank
    unfinished line is no step (the sampler's rule, ``ctrls.generate.decoding``)."""
    if len(spans) > 1 and not tokenizer.decode(list(ids[spans[-1][0]:spans[-1][1]])).strip():
        return spans[:-2] + [(spans[-2][0], spans[-1][1])]
    return spans


def step_spans(ids: Sequence[int], newline_ids: frozenset[int], tokenizer=None,
               max_steps: int | None = None) -> list[tuple[int, int]]:
    """Token spans ``[a, b)`` of the steps in generated ``ids`` (positions relative to ``ids``).

    A span ends with (and includes) a newline token. With ``tokenizer`` given, blank lines are
    not steps: their tokens open the next step (or close the last one, at the end), as in the
    sampler, where a blank line is predicted under the next step's state. With ``max_steps``,
    the spans beyond T are merged into step T.
    """
    def blank(a: int, b: int) -> bool:
        return tokenizer is not None and not tokenizer.decode(list(ids[a:b])).strip()

    spans: list[tuple[int, int]] = []
    start = 0
    for i, tok in enumerate(ids):
        if tok in newline_ids and not blank(start, i + 1):
            spans.append((start, i + 1))
            start = i + 1
    if start < len(ids):
        spans = (join_blank_tail(ids, [*spans, (start, len(ids))], tokenizer) if tokenizer is not None
                 else [*spans, (start, len(ids))])
    if max_steps is not None and len(spans) > max_steps:
        spans = spans[: max_steps - 1] + [(spans[max_steps - 1][0], spans[-1][1])]
    return spans


def encode_solution(tokenizer, steps: Sequence[str]) -> list[int]:
    """Token ids of a reference solution written one step per line (no special tokens)."""
    return tokenizer("\n".join(steps), add_special_tokens=False)["input_ids"]
