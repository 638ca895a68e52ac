"""``validate.metrics.prompt_sample``: fixed k's accepted length over the prompts' greedy
traces, pooled, with the ratio estimator's standard error over the prompts."""

import numpy as np
import pytest

from control.types import PositionRecord
from validate.metrics import prompt_sample


def _trace(runs):
    return [PositionRecord(0, t, r, ()) for t, r in enumerate(runs)]


def test_the_sample_pools_tokens_over_rounds_with_the_ratio_estimators_error():
    L = [3, 2, 1, 0, 0, 5, 4, 3, 2, 1, 0]
    # k = 6 over L: rounds at 0 (3 + 1), 4 (0 + 1) and 5 (5 + 1): 11 tokens in 3 rounds; over 7
    # misses: 7 in 7
    s = prompt_sample([_trace(L), _trace([0] * 7)], 6)
    R = 18 / 10
    assert s["accepted_length"] == pytest.approx(R) and s["prompts"] == 2 and s["fixed_k"] == 6
    resid = np.array([11 - R * 3, 7 - R * 7])
    assert s["se_pct"] == pytest.approx(100 * np.sqrt((resid**2).sum() / 1 / 2) / 5.0 / R)
    # k = 2: 0 (2 + 1), 3, 4, 5 (2 + 1), 8 (2 + 1): 11 tokens in 5 rounds
    assert prompt_sample([_trace(L)], 2)["accepted_length"] == pytest.approx(11 / 5)
    # a run past the trace's end (traces look a horizon ahead): the round stops at the end
    assert prompt_sample([_trace([5, 4, 3, 2, 1])], 6)["accepted_length"] == 5.0
    # prompts that accept alike: no error from the sample; one prompt: none can be told
    assert prompt_sample([_trace(L)] * 3, 6)["se_pct"] == pytest.approx(0.0, abs=1e-12)
    assert np.isnan(prompt_sample([_trace(L)], 6)["se_pct"])
