"""Planning against the driver's SLOs: the SLO-goodput row, the TTFT urgency, the protocol."""

from __future__ import annotations

import math

import numpy as np
import pytest

from control.batch import BatchContext, RoundStats, Slo, plan_round, told_slo
from control.dspark import DSparkConfig, DSparkController
from control.dspark_planner import DSparkPlanner
from control.goodput import (
    CostFunctions,
    RoundPlan,
    binding_hurdle,
    mean_tpot_row,
    plan_round_lengths,
    round_seconds,
    slo_floor_plan,
    slo_goodput_row,
)
from control.seqstate import DECODE_S, TOKENS
from control.types import Observation


def _plan(seconds, expected):
    t = np.asarray(seconds, dtype=float)
    e = np.asarray(expected, dtype=float)
    g = e.sum(axis=1) / t
    k = np.zeros(e.shape, dtype=np.int64)
    return RoundPlan(k[0], 0, np.arange(len(t)), k, g, float(t[0]), t, e)


def test_a_row_that_pushes_a_sequence_past_the_tpot_slo_loses_to_one_that_keeps_it():
    # row 1 has more goodput (4.1 / 0.06 = 68.3 against 3.3 / 0.05 = 66) but sequence 2's
    # predicted TPOT there is 0.06 / 1.1 = 54.5 ms > 50 ms: its share 3.0 / 4.1 makes 50.0
    p = _plan([0.05, 0.06], [[1.8, 1.5], [3.0, 1.1]])
    assert int(np.argmax(p.goodput)) == 1
    assert slo_goodput_row(p, 0.05) == 0
    # a slack SLO: the goodput choice
    assert slo_goodput_row(p, 1.0) == 1
    # both rows lose every token: the goodput choice again
    assert slo_goodput_row(p, 0.001) == 1


def test_the_mean_tpot_row_weighs_each_sequence_where_goodput_weighs_each_token():
    # row 1 makes more tokens a second (5.0 / 0.06 = 83.3 against 4.0 / 0.05 = 80) by the first
    # sequence; the second's time per token rises from 0.05 / 2 to 0.06 / 1.2: the mean of the
    # two, 0.05 · (1/2 + 1/2) / 2 = 0.025 against 0.06 · (1/3.8 + 1/1.2) / 2 = 0.0329
    p = _plan([0.05, 0.06], [[2.0, 2.0], [3.8, 1.2]])
    assert int(np.argmax(p.goodput)) == 1
    assert mean_tpot_row(p) == 0
    # equal means (0.1 · 1/4 and 0.05 · (1/1.25 + 1/5) / 2): the higher goodput, 125 against 80
    q = _plan([0.1, 0.05], [[4.0, 4.0], [1.25, 5.0]])
    assert mean_tpot_row(q) == 1


def _no_slo_planner(rank: str) -> DSparkPlanner:
    """A planner whose costs are learned (rounds at two token counts) and no SLO."""
    pl = DSparkPlanner(DSparkConfig(no_slo_rank=rank, explore_every=0, belief_weights="fixed"))
    for i, n in enumerate([40, 80] * 10):
        pl.observe_round(
            RoundStats(0.1 * i, 0.1 * i + 0.06, 20, 20, 2, n, 5000, 0.01, 0.03 + 3e-4 * n)
        )
    return pl


