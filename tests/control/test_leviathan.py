"""E(a, k) and the batch-1 speedup (Leviathan et al., ICML 2023, Eq. 1 and Thm 3.8): one home."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from control.leviathan import expected_speedup, expected_tokens


def test_expected_tokens_values():
    assert expected_tokens(0.8, 4) == pytest.approx((1 - 0.8**5) / 0.2, rel=1e-15)
    assert expected_tokens(1.0, 4) == 5.0  # every draft accepted: k + 1 tokens
    assert expected_tokens(0.0, 7) == 1.0  # nothing accepted: the target's token only
    assert expected_tokens(0.5, 0) == 1.0  # k = 0 is a plain step


@settings(max_examples=200, deadline=None)
@given(a=st.floats(0.0, 0.999), k=st.integers(0, 32))
def test_expected_tokens_is_the_geometric_sum(a, k):
    assert expected_tokens(a, k) == pytest.approx(sum(a**j for j in range(k + 1)), rel=1e-9)


@pytest.mark.parametrize("k", [1, 4, 15])
def test_expected_tokens_continuous_at_one(k):
    assert expected_tokens(1.0 - 1e-9, k) == pytest.approx(expected_tokens(1.0, k), rel=1e-6)


@pytest.mark.parametrize(
    "a, k, c, expected",
    [
        (0.8, 4, 0.0, (1 - 0.8**5) / 0.2),  # free drafting: the speedup is the tokens per round
        (1.0, 4, 0.1, 5 / 1.4),
        (0.0, 3, 0.5, 1 / 2.5),
        (0.9, 0, 0.3, 1.0),  # k = 0 is target-only decoding
    ],
)
def test_expected_speedup_values(a, k, c, expected):
    assert expected_speedup(a, k, c) == pytest.approx(expected, rel=1e-12)


def test_the_analytic_controller_uses_the_one_definition():
    from control import analytic

    assert analytic.expected_speedup is expected_speedup
