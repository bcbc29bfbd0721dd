"""A bare ``jupyter-book build book/`` before any run: the pages include what ``ctrls reproduce`` writes into
``book/generated/`` (the executed notebooks, the verdict, the scorecard), so without it the build would be an
empty skeleton with include errors. Connected to ``builder-inited``, it stops the build with one line that
names the command to run first.
"""
from pathlib import Path

from sphinx.errors import ExtensionError

NEEDED = ("verdict.md", "scorecard.md", "findings.md")  # written by ctrls reproduce after the notebooks


def check_generated(app):
    gen = Path(app.srcdir) / "generated"
    missing = [n for n in NEEDED if not (gen / n).is_file()]
    if missing:
        raise ExtensionError(f"{gen} has no {', '.join(missing)}: run `make book` (or `.venv/bin/ctrls reproduce`) "
                             "first; it runs the notebooks and writes the pages this book includes")


def setup(app):
    app.connect("builder-inited", check_generated)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
