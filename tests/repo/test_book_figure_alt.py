"""A notebook figure's alt text is its caption's description (``book/_ext/figure_alt.py``), never its file name."""
from __future__ import annotations

import importlib.util
from pathlib import Path

from docutils import nodes
from docutils.frontend import get_default_settings
from docutils.parsers.rst import Parser
from docutils.utils import new_document

EXT = Path(__file__).resolve().parents[2] / "book" / "_ext" / "figure_alt.py"


def _ext():
    spec = importlib.util.spec_from_file_location("figure_alt", EXT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _page():
    doc = new_document("page", get_default_settings(Parser))
    cell = nodes.container(classes=["cell"])
    out1, out2 = nodes.container(classes=["cell_output"]), nodes.container(classes=["cell_output"])
    out1 += nodes.image(uri="_images/0f3a9c.png")
    cap = nodes.paragraph()
    cap += nodes.strong(text="Figure B2.1.")
    cap += nodes.Text(" The held-out bound per epoch. Drawn by ctrls.report.plots.elbo from demo/pretrain/x.json.")
    out2 += cap
    cell += [out1, out2]
    doc += cell
    doc += nodes.image(uri="_images/keep.png", alt="a described image")
    doc += nodes.image(uri="_images/lone.png")
    doc += nodes.paragraph(text="Not a caption.")
    return doc


def test_a_figure_takes_its_captions_description_as_alt():
    mod = _ext()
    doc = _page()
    mod.set_alts(None, doc)
    first, kept, lone = list(doc.findall(nodes.image))
    assert first["alt"] == "Figure B2.1: The held-out bound per epoch."
    assert kept["alt"] == "a described image" and "alt" not in lone  # an alt stays; no caption, nothing invented
    assert mod.caption_alt("Figure B8.4.  Two\nlines.") == "Figure B8.4: Two lines."


def test_the_book_loads_the_extension():
    cfg = (EXT.parents[1] / "_config.yml").read_text()
    assert "figure_alt: _ext" in cfg
