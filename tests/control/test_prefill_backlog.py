"""Prompt chunks in the predicted TPOT while prompts wait beyond the pass (``slo_prefill =
"backlog"``): the share of a sequence's life they fill, the blend, and the planner's use."""

from __future__ import annotations

import numpy as np
import pytest

from control.batch import BatchContext, RoundStats, Slo, plan_round
from control.dspark import DSparkConfig, DSparkController
from control.dspark_planner import DSparkPlanner
from control.goodput import RoundPlan
from control.prefill_backlog import backlog_share, predicted_terms


def test_nothing_waiting_no_budget_a_full_pass_or_no_known_life_is_no_share():
    tpr = np.array([2.0])
    assert backlog_share(0, 2048, 40, 30.0, tpr) is None
    assert backlog_share(5000, None, 40, 30.0, tpr) is None
    assert backlog_share(5000, 2048, 2048, 30.0, tpr) is None  # the drafts fill the pass
    assert backlog_share(5000, 2048, 40, 0.0, tpr) is None


def test_the_share_is_the_backlogs_rounds_over_each_sequences_life():
    # 8,000 prompt tokens at 2,048 − 48 = 2,000 spare a round: 4 rounds. Lives of 30 tokens at
    # 3, 1.5 and 0.5 (counted as 1) tokens a round: 10, 20 and 30 rounds
    f, chunk = backlog_share(8000, 2048, 48, 30.0, np.array([3.0, 1.5, 0.5]))
    np.testing.assert_allclose(f, [0.4, 0.2, 4 / 30], rtol=1e-15)
    assert chunk == 2000.0
    # a backlog that outlives a sequence: all of its life (at most 1); a short one: its chunk
    f, chunk = backlog_share(100_000, 2048, 48, 30.0, np.array([3.0]))
    assert f.tolist() == [1.0]
    assert backlog_share(500, 2048, 48, 30.0, np.array([3.0]))[1] == 500.0


def test_the_terms_blend_the_chunk_a_round_with_the_stretch():
    rng = np.random.default_rng(0)
    f, s, c, t = rng.uniform(0, 1, 5), 1.0 + rng.uniform(0, 2), 0.09, 0.03
    stretch, extra = predicted_terms(s, f, c)
    np.testing.assert_allclose(t * stretch + extra, f * (t + c) + (1 - f) * s * t, rtol=1e-14)
    np.testing.assert_array_equal(predicted_terms(s, np.zeros(3), c)[0], np.full(3, s))


def _batch_planner(prefill: str) -> tuple[DSparkPlanner, list[DSparkController]]:
    """A planner under a 50 ms TPOT SLO whose costs are learned (decode rounds of 17 ms and
    30 ms a draft step, one with a full-budget chunk of ~0.1 s), with three sequences of
    acceptance ~0.8 and 12 sequences' arrivals over its rounds' ~400 tokens."""
    cfg = DSparkConfig(slo_prefill=prefill, explore_every=0, belief_weights="fixed")
    pl = DSparkPlanner(cfg)
    pl.set_slo(Slo(2.0, 0.05))
    members = [DSparkController(cfg) for _ in range(3)]
    for m in members:
        m.set_slo(Slo(2.0, 0.05))
    for r in range(40):
        for m in members:
            m.observe_values(0.1 * r, 4, 3 if r % 5 else 1, None, 0.01, 0.03, 500, 0, 4, ())
    plan_round(pl, members, 0.0, BatchContext(3, 1500))
    pl.seqs.adopted += 9  # 9 more sequences joined and left (12 in all)
    for i, n in enumerate([6, 9, 12, 15] * 10):
        t = 0.1 * i
        steps = n // 3 - 1
        pl.observe_round(
            RoundStats(t, t + 0.03, 3, 3, steps, n, 1500, 0.03 * steps, 0.017 + 1e-4 * n, 6, 9)
        )
    pl.observe_round(  # and a round with a full-budget chunk: its 2,030 prompt tokens' ~0.1 s
        RoundStats(4.0, 4.13, 3, 3, 2, 18, 1500, 0.02, 0.117 + 1e-4 * 18, 6, 9, 2030)
    )
    pl._since = 1 << 30  # the next round plans afresh
    return pl, members


def test_behind_a_long_prompt_the_planner_drafts_longer_than_under_the_stretch():
    backlog = BatchContext(3, 1500, None, 20_000, 2048, 3.9)  # ten full chunks waiting
    calm = BatchContext(3, 1500)
    ks = {}
    for prefill in ("stretch", "backlog"):
        pl, members = _batch_planner(prefill)
        ks[prefill, "calm"] = [d.k for d in plan_round(pl, members, 4.2, calm)]
        pl, members = _batch_planner(prefill)
        ks[prefill, "backlog"] = [d.k for d in plan_round(pl, members, 4.2, backlog)]
    # nothing waiting: the same plan
    assert ks["stretch", "calm"] == ks["backlog", "calm"]
    # ten rounds of 0.1 s chunks ahead: the chunk is a cost a round that longer drafts amortise
    assert min(ks["backlog", "backlog"]) > max(ks["stretch", "backlog"])


def test_the_planners_terms_price_the_rounds_chunk_on_its_verify_fit():
    pl, members = _batch_planner("backlog")
    plan_round(pl, members, 4.2, BatchContext(3, 1500))
    life = pl._emitted / pl._arrivals
    assert pl._arrivals > 0 and life > 0
    k = np.array([2, 2, 2])
    e = np.array([[2.4, 2.4, 2.4]])
    p = RoundPlan(k, 2, np.array([2]), k[None, :], np.array([100.0]), 0.03, np.array([0.03]), e)
    batch = BatchContext(3, 1500, None, 8000, 2048, 3.9)
    s = 1.0 / (1.0 - pl.prefill_share())
    f, chunk = backlog_share(8000, 2048, 9.0, life, e[0])
    v = pl.costs.verify_s(np.array([9.0, 9.0 + chunk]), 1500)
    stretch, extra = pl._prefill_terms(batch, p)
    np.testing.assert_allclose(stretch, s - f * (s - 1.0), rtol=1e-14)
    np.testing.assert_allclose(extra, f * (v[1] - v[0]), rtol=1e-14)
    assert float(v[1] - v[0]) == pytest.approx(0.1, rel=0.1)  # the chunk's ~0.1 s
    assert pl._prefill_terms(BatchContext(3, 1500), p) == (s, 0.0)


def test_prompts_queue_once_the_oldest_has_waited_the_share_of_its_ttft_slo():
    from control.prefill_backlog import prompts_queued

    waiting = BatchContext(3, 1500, None, 800, 2048, 9.0)  # the oldest arrived at 9.0 s
    assert prompts_queued(0.5, 2.0, 10.01, waiting)  # 1.01 s > 0.5 × 2 s
    assert not prompts_queued(0.5, 2.0, 10.0, waiting)  # exactly the share: not yet
    assert not prompts_queued(0.0, 2.0, 100.0, waiting)  # 0: never
    assert not prompts_queued(0.5, 2.0, 100.0, BatchContext(3, 1500))  # no arrival told
