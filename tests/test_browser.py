"""The built book in a real browser: Debian's headless Chromium (driven by Playwright) opens the
smoke book's index and Table 1 pages, screenshots them, and finds no missing asset and no request
leaving localhost. A hand-made broken site proves that the checker does fail.

Without /usr/bin/chromium these tests fail (`apt-get install -y chromium`; `make test` installs it),
unless CTRLS_SKIP_BROWSER=1, where they skip.
"""
from __future__ import annotations

import functools
import http.server
import os
import struct
import threading

import pytest

from conftest import requires_data


@pytest.fixture(scope="session")
def chromium():
    """Debian's Chromium and Playwright, or a clear failure (a skip under CTRLS_SKIP_BROWSER=1)."""
    from ctrls.sitecheck import SiteCheckError, find_chromium

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


@pytest.mark.integration
@requires_data
def test_smoke_book_in_chromium(chromium, smoke_book, tmp_path):
    from ctrls.sitecheck import check_site, format_report

    report = check_site(smoke_book, tmp_path / "shots", chromium=chromium)
    summary = format_report(report)
    index = report["pages"]["index.html"]
    table1 = report["pages"]["generated/02_exploration.html"]

    for r in (index, table1):
        assert r["missing"] == [], summary
        assert r["external"] == [], summary
        assert not [m for m in r["console_errors"] if "failed to load" in m.lower() or "net::" in m], summary
        assert r["n_requests"] > 1, summary
    assert report["ok"], summary

    # index.html redirects to the root page, intro.md ("CTRLS, reproduced")
    assert index["final_url"].endswith("/intro.html"), summary
    assert index["title"].startswith("CTRLS, reproduced"), summary
    assert "Table 1" in table1["title"] and table1["title"].endswith("CTRLS, reproduced"), summary
    # the root page has math, typeset by the book's own MathJax and fonts (served from 127.0.0.1)
    assert index["mathjax"] == "done" and index["n_math"] > 0, summary
    assert any("/mathjax/tex-chtml.js" in u for u in index["requests"]), summary
    assert any("/mathjax/output/chtml/fonts/" in u for u in index["requests"]), summary
    assert table1["mathjax"] in ("none", "done") and not table1["warnings"], summary
    assert any("/_images/" in u for u in table1["requests"]), summary  # the pass@k figure

    for r, name in ((index, "index.png"), (table1, "table1.png")):
        shot = tmp_path / "shots" / name
        assert r["screenshot"] == str(shot) and shot.is_file()
        width, height = png_size(shot)
        assert width >= 800 and height >= 600, (name, width, height)
        assert shot.stat().st_size > 10_000, (name, shot.stat().st_size)


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
    from ctrls.sitecheck import check_site, main

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
