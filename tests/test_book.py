"""The whole smoke book: every notebook through papermill, then `jupyter-book build -W`."""
import re
import subprocess
import sys

import pytest

from conftest import ROOT, SMOKE_OVERRIDES, requires_data
from ctrls.cli import STAGES

pytestmark = [pytest.mark.integration, requires_data]


def test_smoke_book_builds_strict(smoke_runs, tmp_path):
    run_dir, _, _ = smoke_runs
    book = tmp_path / "book"
    r = subprocess.run([sys.executable, "-m", "ctrls", "reproduce", "--profile", "smoke", "--run-dir", str(run_dir),
                        "--book-dir", str(book), "--strict", "-o", *SMOKE_OVERRIDES],
                       cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    html = book / "_build" / "html"
    assert (html / "index.html").exists()
    for nb in STAGES.values():
        page = html / "generated" / nb.replace(".ipynb", ".html")
        text = page.read_text()
        assert "Produced by" in text and "profile <code" in text, f"{page.name} has no provenance banner"
        assert "Traceback" not in text
    setup = (html / "generated" / "00_setup_check.html").read_text()
    assert "gsm8k" in setup and "math" in setup and "valid" in setup
    # MathJax is served from the book, never from a CDN
    intro = (html / "intro.html").read_text()
    assert re.search(r'src="[^"]*mathjax/tex-chtml\.js', intro) and "cdn" not in intro.lower()
    assert (html / "mathjax" / "tex-chtml.js").exists()
