"""The rubric judge of Table 3 and Appendix E ("GPT-as-judge Evaluation Details").

Appendix E's pipeline: :func:`subsample` (up to 100 outputs per row of one pair, ``judge.pair``),
:func:`build_prompt`, a judge model answering in JSON with scores 1-10 for five criteria, and
:func:`parse_scores` (regex, then the default 5.5; a score on another stated scale is rescaled to 10;
every fallback is counted, so a table built on defaults says so).

Backends: any OpenAI-compatible server (``OpenAIBackend``; the key from OPENAI_API_KEY only, never cached
or written) or a local transformers model (``LocalBackend``). Every reply is cached on disk, keyed by
backend, model, base URL, temperature and prompt. "Hallucination" is scored as its *reduction* (10 = none),
so every column is higher-is-better. The steps and our readings of Appendix E: book/method.md.
"""
from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import re
import threading
from datetime import datetime, timezone
from email.utils import parsedate_to_datetime
from pathlib import Path
from time import sleep
from typing import NamedTuple, Protocol, Sequence

import pandas as pd
from tqdm.auto import tqdm

log = logging.getLogger(__name__)

CRITERIA = ("self_reflection", "algebra", "coherence", "hallucination", "overall")
LABELS = {"self_reflection": "S", "algebra": "A", "coherence": "C", "hallucination": "H", "overall": "Overall"}
DEFAULT_SCORE = 5.5  # the midpoint of 1..10: the score of a criterion that cannot be read from the reply
PARSE_LEVELS = ("json", "regex", "clipped", "default")  # how a score was read, from best to worst
REQUIRED_COLUMNS = ("config", "question", "gold", "steps", "pred")

SYSTEM = "You are a strict grader of step-by-step math solutions. Respond with JSON only."
# The format line uses placeholders, not numbers: a judge that echoes it verbatim gets defaults
# (counted) instead of plausible-looking scores.
INSTRUCTIONS = """Score the solution below on each criterion with an integer from 1 (worst) to 10 (best):
- "self_reflection": does it check or validate its own intermediate results?
- "algebra": are the calculations and algebraic manipulations correct?
- "coherence": does each step follow logically from the previous ones?
- "hallucination": are hallucinated steps avoided (10 = no step invents facts or numbers)?
- "overall": the overall quality of the reasoning.
Respond strictly with one JSON object with exactly these keys and integer values:
{"self_reflection": <score>, "algebra": <score>, "coherence": <score>, "hallucination": <score>, "overall": <score>}"""


class JudgeError(RuntimeError):
    pass


class RequestTimeout(Exception):
    """No complete reply within the wall-clock limit of one request (``timeout_s``), however the
    server paces its bytes. Retried like an HTTP 5xx."""


class NotAChatCompletion(Exception):
    """A judge server's HTTP 200 reply that is not a chat completion: a body that is not JSON (an
    HTML page, a truncated object), no ``choices``, or a first choice without message content.
    Retried like an HTTP 5xx; never scored or cached."""


# ---- prompt (Appendix E, step 2) --------------------------------------------------------------------


def build_prompt(question: str, gold: str, steps: Sequence[str], pred: str | None) -> list[dict]:
    """Chat messages asking for the five rubric scores of one solution."""
    numbered = "\n".join(f"Step {i}: {s}" for i, s in enumerate(steps, 1)) or "(no steps)"
    answer = "(none)" if pred is None or (isinstance(pred, float) and math.isnan(pred)) else pred
    user = (f"{INSTRUCTIONS}\n\nQuestion: {question}\nGround-truth answer: {gold}\n\nSolution:\n{numbered}\n\n"
            f"Final answer given: {answer}")
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}]


# ---- parsing (Appendix E, step 4) -------------------------------------------------------------------


class Parsed(NamedTuple):
    scores: dict[str, float]  # one score in 1..10 per criterion
    how: str  # the worst way any score was read: json < regex < clipped < default
    per_key: dict[str, str]  # how each score was read (one of PARSE_LEVELS)


