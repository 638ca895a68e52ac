"""The ``dspark`` planner idling (``control.dspark_planner``, item 7): where speculation does
not pay it stops re-planning every other round and thins its probes; where it pays nothing
changes; prompt tokens newly waiting, or a cheaper verify found by a probe, end it."""

import numpy as np

from control import make_controller
from control.batch import BatchContext, RoundStats
from control.dspark import DSparkConfig
from control.registry import make_planner

CFG = DSparkConfig(k_max=8)  # the defaults: replan_rounds 2, explore_every 32


def run(rounds, cost, a_true=0.6, batch=4, backlog_at=(), seed=0, cfg=CFG, stable=None):
    """Rounds of a batch under a linear verify cost ``c0 + c1·N``; returns (planner, per round:
    (cap, whether that round ran a full plan)); ``stable``: a list that gets the planner's
    count of length-keeping full plans after each round."""
    rng = np.random.default_rng(seed)
    planner = make_planner("dspark", cfg)
    members = [make_controller("dspark", cfg) for _ in range(batch)]
    full = planner._full_plan
    ran = []

    def counted(*a, **kw):
        ran.append(True)
        return full(*a, **kw)

    planner._full_plan = counted
    out, t = [], 0.0
    for r in range(rounds):
        backlog = 300 if r in backlog_at else 0
        ran.clear()
        ctx = BatchContext(batch, 400 * batch, None, prefill_backlog=backlog, token_budget=2048)
        ks = [d.k for d in planner.plan(t, members, ctx)]
        assert planner.full_plan == bool(ran)  # the planner says which rounds it re-planned
        n_tok, steps = sum(k + 1 for k in ks), max(ks)
        d_s, v_s = steps * 1e-4, cost(r)[0] + cost(r)[1] * n_tok
        for m, k in zip(members, ks):
            n = 0
            while n < k and rng.random() < a_true:
                n += 1
            m.observe_values(t + d_s + v_s, k, n, (), d_s, v_s, 400, 0, n + 1, (), batch)
        planner.observe_round(
            RoundStats(
                t, t + d_s + v_s, batch, sum(k > 0 for k in ks), steps, n_tok, 400 * batch, d_s, v_s
            )
        )
        t += d_s + v_s
        out.append((steps, bool(ran)))
        if stable is not None:
            stable.append(planner._stable)
    planner._full_plan = full
    return planner, out


LOSING = lambda r: (0.004, 0.004)  # noqa: E731 - every verified token costs a whole step
PAYING = lambda r: (0.020, 1e-5)  # noqa: E731 - verification nearly free in tokens


def test_where_speculation_loses_full_plans_and_probes_thin_out():
    _, out = run(1024, LOSING)
    late = out[-512:]
    drafting = sum(cap > 0 for cap, _ in late)
    plans = sum(full for _, full in late)
    # without idling: a full plan every 2nd round (256) and a probe every 32 rounds (16)
    assert max(cap for cap, _ in out[-600:]) <= 1  # it settled on not drafting
    assert plans <= 48, plans
    assert 1 <= drafting <= 6, drafting  # probes go on, every 256 rounds (+ the plan after)


def test_where_speculation_pays_it_replans_every_other_round_as_before():
    p, out = run(256, PAYING)
    late = out[-128:]
    assert min(cap for cap, _ in late) >= 2
    assert sum(full for _, full in late) >= 62  # every replan_rounds = 2 (probes re-plan too)
    assert p._idle == 0


def test_prompt_tokens_newly_waiting_end_the_idle_interval():
    _, out = run(700, LOSING, backlog_at={650})
    assert out[650][1]  # the round the backlog appeared ran a full plan
    assert not out[649][1] or not out[648][1]  # (it was idling just before)


def test_a_probe_that_finds_verification_cheap_resumes_drafting():
    """Verification turns cheap at round 600 while the planner idles; the probes (thinned to
    every 256 rounds) find it: drafting resumes within two probe periods."""
    cost = lambda r: LOSING(r) if r < 600 else PAYING(r)  # noqa: E731
    _, out = run(1400, cost)
    assert max(cap for cap, _ in out[500:600]) <= 1
    resumed = next(r for r in range(600, 1400) if all(c >= 2 for c, _ in out[r : r + 20]))
    assert resumed - 600 <= 512, resumed