def test_without_an_slo_and_no_queue_the_mean_tpot_rank_plans_and_with_a_queue_goodput():
    members = [DSparkController(DSparkConfig(belief_weights="fixed")) for _ in range(20)]
    for i, m in enumerate(members):  # half the batch accepts 0.9, half 0.3
        n = 4 if i < 10 else 0
        for r in range(30):
            m.observe_values(
                0.1 * r, 4, n if r % 2 else min(n, 2), None, 0.01, 0.03, 500, 0, 1 + n, ()
            )
    calm = BatchContext(20, 10_000)
    queued = BatchContext(20, 10_000, None, 5000, 512, 0.0)  # a prompt waiting since t = 0
    lengths = {}
    for rank in ("goodput", "mean-tpot"):
        for name, batch in (("calm", calm), ("queued", queued)):
            pl = _no_slo_planner(rank)
            ks = [d.k for d in pl.plan(100.0, members, batch)]
            lengths[rank, name] = ks
    # prompts queueing: the same plan either way; none waiting: the hard half drafts more under
    # the mean-TPOT rank (its time per token weighs as much as an easy sequence's)
    assert lengths["goodput", "queued"] == lengths["mean-tpot", "queued"]
    assert lengths["goodput", "calm"] != lengths["mean-tpot", "calm"]
    assert sum(lengths["mean-tpot", "calm"][10:]) > sum(lengths["goodput", "calm"][10:])
    # the throughput objective ranks by goodput whatever the rank asked for
    pl = DSparkPlanner(DSparkConfig(objective="throughput", no_slo_rank="mean-tpot"))
    assert not pl._ranks_latency(100.0, calm)


def test_rows_whose_goodput_is_below_zero_still_give_the_best_row():
    # a displaced-prompt penalty can outweigh every row's tokens (planners that search caps
    # near the last one have no draft-free row): the least negative score wins, never no row
    p = _plan([0.05, 0.06], [[1.8, 1.5], [3.0, 1.1]])
    neg = RoundPlan(
        p.k, 0, p.caps, p.k_by_cap, np.array([-40.0, -30.0]), 0.05, p.seconds_by_cap, p.expected
    )
    assert slo_goodput_row(neg, 1.0) == 1
    assert slo_goodput_row(neg, 1.0, spread=0.1) == 1


def test_the_logistic_count_is_the_hard_cut_as_its_spread_shrinks():
    p = _plan([0.05, 0.06], [[1.8, 1.5], [3.0, 1.1]])
    assert slo_goodput_row(p, 0.05, spread=1e-4) == slo_goodput_row(p, 0.05, spread=0.0) == 0
    # a wide spread: sequence 2 at 54.5 ms still counts 0.46 in row 1 (68.3 · 0.86 = 58.7),
    # row 0 counts σ(0.44) and σ(0.33) (≈ 66 · 0.60 = 39.8): row 1
    assert slo_goodput_row(p, 0.05, spread=1.0) == 1


def test_a_sequences_tpot_so_far_is_carried_over_the_horizon():
    p = _plan([0.05, 0.06], [[1.8, 1.5], [3.0, 1.1]])
    # sequence 2 is far ahead of its SLO (10 tokens in 0.1 s): with 4 rounds like row 1 it
    # predicts (0.1 + 0.24) / (10 + 4.4) = 23.6 ms and row 1 keeps it
    d, n = np.array([0.0, 0.1]), np.array([0.0, 10.0])
    assert slo_goodput_row(p, 0.05, d, n, horizon=4.0) == 1
    # far behind (10 tokens in 1 s): it misses in both rows, and row 1 has more goodput and
    # the higher share (3.0 / 4.1 against 1.8 / 3.3)
    assert slo_goodput_row(p, 0.05, np.array([0.0, 1.0]), n, horizon=4.0) == 1


def test_attainment_counts_requests_where_slo_goodput_counts_tokens():
    # three sequences; row 1 (one more draft step) doubles the tokens of the two that accept
    # well and lengthens the round for the one that does not: 21 ms a token there against
    # 16 ms (SLO 20 ms, hard cut). Tokens: row 1 keeps 4 of 5 at 5 / 0.021 = 238 tok/s: 190.5
    # of SLO goodput against row 0's 3 / 0.016 = 187.5; requests: row 0 meets all three, row 1
    # two
    p = _plan([0.016, 0.021], [[1.0, 1.0, 1.0], [2.0, 2.0, 1.0]])
    assert slo_goodput_row(p, 0.02, spread=0.0, rank="slo-goodput") == 1
    assert slo_goodput_row(p, 0.02, spread=0.0, rank="attainment") == 0
    # every sequence meets the SLO in both rows: goodput breaks the tie
    assert slo_goodput_row(p, 1.0, spread=0.0, rank="attainment") == 1