# A scale stated with a score ("7/10", "7 out of 10", "7 on a 10-point scale", "7 on a scale of 1 to
# 10"), one stated for the whole reply ("on a 5-point scale", "a scale of 1-5", "a 1-5 scale"), and
# any scale wording after a score, readable or not ("7 out of ten", "7 on a scale").
_N = r"(\d+(?:\.\d+)?)"
_RANGE = r"\d+(?:\.\d+)?\s*(?:-|–|to)\s*"
# A scale named between a criterion and its score ("overall 10-point scale: 3", "overall (1-10 scale): 7",
# "overall, on a scale of 1 to 5: 4"): its best score is group "top" (one of three), never the score. A bare
# range is no scale ("overall (1-10): 7" echoes a requested format: no score).
_SCALE_BEFORE = (rf"(?:\W{{0,6}}?(?:on\s+)?(?:an?\s+|the\s+)?(?:(?P<top>\d+(?:\.\d+)?)[- ]point\s+scale"
                 rf"|scale\s+(?:of|from)\s+{_RANGE}(?P<top2>\d+(?:\.\d+)?)|{_RANGE}(?P<top3>\d+(?:\.\d+)?)\s+scale)"
                 r"(?![\d.])\)?)?")
# "algebra": 7 | Algebra: 7/10 | coherence = 8 | **Self-reflection score**: 4 | hallucinations 9.
# A number that starts a range ("overall (1-10): 7") or names a scale ("overall 10-point scale.") is not a score.
_KEY_RE = {k: re.compile(rf"{k.replace('_', '[ _-]?')}s?(?:\W*score)?{_SCALE_BEFORE}\W{{0,6}}?(?P<v>-?\d+(?:\.\d+)?)"
                         r"(?!\d|\.\d|\s*(?:-|–|to)\s*\d|\s*-?\s*point\s+scale|\s+scale\b)",
                         re.IGNORECASE) for k in CRITERIA}

_OWN_SCALE = re.compile(rf"\s*/\s*{_N}(?![\d.])|\s+out\s+of\s+{_N}(?![\d.])|\s+on\s+an?\s+{_N}[- ]point\s+scale"
                        rf"|\s+on\s+a\s+scale\s+(?:of|from)\s+{_RANGE}{_N}(?![\d.])", re.IGNORECASE)
_SCALE_WORDS = re.compile(r"\s*/|\s+out\s+of\b|\s+on\s+(?:an?|the)\b[^.,;\n]{0,30}?\bscale\b", re.IGNORECASE)
_REPLY_SCALE = re.compile(rf"\b{_N}[- ]point\s+scale|\bscale\s+(?:of|from)\s+{_RANGE}{_N}(?![\d.])"
                          rf"|\b{_RANGE}{_N}\s+scale", re.IGNORECASE)


def _on_scale(v: float, top: float | None) -> float | None:
    """A score ``v`` given on a scale whose best score is ``top``, as the same fraction of 10 (``10 v / top``);
    None (unreadable) when the scale is not a positive finite number or ``v`` lies outside 0..top."""
    if top is None or top == 10:
        return v
    if not (math.isfinite(top) and top > 0 and math.isfinite(v) and 0 <= v <= top):
        return None
    return 10 * v / top


def _reply_scale(text: str) -> float | None:
    """The best score of the one scale the reply states for itself (10 when it states none); None when
    it states several."""
    tops = {float(next(g for g in m.groups() if g)) for m in _REPLY_SCALE.finditer(text)}
    return 10.0 if not tops else tops.pop() if len(tops) == 1 else None


