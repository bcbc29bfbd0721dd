"""The answer checker against the datasets' own solutions: each must verify against its gold.

GSM8K test (1,319): the full answer text, ending in ``#### N``; MATH-500 (500): the solution,
whose last ``\\boxed{}`` holds the answer. Run with ``-s`` to see the rates and every failure.
"""
import time

import pytest

from conftest import requires_data
from ctrls.answers import reference_verify_report


@requires_data
@pytest.mark.integration
@pytest.mark.parametrize("dataset,n,threshold", [("gsm8k", 1319, 0.99), ("math", 500, 0.97)])
def test_reference_solutions_verify(dataset, n, threshold):
    t0 = time.perf_counter()
    rep = reference_verify_report(dataset, "test")
    for f in rep["failures"]:
        print(f"FAIL {f['id']}: gold={f['gold']!r} extracted={f['extracted']!r}")
    print(f"{dataset}/test: {rep['n'] - len(rep['failures'])}/{rep['n']} reference solutions verify "
          f"({100 * rep['rate']:.2f}%) in {time.perf_counter() - t0:.1f} s")
    assert rep["n"] == n
    assert rep["rate"] >= threshold
