"""The rubric judge (Table 3, App. E): parsing fallbacks, retries, caching, key hygiene, and a
real ``transformers serve`` server."""
import json
import math
import os
import random
import re
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace
from typing import NamedTuple

import pandas as pd
import pytest

from ctrls.generate import judge
from ctrls.generate.judge import (
    CRITERIA,
    DEFAULT_SCORE,
    JudgeError,
    LocalBackend,
    OpenAIBackend,
    build_prompt,
    judge_samples,
    make_backend,
    parse_scores,
    subsample,
)
from ctrls.report.paper import PAPER_TABLE3
from ctrls.report.tables import rubric_table

ROOT = Path(__file__).resolve().parents[2]

FAKE_KEY = "sk-test-" + "k3y" * 8
GOOD = '{"self_reflection": 6, "algebra": 8, "coherence": 7, "hallucination": 9, "overall": 7}'
D = DEFAULT_SCORE


def samples(n=3):
    return pd.DataFrame([{"config": "Base" if i % 2 else "eps=0.1", "question_id": f"q{i}", "question": f"What is {i}+1?",
                          "gold": str(i + 1), "steps": [f"{i} + 1 = {i + 1}.", f"The answer is {i + 1}."],
                          "pred": str(i + 1), "correct": True} for i in range(n)])


# ---- prompt and parsing --------------------------------------------------------------------------------


def test_prompt_carries_question_gold_numbered_steps_answer_and_keys():
    msgs = build_prompt("What is 2+3?", "5", ["2 + 3 = 5.", "So 5."], "5")
    assert [m["role"] for m in msgs] == ["system", "user"]
    user = msgs[1]["content"]
    for part in ("Question: What is 2+3?", "Ground-truth answer: 5", "Step 1: 2 + 3 = 5.", "Step 2: So 5.",
                 "Final answer given: 5", "JSON", *(f'"{k}"' for k in CRITERIA)):
        assert part in user, part
    assert "Final answer given: (none)" in build_prompt("q", "1", [], None)[1]["content"]
    assert "Final answer given: (none)" in build_prompt("q", "1", [], float("nan"))[1]["content"]  # None via parquet
    assert "(no steps)" in build_prompt("q", "1", [], None)[1]["content"]


@pytest.mark.parametrize("reply,expect,per_key", [
    (GOOD, [6, 8, 7, 9, 7], "jjjjj"),
    ('Sure! ```json\n{"self_reflection": 3, "algebra": 4, "coherence": 5, "hallucination": 6, "overall": 4}\n```',
     [3, 4, 5, 6, 4], "jjjjj"),
    ('Here is my grading. {"Self-Reflection": 2, "Algebra": 9, "COHERENCE": 5.5, "hallucination": 6, "overall": 4} '
     'Hope this helps {"note": 1}', [2, 9, 5.5, 6, 4], "jjjjj"),
    # partial JSON: the two complete pairs come from the regex, the rest default
    ('{"self_reflection": 6, "algebra": 8, "coher', [6, 8, D, D, D], "rrddd"),
    ("Self-reflection: 4/10, Algebra: 9, coherence = 8, hallucinations 7, Overall score: 6.", [4, 9, 8, 7, 6], "rrrrr"),
    ('{"self_reflection": 15, "algebra": 0, "coherence": 7, "hallucination": 9, "overall": 7}', [10, 1, 7, 9, 7], "ccjjj"),
    ("algebra: 12, coherence: -3", [D, 10, 1, D, D], "dccdd"),
    ('{"self_reflection": "high", "algebra": true, "coherence": null, "hallucination": NaN, "overall": [7]}',
     [D, D, D, D, 7], "ddddr"),
    ('{"self_reflection": "8", "algebra": 8, "coherence": 7, "hallucination": 9, "overall": 7}', [8, 8, 7, 9, 7], "rjjjj"),
    ("I cannot grade this.", [D] * 5, "ddddd"),
    ("", [D] * 5, "ddddd"),
    (None, [D] * 5, "ddddd"),
    # a judge that echoes the requested format (placeholders, a range) gives no numbers
    (judge.INSTRUCTIONS, [D] * 5, "ddddd"),
    ("overall (1-10): 7", [D] * 5, "ddddd"),
])
def test_parse_scores_and_fallbacks(reply, expect, per_key):
    p = parse_scores(reply)
    assert [p.scores[k] for k in CRITERIA] == expect
    names = {"j": "json", "r": "regex", "c": "clipped", "d": "default"}
    assert [p.per_key[k] for k in CRITERIA] == [names[c] for c in per_key]
    assert p.how == max((names[c] for c in per_key), key=judge.PARSE_LEVELS.index)


