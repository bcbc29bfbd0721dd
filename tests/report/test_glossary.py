"""The glossary page defines each statistical and method term once (Holm, Newcombe's interval,
MDD, κ, coincidence and the independent-chain null, Succ., pass@k, fixed s₀, the paper's inferred n), it is
in the book's table of contents, and every link to it, from the pages, the notebooks and the library's
generated text, resolves to one of its anchors."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from ctrls.report import glossary

ROOT = Path(__file__).resolve().parents[2]
GLOSSARY = ROOT / "book" / "glossary.md"


def _anchors() -> set[str]:
    return set(re.findall(r"^\(([\w-]+)\)=$", GLOSSARY.read_text(), re.M))


def _links(text: str) -> list[str]:
    return re.findall(r"<(glossary-[\w-]+)>", text)


def test_the_glossary_is_in_the_table_of_contents():
    assert "file: glossary" in (ROOT / "book" / "_toc.yml").read_text()


@pytest.mark.parametrize("term", ["Holm", "Newcombe", "MDD", "κ", "coincidence", "independent-chain null",
                                  "Succ.", "pass@k", "fixed s₀", "inferred"])
def test_the_glossary_defines_the_pages_terms(term):
    headings = "\n".join(re.findall(r"^## (.+)$", GLOSSARY.read_text(), re.M))
    assert term in headings, term


def test_every_anchor_the_library_links_to_exists():
    anchors = _anchors()
    assert set(glossary.ANCHORS.values()) <= anchors, set(glossary.ANCHORS.values()) - anchors
    assert glossary.term("MDD") == "{ref}`MDD <glossary-mdd>`"
    with pytest.raises(KeyError):
        glossary.term("no such term")


def _sources():
    for p in sorted((ROOT / "book").glob("*.md")):
        yield p.name, p.read_text()
    for nb in sorted((ROOT / "notebooks").glob("*.ipynb")):
        yield nb.name, "\n".join("".join(c["source"]) for c in json.loads(nb.read_text())["cells"])
    for py in sorted((ROOT / "ctrls" / "report").glob("*.py")):
        yield py.name, py.read_text()


def test_every_glossary_link_resolves():
    anchors, seen = _anchors(), 0
    for name, text in _sources():
        for link in _links(text):
            seen += 1
            assert link in anchors, f"{name}: {link} is not an anchor of the glossary"
    assert seen >= 20  # the pages link to the glossary instead of re-explaining


def test_links_in_notebook_outputs_are_rendered_as_myst():
    """A code cell whose output Markdown links to the glossary renders that Markdown as MyST (the
    default, CommonMark, would show the role as text)."""
    for nb in sorted((ROOT / "notebooks").glob("*.ipynb")):
        for i, c in enumerate(json.loads(nb.read_text())["cells"]):
            src = "".join(c["source"])
            if c["cell_type"] == "code" and ("pagetext.folded" in src or "stored=" in src):
                assert c["metadata"].get("mystnb", {}).get("markdown_format") == "myst", f"{nb.name} cell {i}"