def _regex_score(k: str, text: str, top: float | None) -> float | None:
    """The number after criterion ``k``'s name (``_KEY_RE``), on the scale stated right after it or
    named before it ("overall 10-point scale: 3"), else on the reply's (``top``); None when there is
    none, its scale cannot be read, or the two named scales differ."""
    m = _KEY_RE[k].search(text)
    if not m:
        return None
    v, after = float(m.group("v")), text[m.end("v"):m.end("v") + 80]
    before = next((float(g) for g in (m.group("top"), m.group("top2"), m.group("top3")) if g), None)
    own = _OWN_SCALE.match(after)
    if own:
        stated = float(next(g for g in own.groups() if g))
        return None if before is not None and before != stated else _on_scale(v, stated)
    if before is not None:  # the reply's own scale does not override the one named for this score
        return None if _SCALE_WORDS.match(after) else _on_scale(v, before)
    return None if _SCALE_WORDS.match(after) or top is None else _on_scale(v, top)


def _norm_key(key: str) -> str:
    return re.sub(r"[^a-z]+", "_", key.lower()).strip("_")


def _json_scores(text: str) -> dict:
    """The {...} object in the text (bare, in prose or in a ```json fence) that names the most
    criteria, with its keys normalised ("Self-Reflection" -> "self_reflection"); {} if none."""
    best: dict = {}
    for m in re.finditer(r"\{[^{}]*\}", text):
        try:
            obj = json.loads(m.group(0))
        except ValueError:
            continue
        if isinstance(obj, dict):
            obj = {_norm_key(str(k)): v for k, v in obj.items()}
            if sum(k in obj for k in CRITERIA) > sum(k in best for k in CRITERIA):
                best = obj
    return best


def parse_scores(text: str | None) -> Parsed:
    """Read the five scores from a judge's reply; never raises.

    Per criterion: a number under its key in a JSON object ("json"); else the regex ``_KEY_RE``
    on the whole reply ("regex"); else ``DEFAULT_SCORE`` ("default"). A score given on a stated
    scale ("7/10", "3 out of 5", "4 on a 5-point scale", or a scale the reply states once for all
    its scores: "on a 1-5 scale") is read as the same fraction of 10 (3 out of 5 -> 6); a score whose
    scale cannot be read ("7 out of ten", a reply stating two scales, 6/5) counts as unreadable. A
    number outside 1..10 is clipped into it ("clipped"); a non-numeric or non-finite value counts
    as unreadable.
    """
    text = text if isinstance(text, str) else ""
    obj = _json_scores(text)
    top = _reply_scale(text)
    scores, per_key = {}, {}
    for k in CRITERIA:
        v, how = obj.get(k), "json"
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            v = None if top is None else _on_scale(float(v), top)
        else:
            v = _regex_score(k, text, top)
            how = "regex" if v is not None else "default"
        if v is None or not math.isfinite(v):
            v, how = DEFAULT_SCORE, "default"
        elif not 1 <= v <= 10:
            v, how = min(10.0, max(1.0, v)), "clipped"
        scores[k], per_key[k] = float(v), how
    return Parsed(scores, max(per_key.values(), key=PARSE_LEVELS.index), per_key)


# ---- backends (Appendix E, step 3) ------------------------------------------------------------------


class Backend(Protocol):
    name: str  # "openai" or "local"
    model: str
    base_url: str | None

    def complete(self, messages: list[dict], temperature: float) -> str: ...


