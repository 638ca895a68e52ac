"""The load-aware scheduler: online cost model, goodput choice, references."""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from control import make_controller
from control.batch import BatchContext, RoundStats
from control.costmodel import KNOTS, RoundCostModel, verify_features
from control.dspark import DSparkConfig
from control.dspark_planner import DSparkPlanner
from control.goodput import CostFunctions, plan_round_lengths, round_seconds
from control.leviathan import expected_tokens
from control.registry import make_planner


def stats(n_tokens, ctx, verify_s, draft_steps=0, drafting=0, draft_s=0.0, batch=1, over=0.0):
    return RoundStats(
        0.0,
        draft_s + verify_s + over,
        batch,
        drafting,
        draft_steps,
        n_tokens,
        ctx,
        draft_s,
        verify_s,
    )


# --- cost model --------------------------------------------------------------------------------


def test_cost_model_recovers_a_known_linear_cost():
    rng = np.random.default_rng(0)
    cm = RoundCostModel(forget=1.0)
    a, b, c = 0.004, 2.5e-5, 3e-4  # intercept, per verified token, per 1000 context tokens
    s0, s1, s2 = 1e-3, 2e-5, 1e-4  # draft step: intercept, per drafting sequence, context
    for _ in range(300):
        n = int(np.exp(rng.uniform(0.0, np.log(4000))))  # every hinge segment gets rounds
        ctx = float(rng.integers(0, 200_000))
        d = int(rng.integers(1, 64))
        steps = int(rng.integers(1, 9))
        step = s0 + s1 * d + s2 * ctx / 1000
        cm.observe(stats(n, ctx, a + b * n + c * ctx / 1000, steps, d, steps * step, over=0.002))
    # the hinges make the verify parameters collinear: what must be exact is the cost itself
    n = np.arange(1, 4000, 37)
    for ctx in (0.0, 5000.0, 150_000.0):
        assert cm.verify_s(n, ctx) == pytest.approx(a + b * n + c * ctx / 1000, rel=1e-6)
    assert cm.verify_slope(n[2:]) == pytest.approx(np.full(len(n) - 2, b), rel=1e-4)
    assert cm.step.theta[1:4] == pytest.approx([s0, s1, s2], rel=1e-6)
    assert abs(cm.step.theta[0]) < 1e-9  # no fixed cost per draft phase here
    assert abs(cm.step.theta[4]) < 1e-9  # no prompt chunk shared these rounds
    assert cm.overhead_s == pytest.approx(0.002, rel=1e-6)


def test_prompt_chunks_sharing_the_pass_are_accounted():
    """Chunked prefill: prompt tokens ride in the verify pass (and the drafter's first step);
    the fits charge them, so the per-draft-token slope and the step cost stay unbiased."""
    rng = np.random.default_rng(2)
    cm = RoundCostModel(forget=1.0)
    for _ in range(300):
        n = int(np.exp(rng.uniform(0.0, np.log(600))))
        pre = int(rng.choice([0, 0, 256, 1024]))
        steps, d = int(rng.integers(1, 6)), int(rng.integers(1, 32))
        draft = steps * (1e-3 + 2e-5 * d) + 3e-6 * pre
        cm.observe(
            RoundStats(
                0.0, 1.0, d, d, steps, n, 0, draft, 0.004 + 2e-5 * (n + pre), prefill_tokens=pre
            )
        )
    assert cm.step_s(np.array([10]), 0)[0] == pytest.approx(1e-3 + 2e-4, rel=1e-6)
    # the pass's cost is recovered, prompt tokens included ...
    assert cm.verify_s(np.array([356]), 0)[0] == pytest.approx(0.004 + 2e-5 * 356, rel=1e-6)
    # ... and a plan is charged the decode's share only: prompt work is done whatever k is
    f = cm.functions(0.0, prefill_tokens=256)
    assert f.verify_s(np.array([100]))[0] == pytest.approx(0.004 + 2e-5 * 100, rel=1e-6)
    assert f.verify_slope(np.array([100]))[0] == pytest.approx(2e-5, rel=1e-4)


def roofline_model(seed: int = 3) -> RoundCostModel:
    """A cost model fitted on a roofline: flat to 256 verified tokens, then 40 µs a token."""
    cm = RoundCostModel(forget=1.0)
    rng = np.random.default_rng(seed)
    for _ in range(400):
        n = int(rng.integers(8, 2048))
        cm.observe(stats(n, 0, 0.01 + 4e-5 * max(n - 256, 0)))
    return cm


