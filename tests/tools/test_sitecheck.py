"""The built book in a real browser: Debian's headless Chromium (driven by Playwright) opens every
page of the smoke book at 1280 px, screenshots it, and finds no missing asset, no request leaving
localhost, nothing wider than its container and no junk text (progress bars, nan/None, build paths).
Hand-made broken sites prove that the checker does fail, naming the page and the element. The smoke
book's own check, test_smoke_book_in_chromium, is in test_book.py, beside the book's build (one module:
one xdist worker builds the book and runs both).

Without /usr/bin/chromium these tests fail (`apt-get install -y chromium`; `make test` installs it),
unless CTRLS_SKIP_BROWSER=1, where they skip.
"""
from __future__ import annotations

import functools
import http.server
import json
import os
import struct
import threading

import pytest


@pytest.fixture(scope="session")
def chromium():
    """Debian's Chromium and Playwright, or a clear failure (a skip under CTRLS_SKIP_BROWSER=1)."""
    from tools.sitecheck import SiteCheckError, find_chromium

    try:
        exe = find_chromium()
        import playwright.sync_api  # noqa: F401
    except (SiteCheckError, ImportError) as e:
        msg = f"browser check unavailable: {e} (set CTRLS_SKIP_BROWSER=1 to skip the browser tests)"
        if os.environ.get("CTRLS_SKIP_BROWSER") == "1":
            pytest.skip(msg)
        pytest.fail(msg, pytrace=False)
    return exe


def png_size(path) -> tuple[int, int]:
    """(width, height) of a PNG, checking its signature and IHDR chunk."""
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n" and head[12:16] == b"IHDR", f"{path} is not a PNG"
    return struct.unpack(">II", head[16:24])


class _Canary(http.server.SimpleHTTPRequestHandler):
    hits: list[str] = []

    def do_GET(self):
        _Canary.hits.append(self.path)
        super().do_GET()

    def log_message(self, *args):
        pass


def test_checker_reports_missing_and_external_assets(chromium, tmp_path):
    """A broken page: a missing stylesheet, a CDN script, and a script on another loopback address
    (127.0.0.2, not localhost for the checker) where a server listens: it must receive nothing."""
    from tools.sitecheck import check_site, main

    canary = http.server.ThreadingHTTPServer(("127.0.0.2", 0),
                                             functools.partial(_Canary, directory=str(tmp_path)))
    threading.Thread(target=canary.serve_forever, daemon=True).start()
    other = f"http://127.0.0.2:{canary.server_address[1]}/y.js"
    site = tmp_path / "site"
    site.mkdir()
    (site / "present.css").write_text("h1 { color: #036; }\n")
    (site / "index.html").write_text(f"""<!doctype html>
<html><head><title>Broken site</title>
<link rel="stylesheet" href="present.css">
<link rel="stylesheet" href="missing.css">
<script src="https://cdn.example.com/x.js"></script>
<script src="{other}"></script>
</head><body><h1>Broken site</h1></body></html>
""")
    try:
        report = check_site(site, tmp_path / "shots", pages=("index.html",), chromium=chromium, timeout_s=30)
        assert main([str(site), "--out", str(tmp_path / "shots2"), "--page", "index.html"]) == 1
    finally:
        canary.shutdown()
        canary.server_close()

    r = report["pages"]["index.html"]
    assert not report["ok"]
    assert r["title"] == "Broken site"
    assert [u.rsplit("/", 1)[-1] for u in r["missing"]] == ["missing.css"], r
    assert "404" in r["missing_why"][r["missing"][0]]
    assert sorted(r["external"]) == sorted(["https://cdn.example.com/x.js", other]), r
    assert _Canary.hits == []  # aborted in the browser: the request never left
    assert not any(u.endswith("/present.css") for u in r["missing"])
    assert os.path.getsize(r["screenshot"]) > 0


_WIDE_PAGE = """<!doctype html>
<html><head><title>Wide page</title>
<style>article {{ width: 600px; }} pre, div.math {{ overflow-x: auto; }} .wide {{ white-space: nowrap; }}</style>
</head><body><main><article>
<h2>Table 1</h2>
<table id="t1"><tr><td class="wide">{cells}</td></tr></table>
<h2>Code</h2>
<pre id="code1">{code}</pre>
<h2>Math</h2>
<div class="math" id="eq1"><span class="wide">{math}</span></div>
<h2>Junk</h2>
<div class="cell_output"><pre id="bar">Executing:  40%|████      | 4/10 [00:04&lt;00:07,  1.23s/cell]</pre></div>
<table id="t2"><tr><th>acc</th></tr><tr><td>nan</td></tr></table>
<p id="ans">The normalised answer nan was wrong.</p>
<p id="path">Runs are in /work/main/runs/smoke.</p>
<div class="cell_output"><div class="output stream highlight-myst-ansi"><div class="highlight">\
<pre id="none">config = None</pre></div></div></div>
<h2>Clipped text</h2>
<p id="cutx" style="width: 120px; white-space: nowrap; overflow: hidden">pass@1 rose from 20.0% to 35.0% on 60 questions</p>
<p id="cutmath" style="width: 80px; white-space: nowrap; overflow: hidden">{math_text}</p>
<div id="cuty" style="height: 1.5em; line-height: 1.2; overflow: hidden"><p style="margin: 0">The first line shows.</p>\
<p style="margin: 0">The second never does.</p></div>
</article></main>{page_wide}</body></html>
"""

