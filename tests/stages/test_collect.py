"""Stage (b), ``cache_features``: the cached hidden states are those of one pass over each prompt and
trajectory, though the prompts' shared template runs once and each prompt once for its trajectories."""
import pandas as pd
import torch

import ctrls.stages.collect as collect
from ctrls.config.schema import load_config
from ctrls.data.problems import Problem
from ctrls.data.prompts import encode_prompt
from ctrls.generate.decoding import shared_prefix_length
from ctrls.stages.runs import load_torch

QUESTIONS = ["Tom has 3 apples and eats one. How many are left?", "What is 2 + 2?", "Ann has 5 pens."]
SOLUTIONS = {"q0": ["He eats one.\n3 - 1 = 2\nThe answer is 2", "3 - 1 = 2"],  # two lengths: right padding
             "q1": ["2 + 2 = 4\nThe answer is 4"],
             "q2": ["Ann has 5.\nShe keeps them.\nThe answer is 5", "5", "The answer is 5"]}


def test_cached_features_equal_one_pass_over_prompt_and_trajectory(tiny_llama, tmp_path, monkeypatch):
    cfg = load_config("smoke", ["prompt.few_shot=1"])
    tok = tiny_llama.tokenizer
    problems = [Problem(f"q{i}", q, "1", (), "gsm8k", "train") for i, q in enumerate(QUESTIONS)]
    sols = {q: [tok(s, add_special_tokens=False)["input_ids"] for s in ss] for q, ss in SOLUTIONS.items()}
    rows = [{"qid": q, "solution_ids": s, "source": "samples", "sample_index": m} for q, ss in sols.items()
            for m, s in enumerate(ss)]
    monkeypatch.setattr(collect, "kept_trajectories", lambda d: pd.DataFrame(rows))
    prompts = {p.id: encode_prompt(tok, p.question, cfg.prompt.use_chat_template, cfg.prompt.few_shot) for p in problems}
    assert shared_prefix_length([ids for ids, _ in prompts.values()]) > 0  # the template runs once
    out = tmp_path / "features"
    out.mkdir()
    assert collect.cache_features(cfg, tiny_llama, problems, tmp_path, out, progress=False) == {
        "trajectories": 6, "questions": 3}
    for p in problems:
        shard = load_torch(collect.shard_file(out, p.id))
        ids, start = prompts[p.id]
        assert len(shard["trajectories"]) == len(sols[p.id])
        for item, s in zip(shard["trajectories"], sols[p.id]):
            full = tiny_llama.hidden_states(torch.as_tensor([ids + s]))[0].float()
            assert item["hidden"].shape == (len(s) + 1, full.shape[1]) and item["targets"].tolist() == s
            torch.testing.assert_close(item["hidden"].float(), full[len(ids) - 1:], atol=3e-3, rtol=2e-3)
        full = tiny_llama.hidden_states(torch.as_tensor([ids]))[0].float()
        torch.testing.assert_close(shard["question_hidden"].float(), full[start:], atol=3e-3, rtol=2e-3)