@pytest.mark.parametrize("backlog", [0, 300, 5000])
def test_a_fitted_models_plan_reads_its_costs_as_the_callables_tabulated_whole(backlog):
    """A plan on a fitted model's costs evaluates them at the token counts its rows reach; the
    same plan with the callables alone (the costs tabulated over every count a batch could
    reach) gives the same lengths, goodput and round times, bit for bit: with no chunk, and
    with prompts waiting under a token budget (the penalty and its slope read too)."""
    cm = roofline_model()
    rng = np.random.default_rng(backlog)
    for B in (1, 16, 256):
        a = rng.beta(6, 2, B)
        kcap = rng.integers(0, 9, B)
        f = cm.functions(0.0, backlog=backlog, budget=2048, batch_size=B, prompt_value=1.5)
        whole = dataclasses.replace(f, spec=None)
        for near in (None, (1, 4)):
            p = plan_round_lengths(a, kcap, f, 8, cap_range=near)
            q = plan_round_lengths(a, kcap, whole, 8, cap_range=near)
            assert np.array_equal(p.k_by_cap, q.k_by_cap)
            assert np.array_equal(p.goodput, q.goodput)
            assert np.array_equal(p.seconds_by_cap, q.seconds_by_cap)


def test_prompt_share_is_excluded_and_displaced_prompt_tokens_are_charged():
    """Chunked prefill with a budget: the decode share of a pass on a convex (roofline) cost
    is raw(n + p) − raw(p) + raw(0) for a chunk of p = min(backlog, budget − n) prompt tokens;
    no backlog means no chunk; a draft that pushes a prompt token out pays that token's time."""
    cm = roofline_model()
    raw = lambda n: float(cm.verify_s(np.array([n]), 0)[0])  # noqa: E731
    assert raw(1000) == pytest.approx(0.01 + 4e-5 * (1000 - 256), rel=1e-3)
    # an engine that reports a budget and no backlog: the pass holds the drafts alone
    f = cm.functions(0.0, backlog=0, budget=2048, batch_size=64)
    assert f.verify_s(np.array([200]))[0] == pytest.approx(raw(200), rel=1e-9)
    # a chunk of 500 prompt tokens rides along: the decode share sits on the steep part
    f = cm.functions(0.0, backlog=500, budget=2048, batch_size=64)
    share = f.verify_s(np.array([200]))[0]
    assert share == pytest.approx(raw(700) - raw(500) + raw(0), rel=1e-9)
    assert share > raw(200) and share == pytest.approx(0.01 + 4e-5 * 200, rel=2e-2)
    # a backlog larger than the pass: every drafted token displaces a prompt token, whose
    # time is charged (deferred, not saved) -- the slope is a prompt token's
    f = cm.functions(0.0, backlog=5000, budget=2048, batch_size=64)
    d = f.verify_s(np.array([300]))[0] - f.verify_s(np.array([200]))[0]
    assert d == pytest.approx(100 * 4e-5, rel=2e-2)
    assert f.verify_slope(np.array([250]))[0] == pytest.approx(4e-5, rel=2e-2)