_CLEAN_PAGE = """<!doctype html>
<html><head><title>Clean page</title><style>article { width: 600px; }</style></head>
<body><main><article>
<h2>Results</h2>
<table><tr><th>setting</th><th>pass@1</th></tr><tr><td>Base</td><td>0.20</td></tr></table>
<p>None of the questions qualified. See https://example.org/tmp/x and arXiv 2507.08182.</p>
<div class="cell_input"><pre>if x is None:\n    x = float("nan")</pre></div>
<div class="highlight-python notranslate"><div class="highlight"><pre>y = None if z else float("nan")</pre></div></div>
<pre>short code</pre>
<p style="width: 300px; overflow: hidden">Short enough to fit its box.</p>
<span style="position: absolute; width: 1px; height: 1px; overflow: hidden; clip: rect(0 0 0 0)">\
a screen reader's copy of a formula</span>
<p>The rate <span class="math" style="display: inline-block; width: 12px; height: 1em; overflow: hidden">x<span
 style="position: absolute; clip: rect(1px, 1px, 1px, 1px); overflow: hidden; white-space: nowrap">\
MathJax's assistive copy of the formula, as wide as it likes</span></span> rises.</p>
</article></main></body></html>
"""


def test_checker_reports_overflow_and_junk(chromium, tmp_path):
    """Every kind of overflow and junk the check knows, each found and named on its page (text cut off
    by an overflow: hidden box too); a clean page with look-alikes (prose 'None of', a URL with /tmp/,
    code input with None/nan, a box that hides nothing, a screen reader's 1 px copy, MathJax's clipped
    assistive copy of a formula inside a box that hides overflow) passes."""
    from tools.sitecheck import check_site, format_report, main

    site = tmp_path / "site"
    (site / "generated").mkdir(parents=True)
    (site / "bad.html").write_text(_WIDE_PAGE.format(
        cells="x " * 400, code="y = 1  # " + "z" * 300, math="a + " * 200,
        page_wide="<div style='width:2000px'>wide</div>", math_text="a" * 39 + "&#x1D465;" * 20))
    # (a math italic x at the 40th and 50th characters: a cut between its two UTF-16 halves broke the report)
    (site / "generated" / "clean.html").write_text(_CLEAN_PAGE)
    (site / "index.html").write_text(_CLEAN_PAGE)
    (site / "search.html").write_text(_WIDE_PAGE.format(cells="", code="", math="", page_wide="", math_text=""))

    report = check_site(site, tmp_path / "shots", chromium=chromium, timeout_s=30)
    summary = format_report(report)
    assert list(report["pages"]) == ["index.html", "bad.html", "generated/clean.html"], summary  # no search.html
    assert all(r["seconds"] > 0 for r in report["pages"].values()) and "html (" in summary  # each page's time, printed
    assert not report["ok"]
    assert main([str(site), "--out", str(tmp_path / "shots2")]) == 1

    bad = report["pages"]["bad.html"]
    over = " | ".join(o["element"] for o in bad["overflow"])
    assert 'table#t1 under "Table 1"' in over, summary
    assert 'pre#code1 under "Code"' in over, summary
    assert 'div#eq1.math under "Math"' in over, summary
    assert any(o["element"] == "page" for o in bad["overflow"]), summary
    clipped = {o["element"].split(" ")[0]: o["why"] for o in bad["overflow"]}  # text an overflow: hidden box cuts off
    assert "past its right edge" in clipped.get("p#cutx", ""), summary
    assert "The second never does" in clipped.get("div#cuty", "") and "bottom edge" in clipped["div#cuty"], summary
    assert "a" * 39 + "\U0001d465" in clipped.get("p#cutmath", ""), summary
    json.dumps(report, ensure_ascii=False).encode("utf-8")  # whole characters only: no half surrogate pair
    kinds = {(j["kind"], j["element"].split(" ")[0]) for j in bad["junk"]}
    assert ("progress bar", "pre#bar") in kinds, summary
    assert ("bare nan/None cell", "td") in kinds, summary
    assert ("nan in text", "p#ans") in kinds, summary
    assert ("absolute path", "p#path") in kinds, summary
    assert ("None in text", "pre#none") in kinds, summary
    assert "bad.html: table#t1" in summary and "FAILED (1 of 3 pages: bad.html)" in summary, summary

    for clean in ("index.html", "generated/clean.html"):
        r = report["pages"][clean]
        assert r["overflow"] == [] and r["junk"] == [], summary