class OpenAIBackend:
    """Any OpenAI-compatible chat-completions server through the ``openai`` client.

    The API key comes from OPENAI_API_KEY only (a server at ``base_url`` that needs none gets a
    dummy). ``timeout_s`` is a wall-clock limit per request, from sending it to the last byte of the
    reply (:class:`RequestTimeout`; a server that sends one byte at a time does not hold the judge
    longer). Requests that fail with HTTP 408/429/5xx, a timeout, a connection error, or an HTTP
    200 reply that is not a chat completion (:class:`NotAChatCompletion`; the body is read and
    checked here, not by the client, which would hand back an HTML page as a string), or that is
    larger than ``max_tokens`` allows (``max_reply_bytes``), are retried ``max_retries`` times,
    after ``backoff_s * 2**attempt`` seconds capped at ``max_backoff_s``, or after the server's
    ``Retry-After`` (seconds or an HTTP date) when it sends one, capped likewise; then, or on any
    other HTTP error, a ``JudgeError`` says what failed, naming the model and the server. A
    completion whose content is an empty string is a reply (scored with defaults, counted); a
    missing or null content is not.
    """

    name = "openai"
    REPLY_BYTES_PER_TOKEN = 64  # a generous bound on a token's JSON-escaped UTF-8 bytes
    REPLY_OVERHEAD_BYTES = 64 * 1024  # the JSON envelope (ids, usage, a refusal or logprobs field)

    def __init__(self, model: str = "gpt-4", base_url: str | None = None, timeout_s: float = 60.0,
                 max_retries: int = 4, backoff_s: float = 1.0, max_tokens: int = 300, max_backoff_s: float = 60.0):
        import openai

        key = os.environ.get("OPENAI_API_KEY")
        if not key and base_url is None:
            raise JudgeError("the openai judge needs OPENAI_API_KEY in the environment, or judge.base_url "
                             "(an OpenAI-compatible server)")
        if not (math.isfinite(timeout_s) and timeout_s > 0):
            raise JudgeError(f"timeout_s must be a finite number > 0, got {timeout_s!r}")
        self.model, self.base_url, self.timeout_s = model, base_url, timeout_s
        self.max_retries, self.backoff_s, self.max_tokens = max_retries, backoff_s, max_tokens
        self.max_backoff_s = max_backoff_s
        self.max_reply_bytes = self.REPLY_OVERHEAD_BYTES + self.REPLY_BYTES_PER_TOKEN * max_tokens
        self._openai = openai
        self._client = openai.OpenAI(api_key=key or "not-needed", base_url=base_url, timeout=timeout_s, max_retries=0)

    def _describe(self, e: Exception) -> str:
        """The error, naming the model and server, with the API key masked should a server echo it."""
        msg = f"{type(e).__name__}: {e}"
        key = os.environ.get("OPENAI_API_KEY")
        return (msg.replace(key, "***") if key else msg) + f" (model {self.model!r}, {self.base_url or 'api.openai.com'})"

    @staticmethod
    def _content(status: int, ctype: str, body: str) -> str:
        """The message content of the first choice of a successful (2xx) reply, or NotAChatCompletion."""
        what = f"HTTP {status} reply"
        try:
            data = json.loads(body)
        except ValueError:
            raise NotAChatCompletion(f"{what} is not JSON ({ctype}): {body[:200]!r}") from None
        choices = data.get("choices") if isinstance(data, dict) else None
        if not isinstance(choices, list) or not choices:
            raise NotAChatCompletion(f"{what} has no choices: {body[:200]!r}")
        message = choices[0].get("message") if isinstance(choices[0], dict) else None
        content = message.get("content") if isinstance(message, dict) else None
        if not isinstance(content, str):
            raise NotAChatCompletion(f"{what} has no message content in its first choice: {body[:200]!r}")
        return content

    def _fetch(self, messages: list[dict], temperature: float, cancel: threading.Event) -> str:
        """One request, its body read chunk by chunk: stops at ``max_reply_bytes`` or when cancelled."""
        with self._client.chat.completions.with_streaming_response.create(
                model=self.model, messages=messages, temperature=temperature, max_tokens=self.max_tokens) as resp:
            body = bytearray()
            for chunk in resp.iter_bytes():
                if cancel.is_set():
                    raise RequestTimeout("cancelled")
                body += chunk
                if len(body) > self.max_reply_bytes:
                    raise NotAChatCompletion(f"HTTP {resp.status_code} reply is larger than {self.max_reply_bytes} bytes, "
                                             f"far more than max_tokens={self.max_tokens} allows")
            return self._content(resp.status_code, resp.headers.get("content-type", "no content type"),
                                 bytes(body).decode("utf-8", "replace"))

    def _request(self, messages: list[dict], temperature: float) -> str:
        """``_fetch`` under a wall-clock limit: the request runs in a daemon thread, abandoned (and
        told to stop at its next chunk) when ``timeout_s`` has passed."""
        box: dict = {}
        done, cancel = threading.Event(), threading.Event()

        def work():
            try:
                box["reply"] = self._fetch(messages, temperature, cancel)
            except BaseException as e:  # handed to the caller
                box["error"] = e
            finally:
                done.set()

        threading.Thread(target=work, name="judge-request", daemon=True).start()
        if not done.wait(self.timeout_s):
            cancel.set()
            raise RequestTimeout(f"no complete reply within {self.timeout_s:g} s (wall clock)")
        if "error" in box:
            raise box["error"]
        return box["reply"]

    def _delay(self, attempt: int, err: Exception) -> float:
        """The wait before retry ``attempt + 1``: the server's Retry-After if it sent one, else
        exponential backoff; either capped at ``max_backoff_s``."""
        delay = self.backoff_s * 2 ** attempt
        headers = getattr(getattr(err, "response", None), "headers", None) or {}
        after = headers.get("retry-after") if hasattr(headers, "get") else None
        if after:
            try:
                delay = float(after)
            except ValueError:
                try:
                    delay = (parsedate_to_datetime(after) - datetime.now(timezone.utc)).total_seconds()
                except (TypeError, ValueError):
                    pass
        return min(max(0.0, delay), self.max_backoff_s) if math.isfinite(delay) else self.max_backoff_s

    def complete(self, messages: list[dict], temperature: float) -> str:
        o = self._openai
        attempt = 0
        while True:
            try:
                return self._request(messages, temperature)
            except o.APIStatusError as e:
                if e.status_code not in (408, 429) and e.status_code < 500:
                    raise JudgeError(f"judge request rejected with HTTP {e.status_code}: {self._describe(e)}") from None
                err: Exception = e
            except (o.APIConnectionError, NotAChatCompletion, RequestTimeout) as e:  # includes APITimeoutError
                err = e
            if attempt == self.max_retries:
                raise JudgeError(f"judge request failed after {attempt + 1} attempts: {self._describe(err)}") from None
            delay = self._delay(attempt, err)
            attempt += 1
            log.warning("judge request failed (%s), retry %d/%d in %.1f s", type(err).__name__, attempt,
                        self.max_retries, delay)
            sleep(delay)


