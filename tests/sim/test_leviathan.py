"""Analytic check (Leviathan et al., ICML 2023, Eq. 1 and Thm 3.8): i.i.d. acceptance, fixed k,
batch 1, constant latencies with cost ratio c."""

import pytest
from conftest import constant_scenario

from sim import simulate

C = 0.05
ROUNDS = 20_000


@pytest.fixture(scope="module")
def baseline_tpot():
    # the k = 0 run: one target forward per token, whatever the acceptance rate
    return simulate(constant_scenario(out_tokens=3000), "fixed", {"k": 0}, baseline=False).summary[
        "mean_tpot_s"
    ]


@pytest.mark.parametrize("a", [0.6, 0.8, 0.9])
@pytest.mark.parametrize("k", [2, 4, 8])
def test_tokens_per_round_and_speedup(a, k, baseline_tpot):
    per_round = (1 - a ** (k + 1)) / (1 - a)
    scn = constant_scenario(a=a, c=C, out_tokens=int(ROUNDS * per_round))
    s = simulate(scn, "fixed", {"k": k}, seed=7, baseline=False).summary
    assert s["mean_accepted_length"] == pytest.approx(per_round, rel=0.01)
    assert baseline_tpot / s["mean_tpot_s"] == pytest.approx(per_round / (k * C + 1), rel=0.02)
    assert s["acceptance_rate"] == pytest.approx(a, rel=0.02)


def test_speedup_key_uses_same_seed_k0_run():
    a, k = 0.8, 4
    per_round = (1 - a ** (k + 1)) / (1 - a)
    scn = constant_scenario(a=a, c=C, out_tokens=int(8000 * per_round))
    s = simulate(scn, "fixed", {"k": k}, seed=3, baseline=True).summary
    assert s["speedup"] == pytest.approx(per_round / (k * C + 1), rel=0.02)