def test_the_stretch_scales_every_predicted_tpot():
    # row 1 predicts 0.06 / 1.1 = 54.5 ms for sequence 2: with the SLO at 60 ms it meets; with
    # the rounds stretched by 1.25 (a fifth of the replica's time on prompt chunks) it does
    # not (68.2 ms), nor in row 0 (0.05 · 1.25 / 1.5 = 41.7 ms: it does)
    p = _plan([0.05, 0.06], [[1.8, 1.5], [3.0, 1.1]])
    assert slo_goodput_row(p, 0.06, spread=0.0, rank="attainment") == 1
    assert slo_goodput_row(p, 0.06, spread=0.0, rank="attainment", stretch=1.25) == 0


def test_added_chunk_seconds_favour_the_row_that_amortises_them():
    # SLO 50 ms. Sequence 2 predicts 0.05 / 1.5 = 33.3 ms in row 0 and 0.06 / 1.1 = 54.5 ms in
    # row 1: row 0 keeps both sequences. With 0.03 s of prompt chunk added to every round it
    # predicts 0.08 / 1.5 = 53.3 ms and 0.09 / 1.1 = 81.8 ms (a miss in both rows), sequence 1
    # 44.4 and 30 ms (a meet in both): attainment ties at 1/2 and row 1's goodput wins
    p = _plan([0.05, 0.06], [[1.8, 1.5], [3.0, 1.1]])
    assert slo_goodput_row(p, 0.05, spread=0.0, rank="attainment") == 0
    assert slo_goodput_row(p, 0.05, spread=0.0, rank="attainment", extra_s=0.03) == 1
    # the planner adds its recent chunk seconds a round under slo_prefill = "additive"
    pl = _planner(slo_prefill="additive")
    pl.observe_round(RoundStats(0.0, 0.1, 20, 20, 2, 60, 0, 0.02, 0.08, prefill_tokens=180))
    calm = BatchContext(2, 1000)
    assert pl._prefill_terms(calm, p) == (1.0, pytest.approx(0.06))
    assert _planner()._prefill_terms(calm, p) == (1.0, 0.0)


def test_the_prefill_share_is_the_chunks_share_of_the_recent_round_time():
    from control.dspark_planner import PREFILL_SHARE_MAX, PREFILL_SHARE_RATE

    pl = _planner()
    assert pl.prefill_share() == 0.0
    # a 0.1 s round whose verify pass (0.08 s) carried 60 decode and 180 prompt tokens: the
    # chunk's 0.06 s of it; then a 0.05 s round without a chunk
    pl.observe_round(RoundStats(0.0, 0.1, 20, 20, 2, 60, 0, 0.02, 0.08, prefill_tokens=180))
    assert pl.prefill_share() == pytest.approx(0.6)
    pl.observe_round(RoundStats(0.1, 0.15, 20, 20, 2, 60, 0, 0.01, 0.04))
    r = PREFILL_SHARE_RATE
    want = (0.06 * (1 - r)) / (0.1 + r * (0.05 - 0.1))
    assert pl.prefill_share() == pytest.approx(want, rel=1e-12)
    assert pl.state()["prefill_share"] == pl.prefill_share()
    # a replica that only prefills still plans its decode: the share is capped
    only = _planner()
    only.observe_round(RoundStats(0.0, 0.1, 1, 0, 0, 1, 0, 0.0, 0.1, prefill_tokens=10**6))
    assert only.prefill_share() == PREFILL_SHARE_MAX


def test_with_a_slack_slo_the_planner_rows_are_the_goodput_plan():
    rng = np.random.default_rng(3)
    a = rng.uniform(0.3, 0.95, 12)
    costs = CostFunctions(
        verify_s=lambda n: 0.02 + 1e-4 * n,
        verify_slope=lambda n: np.full_like(np.asarray(n, dtype=float), 1e-4),
        step_s=lambda d: np.full_like(np.asarray(d, dtype=float), 0.003),
    )
    p = plan_round_lengths(a, np.full(12, 8), costs, 8)
    assert slo_goodput_row(p, 1e3) == int(np.argmax(p.goodput))
    assert p.seconds_by_cap is not None and p.expected is not None
    assert p.seconds_by_cap[int(np.argmax(p.goodput))] == pytest.approx(p.seconds)


