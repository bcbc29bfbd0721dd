"""The equation index on the method page (book/method.md, "Where each piece lives"): every function
it names exists, carries its tag in a comment on a line of its source, and every test it names exists."""
import ast
import importlib
import inspect
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def index_rows() -> list[dict]:
    from ctrls.report.codeindex import index_rows as rows

    return rows(ROOT / "book" / "method.md")


def test_the_index_covers_the_papers_objects():
    papers = " ".join(r["paper"] for r in index_rows())
    for obj in ("Eq. 5", "Eq. 8", "Eq. 14", "Eq. 16", "Thm. 5.3", "Alg. 1", "Alg. 2", "Table 1", "Table 2", "Table 3"):
        assert obj in papers, obj


@pytest.mark.parametrize("row", index_rows(), ids=lambda r: f"{r['file']}::{r['obj']}")
def test_each_function_exists_carries_its_tag_and_has_its_test(row):
    module = importlib.import_module(row["file"][:-3].replace("/", "."))
    obj = module
    for part in row["obj"].split("."):
        obj = getattr(obj, part)
    src = inspect.getsource(obj)
    comments = [line.split("#", 1)[1] for line in src.splitlines() if "#" in line]
    assert any(row["tag"] in c for c in comments), f"{row['obj']} has no comment tagged {row['tag']!r}"
    tree = ast.parse((ROOT / row["test"]).read_text())
    names = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
    assert row["fn"] in names, f"{row['test']} has no {row['fn']}"


def test_each_code_name_links_to_its_source_section(tmp_path):
    from ctrls.report.codeindex import src_label, write_code_page

    rows = index_rows()
    for r in rows:
        assert r["link"] == src_label(r["file"], r["obj"]), r
    (tmp_path / "method.md").write_text((ROOT / "book" / "method.md").read_text())
    page = write_code_page(tmp_path).read_text()
    for r in rows:
        assert f"({r['link']})=\n## `{r['file']}::{r['obj']}`" in page, r
    assert "def spectral_embedding(" in page and "def reinforce_loss(" in page