def test_a_chunk_sharing_the_pass_leaves_the_plain_steps_cost_out_of_the_ratio():
    """On a convex cost the plain step's own tokens sit on the chunk's steep part: that share,
    paid whatever the drafts, is ``shared_s`` = verify_s(B) − raw(B), in the round's time but
    not in the goodput ratio. A chunk that fits the pass beside every draft then leaves the
    plan as it is without one (the drafts' marginal cost is the steep slope either way), where
    counting the share made the round look dearer and every draft cheaper."""
    cm = roofline_model()
    raw = lambda n: float(cm.verify_s(np.array([n]), 0)[0])  # noqa: E731
    B, a = 128, np.full(128, 0.75)
    alone = cm.functions(0.0, backlog=0, budget=2048, batch_size=B)
    chunk = cm.functions(0.0, backlog=421, budget=2048, batch_size=B, sunk=True)
    assert alone.shared_s == 0.0
    assert chunk.shared_s == pytest.approx(raw(B + 421) - raw(421) + raw(0) - raw(B), rel=1e-9)
    assert chunk.shared_s == pytest.approx(4e-5 * B, rel=5e-2)
    # the round's time keeps it
    k0 = np.zeros((1, B), dtype=np.int64)
    assert round_seconds(k0, chunk)[0] - round_seconds(k0, alone)[0] == pytest.approx(
        chunk.shared_s, rel=1e-9
    )
    p_alone = plan_round_lengths(a, np.full(B, 8), alone, 8)
    p_chunk = plan_round_lengths(a, np.full(B, 8), chunk, 8)
    assert p_alone.cap >= 1 and (p_chunk.k == p_alone.k).all()
    # a round that drafts nothing is rated as the plain step alone, chunk or not
    assert p_chunk.goodput[0] == pytest.approx(p_alone.goodput[0], rel=1e-9)
    # with the share in the ratio the same chunk made every sequence draft longer
    whole = cm.functions(0.0, backlog=421, budget=2048, batch_size=B)
    assert plan_round_lengths(a, np.full(B, 8), whole, 8).k.sum() > p_alone.k.sum()


def test_the_plain_steps_share_leaves_the_ratio_only_while_prompts_queue():
    """A prompt that has waited more than ``sunk_share_rounds`` rounds (the recent round time)
    means prompts queue: the planner's costs then carry ``shared_s``; a prompt that just
    arrived, or an engine that does not say since when it waits, leaves it 0; at 0 always."""

    def costs(since, **cfg):
        pl = DSparkPlanner(DSparkConfig(**cfg))
        pl.observe_round(stats(256, 0, 0.01))  # one round of 10 ms
        pl.costs = roofline_model()
        return pl.cost_functions(BatchContext(128, 0, None, 421, 2048, since), 1.0)

    share = costs(0.9).shared_s  # waited 10 rounds
    assert share == pytest.approx(
        roofline_model().functions(0.0, 0, 421, 2048, 128, sunk=True).shared_s
    )
    assert share > 0.0
    assert costs(0.97).shared_s == 0.0  # 3 rounds
    assert costs(0.97, sunk_share_rounds=2.0).shared_s == share
    assert costs(None).shared_s == 0.0
    assert costs(None, sunk_share_rounds=0.0).shared_s == share


def test_cost_model_learns_a_roofline_turn_and_tracks_a_step_change():
    cm = RoundCostModel(forget=0.98)
    rng = np.random.default_rng(1)

    def roof(n, scale=1.0):  # flat (memory-bound) up to 256 tokens, then compute-bound
        return scale * max(0.02, 0.02 * n / 256)

    for _ in range(400):
        n = int(rng.integers(16, 1024))
        cm.observe(stats(n, 0, roof(n)))
    for n in (64, 200, 600, 1000):
        assert float(cm.verify_s(np.array([n]), 0)[0]) == pytest.approx(roof(n), rel=0.05)
    assert cm.verify_slope(np.array([100]))[0] < 0.2 * cm.verify_slope(np.array([800]))[0]
    # the hardware gets 1.5x slower: the forgetting fit follows within a few hundred rounds
    for _ in range(300):
        n = int(rng.integers(16, 1024))
        cm.observe(stats(n, 0, roof(n, 1.5)))
    for n in (64, 600):
        assert float(cm.verify_s(np.array([n]), 0)[0]) == pytest.approx(roof(n, 1.5), rel=0.02)


def test_seed_rows_and_bad_path():
    cm = RoundCostModel()
    cm.seed([("verify", 1, 10, 0, 0.011), ("verify", 1, 100, 0, 0.02), ("draft", 4, 4, 0, 1e-3)])
    assert cm.ready and float(cm.verify_s(np.array([55]), 0)[0]) == pytest.approx(0.0155, rel=1e-3)
    with pytest.raises(ValueError, match="unknown cost path 'prefill'"):
        cm.seed([("prefill", 1, 1, 0, 1.0)])
    assert verify_features(np.array([5.0]), 0).shape == (1, 3 + len(KNOTS))


# --- the goodput choice ------------------------------------------------------------------------


def linear_costs(c0, c1, s0, s1, over=0.0):
    return CostFunctions(
        verify_s=lambda n: c0 + c1 * np.asarray(n, float),
        verify_slope=lambda n: np.full(np.shape(np.atleast_1d(n)), c1),
        step_s=lambda d: s0 + s1 * np.asarray(d, float),
        overhead_s=over,
    )


