"""Analytic check (Leviathan et al., ICML 2023, Eq. 1 and Thm 3.8): i.i.d. acceptance, fixed k,
batch 1, constant latencies with cost ratio c."""

import pytest

from conftest import constant_scenario
from sim import simulate

C = 0.05
ROUNDS = 30_000


@pytest.mark.parametrize("a", [0.6, 0.8, 0.9])
@pytest.mark.parametrize("k", [2, 4, 8])
def test_tokens_per_round_and_speedup(a, k):
    per_round = (1 - a ** (k + 1)) / (1 - a)
    scn = constant_scenario(a=a, c=C, out_tokens=int(ROUNDS * per_round))
    res = simulate(scn, "fixed", {"k": k}, seed=7, baseline=True)
    s = res.summary
    assert s["mean_accepted_length"] == pytest.approx(per_round, rel=0.01)
    assert s["speedup"] == pytest.approx(per_round / (k * C + 1), rel=0.02)
    assert s["acceptance_rate"] == pytest.approx(a, rel=0.02)
