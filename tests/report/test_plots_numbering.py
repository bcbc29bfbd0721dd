"""The book's figures are numbered "Figure B<page>.<n>", so that no number restarts into another
page's and none can be mistaken for one of the paper's Figures 1 to 7; each page sets its own number."""
from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

from ctrls.report import findings, plots

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def test_captions_are_numbered_by_page_and_restart_per_page():
    plots.set_page("01_pretraining")
    assert plots.caption("a").startswith("**Figure B2.1.** ") and plots.caption("b").startswith("**Figure B2.2.** ")
    assert plots.set_page(7) == "B8" and plots.caption("c").startswith("**Figure B8.1.** ")
    with pytest.raises(ValueError):
        plots.page_prefix("summary")


def _show_provenance_pages(nb: Path) -> list[str]:
    pages = []
    for c in json.loads(nb.read_text())["cells"]:
        if c["cell_type"] != "code":
            continue
        for node in ast.walk(ast.parse("".join(c["source"]))):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "show_provenance":
                pages += [k.value.value for k in node.keywords if k.arg == "page"]
    return pages


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=[n.stem for n in NOTEBOOKS])
def test_every_page_numbers_its_figures_by_its_own_name(nb):
    assert _show_provenance_pages(nb) == [nb.stem]


def test_no_two_pages_share_a_prefix_and_the_first_page_has_its_own():
    prefixes = [plots.page_prefix(nb.stem) for nb in NOTEBOOKS]
    assert len(set(prefixes)) == len(prefixes)
    assert findings.FIGURE.split(".")[0] not in prefixes and findings.FIGURE.startswith("B")


def _texts():
    for p in sorted((ROOT / "book").glob("*.md")):
        yield p.name, p.read_text()
    for nb in NOTEBOOKS:
        yield nb.name, "\n".join("".join(c["source"]) for c in json.loads(nb.read_text())["cells"])
    for mod in ("plots", "synthetic_figures", "findings", "cases", "pagetext", "provenance"):
        yield f"{mod}.py", (ROOT / "ctrls" / "report" / f"{mod}.py").read_text()


def test_no_book_figure_number_collides_with_the_papers():
    """Every "Figure N" with a bare number is one of the paper's, said as such."""
    for name, text in _texts():
        flat = " ".join(text.split())
        for m in re.finditer(r"\bFig(?:ure)?s?\.? (\d)", flat):
            near = flat[max(0, m.start() - 60):m.end()]
            assert "paper" in near or "App. D" in flat[m.start():m.end() + 40] or "Sec. 6.4" in flat[m.start():m.end() + 40] \
                or re.search(r"Figures? 3, 6 and 7", flat[m.start():m.end() + 12]), f"{name}: {near!r}"
