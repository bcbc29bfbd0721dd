"""The whole smoke book: every notebook through papermill, then `jupyter-book build -W`.

The build itself is the session fixture `smoke_book` (conftest.py). Every test that reads it is in this
module, so that under `pytest -n 2 --dist loadfile` (`make test`) one worker builds it once: the build
checks, and the book in a real browser (moved here from test_browser.py, which keeps the checker's own
tests and the `chromium` fixture).
"""
import re

import nbformat
import pytest
from conftest import requires_data

from ctrls.cli import STAGES
from tests.tools.test_sitecheck import chromium, png_size  # noqa: F401  (a fixture, and the screenshot check)

pytestmark = [pytest.mark.integration, requires_data]


def test_smoke_book_builds_strict(smoke_book):
    html = smoke_book  # the fixture asserts that `ctrls reproduce --strict` exited 0
    assert (html / "index.html").exists()
    for nb in STAGES.values():
        page = html / "generated" / nb.replace(".ipynb", ".html")
        text = page.read_text()
        assert "Produced by" in text and "profile <code" in text, f"{page.name} has no provenance banner"
        assert "Traceback" not in text
        executed = nbformat.read(str(html.parents[1] / "generated" / nb), as_version=4)
        assert not any("\r" in o.text for c in executed.cells for o in c.get("outputs", [])
                       if o.output_type == "stream"), f"{nb}: progress-bar refreshes left in the page"
    setup = (html / "generated" / "00_setup_check.html").read_text()
    assert "gsm8k" in setup and "math" in setup and "valid" in setup
    # MathJax is served from the book, never from a CDN
    intro = (html / "intro.html").read_text()
    assert re.search(r'src="[^"]*mathjax/tex-chtml\.js', intro) and "cdn" not in intro.lower()
    assert (html / "mathjax" / "tex-chtml.js").exists()


def test_smoke_book_in_chromium(chromium, smoke_book, tmp_path):
    from tools.sitecheck import check_site, format_report

    shots = ("index.html", "generated/02_exploration.html")  # every page is checked; these two are screenshot
    report = check_site(smoke_book, tmp_path / "shots", chromium=chromium, shots=shots)
    summary = format_report(report)
    index = report["pages"]["index.html"]
    table1 = report["pages"]["generated/02_exploration.html"]

    assert len(report["pages"]) >= 10, summary  # every page, not just the two named here
    for r in report["pages"].values():
        assert r["overflow"] == [] and r["junk"] == [], summary
        # no page logs an error: the theme's inline scripts run once (book/_ext/single_scripts.py) and
        # its mode is set on a first visit (html_context.default_mode)
        assert r["console_errors"] == [], summary
        # a page that never goes network-idle, or whose MathJax never finishes, costs the whole timeout silently
        assert r["warnings"] == [], summary
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
    # the figures are served by the book itself (the pass@k figure is a sentence when every value is equal)
    pretraining = report["pages"]["generated/01_pretraining.html"]
    assert any("/_images/" in u for u in pretraining["requests"]), summary

    assert sorted(p.name for p in (tmp_path / "shots").iterdir()) == ["index.png", "table1.png"]
    assert all(r["screenshot"] is None for p, r in report["pages"].items() if p not in shots), summary
    for r, name in ((index, "index.png"), (table1, "table1.png")):
        shot = tmp_path / "shots" / name
        assert r["screenshot"] == str(shot) and shot.is_file()
        width, height = png_size(shot)
        assert width >= 800 and height >= 600, (name, width, height)
        assert shot.stat().st_size > 10_000, (name, shot.stat().st_size)


def test_a_bare_build_before_any_run_names_the_command_to_run_first(tmp_path):
    """``jupyter-book build book/`` in a fresh clone (no ``book/generated/``) stops with the command to run first,
    not an empty skeleton."""
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    book = tmp_path / "book"
    shutil.copytree(root / "book", book, ignore=shutil.ignore_patterns("_build", "generated"))
    jb = Path(sys.executable).with_name("jupyter-book")
    out = subprocess.run([str(jb), "build", str(book)], capture_output=True, text=True, timeout=600)
    assert out.returncode != 0 and "run `make book` (or `.venv/bin/ctrls reproduce`) first" in out.stdout + out.stderr