def _planner(**kw) -> DSparkPlanner:
    pl = DSparkPlanner(DSparkConfig(**kw))
    pl.set_slo(Slo(2.0, 0.05))
    return pl


def test_ttft_urgency_is_twice_the_backlog_time_over_the_slack_capped():
    pl = _planner(ttft_value_max=8.0)
    pl.observe_round(RoundStats(0.0, 0.1, 10, 10, 1, 20, 1000, 0.01, 0.09))
    # 3000 prompt tokens at 2048 − 48 spare a pass: 2 rounds of 0.1 s; the oldest prompt
    # arrived 1.5 s ago: slack 0.5 s -> 2 · 0.2 / 0.5 = 0.8
    b = BatchContext(48, 0, None, 3000, 2048, 8.5)
    assert pl.ttft_urgency(10.0, b) == pytest.approx(0.8)
    # 1.9 s ago: slack 0.1 s -> 4, and past its SLO: the cap
    assert pl.ttft_urgency(10.4, b) == pytest.approx(4.0)
    assert pl.ttft_urgency(11.0, b) == 8.0
    # nothing waiting, no SLO told, or no arrival given: no urgency
    assert pl.ttft_urgency(10.0, BatchContext(48, 0, None, 0, 2048, 8.5)) == 1.0
    assert pl.ttft_urgency(10.0, BatchContext(48, 0, None, 3000, 2048, None)) == 1.0
    untold = DSparkPlanner(DSparkConfig())
    assert untold.ttft_urgency(10.0, b) == 1.0
    assert not untold.serves_slo()


def test_the_objective_throughput_ignores_the_slo():
    assert _planner().serves_slo()
    assert not _planner(objective="throughput").serves_slo()


def test_the_simulator_tells_planners_and_controllers_the_scenario_slos():
    from sim import load_scenario
    from sim.cluster import Cluster
    from sim.engine import _planner as sim_planner
    from sim.params import EngineParams

    scn = load_scenario("configs/tiny.toml", {"slo.ttft_s": 1.5, "slo.tpot_s": 0.03})
    params = EngineParams.of(scn, Cluster(scn))
    p = sim_planner(lambda: DSparkPlanner(DSparkConfig()), params, Cluster(scn))
    assert p.slo == Slo(1.5, 0.03)
    c = told_slo(lambda: DSparkController(), Slo(1.5, 0.03))()
    assert c.slo == Slo(1.5, 0.03)


def test_a_solo_sequence_plans_with_the_slo_its_driver_gave():
    c = DSparkController()
    c.set_slo(Slo(math.inf, 0.04))
    c.decide(0.0)
    assert c._solo is not None and c._solo.slo == Slo(math.inf, 0.04)
    # and its TPOT trim measures against that SLO, not the config's 50 ms: rounds of 20 ms
    # that emit one token each read a latency ratio of 0.02 / 0.04 at the first block end
    assert c.config.slo_tpot_s == 0.05
    for i in range(400):
        c.observe(Observation(now_s=0.02 * (i + 1), drafted=0, accepted=0, verify_s=0.02))
        if c.latency_ratio is not None:
            break
    assert c.latency_ratio == pytest.approx(0.5)


def test_requests_past_their_ttft_slo_count_in_no_share():
    p = _plan([0.05, 0.06], [[1.8, 1.5], [3.0, 1.1]])
    # sequence 2 (the one row 1 pushes past the TPOT SLO) already missed its TTFT SLO:
    # only sequence 1's share counts, and it meets in both rows: the goodput row
    assert slo_goodput_row(p, 0.05, lost=np.array([False, True])) == 1
    assert slo_goodput_row(p, 0.05, lost=np.array([False, False])) == 0
    assert slo_goodput_row(p, 0.05, lost=np.array([True, True])) == 1


