"""The equation index on the method page (book/method.md, "Where each piece lives"): every function
it names exists, carries its tag in a comment on a line of its source, and every test it names exists."""
import ast
import importlib
import inspect
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ROW = re.compile(r"^\| (?P<paper>[^|]+) \| [^|]+ \| `(?P<file>ctrls/[\w/]+\.py)::(?P<obj>[\w.]+)` \| `(?P<tag>[^`]+)` "
                 r"\| `(?P<test>tests/\w+\.py)::(?P<fn>\w+)` \|$")


def index_rows() -> list[dict]:
    text = (ROOT / "book" / "method.md").read_text()
    section = text[text.index("## Where each piece lives"):]
    rows = [m.groupdict() for line in section.splitlines() if (m := ROW.match(line))]
    body = [line for line in section.splitlines() if line.startswith("| ") and not line.startswith("| paper")]
    assert len(rows) == len(body), "an index row does not parse: " + repr(set(body) - {r for r in body if ROW.match(r)})
    return rows


def test_the_index_covers_the_papers_objects():
    papers = " ".join(r["paper"] for r in index_rows())
    for obj in ("Eq. 5", "Eq. 7", "Eq. 13", "Eq. 14", "Thm. 5.3", "Alg. 1", "Alg. 2", "Table 1", "Table 2", "Table 3"):
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
