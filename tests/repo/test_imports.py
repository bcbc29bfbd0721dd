"""The floors of the library: each subpackage imports only the floors below it, no module imports
itself round a circle, and no private name (``_x``) is imported across modules.

Imports are read statically (``ast``): at module level, inside functions and under
``if TYPE_CHECKING:`` alike, since an annotation-only or local import that runs upward is still a
dependency a reader has to untangle. Tests may import private helpers: they check internals on purpose.
"""
from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# The floors, bottom first: a module may import its own floor and those below, never above.
FLOORS = ["ctrls.errors", "ctrls.stats", "ctrls.data", "ctrls.method", "ctrls.generate", "ctrls.config",
          "ctrls.synthetic", "ctrls.stages", "ctrls.report", "ctrls.cli"]
TOP = {"ctrls", "ctrls.__main__"}  # the public face and the entry point sit above every floor


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def walk(node: ast.AST):
    """Every node, ``if TYPE_CHECKING:`` blocks and function bodies included."""
    return ast.walk(node)


def floor(module: str) -> int:
    """The floor index of a library module (``ctrls.method.policy`` -> the index of ``ctrls.method``)."""
    if module in TOP:
        return len(FLOORS)
    for i, f in enumerate(FLOORS):
        if module == f or module.startswith(f + "."):
            return i
    raise AssertionError(f"{module} is on no floor: add its subpackage to FLOORS")


def imports(source: str, here: str) -> list[tuple[str, list[str], int]]:
    """(module, names, line) for every ``import ctrls...`` / ``from ctrls... import ...`` in source."""
    out = []
    for node in walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            mod = node.module or ""
            if node.level:  # relative: resolve against the importing package
                base = here.split(".")[: -node.level]
                mod = ".".join([*base, mod] if mod else base)
            if mod == "ctrls" or mod.startswith("ctrls."):
                out.append((mod, [a.name for a in node.names], node.lineno))
        elif isinstance(node, ast.Import):
            out += [(a.name, [], node.lineno) for a in node.names if a.name.startswith("ctrls")]
    return out


def library_graph() -> dict[str, set[str]]:
    mods = {module_name(p): p for p in (ROOT / "ctrls").rglob("*.py")}
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for m, p in mods.items():
        for target, names, _ in imports(p.read_text(), m):
            # `from ctrls import x` names a submodule when x is one, else the package
            subs = [f"{target}.{n}" for n in names if f"{target}.{n}" in mods]
            for t in subs or [target]:
                if t != m and t in mods and t != "ctrls":
                    graph[m].add(t)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A cycle of the directed graph as a list of nodes (first == last), or None (depth-first search)."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(n: str) -> list[str] | None:
        state[n] = 1
        stack.append(n)
        for t in sorted(graph[n]):
            if state.get(t) == 1:
                return stack[stack.index(t):] + [t]
            if t not in state and (c := visit(t)):
                return c
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(graph):
        if n not in state and (c := visit(n)):
            return c
    return None


def test_find_cycle_finds_a_cycle_and_only_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_the_library_has_no_import_cycle():
    graph = library_graph()
    assert graph["ctrls.generate.sampling"], "the static reader found no imports: it is broken"
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def book_imports(source: str, here: str) -> list[str]:
    """Every import of the book's layer (``ctrls.report``) in ``source``, ``from ctrls import report`` included."""
    return [f"{here}:{line}: {m}" for m, names, line in imports(source, here)
            if m == "ctrls.report" or m.startswith("ctrls.report.") or (m == "ctrls" and "report" in names)]


def test_the_studies_compute_with_stats_and_stages_never_with_the_book():
    """``studies/`` computes with ``ctrls.stats`` and ``ctrls.stages``; ``ctrls.report`` reads stored results."""
    bad = [b for f in sorted((ROOT / "studies").glob("*.py")) for b in book_imports(f.read_text(), f"studies/{f.name}")]
    assert not bad, "studies that import the book's layer:\n" + "\n".join(bad)
    src = "import ctrls.stats\nfrom ctrls import report\ndef f():\n    from ctrls.report.tables import table1\n"
    assert book_imports(src, "s.py") == ["s.py:2: ctrls", "s.py:4: ctrls.report.tables"]


def upward(graph: dict[str, set[str]]) -> list[str]:
    return sorted(f"{m} -> {t}" for m, ts in graph.items() for t in ts if floor(t) > floor(m))


