from ctrls.data.prompts import (
    ANSWER_LINE,
    EXEMPLARS,
    build_prompt,
    encode_solution,
    join_blank_tail,
    newline_token_ids,
    prompt_ids,
    split_steps,
    step_spans,
)


def test_split_steps_drops_blank_lines_and_caps_T():
    text = "a = 1\n\n  b = 2  \nc = 3\nThe answer is 3.\n"
    assert split_steps(text) == ["a = 1", "b = 2", "c = 3", "The answer is 3."]
    assert split_steps(text, max_steps=2) == ["a = 1", "b = 2 c = 3 The answer is 3."]


def test_chat_prompt_asks_for_steps_and_answer_line(tokenizer):
    text = build_prompt(tokenizer, "What is 2 + 3?", few_shot=1)
    assert "one its own line" not in text and "on its own line" in text
    assert "The answer is X." in text and text.rstrip().endswith("assistant")
    assert EXEMPLARS[0][0] in text


def test_prompt_without_chat_template_uses_few_shot(tokenizer):
    text = build_prompt(tokenizer, "What is 2 + 3?", use_chat_template=False, few_shot=2)
    assert text.count("Problem:") == 3 and text.endswith("Solution:\n")
    assert "\n".join(EXEMPLARS[1][1]) in text


def test_step_spans_follow_newlines(tokenizer):
    steps = ["First, 2 + 3 = 5.", "Then 5 * 2 = 10.", "The answer is 10."]
    ids = encode_solution(tokenizer, steps)
    nl = newline_token_ids(tokenizer)
    spans = step_spans(ids, nl, tokenizer)
    assert len(spans) == 3
    assert [tokenizer.decode(ids[a:b]).strip() for a, b in spans] == steps
    # spans tile the sequence; every span but the last ends with its newline token
    assert spans[0][0] == 0 and spans[-1][1] == len(ids)
    assert all(b == a2 for (_, b), (a2, _) in zip(spans, spans[1:]))
    assert all(ids[b - 1] in nl for _, b in spans[:-1])


def test_blank_lines_open_the_next_step_and_cap(tokenizer):
    ids = tokenizer("x = 1\n\n\ny = 2\nz = 3\nw = 4", add_special_tokens=False)["input_ids"]
    nl = newline_token_ids(tokenizer)
    spans = step_spans(ids, nl, tokenizer)
    assert [tokenizer.decode(ids[a:b]).strip() for a, b in spans] == ["x = 1", "y = 2", "z = 3", "w = 4"]
    capped = step_spans(ids, nl, tokenizer, max_steps=2)
    assert len(capped) == 2 and capped[-1][1] == len(ids)


def test_a_blank_tail_joins_the_last_step(tokenizer):
    enc = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in ("x = 1\n", "y = 2\n", "  ")]
    ids, a, b = enc[0] + enc[1] + enc[2], len(enc[0]), len(enc[0]) + len(enc[1])
    raw = [(0, a), (a, b), (b, len(ids))]  # the blank tail as its own span
    assert join_blank_tail(ids, raw, tokenizer) == [(0, a), (a, len(ids))]
    assert step_spans(ids, newline_token_ids(tokenizer), tokenizer) == [(0, a), (a, len(ids))]
    assert join_blank_tail(ids, raw[:2], tokenizer) == raw[:2]  # a non-blank last span stays
    assert join_blank_tail(ids, [(b, len(ids))], tokenizer) == [(b, len(ids))]  # a lone span stays


def test_prompt_ids_have_no_duplicate_bos(tokenizer):
    ids = prompt_ids(tokenizer, "What is 1 + 1?")
    assert ids[:2] != [ids[0], ids[0]]
    assert tokenizer.decode(ids).count("What is 1 + 1?") == 1


def test_answer_line_pattern():
    assert ANSWER_LINE.search("So the answer is 7.")
    assert ANSWER_LINE.search("#### 7") and ANSWER_LINE.search(r"\boxed{7}")
    assert not ANSWER_LINE.search("We add 3 and 4.")