def test_the_simulator_tells_each_controller_its_ttft():
    from sim import load_scenario
    from sim.api import simulate

    scn = load_scenario("configs/tiny.toml", {"workload.num_requests": 8})
    seen = []

    class Spy(DSparkController):
        def first_token(self, ttft_s):
            seen.append(ttft_s)
            super().first_token(ttft_s)

    import control.registry as reg

    reg._REGISTRY["spy-dspark"] = ("tests.control.test_slo_plan", "Spy", "DSparkConfig")
    globals()["Spy"] = Spy
    try:
        res = simulate(scn, "spy-dspark", baseline=False)
    finally:
        del reg._REGISTRY["spy-dspark"]
    req = res.requests
    multi = req[req.output_tokens > 1]
    assert sorted(seen) == pytest.approx(sorted(multi.ttft_s))


def _linear_costs():
    return CostFunctions(
        verify_s=lambda n: 0.02 + 1e-4 * np.asarray(n, dtype=float),
        verify_slope=lambda n: np.full_like(np.asarray(n, dtype=float), 1e-4),
        step_s=lambda d: np.full_like(np.asarray(d, dtype=float), 0.003),
    )


def test_the_slo_floor_raises_a_sequence_to_the_shortest_length_that_meets_the_slo():
    # i.i.d. rates: E(a, k) = 1 + a + ... + a^k. Hand-made rows (caps 0..3) where sequence 1
    # (a = 0.5) does not draft: at cap 2 the round takes 0.02 + 1e-4·(2+0+2) + 2·0.003 =
    # 0.0264 s. Against a 20 ms SLO it needs 0.0264 / 0.02 = 1.32 tokens: k = 1 gives 1.5
    a = np.array([0.9, 0.5])
    costs = _linear_costs()
    k = np.array([[0, 0], [1, 0], [2, 0], [3, 0]])
    t = round_seconds(k, costs)
    e = np.array([[sum(x**j for j in range(n + 1)) for x, n in zip(a, row)] for row in k])
    p = RoundPlan(k[2], 2, np.arange(4), k, e.sum(1) / t, float(t[2]), t, e)
    f = slo_floor_plan(p, a, np.array([8, 8]), costs, 0.02)
    assert t[2] == pytest.approx(0.0264)
    assert f.k_by_cap[2].tolist() == [2, 1]
    # cap 1: 0.02 + 1e-4·(1+0+2) + 0.003 = 0.0233 s needs 1.165 tokens; k = 1 again
    assert f.k_by_cap[1].tolist() == [1, 1]
    # cap 0 cannot draft: unchanged; cap 3 also raises sequence 1 to 1
    assert f.k_by_cap[0].tolist() == [0, 0] and f.k_by_cap[3].tolist() == [3, 1]
    # the raised rows are re-timed and re-scored
    assert f.seconds_by_cap[2] == pytest.approx(round_seconds(np.array([[2, 1]]), costs)[0])
    assert f.expected[2].tolist() == pytest.approx([1 + 0.9 + 0.81, 1.5])
    assert f.goodput[2] == pytest.approx(f.expected[2].sum() / f.seconds_by_cap[2])
    # a slack SLO, a sequence that cannot meet it within the cap, or one past its TTFT SLO:
    # nothing moves
    assert slo_floor_plan(p, a, np.array([8, 8]), costs, 1.0) is p
    tight = slo_floor_plan(p, a, np.array([8, 8]), costs, 0.0264 / 1.9)
    assert tight.k_by_cap[2].tolist() == [2, 0]  # a = 0.5 never reaches 1.9 tokens by k = 2
    lost = slo_floor_plan(p, a, np.array([8, 8]), costs, 0.02, lost=np.array([False, True]))
    assert lost is p
    # its own bound (a cool-down: kcap 0) holds
    assert slo_floor_plan(p, a, np.array([8, 0]), costs, 0.02) is p