def test_no_import_runs_up_a_floor():
    bad = upward(library_graph())
    assert not bad, "imports that run upward:\n" + "\n".join(bad)


def test_the_floor_check_sees_upward_imports_in_functions_and_type_checking():
    src = ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ctrls.config.schema import Config\n"
           "def f():\n    from ctrls.report import tables\n")
    targets = [m for m, _, _ in imports(src, "ctrls.method.policy")]
    assert targets == ["ctrls.config.schema", "ctrls.report"]
    assert upward({"ctrls.method.policy": {"ctrls.config.schema"}, "ctrls.config.schema": set()}) == [
        "ctrls.method.policy -> ctrls.config.schema"]
    assert upward({"ctrls.config.schema": {"ctrls.method.policy"}, "ctrls.method.policy": set()}) == []


def test_every_subpackage_says_what_lives_there():
    for init in sorted((ROOT / "ctrls").glob("*/__init__.py")):
        doc = ast.get_docstring(ast.parse(init.read_text()))
        assert doc and len(doc.splitlines()) >= 3, f"{init.relative_to(ROOT)} opens with no docstring"


def test_the_top_level_is_small_and_modules_stay_short():
    top = sorted(p.name for p in (ROOT / "ctrls").glob("*.py"))
    assert len(top) <= 6, top
    assert len([p for p in (ROOT / "ctrls").iterdir() if (p / "__init__.py").is_file()]) >= 5
    long = [f"{p.relative_to(ROOT)}: {n}" for p in (ROOT / "ctrls").rglob("*.py")
            if (n := len(p.read_text().splitlines())) > 600]
    assert not long, long


def test_import_ctrls_does_not_import_torch():
    import subprocess
    import sys

    code = "import sys, ctrls; ctrls.__version__; print('torch' in sys.modules, 'pandas' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True).stdout
    assert out.split() == ["False", "False"], out


# pages that read runs, never a language model
REPORT_ONLY = ("04_judge.ipynb", "06_summary.ipynb", "07_synthetic.ipynb", "08_seeds.ipynb")


def test_a_report_only_notebook_does_not_import_the_modelling_stack():
    """Every import of a page that only reads runs (and the judge, whose backends load a model
    themselves when one is used) leaves transformers and the sampling engine unloaded: each kernel of
    `make book` would spend seconds importing them. One process imports the pages in turn and
    names the first whose imports load either."""
    import subprocess
    import sys

    check = "print({nb!r}, sorted(m for m in ('transformers', 'ctrls.generate.sampling') if m in sys.modules))"
    code = ["import sys"]
    for nb in REPORT_ONLY:
        lines = [line for line in notebook_code(ROOT / "notebooks" / nb).splitlines()
                 if line.startswith(("from ctrls", "import ctrls"))]
        assert lines, nb
        code += lines + [check.format(nb=nb)]
    out = subprocess.run([sys.executable, "-c", "\n".join(code)], capture_output=True, text=True, cwd=ROOT,
                         check=True).stdout
    assert out.splitlines() == [f"{nb} []" for nb in REPORT_ONLY], out


def notebook_code(nb: Path) -> str:
    """A notebook's code cells, joined."""
    cells = json.loads(nb.read_text())["cells"]
    return "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")


def sources() -> list[tuple[str, str, str]]:
    """(file, module name, source) of the library, the benchmarks and the notebooks' code cells."""
    out = [(str(p.relative_to(ROOT)), module_name(p), p.read_text())
           for d in ("ctrls", "bench") for p in sorted((ROOT / d).rglob("*.py"))]
    for nb in sorted((ROOT / "notebooks").glob("*.ipynb")):
        code = "\n".join(line for line in notebook_code(nb).splitlines() if not line.lstrip().startswith(("%", "!")))
        out.append((str(nb.relative_to(ROOT)), "notebook", code))
    return out


@pytest.mark.parametrize("file,module,source", [pytest.param(*s, id=s[0]) for s in sources()])  # id: the file alone
def test_no_private_name_is_imported_across_modules(file, module, source):
    bad = [f"{file}:{line}: from {mod} import {n}" for mod, names, line in imports(source, module)
           for n in names if n.startswith("_") and not n.startswith("__") and mod != module]
    assert not bad, "private names imported across modules:\n" + "\n".join(bad)


def test_the_private_import_check_sees_a_violation():
    src = "def f():\n    from ctrls.generate.sampling import _pick, sample\n"
    assert [n for _, names, _ in imports(src, "ctrls.x") for n in names] == ["_pick", "sample"]