class LocalBackend:
    """A local transformers chat model (offline): the chat template, then greedy decoding at
    temperature 0 or sampling (seeded by the prompt, so a reply is reproducible) above it."""

    name = "local"
    base_url = None

    def __init__(self, model: str = "smollm2-135m-instruct", max_new_tokens: int = 200):
        from ctrls.method.backbone import load_backbone

        self.model, self.max_new_tokens = model, max_new_tokens
        self._bb = load_backbone(model)

    def complete(self, messages: list[dict], temperature: float) -> str:
        import torch

        tok, m = self._bb.tokenizer, self._bb.model
        enc = tok.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
        enc = {k: v.to(self._bb.device) for k, v in enc.items()}
        seed = int(hashlib.sha256(json.dumps(messages).encode()).hexdigest()[:8], 16)
        with torch.no_grad(), torch.random.fork_rng():
            torch.manual_seed(seed)
            out = m.generate(**enc, max_new_tokens=self.max_new_tokens, do_sample=temperature > 0,
                             temperature=temperature if temperature > 0 else None, top_k=None, top_p=None,
                             pad_token_id=tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id)
        return tok.decode(out[0, enc["input_ids"].shape[1]:], skip_special_tokens=True)


def make_backend(jc) -> Backend:
    """The backend of a ``JudgeConfig``. ``backend``: "auto" (openai when OPENAI_API_KEY or
    ``base_url`` is set, else local), "openai" or "local"."""
    if jc.backend not in ("auto", "openai", "local"):
        raise JudgeError(f"judge.backend must be auto, openai or local, not {jc.backend!r}")
    use_openai = jc.backend == "openai" or (jc.backend == "auto" and bool(os.environ.get("OPENAI_API_KEY") or jc.base_url))
    if use_openai:
        return OpenAIBackend(jc.model, jc.base_url, jc.timeout_s, jc.max_retries)
    return LocalBackend(jc.local_model, jc.local_max_new_tokens)