def test_the_slo_floor_keeps_a_plan_whose_sequences_all_meet_the_slo():
    rng = np.random.default_rng(5)
    a = rng.uniform(0.3, 0.95, 16)
    p = plan_round_lengths(a, np.full(16, 8), _linear_costs(), 8)
    assert slo_floor_plan(p, a, np.full(16, 8), _linear_costs(), 10.0) is p


def test_the_slo_floor_with_per_position_rates_stays_within_the_positions_known():
    # rates for 2 positions only (a block drafter's confidences) under caps up to 4: a
    # sequence that would need a third position is left alone, one that needs the second rises
    a = np.array([[0.5, 0.9], [0.5, 0.9]])  # (positions, B)
    costs = _linear_costs()
    k = np.array([[0, 0], [1, 0], [2, 0], [2, 0], [2, 0]])
    t = round_seconds(k, costs)
    cum = np.cumsum(np.vstack([np.ones(2), np.cumprod(a, axis=0)]), axis=0)
    e = cum[k, np.arange(2)[None, :]]
    p = RoundPlan(k[2], 2, np.arange(5), k, e.sum(1) / t, float(t[2]), t, e)
    # cap 4's round: 0.02 + 1e-4·4 + 2·0.003 = 0.0264 s; at a 15 ms SLO it needs 1.76 tokens:
    # sequence 1 reaches 1 + 0.9 = 1.9 at k = 1, sequence 0 would need a third position
    f = slo_floor_plan(p, a, np.array([8, 8]), costs, 0.015)
    assert f.k_by_cap[4].tolist() == [2, 1]
    # needing 2.8 tokens, sequence 1 too would need a third position (it reaches 2.71 at 2)
    g = slo_floor_plan(p, a, np.array([8, 8]), costs, 0.0264 / 2.8)
    assert g is p


def test_a_sequence_behind_its_slo_counts_while_its_life_left_can_recover():
    # sequence 2 has run at 70 ms a token (1.4 s over 20 tokens; SLO 50 ms, hard cut). Row 0
    # gives it 0.05 / 1.5 = 33.3 ms a token, row 1 54.5 ms; sequence 1 meets both rows
    p = _plan([0.05, 0.06], [[1.8, 1.5], [3.0, 1.1]])
    d, n = np.array([0.0, 1.4]), np.array([0.0, 20.0])
    kw = {"spread": 0.0, "rank": "attainment"}
    # 4 rounds like the row: (1.4 + 0.2) / 26 = 61.5 ms and 67.2 ms, a miss in both rows:
    # it stops counting and row 1's goodput decides
    assert slo_goodput_row(p, 0.05, d, n, horizon=4.0, **kw) == 1
    # 200 more tokens (its expected remaining output): (1.4 + 200 · 0.0333) / 220 = 36.7 ms
    # in row 0, 55.9 ms in row 1: row 0 keeps it
    assert slo_goodput_row(p, 0.05, d, n, horizon=4.0, horizon_tokens=200.0, **kw) == 0
    # 5 tokens left: 62.7 ms in row 0 as well: row 1 again
    assert slo_goodput_row(p, 0.05, d, n, horizon=4.0, horizon_tokens=5.0, **kw) == 1


def _told_planner(**kw) -> tuple[DSparkPlanner, list[DSparkController]]:
    """A planner under a 15 ms TPOT SLO with learned costs (decode rounds of ~18 ms and 6 ms
    a draft step) and four sequences accepting ~0.9, 0.8, 0.5 and 0.3, its next round a full
    plan (the rank's hurdle off unless given)."""
    cfg = DSparkConfig(
        **{"explore_every": 0, "belief_weights": "fixed", "slo_rank_hurdle": 0.0, **kw}
    )
    pl = DSparkPlanner(cfg)
    pl.set_slo(Slo(2.0, 0.015))
    members = [DSparkController(cfg) for _ in range(4)]
    for m in members:
        m.set_slo(Slo(2.0, 0.015))
    rng = np.random.default_rng(0)
    for r in range(40):
        for m, a in zip(members, [0.9, 0.8, 0.5, 0.3]):
            ok = rng.random(4) < a
            n = 4 if ok.all() else int(np.argmin(ok))
            m.observe_values(0.1 * r, 4, n, None, 0.01, 0.03, 500, 0, n + 1, ())
    plan_round(pl, members, 0.0, BatchContext(4, 2000))
    for i, n in enumerate([8, 12, 16, 20] * 10):
        t, steps = 0.1 * i, n // 4 - 1
        pl.observe_round(
            RoundStats(t, t + 0.03, 4, 4, steps, n, 2000, 0.006 * steps, 0.017 + 1e-4 * n, 8, 12)
        )
    pl._since = 1 << 30  # the next round plans afresh
    return pl, members