def goodput_of(k, a, costs):
    k = np.asarray(k)[None, :]
    e = sum(expected_tokens(ai, int(ki)) for ai, ki in zip(a, k[0]))
    return e / (round_seconds(k, costs)[0] - costs.shared_s)


@settings(max_examples=150, deadline=None)
@given(
    a=st.lists(st.floats(0.0, 0.99), min_size=1, max_size=3),
    c0=st.floats(1e-3, 0.05),
    c1=st.floats(0.0, 5e-3),
    s0=st.floats(0.0, 5e-3),
    s1=st.floats(0.0, 1e-3),
    shared=st.sampled_from([0.0, 0.3, 0.9]),
    K=st.integers(1, 5),
)
def test_goodput_choice_equals_brute_force(a, c0, c1, s0, s1, shared, K):
    """The plan maximises E / (T − shared_s) exactly (``shared_s``: seconds of the round the
    ratio leaves out)."""
    costs = dataclasses.replace(linear_costs(c0, c1, s0, s1), shared_s=shared * c0)
    plan = plan_round_lengths(np.array(a), np.full(len(a), K), costs, K, iterations=20)
    best = max(goodput_of(k, a, costs) for k in itertools.product(range(K + 1), repeat=len(a)))
    assert goodput_of(plan.k, a, costs) == pytest.approx(best, rel=1e-9)
    assert plan.goodput.max() == pytest.approx(best, rel=1e-9)


@settings(max_examples=80, deadline=None)
@given(
    a=st.floats(0.3, 0.95),
    spread=st.floats(0.0, 0.3),
    c0=st.floats(5e-3, 0.05),
    knee=st.integers(16, 512),
    slope=st.floats(1e-5, 1e-3),
    seed=st.integers(0, 1000),
)
def test_cap_never_grows_with_batch_size(a, spread, c0, knee, slope, seed):
    """Verification cost grows with the batch (a roofline turn): the chosen cap never rises."""
    rng = np.random.default_rng(seed)
    rates = np.clip(a + spread * (rng.random(256) - 0.5), 0.0, 0.99)

    def verify(n):
        return c0 + slope * np.maximum(np.asarray(n, float) - knee, 0.0)

    costs = CostFunctions(
        verify_s=verify,
        verify_slope=lambda n: np.where(np.asarray(n) > knee, slope, 0.0),
        step_s=lambda d: 0.1 * c0 + 0.0 * np.asarray(d, float),
    )
    caps = []
    for B in (1, 2, 4, 8, 16, 32, 64, 128, 256):
        r = np.full(B, a)  # all else fixed: the same rate for every sequence
        caps.append(plan_round_lengths(r, np.full(B, 16), costs, 16).cap)
    assert caps == sorted(caps, reverse=True), caps
    del rates


def test_low_rate_sequences_stop_below_the_cap():
    costs = linear_costs(0.02, 2e-4, 1e-3, 0.0)
    a = np.array([0.9, 0.9, 0.9, 0.2])
    p = plan_round_lengths(a, np.full(4, 10), costs, 10)
    assert p.cap >= 3 and p.k[3] < p.k[0] and p.k[0] == p.cap
    # a sequence in a cool-down (cap 0) never drafts
    p0 = plan_round_lengths(a, np.array([10, 10, 10, 0]), costs, 10)
    assert p0.k[3] == 0


# --- the dspark planner and the references ------------------------------------------------------


def drive(planner, members, rounds, rate_rng, cost, a_true):
    """Rounds of a batch with a synthetic linear cost; returns the caps chosen."""
    caps, t = [], 0.0
    for _ in range(rounds):
        decs = planner.plan(t, members, BatchContext(len(members), 1000 * len(members)))
        ks = [d.k for d in decs]
        n_tokens = sum(k + 1 for k in ks)
        steps = max(ks)
        d_s, v_s = steps * cost["step"], cost["c0"] + cost["c1"] * n_tokens
        for m, k in zip(members, ks):
            n = 0
            while n < k and rate_rng.random() < a_true:
                n += 1
            m.observe_values(
                t + d_s + v_s,
                k,
                n,
                (),
                d_s,
                v_s,
                1000,
                0,
                n + 1,
                (),
                len(members),
                n_tokens,
                1000 * len(members),
            )
        planner.observe_round(
            RoundStats(
                t,
                t + d_s + v_s,
                len(members),
                sum(k > 0 for k in ks),
                steps,
                n_tokens,
                1000 * len(members),
                d_s,
                v_s,
            )
        )
        t += d_s + v_s
        caps.append(steps)
    return caps