def test_parse_never_raises_on_garbage():
    rng = random.Random(0)
    alphabet = '{}[]":,0123456789-.eE \n`abcdefghijklmnopqrstuvwxyz_/\\\x00\u00e9'
    texts = ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 80))) for _ in range(300)]
    texts += ['{"algebra": 1e999}', '{"algebra": -1e999}', '{' * 500, '{"a": {"b": ' * 50, GOOD[:-1] * 3]
    for t in texts:
        p = parse_scores(t)
        assert all(1 <= v <= 10 and math.isfinite(v) for v in p.scores.values()), t
        assert set(p.per_key.values()) <= set(judge.PARSE_LEVELS)


# ---- an OpenAI-compatible server in-process -------------------------------------------------------------


class Raw(NamedTuple):
    """A reply body sent as it is, in place of a chat completion or an error object."""
    body: str
    content_type: str = "application/json"


class FakeServer:
    """/v1/chat/completions that plays a script of (status, delay_s, reply); the last entry repeats.
    A ``Raw`` reply is sent verbatim with its content type."""

    def __init__(self, script):
        self.script, self.calls, self.headers, self.bodies = list(script), 0, [], []
        self.release = threading.Event()  # set at close: a reply still "thinking" ends then, not after its delay
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_POST(self):
                fake.bodies.append(json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0)))))
                fake.headers.append({k.lower(): v for k, v in self.headers.items()})
                status, delay, reply = fake.script[min(fake.calls, len(fake.script) - 1)]
                fake.calls += 1
                fake.release.wait(delay)
                ok = {"id": "x", "object": "chat.completion", "created": 0, "model": "m",
                      "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": reply}}]}
                body = json.dumps(ok if status == 200 else {"error": {"message": reply}}).encode()
                ctype = "application/json"
                if isinstance(reply, Raw):
                    body, ctype = reply.body.encode(), reply.content_type
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", ctype)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except OSError:  # the client gave up (timeout)
                    pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def close(self):
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server():
    servers = []

    def make(script):
        servers.append(FakeServer(script))
        return servers[-1]
    yield make
    for s in servers:
        s.close()


@pytest.fixture
def sleeps(monkeypatch):
    """Record the backoff delays instead of sleeping them."""
    slept = []
    monkeypatch.setattr(judge, "sleep", slept.append)
    return slept


@pytest.mark.parametrize("status", [500, 503, 429])
def test_transient_errors_are_retried_with_exponential_backoff(server, sleeps, tmp_path, status):
    srv = server([(status, 0, "busy"), (status, 0, "busy"), (200, 0, GOOD)])
    be = OpenAIBackend("m", base_url=srv.url, max_retries=3, backoff_s=0.5)
    out = judge_samples(samples(1), be, tmp_path, progress=False)
    assert srv.calls == 3 and sleeps == [0.5, 1.0]
    assert out.overall[0] == 7 and out.parse[0] == "json" and not out.cached[0]
    assert srv.bodies[-1]["temperature"] == 0.1 and srv.bodies[-1]["model"] == "m"


def test_persistent_server_error_is_a_clear_error_after_max_retries(server, sleeps, tmp_path):
    srv = server([(500, 0, "the server is on fire")])
    be = OpenAIBackend("judge-model", base_url=srv.url, max_retries=2, backoff_s=0.01)
    with pytest.raises(JudgeError, match=r"after 3 attempts.*InternalServerError.*judge-model") as e:
        judge_samples(samples(1), be, tmp_path, progress=False)
    assert srv.calls == 3 and "on fire" in str(e.value)
    assert not list(tmp_path.glob("*.json"))  # nothing cached for a failed request


