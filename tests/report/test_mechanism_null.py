"""The independent-chain null of the controllability table: each epsilon step is compared with the state an
independent chain (a Base sample's, drawn by the same policy from the same s_0) holds at that step."""
import pandas as pd
import pytest

from ctrls.report.mechanism import null_steps


def test_null_steps_pair_each_step_with_an_independent_chain_and_fall_back_when_one_is_short():
    base = pd.DataFrame([{"question_id": "q", "sample_index": 0, "chain_eps": [0.1], "chains": [[1, 1]]},
                         {"question_id": "q", "sample_index": 1, "chain_eps": [0.1], "chains": [[2, 0, 3]]}])
    row = pd.DataFrame([{"question_id": "q", "sample_index": 0, "states": [1, 0, 3], "encoded": [1, 0, 3]}])
    f, n, q = null_steps(row, base, 0.1)
    assert f.tolist() == [1, 1, 1]  # every step lands in its drawn state
    assert n.tolist() == [1, 0, 1]  # sample 0's chain for steps 0-1, then sample 1's (the only one long enough)
    assert q == ["q", "q", "q"]
    with pytest.raises(ValueError, match="no state chain drawn with epsilon 0.3"):
        null_steps(row, base, 0.3)
