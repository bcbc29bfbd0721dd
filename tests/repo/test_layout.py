"""The repository's shape: tests mirror the packages, the README stays a README."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = sorted(p.parent.name for p in (ROOT / "ctrls").glob("*/__init__.py"))
OTHER = {"repo": None, "tools": ROOT / "tools", "bench": ROOT / "bench", "studies": ROOT / "studies"}


def misplaced(tests: Path) -> list[str]:
    """Test files not named after a module of the folder they mirror (``test_<module>[_<aspect>].py``)."""
    bad = []
    for f in sorted(tests.rglob("test_*.py")):
        rel = f.relative_to(tests)
        if re.search(r"issue|round\d|_\d{2,}", f.stem):
            bad.append(f"{rel}: named after an issue or a review round")
            continue
        if len(rel.parts) == 1:
            src = [ROOT / "ctrls" / f"{f.stem[5:]}.py"]
        elif rel.parts[0] in PACKAGES:
            src = sorted((ROOT / "ctrls" / rel.parts[0]).rglob("*.py"))
        elif rel.parts[0] in OTHER:
            src = None if OTHER[rel.parts[0]] is None else sorted(OTHER[rel.parts[0]].rglob("*.py"))
        else:
            bad.append(f"{rel}: {rel.parts[0]}/ mirrors no package")
            continue
        if src is not None and not any(f.stem == f"test_{s.stem}" or f.stem.startswith(f"test_{s.stem}_") for s in src):
            bad.append(f"{rel}: no module {f.stem[5:]} in {rel.parts[0] if len(rel.parts) > 1 else 'ctrls'}/")
    return bad


def test_tests_mirror_the_packages():
    assert not misplaced(ROOT / "tests")


def test_the_mirror_check_sees_a_misplaced_test(tmp_path):
    for name in ("method/test_policy.py", "method/test_tables.py", "test_reliability_round3.py", "stats/test_power_issue35.py"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("")
    assert [b.split(":")[0] for b in misplaced(tmp_path)] == [
        "method/test_tables.py", "stats/test_power_issue35.py", "test_reliability_round3.py"]


def test_the_readme_is_at_most_200_lines():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 200
