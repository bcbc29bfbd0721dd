"""The answer checker against the datasets' own solutions: each must verify against its gold.

GSM8K test (1,319): the full answer text, ending in ``#### N``; MATH-500 (500): the solution,
whose last ``\\boxed{}`` holds the answer. Every one verifies (measured: 1319/1319 and 500/500),
so any failure is a change of the answer policy or of the loader. Run with ``-s`` to see the
rates and every failure. (The train splits, checked by hand with ``ctrls verify-references
--split train``: GSM8K 7473/7473, MATH 4499/4500, where math-4428 ends "the answer is positive,
because ..." after its ``\\boxed{}``, and the last marker wins.)
"""
import time

import pytest
from conftest import requires_data

from ctrls.data.problems import reference_verify_report


@requires_data
@pytest.mark.integration
@pytest.mark.parametrize("dataset,n", [("gsm8k", 1319), ("math", 500)])
def test_reference_solutions_verify(dataset, n):
    t0 = time.perf_counter()
    rep = reference_verify_report(dataset, "test")
    for f in rep["failures"]:
        print(f"FAIL {f['id']}: gold={f['gold']!r} extracted={f['extracted']!r}")
    print(f"{dataset}/test: {rep['n'] - len(rep['failures'])}/{rep['n']} reference solutions verify "
          f"({100 * rep['rate']:.2f}%) in {time.perf_counter() - t0:.1f} s")
    assert rep["n"] == n
    assert rep["failures"] == []


def test_the_cross_check_grades_each_solution_with_math_verify_alone_and_lists_those_only_it_verifies(monkeypatch, capsys):
    from ctrls import cli
    from ctrls.data import problems
    from ctrls.data.problems import Problem

    sols = [(r"So the answer is $\boxed{\frac{1}{2}}$.", "1/2"), ("so x = 5", "5"), ("The answer is 3.", "4")]
    probs = [Problem(f"math-{i}", "q", gold, (), "math", "test", {"solution": s}) for i, (s, gold) in enumerate(sols)]
    monkeypatch.setattr(problems, "load_problems", lambda *a, **k: probs)
    rep = reference_verify_report("math", "test", cross_check=True)
    assert [f["id"] for f in rep["failures"]] == ["math-1", "math-2"]
    assert rep["math_verify"] == 2 and rep["only_math_verify"] == [{"id": "math-1", "gold": "5", "extracted": None}]
    assert "math_verify" not in reference_verify_report("math", "test")
    with pytest.raises(SystemExit) as e:
        cli.main(["verify-references", "--dataset", "math", "--math-verify"])
    out = capsys.readouterr().out
    assert e.value.code == 0 and "math/test: 1/3 reference solutions" in out
    assert "ONLY MATH-VERIFY {'id': 'math-1'" in out and "math-verify alone: 2/3 verify; 1 of them not by this checker" in out