def test_while_prompts_queue_past_the_wait_the_plan_takes_the_congested_spread():
    # the oldest waiting prompt has waited 0.2 s (calm) or 1.7 s (queued: past 0.5 × 2 s)
    calm, queued = (BatchContext(4, 2000, None, 500, 2048, since) for since in (4.0, 2.5))
    ks = {}
    for name, kw in (
        ("narrow", {"slo_spread": 0.01}),
        ("wide", {"slo_spread": 0.3}),
        ("switch", {"slo_spread": 0.01, "slo_congested_wait": 0.5, "slo_congested_spread": 0.3}),
    ):
        for state, batch in (("calm", calm), ("queued", queued)):
            pl, members = _told_planner(**kw)
            ks[name, state] = [d.k for d in plan_round(pl, members, 4.2, batch)]
    # the spread decides here: the narrow one drafts 3 for the three that accept well and
    # stops the fourth, the wide one drafts 1 for each
    assert ks["narrow", "calm"] == [3, 3, 3, 0] and ks["wide", "calm"] == [1, 1, 1, 1]
    assert ks["switch", "calm"] == ks["narrow", "calm"] == ks["narrow", "queued"]
    assert ks["switch", "queued"] == ks["wide", "queued"] != ks["narrow", "queued"]


def test_a_rank_hurdle_takes_the_lowest_cap_within_it_of_the_best_share():
    # shares meeting a 20 ms TPOT (hard cut; predicted TPOT = T_r / E_ir): row 0 16 ms for
    # three sequences and 32 ms for the fourth (3/4), row 1 10.5 and 26.3 ms (3/4), row 2 8.7
    # and 18.6 ms (4/4)
    p = _plan([0.016, 0.021, 0.026], [[1, 1, 1, 0.5], [2, 2, 2, 0.8], [3, 3, 3, 1.4]])
    kw = {"spread": 0.0, "rank": "attainment"}
    assert slo_goodput_row(p, 0.02, **kw) == slo_goodput_row(p, 0.02, hurdle=0.2, **kw) == 2
    assert slo_goodput_row(p, 0.02, hurdle=0.25, **kw) == 0  # the lowest of the rows within
    # the SLO-goodput rank scores tokens a second, not shares: no hurdle
    assert slo_goodput_row(p, 0.02, spread=0.0, rank="slo-goodput", hurdle=0.25) == 2


