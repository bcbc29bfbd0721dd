"""The answer checker against the datasets' own solutions: each must verify against its gold."""
import pytest

from conftest import requires_data
from ctrls.answers import reference_verify_report


@requires_data
@pytest.mark.integration
@pytest.mark.parametrize("dataset,threshold", [("gsm8k", 0.99), ("math", 0.97)])
def test_reference_solutions_verify(dataset, threshold):
    rep = reference_verify_report(dataset, "test")
    for f in rep["failures"]:
        print("FAIL", f)
    print(f"{dataset}/test: {rep['n'] - len(rep['failures'])}/{rep['n']} verify ({100 * rep['rate']:.2f}%)")
    assert rep["rate"] >= threshold