@pytest.mark.parametrize("batch, c1, expect", [(1, 1e-5, (4, 16)), (64, 1e-3, (0, 2))])
def test_dspark_planner_follows_load(batch, c1, expect):
    """Cheap verification at batch 1 → long drafts; expensive per token at batch 64 → short."""
    cfg = DSparkConfig(k_max=16, explore_every=0)
    planner = make_planner("dspark", cfg)
    assert isinstance(planner, DSparkPlanner)
    members = [make_controller("dspark", cfg) for _ in range(batch)]
    caps = drive(
        planner, members, 200, np.random.default_rng(0), {"step": 1e-3, "c0": 0.02, "c1": c1}, 0.85
    )
    late = caps[-50:]
    assert expect[0] <= min(late) and max(late) <= expect[1], late


def test_seed_policy_has_no_planner_and_goodput_solo_decides():
    assert make_planner("dspark", {"policy": "seed"}) is None
    assert make_planner("fixed") is None
    c = make_controller("dspark")
    d = c.decide(0.0)  # no planner drives it: it plans a batch of itself (cold start: k_start)
    assert d.k == c.config.k_start


def test_clairvoyant_drafts_exactly_the_run_when_drafting_is_cheap():
    planner = make_planner("clairvoyant")
    members = [make_controller("clairvoyant") for _ in range(3)]
    t = 0.0
    for r in range(60):
        futures = [r % 7, (3 * r) % 11, 2]
        planner.set_futures(futures)
        decs = planner.plan(t, members, BatchContext(3, 3000))
        ks = [d.k for d in decs]
        assert all(k <= max(f, 0) for k, f in zip(ks, futures))  # never drafts a refused token
        n = sum(k + 1 for k in ks)
        v = 0.02 + 1e-5 * n
        planner.observe_round(
            RoundStats(t, t + v, 3, sum(k > 0 for k in ks), max(ks), n, 3000, max(ks) * 1e-5, v)
        )
        t += v
        if r > 10:
            assert ks == futures  # verification nearly free per token: every run is taken


def test_rate_oracle_plans_with_the_true_rates():
    planner = make_planner("rate-oracle")
    assert planner.needs_rates
    members = [make_controller("rate-oracle") for _ in range(2)]
    drive(
        planner, members, 30, np.random.default_rng(0), {"step": 1e-3, "c0": 0.02, "c1": 1e-4}, 0.5
    )
    planner.set_rates([0.99, 0.01])
    ks = [d.k for d in planner.plan(0.0, members, BatchContext(2, 2000))]
    assert ks[0] > ks[1] == 0


@settings(max_examples=100, deadline=None)
@given(
    rates=st.lists(st.lists(st.floats(0.0, 1.0), min_size=4, max_size=4), min_size=1, max_size=3),
    c0=st.floats(1e-3, 0.05),
    c1=st.floats(0.0, 5e-3),
    s0=st.floats(0.0, 5e-3),
)
def test_goodput_choice_with_per_position_rates_equals_brute_force(rates, c0, c1, s0):
    """Rates that change with the draft position (row j-1 = position j): exact too."""
    K = 4
    a = np.array(rates).T  # (K, B)
    prefix = np.vstack([np.ones((1, a.shape[1])), np.cumprod(a, axis=0)])
    costs = linear_costs(c0, c1, s0, 0.0)

    def value(k):
        e = sum(prefix[: kk + 1, i].sum() for i, kk in enumerate(k))
        return e / round_seconds(np.asarray(k)[None, :], costs)[0]

    plan = plan_round_lengths(a, np.full(a.shape[1], K), costs, K, iterations=20)
    best = max(value(k) for k in itertools.product(range(K + 1), repeat=a.shape[1]))
    assert value(plan.k) == pytest.approx(best, rel=1e-9)


