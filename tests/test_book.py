"""The whole smoke book: every notebook through papermill, then `jupyter-book build -W`.

The build itself is the session fixture `smoke_book` (conftest.py), shared with test_browser.py.
"""
import re

import nbformat
import pytest

from conftest import requires_data
from ctrls.cli import STAGES

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
