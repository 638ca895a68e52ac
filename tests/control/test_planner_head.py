"""``dspark`` on a drafter's confidence head (``acceptance_source = "confidence"``): the survival
stop (``Decision.survival``, :func:`control.types.draft_stop`), the break-even it is set to
(:func:`control.goodput.break_even`), and the planner's decisions."""

from __future__ import annotations

import numpy as np
import pytest

from control.batch import BatchContext, RoundStats
from control.dspark import DSparkConfig, DSparkController
from control.goodput import CostFunctions, break_even, plan_round_lengths
from control.registry import make_planner
from control.types import Decision, draft_stop
from sim.drafting import confidence_stop


def linear_costs(c0, c1, s0):
    return CostFunctions(
        verify_s=lambda n: c0 + c1 * np.asarray(n, float),
        verify_slope=lambda n: np.full(np.shape(np.atleast_1d(n)), c1),
        step_s=lambda d: np.full(np.shape(np.atleast_1d(d)), s0),
    )


def test_draft_stop_cuts_at_the_first_low_confidence_or_survival():
    c = (0.9, 0.8, 0.7, 0.95)  # survival 0.9, 0.72, 0.504, 0.4788
    assert draft_stop(c, 4) == 4
    assert draft_stop(c, 4, survival=0.5) == 3
    assert draft_stop(c, 4, survival=0.72) == 2  # 0.72 itself is kept
    assert draft_stop(c, 4, survival=0.73) == 1
    assert draft_stop(c, 4, tau=0.75, survival=0.4) == 2  # τ fires first
    assert draft_stop(c, 2, survival=0.5) == 2  # within k
    assert draft_stop(c[:2], 4, survival=0.5) == 4  # past the confidences given: kept
    # the flag the simulator reads per sequence: either stop set
    assert [
        Decision(k=3).stops,
        Decision(k=3, tau=0.1).stops,
        Decision(k=3, survival=0.2).stops,
    ] == [False, True, True]


def test_the_simulators_stops_match_the_rule_and_the_survival_cut_saves_no_step():
    rng = np.random.default_rng(4)
    conf = rng.uniform(0.3, 1.0, (40, 7))
    k = rng.integers(0, 8, 40)
    tau = np.where(rng.random(40) < 0.3, 0.5, 0.0)
    surv = np.where(rng.random(40) < 0.6, rng.uniform(0.05, 0.6, 40), 0.0)
    drafted, steps = confidence_stop(conf, tau, k, surv)
    want = [draft_stop(conf[i].tolist(), int(k[i]), tau[i], surv[i]) for i in range(40)]
    assert drafted.tolist() == want
    _, tau_steps = confidence_stop(conf, tau, k)
    assert steps == tau_steps  # what the τ stops alone ran


def test_break_even_is_the_threshold_the_plan_holds_each_token_to():
    """With i.i.d. rates a_i, each sequence's planned length below the cap is the number of
    positions j with a_i^j ≥ its break-even (the plan's own condition, at its fixed point)."""
    costs = linear_costs(0.02, 4e-4, 1e-3)
    a = np.array([0.95, 0.8, 0.6, 0.3])
    alpha = np.array([1.0, 1.0, 0.5, 1.0])
    p = plan_round_lengths(a, np.full(4, 12), costs, 12, alpha)
    row = int(np.argmax(p.goodput))
    thr = break_even(p, row, costs, alpha)
    assert thr[2] == pytest.approx(2 * thr[0])  # α = 0.5 doubles its time penalty
    for i in range(4):
        kj = int(np.sum(a[i] ** np.arange(1, 13) >= thr[i]))
        assert p.k[i] == min(kj, p.cap) or p.k[i] == 0
    assert p.k[0] == p.cap > p.k[3]


def drive(planner, members, rounds, rng, conf_of):
    """Rounds under a linear cost; each member's confidences ``conf_of(i)`` at every position,
    outcomes drawn from them. Returns each round's decisions."""
    t, out = 0.0, []
    for _ in range(rounds):
        decs = planner.plan(t, members, BatchContext(len(members), 100 * len(members)))
        out.append(decs)
        drafted, accepted, confs = [], [], []
        for i, d in enumerate(decs):
            c = (conf_of(i),) * d.k
            m = draft_stop(c, d.k, d.tau, d.survival)
            n = 0
            while n < m and rng.random() < c[n]:
                n += 1
            drafted.append(m)
            accepted.append(n)
            confs.append(c[:m])
        tokens = sum(m + 1 for m in drafted)
        d_s, v_s = 0.001, 0.01 + 0.002 * tokens
        for mem, m, n, c in zip(members, drafted, accepted, confs):
            mem.observe_values(t + d_s + v_s, m, n, c, d_s, v_s, 100, 0, n + 1, ())
        planner.observe_round(
            RoundStats(t, t + d_s + v_s, len(members), sum(m > 0 for m in drafted), 1, tokens,
                       100 * len(members), d_s, v_s)
        )  # fmt: skip
        t += d_s + v_s
    return out


def test_the_head_mode_drafts_to_the_cap_and_cuts_at_each_sequences_break_even():
    """Once its costs are learned, a head-mode plan gives every sequence the round's cap and
    its break-even survival (the same for sequences of one α), held between full plans; the
    outcome mode plans lengths and never sets a survival stop."""
    cfg = DSparkConfig(k_max=7, acceptance_source="confidence", explore_every=0)
    planner = make_planner("dspark", cfg)
    members = [DSparkController(cfg) for _ in range(4)]
    rates = [0.9, 0.9, 0.5, 0.3]
    decs = drive(planner, members, 60, np.random.default_rng(1), lambda i: rates[i])
    late = decs[-20:]
    for row in late:
        assert len({d.k for d in row}) == 1 and row[0].k > 0
        assert len({d.survival for d in row}) == 1 and 0.0 < row[0].survival < 1.0
    costs = planner.cost_functions(BatchContext(4, 400))
    assert planner.costs.ready and costs.verify_slope(np.array([20]))[0] == pytest.approx(0.002)
    # a newcomer between two full plans drafts the cap with the plan's survival (its α is 1)
    new = DSparkController(cfg)
    planner._since = 0  # the next round keeps the plan
    row = planner.plan(99.0, [*members, new], BatchContext(5, 500))
    assert planner._since == 1 and row[-1].k == row[0].k
    assert row[-1].survival == row[0].survival > 0.0
    plain = make_planner("dspark", DSparkConfig(k_max=7, explore_every=0))
    pm = [DSparkController(plain.config) for _ in range(4)]
    odecs = drive(plain, pm, 60, np.random.default_rng(1), lambda i: rates[i])
    assert all(d.survival == 0.0 for row in odecs for d in row)
    assert any(len({d.k for d in row}) > 1 for row in odecs[-20:])  # lengths per sequence


def test_decisions_with_a_survival_stop_round_trip_through_records():
    from control.types import Observation, RoundRecord, records_from_rows, records_to_columns

    d = Decision(k=5, survival=0.125)
    obs = Observation(1.0, 3, 2, (0.9, 0.5, 0.3), 0.001, 0.01, 50)
    r = RoundRecord.from_round(0, 0, d, obs)
    cols = records_to_columns([r])
    rows = [dict(zip(cols, vals)) for vals in zip(*cols.values())]
    assert records_from_rows(rows)[0].survival == 0.125
    rows[0].pop("survival")  # a trace written before the column: the default
    assert records_from_rows(rows)[0].survival == 0.0