# ---- the pipeline -----------------------------------------------------------------------------------


def subsample(df: pd.DataFrame, per_config: int = 100, seed: int = 0) -> pd.DataFrame:
    """Up to ``per_config`` rows of each ``config`` value, drawn with ``seed`` (the same rows for
    the same input in the same order)."""
    parts = [g.sample(n=min(per_config, len(g)), random_state=seed) for _, g in df.groupby("config", sort=False)]
    return pd.concat(parts).reset_index(drop=True) if parts else df.iloc[:0]


def cache_key(backend: Backend, messages: list[dict], temperature: float) -> str:
    """sha256 of what determines a reply: backend, model, base URL, temperature and prompt."""
    payload = json.dumps({"backend": backend.name, "model": backend.model, "base_url": backend.base_url,
                          "temperature": temperature, "messages": messages}, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()


def judge_one(backend: Backend, messages: list[dict], cache_dir: Path, temperature: float) -> tuple[str, bool]:
    """The raw reply, from ``cache_dir/<cache_key>.json`` when present, and whether it was cached.

    The file holds the reply and, for reading by eye, its parse; callers re-parse the reply, so a
    parser change applies to cached replies too. An unreadable file is replaced by a new reply.
    """
    f = Path(cache_dir) / f"{cache_key(backend, messages, temperature)}.json"
    if f.exists():
        try:
            return json.loads(f.read_text())["reply"], True
        except (ValueError, KeyError, TypeError):
            log.warning("unreadable judge cache file %s: asking the judge again", f)
    reply = backend.complete(messages, temperature)
    parsed = parse_scores(reply)
    record = {"backend": backend.name, "model": backend.model, "temperature": temperature, "messages": messages,
              "reply": reply, "scores": parsed.scores, "how": parsed.how, "per_key": parsed.per_key}
    tmp = f.with_name(f"{f.stem}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(record, indent=1))
    tmp.replace(f)
    return reply, False


def judge_samples(df: pd.DataFrame, backend: Backend, cache_dir: str | Path, temperature: float = 0.1,
                  progress: bool = True) -> pd.DataFrame:
    """Score every row (``question``, ``gold``, ``steps``, ``pred``) with the judge.

    Returns ``df`` with one column per criterion (``CRITERIA``), ``parse`` (the worst way a
    score of the row was read), ``parse_<criterion>``, ``judge_backend``, ``judge_model`` and
    ``cached``. Replies are cached as they come, so a run stopped by a ``JudgeError`` resumes.
    """
    missing = [c for c in REQUIRED_COLUMNS if c not in df.columns]
    if missing:
        raise ValueError(f"judge_samples needs the columns {list(REQUIRED_COLUMNS)}; missing: {missing}")
    cache_dir = Path(cache_dir)
    cache_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    for r in tqdm(df.itertuples(index=False), total=len(df), desc=f"judge ({backend.name}:{backend.model})",
                  disable=not progress):
        steps = [] if r.steps is None else list(r.steps)
        reply, cached = judge_one(backend, build_prompt(r.question, r.gold, steps, r.pred), cache_dir, temperature)
        p = parse_scores(reply)
        rows.append({**p.scores, "parse": p.how, **{f"parse_{k}": v for k, v in p.per_key.items()},
                     "judge_backend": backend.name, "judge_model": backend.model, "cached": cached})
    columns = [*CRITERIA, "parse", *(f"parse_{k}" for k in CRITERIA), "judge_backend", "judge_model", "cached"]
    return pd.concat([df.reset_index(drop=True), pd.DataFrame(rows, columns=columns)], axis=1)


# ---- the judge stage ------------------------------------------------------------------------------------


