"""Data: benchmark problems, answer checking, prompts and the procedural word problems.

Floor 2: imports ``ctrls.errors`` and ``ctrls.stats`` only; it never sees the config (stages pass plain values).

- ``problems``: GSM8K, MATH, GSM-Symbolic and local JSONL as :class:`~ctrls.data.problems.Problem` rows;
- ``answers``: final-answer extraction and grading (math-verify);
- ``prompts``: chat templates and few-shot exemplars;
- ``word_problems``: the procedural dataset and its difficulty;
- ``names``: names that become path components, injectively.

A new dataset: a loader in ``problems`` and its name in ``DATASETS``.
"""