def test_solo_goodput_keeps_learned_costs_across_reset():
    """A batch-1 driver reuses one controller per method (reset per request): the costs it
    learned are the hardware's, so a new request does not start cold; the sequence state does."""
    c = make_controller("dspark", {"k_max": 8})
    t = 0.0
    for r in range(40):
        d = c.decide(t)
        v = 0.02 + 1e-4 * (d.k + 1)
        t += d.k * 1e-3 + v
        c.observe_values(t, d.k, min(d.k, 2), (), d.k * 1e-3, v, 100 + r, 0, min(d.k, 2) + 1, ())
    assert c._solo.costs.ready
    c.reset()
    assert c.rounds == 0 and c.sum_n == 0.0 and c._solo.costs.ready
    fresh = make_controller("dspark", {"k_max": 8})
    assert fresh._solo is None


def test_alpha_trim_has_a_feedback_path():
    """Goodput α loop: a sequence missing its TPOT SLO lowers α below 1 at block ends, and a
    lower α makes the plan stop that sequence's drafts earlier (shorter rounds, lower TPOT)."""
    cfg = {
        "alpha_ki": 0.2,
        "slo_tpot_s": 0.005,
        "block_tokens": 16,
        "snap_tokens": 0,
        "warmup_rounds": 0,
        "min_update_rounds": 1,
        "window_rounds": 4,
    }
    slow = make_controller("dspark", cfg)
    ok = make_controller("dspark", cfg)
    t = 0.0
    for _ in range(40):
        t += 0.03
        slow.observe_values(t, 3, 3, (), 0.01, 0.02, 100, 0, 4, ())  # 30 ms / 4 tokens
        ok.observe_values(t, 3, 3, (), 0.001, 0.002, 100, 0, 4, ())  # 3 ms / 4 tokens
    assert slow.alpha < 1.0 and ok.alpha == 1.0
    costs = linear_costs(0.01, 2e-3, 1e-4, 0.0)  # verified tokens cost: a batch under load
    a = np.array([0.8, 0.8])
    w = np.array([ok.alpha, slow.alpha])
    p = plan_round_lengths(a, np.array([10, 10]), costs, 10, weight=w)
    assert p.k[1] < p.k[0]


def test_drafter_catchup_is_priced_apart_from_the_step():
    """Tokens a drafter catches up on after rounds at k = 0 are in ``draft_s``; the fit prices
    them as drafter prefill, so the per-step cost a plan reads stays the step's own."""
    rng = np.random.default_rng(4)
    cm = RoundCostModel(forget=1.0)
    for _ in range(300):
        steps, d = int(rng.integers(1, 6)), int(rng.integers(1, 64))
        lag = int(rng.choice([0, 0, 5, 40, 200]))
        draft = steps * (1e-3 + 2e-5 * d) + 3e-6 * lag
        cm.observe(
            RoundStats(0.0, 1.0, d, d, steps, d * (steps + 1), 0, draft, 0.01, catchup_tokens=lag)
        )
    assert cm.step_s(np.array([10]), 0)[0] == pytest.approx(1e-3 + 2e-4, rel=1e-6)
    assert cm.step.theta[4] == pytest.approx(3e-3, rel=1e-6)  # seconds per 1000 tokens


def test_draft_phase_fixed_cost_is_priced_apart_from_the_step():
    """A real engine's draft phase costs a fixed part (launch, feeding the last committed
    tokens, the host sync) plus its steps; the fit finds the fixed part (pulled toward 0 by a
    tenth of its data weight, so somewhat below it) and charges each further step about a step,
    where a fit without it charged the fixed part once per step."""
    rng = np.random.default_rng(5)
    cm = RoundCostModel(forget=1.0)
    fixed, s0 = 8e-4, 5e-4
    for _ in range(200):
        steps = int(rng.integers(1, 9))
        cm.observe(stats(steps + 1, 64, 0.006, steps, 1, fixed + steps * s0))
    cm.fold()
    assert 0.5 * fixed < cm.step.theta[0] <= fixed
    f = cm.functions(64.0)
    assert f.draft_fixed_s == cm.step.theta[0]
    k = np.arange(9)[:, None]
    t = round_seconds(k, f) - round_seconds(np.zeros((1, 1), dtype=int), f)[0]
    want = np.where(k[:, 0] > 0, fixed + k[:, 0] * s0, 0.0)
    # the pull leaves the shortest phases up to a fifth under, the longer ones close
    assert t == pytest.approx(want, rel=0.2)
    assert t[4:] == pytest.approx(want[4:], rel=0.06)
    # each further step costs about a step, not a step plus the fixed part
    assert np.diff(t[1:]) == pytest.approx(np.full(7, s0), rel=0.1)