def test_timeouts_are_retried_then_fail_or_succeed(server, sleeps, tmp_path):
    # The slow reply never comes in time (60 s); the timeout leaves an instant local reply 1 s, since
    # 0.2 s once failed under a loaded CI machine.
    slow = server([(200, 60.0, GOOD)])
    with pytest.raises(JudgeError, match="after 2 attempts.*Timeout"):
        judge_samples(samples(1), OpenAIBackend("m", base_url=slow.url, timeout_s=1.0, max_retries=1), tmp_path,
                      progress=False)
    assert slow.calls == 2
    once = server([(200, 60.0, GOOD), (200, 0, GOOD)])
    out = judge_samples(samples(1), OpenAIBackend("m", base_url=once.url, timeout_s=1.0, max_retries=1), tmp_path,
                        progress=False)
    assert once.calls == 2 and out.overall[0] == 7


def test_connection_refused_is_retried_then_an_error(sleeps, tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed when the block ends: nothing listens there
    be = OpenAIBackend("m", base_url=f"http://127.0.0.1:{port}/v1", max_retries=2, backoff_s=0.01)
    with pytest.raises(JudgeError, match="after 3 attempts.*APIConnectionError"):
        be.complete(build_prompt("q", "1", ["s"], "1"), 0.1)
    assert len(sleeps) == 2


@pytest.mark.parametrize("status", [400, 401, 404])
def test_client_errors_are_not_retried(server, sleeps, tmp_path, status, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", FAKE_KEY)
    srv = server([(status, 0, f"Server is pinned to 'x'; key {FAKE_KEY} rejected")])
    with pytest.raises(JudgeError, match=f"HTTP {status}.*pinned to 'x'") as e:
        OpenAIBackend("m", base_url=srv.url).complete(build_prompt("q", "1", ["s"], "1"), 0.1)
    assert srv.calls == 1 and sleeps == [] and FAKE_KEY not in str(e.value)


NOT_COMPLETIONS = {
    "truncated JSON": (Raw('{"id": "x", "object": "chat.completion", "choices": [{"message": {"content": "{\\"alg'),
                       "is not JSON"),
    "an HTML page": (Raw(f"<html><body><h1>Gateway</h1>token {FAKE_KEY}</body></html>", "text/html; charset=utf-8"),
                     r"is not JSON \(text/html"),
    "JSON sent as text/plain, no choices": (Raw('{"object": "list", "data": []}', "text/plain"), "has no choices"),
    "choices: []": (Raw('{"id": "x", "object": "chat.completion", "created": 0, "model": "m", "choices": []}'),
                    "has no choices"),
    "an error object": (Raw('{"error": {"message": "model is loading"}}'), "has no choices.*model is loading"),
    "a list": (Raw("[]"), "has no choices"),
    "content null": (Raw('{"id": "x", "choices": [{"index": 0, "finish_reason": "stop", '
                         '"message": {"role": "assistant", "content": null}}]}'), "has no message content"),
    "no message": (Raw('{"id": "x", "choices": [{"index": 0, "finish_reason": "length"}]}'), "has no message content"),
    "content not a string": (Raw('{"id": "x", "choices": [{"message": {"role": "assistant", "content": 7}}]}'),
                             "has no message content"),
}


@pytest.mark.parametrize("reply,why", NOT_COMPLETIONS.values(), ids=NOT_COMPLETIONS.keys())
def test_a_200_that_is_not_a_chat_completion_is_retried_then_an_error(server, sleeps, tmp_path, monkeypatch, reply,
                                                                       why):
    monkeypatch.setenv("OPENAI_API_KEY", FAKE_KEY)
    srv = server([(200, 0, reply)])
    be = OpenAIBackend("judge-model", base_url=srv.url, timeout_s=10, max_retries=2, backoff_s=0.5)
    with pytest.raises(JudgeError, match=rf"after 3 attempts: NotAChatCompletion: HTTP 200 reply {why}") as e:
        judge_samples(samples(1), be, tmp_path, progress=False)
    assert srv.calls == 3 and sleeps == [0.5, 1.0]  # the retry policy of a 5xx
    assert f"'judge-model', {srv.url})" in str(e.value) and FAKE_KEY not in str(e.value)  # names model and server
    assert not list(tmp_path.glob("*.json"))  # nothing cached, no score recorded


def test_a_bad_200_then_a_completion_is_scored_from_the_completion(server, sleeps, tmp_path):
    srv = server([(200, 0, NOT_COMPLETIONS["an HTML page"][0]), (200, 0, NOT_COMPLETIONS["choices: []"][0]),
                  (200, 0, GOOD)])
    out = judge_samples(samples(1), OpenAIBackend("m", base_url=srv.url, timeout_s=10, max_retries=2, backoff_s=0.5),
                        tmp_path, progress=False)
    assert srv.calls == 3 and sleeps == [0.5, 1.0]
    assert out.overall[0] == 7 and out.parse[0] == "json"
    (f,) = tmp_path.glob("*.json")
    assert json.loads(f.read_text())["reply"] == GOOD


def test_an_empty_content_is_a_reply(server, sleeps, tmp_path):
    """A completion whose content is "" is the judge's answer: scored with defaults (counted), not retried."""
    srv = server([(200, 0, "")])
    out = judge_samples(samples(1), OpenAIBackend("m", base_url=srv.url, timeout_s=10), tmp_path, progress=False)
    assert srv.calls == 1 and sleeps == [] and out.parse[0] == "default" and out.overall[0] == D


# ---- cache and key hygiene --------------------------------------------------------------------------------


def test_cache_hit_makes_no_call_and_the_key_is_never_stored(server, tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", FAKE_KEY)
    srv = server([(200, 0, "Algebra: 9. Nothing else.")])
    be = OpenAIBackend("m", base_url=srv.url)
    first = judge_samples(samples(3), be, tmp_path, progress=False)
    again = judge_samples(samples(3), be, tmp_path, progress=False)
    assert srv.calls == 3 and again.cached.all() and not first.cached.any()
    pd.testing.assert_frame_equal(first.drop(columns="cached"), again.drop(columns="cached"))
    assert srv.headers[0]["authorization"] == f"Bearer {FAKE_KEY}"  # sent to the server, stored nowhere
    files = list(tmp_path.rglob("*"))
    assert len(files) == 3 and all(FAKE_KEY not in f.read_text() for f in files)
    assert FAKE_KEY not in first.to_csv() and FAKE_KEY not in again.to_csv()
    record = json.loads(files[0].read_text())
    assert record["reply"] == "Algebra: 9. Nothing else." and record["scores"]["algebra"] == 9
    assert record["per_key"]["algebra"] == "regex" and record["how"] == "default"
    # another temperature, model or server is another judgement
    judge_samples(samples(1), be, tmp_path, temperature=0.0, progress=False)
    judge_samples(samples(1), OpenAIBackend("m2", base_url=srv.url), tmp_path, progress=False)
    assert srv.calls == 5


def test_unreadable_cache_file_is_replaced(tmp_path):
    class Counting:
        name, model, base_url, calls = "fake", "f", None, 0

        def complete(self, messages, temperature):
            self.calls += 1
            return GOOD

    be = Counting()
    judge_samples(samples(1), be, tmp_path, progress=False)
    (f,) = tmp_path.glob("*.json")
    f.write_text('{"reply": "trunc')
    out = judge_samples(samples(1), be, tmp_path, progress=False)
    assert be.calls == 2 and not out.cached[0] and json.loads(f.read_text())["reply"] == GOOD


# ---- the pipeline ------------------------------------------------------------------------------------------


class Scripted:
    """A backend replying from a list, in order."""
    name, model, base_url = "fake", "scripted", None

    def __init__(self, replies):
        self.replies = list(replies)

    def complete(self, messages, temperature):
        return self.replies.pop(0)


def test_judge_samples_columns_and_rubric_table_counts(tmp_path):
    df = pd.DataFrame({"config": ["Base", "Base", "Base", "eps=0.1"], "question": list("abcd"), "gold": ["1"] * 4,
                       "steps": [["x"], ["y"], ["z"], ["w"]], "pred": ["1", None, "2", "1"]})
    replies = [GOOD, '{"self_reflection": 2, "algebra": 4, "coherence": 3, "hallucination": 1, "overall": 2}',
               "no idea", "Algebra: 12, overall: 9"]
    out = judge_samples(df, Scripted(replies), tmp_path, progress=False)
    assert list(out.parse) == ["json", "json", "default", "default"]
    assert list(out.judge_backend.unique()) == ["fake"] and list(out.judge_model.unique()) == ["scripted"]
    assert out.algebra.tolist() == [8, 4, D, 10] and out.overall.tolist() == [7, 2, D, 9]
    t = rubric_table(out, n_boot=200).set_index("config")
    assert t.loc["Base", "n"] == 3 and t.loc["eps=0.1", "n"] == 1
    assert t.loc["Base", "defaulted"] == 5 and t.loc["Base", "scores read by regex"] == 0
    assert (t.loc["eps=0.1", "scores read by regex"], t.loc["eps=0.1", "clipped"], t.loc["eps=0.1", "defaulted"]) == (1, 1, 3)
    mean, lo, hi = map(float, re.findall(r"[\d.]+", t.loc["Base", "A"]))
    assert mean == pytest.approx((8 + 4 + D) / 3, abs=0.005) and lo <= mean <= hi and lo < hi
    assert t.loc["eps=0.1", "Overall"] == "9.00 (n = 1, no interval)"  # one judged row: no zero-width interval


def test_judge_samples_names_missing_columns(tmp_path):
    with pytest.raises(ValueError, match=r"missing: \['gold', 'steps'\]"):
        judge_samples(samples(2).drop(columns=["gold", "steps"]), Scripted([]), tmp_path, progress=False)


def test_subsample_is_seeded_and_capped():
    df = pd.concat([samples(10)] * 3, ignore_index=True)
    a, b = subsample(df, 4, seed=1), subsample(df, 4, seed=1)
    pd.testing.assert_frame_equal(a, b)
    assert a.groupby("config").size().to_dict() == {"Base": 4, "eps=0.1": 4}
    assert not a.equals(subsample(df, 4, seed=2))
    assert len(subsample(df, 100)) == len(df)  # small configs are kept whole


def test_make_backend_picks_openai_or_local(monkeypatch):
    import ctrls.method.backbone

    monkeypatch.setattr(ctrls.method.backbone, "load_backbone", lambda name: SimpleNamespace(name=name))
    jc = SimpleNamespace(backend="auto", model="gpt-4", base_url=None, timeout_s=5.0, max_retries=1,
                         local_model="smollm2-135m-instruct", local_max_new_tokens=20)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    assert isinstance(make_backend(jc), LocalBackend)
    with pytest.raises(JudgeError, match="OPENAI_API_KEY"):
        make_backend(SimpleNamespace(**{**vars(jc), "backend": "openai"}))
    assert isinstance(make_backend(SimpleNamespace(**{**vars(jc), "base_url": "http://127.0.0.1:1/v1"})), OpenAIBackend)
    monkeypatch.setenv("OPENAI_API_KEY", FAKE_KEY)
    assert isinstance(make_backend(jc), OpenAIBackend)
    assert isinstance(make_backend(SimpleNamespace(**{**vars(jc), "backend": "local"})), LocalBackend)
    with pytest.raises(JudgeError, match="'gpt4'"):
        make_backend(SimpleNamespace(**{**vars(jc), "backend": "gpt4"}))


PAPER_TEX = ROOT.parent / "shared" / "paper" / "ctrls_paper.tex"


@pytest.mark.skipif(not PAPER_TEX.exists(), reason="the paper's LaTeX is not here")
def test_paper_table3_matches_the_latex():
    tex = PAPER_TEX.read_text()
    body = tex[:tex.index(r"\label{tab:gptjudge_qwen_gsm8k}")].rsplit(r"\midrule", 1)[1]
    rows = [[c.strip() for c in line.rstrip("\\ ").split("&")] for line in body.splitlines() if "&" in line]
    assert len(rows) == len(PAPER_TABLE3) == 6
    for row, (_, ours) in zip(rows, PAPER_TABLE3.iterrows()):
        assert [float(c) for c in row[1:]] == ours[["S", "A", "C", "H", "Overall"]].tolist()
        assert re.sub(r"[$\\ ]|epsilon", "", row[0]) == ours.setting.replace("ε", "").replace(" ", "")


# ---- real models (integration) -----------------------------------------------------------------------------


def test_local_backend_samples_reproducibly_without_touching_the_global_rng(monkeypatch, tiny_llama):
    import torch

    import ctrls.method.backbone

    monkeypatch.setattr(ctrls.method.backbone, "load_backbone", lambda name: tiny_llama)
    be = LocalBackend("tiny", max_new_tokens=8)
    msgs = build_prompt("What is 2+3?", "5", ["2 + 3 = 5."], "5")
    state = torch.get_rng_state()
    a, b = be.complete(msgs, 1.5), be.complete(msgs, 1.5)  # random weights at a high temperature: noisy tokens
    assert a == b and torch.equal(state, torch.get_rng_state())  # sampling is seeded by the prompt
    assert a != be.complete(build_prompt("What is 2+4?", "6", ["2 + 4 = 6."], "6"), 1.5)
    assert be.complete(msgs, 0.0) == be.complete(msgs, 0.0)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def transformers_serve(tmp_path):
    """`transformers serve` pinned to the embedded backbone on 127.0.0.1: (base_url, model id).

    The server listens once the pinned model is loaded; /health answers then (/v1/models scans
    the hub cache and fails without one). A pinned server accepts only its own model id (HTTP 400
    otherwise), which is the path it was started with.
    """
    import urllib.request

    from ctrls.method.backbone import resolve

    path, port = resolve("smollm2-135m-instruct"), _free_port()
    exe = os.path.join(os.path.dirname(sys.executable), "transformers")
    # one thread: on a busy 2-core machine, torch's spinning worker threads slow decoding several times
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    log = open(tmp_path / "serve.log", "w")  # a file, not a pipe: a full pipe would block the server
    proc = subprocess.Popen([exe, "serve", path, "--host", "127.0.0.1", "--port", str(port), "--device", "cpu"],
                            stdout=log, stderr=subprocess.STDOUT, env=env)

    def tail():
        return (tmp_path / "serve.log").read_text()[-3000:]

    try:
        t0 = time.time()
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
                break
            except OSError:
                assert proc.poll() is None, f"transformers serve exited:\n{tail()}"
                assert time.time() - t0 < 120, f"transformers serve did not answer in 120 s:\n{tail()}"
                time.sleep(0.5)
        yield f"http://127.0.0.1:{port}/v1", path
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


@pytest.mark.integration
def test_real_transformers_serve_end_to_end(transformers_serve, tmp_path):
    """Two judgements by SmolLM2-135M through `transformers serve` and the openai client: its
    replies are rarely valid JSON, so this exercises the fallbacks on real output."""
    base_url, model = transformers_serve
    be = OpenAIBackend(model, base_url=base_url, timeout_s=120, max_retries=1, max_tokens=64)
    out = judge_samples(samples(2), be, tmp_path / "cache", progress=False)
    assert len(out) == 2 and not out.cached.any()
    assert out[list(CRITERIA)].apply(lambda c: c.between(1, 10)).all().all()
    assert set(out.parse) <= set(judge.PARSE_LEVELS)
    assert all(json.loads(f.read_text())["reply"] for f in (tmp_path / "cache").glob("*.json"))
    with pytest.raises(JudgeError, match="HTTP 400"):  # a pinned server names the model it serves
        OpenAIBackend("another-model", base_url=base_url, max_retries=0).complete(build_prompt("q", "1", [], "1"), 0.1)


# ---- wall-clock limits, Retry-After, capped backoff, bounded replies ----------------


class PacedServer:
    """/v1/chat/completions answering each request with ``reply(n)`` -> (status, headers, body), the
    body sent ``chunk`` bytes every ``pause`` seconds (headers at once)."""

    def __init__(self, reply, chunk=1 << 20, pause=0.0):
        self.calls = 0
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_POST(self):
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                status, headers, body = reply(fake.calls)
                fake.calls += 1
                try:
                    self.send_response(status)
                    for k, v in {"Content-Type": "application/json", "Content-Length": str(len(body)), **headers}.items():
                        self.send_header(k, v)
                    self.end_headers()
                    for i in range(0, len(body), chunk):
                        self.wfile.write(body[i:i + chunk])
                        self.wfile.flush()
                        time.sleep(pause)
                except OSError:  # the client gave up
                    pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def completion(content=GOOD) -> bytes:
    return json.dumps({"id": "x", "object": "chat.completion", "created": 0, "model": "m",
                       "choices": [{"index": 0, "finish_reason": "stop",
                                    "message": {"role": "assistant", "content": content}}]}).encode()


@pytest.fixture
def paced():
    servers = []

    def make(*a, **k):
        servers.append(PacedServer(*a, **k))
        return servers[-1]
    yield make
    for s in servers:
        s.close()


def test_the_timeout_is_wall_clock_per_request_not_per_read(paced, sleeps):
    """A valid completion at 1 byte per 0.1 s (about 20 s a request): every read is quick, the
    request is not. It held a 2 s-timeout judge for 85 s. The bound (10 s for two 0.3 s attempts)
    is far from both, so a loaded machine does not fail it."""
    srv = paced(lambda n: (200, {}, completion()), chunk=1, pause=0.1)
    be = OpenAIBackend("m", base_url=srv.url, timeout_s=0.3, max_retries=1)
    t0 = time.perf_counter()
    with pytest.raises(JudgeError, match=r"after 2 attempts: RequestTimeout: no complete reply within 0.3 s"):
        be.complete(build_prompt("q", "1", ["s"], "1"), 0.1)
    assert time.perf_counter() - t0 < 10.0 and srv.calls == 2


def test_a_quick_paced_reply_is_read_whole(paced, sleeps):
    srv = paced(lambda n: (200, {}, completion()), chunk=64, pause=0.001)
    assert OpenAIBackend("m", base_url=srv.url, timeout_s=10).complete(build_prompt("q", "1", ["s"], "1"), 0.1) == GOOD


@pytest.mark.parametrize("after,expect", [("3", 3.0), ("0.5", 0.5), ("86400", 60.0), ("Wed, 21 Oct 2015 07:28:00 GMT", 0.0),
                                          ("soon", 0.5)])
def test_retry_after_is_honoured_and_capped(paced, sleeps, after, expect):
    srv = paced(lambda n: (429, {"Retry-After": after}, b'{"error": {"message": "slow down"}}') if n == 0
                else (200, {}, completion()))
    be = OpenAIBackend("m", base_url=srv.url, max_retries=2, backoff_s=0.5)
    assert be.complete(build_prompt("q", "1", ["s"], "1"), 0.1) == GOOD
    assert sleeps == [expect] and srv.calls == 2


def test_the_backoff_is_capped(paced, sleeps):
    srv = paced(lambda n: (503, {}, b'{"error": {"message": "down"}}'))
    be = OpenAIBackend("m", base_url=srv.url, max_retries=5, backoff_s=10.0, max_backoff_s=30.0)
    with pytest.raises(JudgeError, match="after 6 attempts"):
        be.complete(build_prompt("q", "1", ["s"], "1"), 0.1)
    assert sleeps == [10.0, 20.0, 30.0, 30.0, 30.0]


def test_a_reply_far_larger_than_max_tokens_allows_is_refused(paced, sleeps):
    srv = paced(lambda n: (200, {}, completion("x" * 5_000_000)))
    be = OpenAIBackend("m", base_url=srv.url, timeout_s=20, max_retries=1, max_tokens=300)
    with pytest.raises(JudgeError, match=r"larger than \d+ bytes, far more than max_tokens=300 allows"):
        be.complete(build_prompt("q", "1", ["s"], "1"), 0.1)
    assert srv.calls == 2
    assert OpenAIBackend.REPLY_OVERHEAD_BYTES + 300 * OpenAIBackend.REPLY_BYTES_PER_TOKEN < 5_000_000