def test_the_planner_ranks_with_its_hurdle_and_without_it_while_prompts_queue():
    calm, queued = (BatchContext(4, 2000, None, 500, 2048, since) for since in (4.0, 2.5))
    # the narrow spread's expected shares by cap 1 / 2 / 3 here: 0.292 / 0.494 / 0.4998: cap 3
    # (three sequences draft 3, the fourth is stopped) by 0.006 over cap 2, by 0.21 over cap 1
    ks = {}
    for h in (0.0, 0.24, 0.25):
        for state, batch in (("calm", calm), ("queued", queued)):
            pl, members = _told_planner(slo_spread=0.01, slo_rank_hurdle=h)
            ks[h, state] = [d.k for d in plan_round(pl, members, 4.2, batch)]
            pl, members = _told_planner(
                slo_spread=0.01, slo_rank_hurdle=h, slo_congested_wait=0.5,
                slo_congested_spread=0.01,
            )  # fmt: skip
            ks[h, state, "switch"] = [d.k for d in plan_round(pl, members, 4.2, batch)]
    assert ks[0.0, "calm"] == ks[0.0, "queued"] == [3, 3, 3, 0]
    assert ks[0.25, "calm"] == ks[0.25, "queued"] == [1, 1, 1, 1]  # cap 1 within 0.25
    # 0.24 of four sequences is less than one: no hurdle
    assert ks[0.24, "calm"] == [3, 3, 3, 0]
    # past the congested wait the hurdle is off (the switch's own spread, equal here)
    assert ks[0.25, "calm", "switch"] == [1, 1, 1, 1]
    assert ks[0.25, "queued", "switch"] == ks[0.0, "queued"] == [3, 3, 3, 0]
    # the hurdle applies only while the batch's mean TPOT so far reaches slo_hurdle_from of
    # the SLO: here its sequences have run at ~3x the 15 ms SLO (~46 ms a token so far)
    pl, members = _told_planner()
    v = pl.seqs.values[pl.seqs.slots_of(members)]
    so_far = float(np.mean(v[:, DECODE_S] / v[:, TOKENS]))
    assert 2.5 < so_far / 0.015 < 3.5
    for start, want in ((2.5, [1, 1, 1, 1]), (3.5, [3, 3, 3, 0])):
        pl, members = _told_planner(slo_spread=0.01, slo_rank_hurdle=0.25, slo_hurdle_from=start)
        assert [d.k for d in plan_round(pl, members, 4.2, calm)] == want


def test_the_hurdle_binds_from_a_mean_tpot_so_far_and_one_sequence_of_the_batch():
    # 50 sequences at 20 ms a token so far and 50 new ones (no token yet): the mean over the
    # 50 is 0.4 of a 50 ms SLO
    d = np.r_[np.full(50, 0.2), np.zeros(50)]
    n = np.r_[np.full(50, 10.0), np.zeros(50)]
    assert binding_hurdle(0.02, 0.39, 0.05, d, n) == 0.02
    assert binding_hurdle(0.02, 0.41, 0.05, d, n) == 0.0  # the SLO does not bind
    assert binding_hurdle(0.0, 0.39, 0.05, d, n) == 0.0
    assert binding_hurdle(0.02, 0.39, 0.05, d[:49], n[:49]) == 0.0  # 2% of 49 < 1 sequence
    assert binding_hurdle(0.02, 0.0, 0.05, d[50:], n[50:]) == 0.0  # no token so far


def test_no_cost_probe_while_the_rank_hurdle_binds():
    calm = BatchContext(4, 2000, None, 500, 2048, 4.0)
    # _told_planner's 40 rounds: with explore_every 42 the plan after the next round is a probe
    # (its 41st). The hurdle binds (the batch runs at ~3x its SLO so far): cap 1, as planned,
    # or the probe's cap 2 for one round
    caps = {}
    for quiet in (False, True):
        pl, members = _told_planner(
            slo_spread=0.01, slo_rank_hurdle=0.25, explore_every=42, slo_quiet_probes=quiet
        )
        first = [d.k for d in plan_round(pl, members, 4.2, calm)]
        pl.observe_round(RoundStats(4.2, 4.23, 4, 4, 1, 8, 2000, 0.006, 0.018, 4, 8))
        pl._since = 1 << 30  # a full plan either way
        caps[quiet] = (first, [d.k for d in plan_round(pl, members, 4.3, calm)], pl._probed)
    assert caps[True][0] == caps[False][0] == [1, 1, 1, 1]
    assert caps[False][2] and max(caps[False][1]) == 2  # the probe, one cap up
    assert not caps[True][2] and caps[True][1] == [1, 1, 1, 1]
    # without the hurdle nothing binds: the probe runs whatever the option
    pl, members = _told_planner(slo_spread=0.01, explore_every=42, slo_quiet_probes=True)
    plan_round(pl, members, 4.2, calm)
    pl.observe_round(RoundStats(4.2, 4.23, 4, 4, 3, 16, 2000, 0.018, 0.019, 8, 12))
    pl._since = 1 << 30
    plan_round(pl, members, 4.3, calm)
    assert pl._probed