class _TcpCanary:
    """A TCP listener on 127.0.0.2 (not a local host for the checker) that records every connection
    it accepts, with the first line the client sent (if any): a connection of any kind, an HTTP
    request, a WebSocket handshake or a bare preconnect, would show up here."""

    def __init__(self):
        import socket

        self.hits: list[str] = []
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.2", 0))
        self.sock.listen(50)
        self.host = f"127.0.0.2:{self.sock.getsockname()[1]}"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            conn.settimeout(2)
            try:
                first = conn.recv(1024).split(b"\r\n")[0].decode(errors="replace")
            except OSError:
                first = ""
            self.hits.append(first or "<connection without a request>")
            conn.close()

    def close(self):
        self.sock.close()


# Every way a page can reach another host from script or markup, each to its own path on the canary.
_CONNECTIONS = {
    "websocket": "new WebSocket('ws://{h}/ws');",
    "eventsource": "new EventSource('http://{h}/es');",
    "sendbeacon": "navigator.sendBeacon('http://{h}/beacon', 'x');",
    "fetch": "fetch('http://{h}/fetch').catch(() => 0);",
    "xhr": "const x = new XMLHttpRequest(); x.open('GET', 'http://{h}/xhr'); x.send();",
    "worker": "new Worker(URL.createObjectURL(new Blob([\"fetch('http://{h}/worker').catch(() => 0)\"])));",
    "webrtc": "new RTCPeerConnection({{iceServers: [{{urls: 'stun:{h}'}}]}}).createDataChannel('x');",
    "preconnect": "",  # a <link rel=preconnect>: a connection without any request
    "popup": "window.open('http://{h}/popup');",  # a window the page opens is the page's
    "popup_fetch": "window.open('popped.html');",  # a local window that then reaches out
}


@pytest.fixture(scope="module")
def leaky_site(chromium, tmp_path_factory):
    """One page per kind of connection (``<kind>.html``), each to its own path on one canary host,
    checked in one browser run (a launch costs seconds; the checker opens every page in a page of its
    own, so what a page sends is recorded on that page); and the command's exit status on one page.
    Returns (report, what the canary received, the canary's host, the command's exit status)."""
    from tools.sitecheck import check_site, main

    tmp = tmp_path_factory.mktemp("leaky")
    canary = _TcpCanary()
    h = canary.host
    site = tmp / "site"
    site.mkdir()
    (site / "index.html").write_text("<!doctype html><html><head><title>Index</title></head><body><h1>Index</h1></body></html>")
    (site / "popped.html").write_text(f"<!doctype html><html><head><title>Popped</title></head><body>"
                                      f"<script>fetch('http://{h}/from-popup').catch(() => 0);</script></body></html>")
    for kind, js in _CONNECTIONS.items():
        head = f'<link rel="preconnect" href="http://{h}">' if kind == "preconnect" else ""
        (site / f"{kind}.html").write_text(f"<!doctype html><html><head><title>Leaky</title>{head}</head>"
                                          f"<body><h1>Leaky</h1><script>{js.format(h=h)}</script></body></html>")
    try:
        report = check_site(site, tmp / "shots", pages=tuple(f"{k}.html" for k in _CONNECTIONS), chromium=chromium,
                            timeout_s=30)
        # the command's exit status follows the report, whatever the kind: one page, one more browser run
        status = main([str(site), "--out", str(tmp / "shots2"), "--page", "websocket.html"])
    finally:
        canary.close()
    return report, list(canary.hits), h, status


@pytest.mark.parametrize("kind", list(_CONNECTIONS))
def test_every_kind_of_connection_to_another_host_is_recorded_and_blocked(leaky_site, kind):
    """A WebSocket, an EventSource, a beacon (and fetch, XHR, a worker's fetch,
    a WebRTC ICE server, a preconnect, a popup window and a popup's own fetch) to a non-local host is
    external: recorded with its type on the page that opened it, the page fails the check, and the host \
receives no connection at all."""
    from tools.sitecheck import format_report, page_ok

    report, hits, h, status = leaky_site
    r, summary = report["pages"][f"{kind}.html"], format_report(report)
    assert not report["ok"] and not page_ok(r) and status == 1, summary
    assert r["external"] and all(h in u for u in r["external"]), summary
    assert any(h in c["url"] for c in r["connections"]), summary
    assert hits == [], (hits, summary)  # nothing reached the other host


