"""The rubric judge: parsing fallbacks, retries, caching, key hygiene, and a real local server."""
import json
import os
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pandas as pd
import pytest

from ctrls import judge
from ctrls.judge import DEFAULT_SCORE, JudgeError, OpenAIBackend, judge_samples, parse_scores, rubric_table, subsample

FAKE_KEY = "sk-test-" + "x" * 24


def samples(n=3):
    return pd.DataFrame([{"config": "Base" if i % 2 else "eps=0.1", "question_id": f"q{i}", "question": f"What is {i}+1?",
                          "gold": str(i + 1), "steps": [f"{i} + 1 = {i + 1}.", f"The answer is {i + 1}."],
                          "pred": str(i + 1), "correct": True} for i in range(n)])


@pytest.mark.parametrize("reply,expect,how", [
    ('{"self_reflection": 6, "algebra": 8, "coherence": 7, "hallucination": 9, "overall": 7}', [6, 8, 7, 9, 7], "json"),
    ('Sure! ```json\n{"self_reflection": 3, "algebra": 4, "coherence": 5, "hallucination": 6, "overall": 4}\n```', [3, 4, 5, 6, 4], "json"),
    ('{"self_reflection": 6, "algebra": 8, "coher', [6, 8, DEFAULT_SCORE, DEFAULT_SCORE, DEFAULT_SCORE], "default"),
    ("Self-reflection: 4/10, Algebra: 9, coherence = 8, hallucination 7, Overall: 6", [4, 9, 8, 7, 6], "regex"),
    ('{"self_reflection": 15, "algebra": 0, "coherence": 7, "hallucination": 9, "overall": 7}', [10, 1, 7, 9, 7], "clipped"),
    ("I cannot grade this.", [DEFAULT_SCORE] * 5, "default"),
    ('{"self_reflection": "high", "algebra": 8, "coherence": 7, "hallucination": 9, "overall": 7}', [DEFAULT_SCORE, 8, 7, 9, 7], "default"),
])
def test_parse_fallbacks(reply, expect, how):
    scores, hows = parse_scores(reply)
    assert [scores[k] for k in judge.CRITERIA] == expect
    assert judge.worst(hows) == how


class FakeServer:
    """An OpenAI-compatible /v1/chat/completions that plays a script of (status, delay_s, reply)."""

    def __init__(self, script):
        self.script, self.calls, self.headers = list(script), 0, []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_POST(self):
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                fake.headers.append(dict(self.headers))
                status, delay, reply = fake.script[min(fake.calls, len(fake.script) - 1)]
                fake.calls += 1
                time.sleep(delay)
                body = json.dumps({"id": "x", "object": "chat.completion", "created": 0, "model": "m",
                                   "choices": [{"index": 0, "finish_reason": "stop",
                                                "message": {"role": "assistant", "content": reply}}]}).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                try:
                    self.wfile.write(body)
                except OSError:
                    pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def close(self):
        self.httpd.shutdown()


GOOD = '{"self_reflection": 6, "algebra": 8, "coherence": 7, "hallucination": 9, "overall": 7}'


@pytest.fixture
def server_factory():
    servers = []

    def make(script):
        servers.append(FakeServer(script))
        return servers[-1]
    yield make
    for s in servers:
        s.close()


@pytest.mark.parametrize("status", [500, 429])
def test_retries_then_succeeds(server_factory, tmp_path, status):
    srv = server_factory([(status, 0, "oops"), (status, 0, "oops"), (200, 0, GOOD)])
    be = OpenAIBackend("m", base_url=srv.url, max_retries=3, backoff_s=0.01)
    out = judge_samples(samples(1), be, tmp_path, progress=False)
    assert srv.calls == 3 and out.overall[0] == 7 and out.parse[0] == "json"


def test_persistent_errors_and_timeouts_give_a_clear_error(server_factory, tmp_path):
    srv = server_factory([(500, 0, "oops")])
    with pytest.raises(JudgeError, match="after 3 attempts"):
        judge_samples(samples(1), OpenAIBackend("m", base_url=srv.url, max_retries=2, backoff_s=0.01), tmp_path, progress=False)
    slow = server_factory([(200, 2.0, GOOD), (200, 0, GOOD)])
    be = OpenAIBackend("m", base_url=slow.url, timeout_s=0.5, max_retries=2, backoff_s=0.01)
    out = judge_samples(samples(1), be, tmp_path / "t", progress=False)  # the first call times out, the retry succeeds
    assert slow.calls == 2 and out.overall[0] == 7


def test_cache_hit_makes_no_call_and_key_never_stored(server_factory, tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", FAKE_KEY)
    srv = server_factory([(200, 0, "Algebra: 9. Nothing else.")])
    be = OpenAIBackend("m", base_url=srv.url, backoff_s=0.01)
    first = judge_samples(samples(3), be, tmp_path, progress=False)
    again = judge_samples(samples(3), be, tmp_path, progress=False)
    assert srv.calls == 3 and again.cached.all() and not first.cached.any()
    assert {k.lower(): v for k, v in srv.headers[0].items()}["authorization"] == f"Bearer {FAKE_KEY}"  # sent, never stored
    for f in tmp_path.iterdir():
        assert FAKE_KEY not in f.read_text()
    assert FAKE_KEY not in first.to_csv()
    table = rubric_table(first, n_boot=200)
    assert list(table.n) == [2, 1] and (table["scores read by regex"] > 0).all() and (table["defaulted"] > 0).all()


def test_subsample_is_seeded_and_capped():
    df = pd.concat([samples(10)] * 3, ignore_index=True)
    a, b = subsample(df, 4, seed=1), subsample(df, 4, seed=1)
    pd.testing.assert_frame_equal(a, b)
    assert a.groupby("config").size().tolist() == [4, 4]


def test_missing_key_is_an_error(monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with pytest.raises(JudgeError, match="OPENAI_API_KEY"):
        OpenAIBackend("gpt-4")


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.integration
def test_real_transformers_serve_end_to_end(tmp_path):
    """`transformers serve` with the embedded backbone on 127.0.0.1, judged through the openai client."""
    import urllib.request

    from ctrls.backbone import resolve

    path = resolve("smollm2-135m-instruct")
    port = _free_port()
    exe = os.path.join(os.path.dirname(sys.executable), "transformers")
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen([exe, "serve", path, "--host", "127.0.0.1", "--port", str(port), "--device", "cpu"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    try:
        t0 = time.time()
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
                break
            except OSError:
                assert proc.poll() is None, proc.stdout.read().decode()[-3000:]
                assert time.time() - t0 < 180, "transformers serve did not come up"
                time.sleep(1)
        be = OpenAIBackend(path, base_url=f"http://127.0.0.1:{port}/v1", timeout_s=120, max_retries=1)
        out = judge_samples(samples(2), be, tmp_path, progress=False)
        assert len(out) == 2
        assert out[list(judge.CRITERIA)].apply(lambda c: c.between(1, 10)).all().all()
        assert set(out.parse) <= {"json", "regex", "clipped", "default"}
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
