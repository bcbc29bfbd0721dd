"""The rubric judge of Table 3 and Appendix D ("GPT-as-judge").

1. Subsample up to 100 outputs per configuration (seeded).
2. Build a prompt with the question, the gold answer, the numbered steps and the final answer,
   asking for JSON scores from 1 to 10 for self-reflection, algebra, coherence, hallucination
   and overall, at temperature 0.1.
3. Parse the JSON; on failure fall back to a regex, then to the default (the scale's midpoint);
   out-of-range scores are clipped. Every fallback is counted and shown in the table.

Backends: any OpenAI-compatible server through the ``openai`` client (GPT-4 when OPENAI_API_KEY
is set; vLLM, Ollama or ``transformers serve`` via ``base_url``), or a local transformers model.
Every judgement is cached on disk, keyed by backend, model, temperature and a hash of the prompt,
so re-rendering the book costs nothing. The API key is read from the environment only and is
never written anywhere.

On "hallucination": the paper's criterion is "reduction of hallucinated steps" and its table
header carries a down arrow, yet its values are on the same higher-is-better scale as the other
criteria. We ask for the reduction (10 = no hallucinated step), so every column is higher-is-better.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, Sequence

import numpy as np
import pandas as pd
from tqdm.auto import tqdm

log = logging.getLogger(__name__)

CRITERIA = ("self_reflection", "algebra", "coherence", "hallucination", "overall")
LABELS = {"self_reflection": "S", "algebra": "A", "coherence": "C", "hallucination": "H", "overall": "Overall"}
DEFAULT_SCORE = 5.5  # the midpoint of 1..10, used when a score cannot be read

SYSTEM = "You are a strict grader of step-by-step math solutions. Respond with JSON only."
INSTRUCTIONS = """Score the solution below on each criterion with an integer from 1 (worst) to 10 (best):
- "self_reflection": does it check or validate its own intermediate results?
- "algebra": are the calculations and algebraic manipulations correct?
- "coherence": does each step follow logically from the previous ones?
- "hallucination": are hallucinated steps avoided (10 = no step invents facts or numbers)?
- "overall": the overall quality of the reasoning.
Respond strictly with one JSON object with exactly these keys, for example:
{"self_reflection": 6, "algebra": 8, "coherence": 7, "hallucination": 9, "overall": 7}"""

# Table 3 of the paper: GPT-4 rubric scores on GSM8K with Qwen2.5-3B-Instruct (100 samples each).
PAPER_TABLE3 = pd.DataFrame(
    [("Base", 7.62, 8.44, 8.23, 8.51, 8.05),
     ("ε=0.0, H=0.0", 7.82, 8.83, 8.43, 8.66, 8.34),
     ("ε=0.1, H=0.0", 7.74, 8.65, 8.33, 8.51, 8.17),
     ("ε=0.1, H=0.01", 7.73, 8.54, 8.35, 8.55, 8.16),
     ("ε=0.3, H=0.0", 7.80, 8.77, 8.45, 8.68, 8.30),
     ("ε=0.3, H=0.01", 7.72, 8.73, 8.37, 8.60, 8.20)],
    columns=["setting", "S", "A", "C", "H", "Overall"])


class JudgeError(RuntimeError):
    pass


# ---- prompt and parsing -----------------------------------------------------------------------------


def build_prompt(question: str, gold: str, steps: Sequence[str], pred: str | None) -> list[dict]:
    numbered = "\n".join(f"Step {i}: {s}" for i, s in enumerate(steps, 1)) or "(no steps)"
    user = (f"{INSTRUCTIONS}\n\nQuestion: {question}\nGround-truth answer: {gold}\n\nSolution:\n{numbered}\n\n"
            f"Final answer given: {pred if pred is not None else '(none)'}")
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}]


_KEY_RE = {k: re.compile(rf"{k.replace('_', '[ _-]?')}\W{{0,6}}?(-?\d+(?:\.\d+)?)", re.IGNORECASE) for k in CRITERIA}


def _json_objects(text: str):
    """Every {...} object in the text that parses as JSON (innermost first)."""
    for m in re.finditer(r"\{[^{}]*\}", text, re.DOTALL):
        try:
            obj = json.loads(m.group(0))
        except json.JSONDecodeError:
            continue
        if isinstance(obj, dict):
            yield obj


def parse_scores(text: str) -> tuple[dict[str, float], dict[str, str]]:
    """Scores per criterion and, per criterion, how it was read: json, regex, clipped or default."""
    scores: dict[str, float] = {}
    how: dict[str, str] = {}
    obj = next((o for o in _json_objects(text or "") if set(CRITERIA) & set(o)), {})
    for k in CRITERIA:
        v, src = obj.get(k), "json"
        if not isinstance(v, (int, float)) or isinstance(v, bool):
            m = _KEY_RE[k].search(text or "")
            v, src = (float(m.group(1)), "regex") if m else (None, "default")
        if v is None or not np.isfinite(v):
            scores[k], how[k] = DEFAULT_SCORE, "default"
            continue
        if not 1 <= v <= 10:
            v, src = float(min(10, max(1, v))), "clipped"
        scores[k], how[k] = float(v), src
    return scores, how


def worst(how: dict[str, str]) -> str:
    for level in ("default", "clipped", "regex"):
        if level in how.values():
            return level
    return "json"


# ---- backends -----------------------------------------------------------------------------------------


class Backend(Protocol):
    name: str
    model: str
    base_url: str | None

    def complete(self, messages: list[dict], temperature: float) -> str: ...


class OpenAIBackend:
    """Any OpenAI-compatible chat-completions server, with retries and exponential backoff on
    429, 5xx, timeouts and connection errors."""

    name = "openai"

    def __init__(self, model: str = "gpt-4", base_url: str | None = None, timeout_s: float = 60.0,
                 max_retries: int = 4, backoff_s: float = 1.0):
        import openai

        key = os.environ.get("OPENAI_API_KEY")
        if not key and base_url is None:
            raise JudgeError("the openai judge needs OPENAI_API_KEY in the environment, or a base_url")
        self.model, self.base_url, self.max_retries, self.backoff_s = model, base_url, max_retries, backoff_s
        self._openai = openai
        self._client = openai.OpenAI(api_key=key or "not-needed", base_url=base_url, timeout=timeout_s, max_retries=0)

    def complete(self, messages: list[dict], temperature: float) -> str:
        o = self._openai
        for attempt in range(self.max_retries + 1):
            try:
                r = self._client.chat.completions.create(model=self.model, messages=messages, temperature=temperature,
                                                         max_tokens=300)
                return r.choices[0].message.content or ""
            except (o.RateLimitError, o.InternalServerError, o.APITimeoutError, o.APIConnectionError) as e:
                if attempt == self.max_retries:
                    raise JudgeError(f"judge request failed after {attempt + 1} attempts: {type(e).__name__}: {e}") from e
                delay = self.backoff_s * 2 ** attempt
                log.warning("judge request failed (%s), retrying in %.1f s", type(e).__name__, delay)
                time.sleep(delay)
        raise AssertionError("unreachable")


class LocalBackend:
    """A local transformers chat model (offline)."""

    name = "local"
    base_url = None

    def __init__(self, model: str = "smollm2-135m-instruct", max_new_tokens: int = 120):
        from ctrls.backbone import load_backbone

        self.model, self.max_new_tokens = model, max_new_tokens
        self._bb = load_backbone(model)

    def complete(self, messages: list[dict], temperature: float) -> str:
        import torch

        tok, m = self._bb.tokenizer, self._bb.model
        ids = tok.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
        ids = {k: v.to(self._bb.device) for k, v in ids.items()}
        with torch.no_grad():
            out = m.generate(**ids, max_new_tokens=self.max_new_tokens, do_sample=temperature > 0,
                             temperature=temperature if temperature > 0 else None, top_k=None, top_p=None,
                             pad_token_id=tok.pad_token_id)
        return tok.decode(out[0, ids["input_ids"].shape[1]:], skip_special_tokens=True)


def make_backend(jc) -> Backend:
    """``judge.backend``: auto (openai when OPENAI_API_KEY or base_url is set, else local), openai, local."""
    use_openai = jc.backend == "openai" or (jc.backend == "auto" and (os.environ.get("OPENAI_API_KEY") or jc.base_url))
    if use_openai:
        return OpenAIBackend(jc.model, jc.base_url, jc.timeout_s, jc.max_retries)
    return LocalBackend(jc.local_model, jc.local_max_new_tokens)


# ---- the pipeline -----------------------------------------------------------------------------------


def subsample(df: pd.DataFrame, per_config: int = 100, seed: int = 0) -> pd.DataFrame:
    """Up to ``per_config`` rows of each ``config`` value, seeded."""
    parts = [g.sample(n=min(per_config, len(g)), random_state=seed) for _, g in df.groupby("config", sort=False)]
    return pd.concat(parts).reset_index(drop=True) if parts else df.iloc[:0]


def cache_key(backend: Backend, messages: list[dict], temperature: float) -> str:
    payload = json.dumps({"backend": backend.name, "model": backend.model, "base_url": backend.base_url,
                          "temperature": temperature, "messages": messages}, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()


def judge_one(backend: Backend, messages: list[dict], cache_dir: Path, temperature: float) -> tuple[str, bool]:
    """The raw reply (from the cache when present) and whether it was cached."""
    f = Path(cache_dir) / f"{cache_key(backend, messages, temperature)}.json"
    if f.exists():
        return json.loads(f.read_text())["reply"], True
    reply = backend.complete(messages, temperature)
    tmp = f.with_suffix(".tmp")
    tmp.write_text(json.dumps({"backend": backend.name, "model": backend.model, "reply": reply}))
    tmp.replace(f)
    return reply, False


def judge_samples(df: pd.DataFrame, backend: Backend, cache_dir: str | Path, temperature: float = 0.1,
                  progress: bool = True) -> pd.DataFrame:
    """Score every row (question, gold, steps, pred); adds one column per criterion and the parse path."""
    cache_dir = Path(cache_dir)
    cache_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    for r in tqdm(df.itertuples(index=False), total=len(df), desc=f"judge ({backend.name}:{backend.model})",
                  disable=not progress):
        msgs = build_prompt(r.question, r.gold, list(r.steps), r.pred)
        reply, cached = judge_one(backend, msgs, cache_dir, temperature)
        scores, how = parse_scores(reply)
        rows.append({**scores, "parse": worst(how), **{f"parse_{k}": v for k, v in how.items()},
                     "judge_backend": backend.name, "judge_model": backend.model, "cached": cached})
    return pd.concat([df.reset_index(drop=True), pd.DataFrame(rows)], axis=1)


def rubric_table(judged: pd.DataFrame, n_boot: int = 2000, seed: int = 0) -> pd.DataFrame:
    """Per config: n, mean score per criterion with a 95% bootstrap CI over samples, and the
    number of scores read by regex, clipped, or defaulted."""
    from ctrls.metrics import bootstrap_ci

    out = []
    for cfg, g in judged.groupby("config", sort=False):
        row = {"config": cfg, "n": len(g)}
        for k in CRITERIA:
            m, lo, hi = bootstrap_ci(g[k].to_numpy(), n_boot=n_boot, seed=seed)
            row[LABELS[k]] = f"{m:.2f} [{lo:.2f}, {hi:.2f}]"
        how = g[[f"parse_{k}" for k in CRITERIA]].to_numpy().ravel()
        row.update({"scores read by regex": int((how == "regex").sum()), "clipped": int((how == "clipped").sum()),
                    "defaulted": int((how == "default").sum())})
        out.append(row)
    return pd.DataFrame(out)


# ---- the judge stage ------------------------------------------------------------------------------------


def judged_configs(cfg) -> pd.DataFrame:
    """The outputs Table 3 scores: Base from the exploration stage and every RL policy of Table 2,
    at eta = rl.temperature, labelled in the paper's "ε=…, H=…" style."""
    from ctrls.exploration import BASE, load_samples
    from ctrls.rl import load_table2_samples

    ex = load_samples(cfg)
    base = ex[(ex.config == BASE) & (ex.temperature == cfg.rl.temperature)].assign(setting="Base")
    parts = [base]
    try:
        rl = load_table2_samples(cfg)
        parts.append(rl.assign(setting=[f"ε={e:.1f}, H={a:g}" for e, a in zip(rl.epsilon, rl.alpha)]))
    except FileNotFoundError:  # no RL stage: judge the exploration rows instead
        ctrls_rows = ex[(ex.config != BASE) & (ex.temperature == cfg.rl.temperature)]
        parts.append(ctrls_rows.assign(setting=[f"ε={e:.1f}, H=0 (no RL)" for e in ctrls_rows.epsilon]))
    out = pd.concat(parts, ignore_index=True)
    return out.assign(config=out.setting)


def run_judge(cfg, force: bool = False, progress: bool = True) -> pd.DataFrame:
    """Subsample, judge (cached) and return the judged rows; written to runs/<profile>/judge/."""
    from ctrls.runs import Stage

    backend = make_backend(cfg.judge)
    stage = Stage(cfg, "judge", ("judge", "seed", "grid", "rl", "data"), upstream=(backend.name, backend.model))
    out = stage.dir / "judged.parquet"
    if stage.is_done() and not force and out.exists():
        return pd.read_parquet(out)
    stage.begin(keep=True)  # never cleared: the reply cache lives here, keyed by prompt
    picked = subsample(judged_configs(cfg), cfg.judge.samples_per_config, seed=cfg.seed)
    judged = judge_samples(picked, backend, stage.dir / "cache", cfg.judge.temperature, progress)
    judged.to_parquet(out)
    stage.finish(rows=len(judged), backend=backend.name, model=backend.model,
                 fallbacks=int((judged.parse != "json").sum()))
    return judged