def test_local_connections_of_every_kind_are_not_external(chromium, tmp_path):
    """fetch, XHR, a beacon and a worker on the page's own host: recorded by type, not external."""
    from tools.sitecheck import check_site, format_report

    site = tmp_path / "site"
    site.mkdir()
    (site / "data.json").write_text('{"a": 1}')
    (site / "index.html").write_text(
        "<!doctype html><html><head><title>Local</title><link rel='preload' href='data.json' as='fetch'></head>"
        "<body><h1>Local</h1><script>fetch('data.json'); const x = new XMLHttpRequest(); x.open('GET', 'data.json');"
        " x.send(); new Worker(URL.createObjectURL(new Blob([\"fetch('" + "/data.json')\"])));</script></body></html>")
    report = check_site(site, tmp_path / "shots", pages=("index.html",), chromium=chromium, timeout_s=30)
    r, summary = report["pages"]["index.html"], format_report(report)
    assert r["external"] == [] and r["missing"] == [] and report["ok"], summary
    kinds = {c["type"] for c in r["connections"]}
    assert {"document", "fetch", "xhr"} <= kinds, (kinds, summary)


def test_screenshots_only_of_the_pages_named(chromium, tmp_path):
    """``shots`` picks the pages to screenshot (every other check runs on every page); a page it names
    that is not checked is refused before the browser starts."""
    from tools.sitecheck import check_site

    site = tmp_path / "site"
    site.mkdir()
    (site / "index.html").write_text("<!doctype html><title>i</title><p>index</p>")
    (site / "other.html").write_text("<!doctype html><title>o</title><p>other</p>")
    report = check_site(site, tmp_path / "shots", chromium=chromium, timeout_s=30, shots=("other.html",))
    assert set(report["pages"]) == {"index.html", "other.html"} and report["ok"]
    assert report["pages"]["index.html"]["screenshot"] is None
    assert [p.name for p in (tmp_path / "shots").iterdir()] == ["other.png"]
    with pytest.raises(ValueError, match="not checked: \\['gone.html'\\]"):
        check_site(site, tmp_path / "shots", chromium=chromium, shots=("gone.html",))


def test_a_page_that_never_goes_idle_is_named_with_what_was_pending(chromium, tmp_path):
    """The idle wait counts requests itself: a request that is never answered is named in the warning,
    a page that keeps starting requests says so, and a quiet page has no warning."""
    import socket

    from tools.sitecheck import check_site

    hang = socket.socket()  # accepts (the kernel's backlog) and never answers
    hang.bind(("127.0.0.1", 0))
    hang.listen(4)
    port = hang.getsockname()[1]
    site = tmp_path / "site"
    site.mkdir()
    (site / "index.html").write_text("<!doctype html><title>i</title><p>quiet</p>")
    (site / "hang.html").write_text(
        f'<!doctype html><title>h</title><script>fetch("http://127.0.0.1:{port}/never")</script>')
    (site / "poll.html").write_text(
        '<!doctype html><title>p</title><script>setInterval(() => fetch("index.html"), 100)</script>')
    try:
        report = check_site(site, tmp_path / "shots", chromium=chromium, timeout_s=3, shots=())
    finally:
        hang.close()
    pages = report["pages"]
    assert pages["index.html"]["warnings"] == []
    assert pages["hang.html"]["warnings"] and all(
        f"1 pending: http://127.0.0.1:{port}/never" in w for w in pages["hang.html"]["warnings"])
    assert pages["poll.html"]["warnings"] and all(
        "requests kept starting" in w or "pending: " in w for w in pages["poll.html"]["warnings"])


@pytest.mark.parametrize("width", [0, -5, 239, 7681, 10**6])
def test_a_window_width_no_device_has_is_refused_before_a_browser_starts(width, tmp_path, capsys):
    """`--width 0` once "checked" the site in a 0 px window and reported every page broken."""
    from tools.sitecheck import SiteCheckError, check_site, main

    with pytest.raises(SystemExit) as e:
        main([str(tmp_path), "--width", str(width)])
    assert e.value.code == 2 and f"--width must be an integer between 240 and 7680 px, got {width}" in capsys.readouterr().err
    with pytest.raises(SiteCheckError, match="width must be an integer between 240 and 7680"):
        check_site(tmp_path, tmp_path / "shots", width=width)
    with pytest.raises(SiteCheckError, match="got True"):
        check_site(tmp_path, tmp_path / "shots", width=True)