def profile_rows(slope, intercept=0.006, step=5e-4):
    """A measured start-up profile: verify over N = 1..16, draft phases of 1..8 steps."""
    rows = [("verify", 1, n, 64.0, intercept + slope * n) for n in range(1, 17)]
    return rows + [("draft", 1, k, 64.0, k * step) for k in range(1, 9)]


def test_a_seeded_profile_holds_the_slope_rounds_crowded_at_one_length_cannot_measure():
    """Rounds at N in {2, 3} with noise measure the verify slope badly; the profile's prior
    keeps it near the profile's. Rounds spread over N = 1..16 at another slope outweigh it.
    ``reset`` forgets the rounds, not the profile."""
    rng = np.random.default_rng(6)
    true = 2e-4
    noisy = RoundCostModel(forget=0.99)
    seeded = RoundCostModel(forget=0.99)
    seeded.seed(profile_rows(true), weight=32.0)
    assert seeded.ready and seeded.verify_slope(np.array([5]))[0] == pytest.approx(true, rel=1e-6)
    for _ in range(300):
        n = int(rng.integers(2, 4))
        y = 0.006 + true * n + rng.normal(0.0, 1e-3)
        for cm in (noisy, seeded):
            cm.observe(stats(n, 64, y))
    err = lambda cm: abs(cm.verify_slope(np.array([5]))[0] - true)  # noqa: E731
    assert err(seeded) < 0.5 * err(noisy)
    # rounds over the profile's whole range at 3x the slope: ~100 remembered rounds (forget
    # 0.99) against the profile's 32, spread alike, so the fit sits at their weighted mean
    for _ in range(600):
        n = int(rng.integers(1, 17))
        seeded.observe(stats(n, 64, 0.006 + 3 * true * n))
    mixed = (100 * 3 * true + 32 * true) / 132
    assert seeded.verify_slope(np.array([5]))[0] == pytest.approx(mixed, rel=0.05)
    seeded.reset()
    assert seeded.verify_slope(np.array([5]))[0] == pytest.approx(true, rel=1e-6)
    with pytest.raises(ValueError, match="unknown cost path"):
        seeded.seed([("prefill", 1, 1, 0.0, 1.0)])


def test_planner_seed_uses_its_configured_weight():
    p = DSparkPlanner(DSparkConfig(profile_prior_rounds=0.0))
    p.seed_costs(profile_rows(2e-4))
    # weight 0: no prior at all, the levels only make the fit "ready" on the prior's slope 0
    assert p.costs.verify_slope(np.array([5]))[0] == 0.0
    q = DSparkPlanner(DSparkConfig())  # on by default
    assert q.wants_costs_seed
    q.seed_costs(profile_rows(2e-4))
    assert q.costs.verify_slope(np.array([5]))[0] == pytest.approx(2e-4, rel=1e-6)


def test_a_block_drafters_round_pays_one_draft_forward_whatever_the_lengths():
    """``CostFunctions.block``: the draft phase is one step for any cap, so with a costly
    drafter step and a flat verify the plan drafts the whole window, where an autoregressive
    drafter of the same step cost stops short; round times follow the one-step rule."""
    import dataclasses

    ar = linear_costs(0.02, 1e-5, 4e-3, 0.0)
    blk = dataclasses.replace(ar, block=True)
    k = np.array([[0, 0], [3, 1], [7, 7]])
    assert round_seconds(k, blk).tolist() == pytest.approx(
        [0.02 + 2e-5, 0.02 + 6e-5 + 4e-3, 0.02 + 16e-5 + 4e-3]
    )
    assert round_seconds(k, ar)[2] == pytest.approx(0.02 + 16e-5 + 7 * 4e-3)
    a = np.array([0.8, 0.8])
    assert plan_round_lengths(a, np.full(2, 7), blk, 7).k.tolist() == [7, 7]
    assert plan_round_lengths(a, np.full(2, 7), ar, 7).cap < 7
