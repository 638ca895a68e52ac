"""The round-planner hook: a planner that changes nothing changes nothing (to the bit); a
capping planner caps; RoundStats, BatchContext and the batch context of every Observation agree
with the traced rounds; the planners' reference hooks (futures, true rates) draw nothing."""

from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

import sim.api
from control.batch import BatchContext, RoundPlanner, RoundStats
from sim import simulate
from sim.acceptance import AcceptanceConfig, AcceptanceModel


class Recording(RoundPlanner):
    """Each member's own decision (optionally k capped at ``cap``); records what it is told."""

    def __init__(self, cap=None, needs_future=False, needs_rates=False):
        self.cap, self.needs_future, self.needs_rates = cap, needs_future, needs_rates
        self.contexts: list[BatchContext] = []
        self.stats: list[RoundStats] = []
        self.futures: list[list[int]] = []
        self.rates: list[list[float]] = []

    def plan(self, now_s, members, batch):
        self.contexts.append(batch)
        decisions = [c.decide(now_s) for c in members]
        if self.cap is not None:
            decisions = [replace(d, k=min(d.k, self.cap)) for d in decisions]
        return decisions

    def observe_round(self, stats):
        self.stats.append(stats)

    def set_futures(self, run_lengths):
        self.futures.append(list(run_lengths))

    def set_rates(self, rates):
        self.rates.append(list(rates))


def _with_planner(monkeypatch, make):
    """simulate() builds its planners with ``make()`` (None: no planner at all)."""
    made = []

    def fake(name, config):
        p = make()
        if p is not None:
            made.append(p)
        return p

    monkeypatch.setattr(sim.api, "make_planner", fake)
    return made


def _run(tiny, monkeypatch, make, controller="dspark", cfg=None, trace=False, seed=2):
    made = _with_planner(monkeypatch, make)
    res = simulate(tiny, controller, cfg, seed=seed, baseline=False, trace=trace)
    return res, made[1:]  # made[0] is the probe that tells simulate() to use planners


def _same(a, b):
    pd.testing.assert_frame_equal(a.requests, b.requests)
    assert pd.Series(a.summary).equals(pd.Series(b.summary))
    if a.rounds is not None:
        pd.testing.assert_frame_equal(a.rounds, b.rounds)
        pd.testing.assert_frame_equal(a.controller_trace, b.controller_trace)


CASES = [
    ("dspark", {}),
    ("dspark", {"mode": "threshold", "beta0": 0.75}),
    ("confidence-stop", {"tau": 0.5}),
    ("fixed", {"k": 5}),
    ("fixed", {"k": 6, "mode": "threshold", "beta": 0.72}),
]


@pytest.mark.parametrize(("controller", "cfg"), CASES)
@pytest.mark.parametrize("trace", [False, True])
def test_pass_through_planner_is_bit_identical(tiny, monkeypatch, controller, cfg, trace):
    plain, none = _run(tiny, monkeypatch, lambda: None, controller, cfg, trace)
    assert none == []
    planned, planners = _run(tiny, monkeypatch, Recording, controller, cfg, trace)
    assert len(planners) == tiny.deployment.replicas and planners[0].stats
    _same(plain, planned)


def test_reference_hooks_draw_nothing(tiny, monkeypatch):
    """Futures and true rates handed to a planner leave the run unchanged, to the bit."""
    plain, _ = _run(tiny, monkeypatch, lambda: None, trace=True)
    told, (p,) = _run(
        tiny, monkeypatch, lambda: Recording(needs_future=True, needs_rates=True), trace=True
    )
    _same(plain, told)
    assert len(p.futures) == len(p.rates) == len(p.stats)
    assert [len(f) for f in p.futures] == [s.batch_size for s in p.stats]
    assert [len(r) for r in p.rates] == [s.batch_size for s in p.stats]
    assert all(0.0 < r < 1.0 for rates in p.rates for r in rates)  # tiny: Beta rates
    # the futures are the run lengths: no round accepts more than its sequence's L
    acc_total = sum(s.accepted for s in p.stats)
    assert acc_total <= sum(min(f, 64) for fs in p.futures for f in fs)


def test_capping_planner_caps_draft_steps(tiny, monkeypatch):
    fixed4, (p4,) = _run(tiny, monkeypatch, Recording, "fixed", {"k": 4})
    capped, (p2,) = _run(tiny, monkeypatch, lambda: Recording(cap=2), "fixed", {"k": 4})
    fixed2, _ = _run(tiny, monkeypatch, lambda: None, "fixed", {"k": 2})
    assert {s.draft_steps for s in p4.stats} == {4}
    assert {s.draft_steps for s in p2.stats} == {2}
    assert all(s.verify_tokens == 3 * s.batch_size for s in p2.stats)
    # capping fixed k = 4 at 2 is fixed k = 2, to the bit
    pd.testing.assert_frame_equal(capped.requests, fixed2.requests)
    assert pd.Series(capped.summary).equals(pd.Series(fixed2.summary))
    assert capped.summary["mean_accepted_length"] < fixed4.summary["mean_accepted_length"]


def test_engine_cap_is_told_and_applied(tiny, monkeypatch):
    scn = tiny.with_overrides({"deployment.max_draft_tokens": 3})
    res, (p,) = _run(scn, monkeypatch, Recording, "fixed", {"k": 6}, trace=True)
    assert {c.max_draft for c in p.contexts} == {3}
    assert {s.draft_steps for s in p.stats} == {3}
    assert res.rounds["drafted"].max() == 3
    _, (q,) = _run(tiny, monkeypatch, Recording, "fixed", {"k": 6})
    assert {c.max_draft for c in q.contexts} == {None}


@pytest.mark.parametrize(
    ("controller", "cfg"),
    [("dspark", {}), ("confidence-stop", {"tau": 0.5}), ("dspark", {"mode": "threshold"})],
)
def test_round_stats_match_the_trace(tiny, monkeypatch, controller, cfg):
    res, (p,) = _run(tiny, monkeypatch, Recording, controller, cfg, trace=True)
    rounds = res.rounds
    assert tiny.deployment.replicas == 1  # one round ends at a time: group by end time
    groups = list(rounds.groupby("now_s", sort=True))
    assert len(groups) == len(p.stats) == len(p.contexts)
    overhead = tiny.latency.round_overhead_s
    for (end, g), s, ctx in zip(groups, sorted(p.stats, key=lambda s: s.end_s), p.contexts):
        assert s.end_s == end
        assert s.batch_size == len(g) == ctx.batch_size
        assert s.verify_tokens == int((g["drafted"] + 1).sum())
        assert s.context_tokens == int(g["context_tokens"].sum()) == ctx.context_tokens
        assert s.accepted == int(g["accepted"].sum())
        assert s.emitted == int(g["emitted"].sum())
        assert s.drafting == int((g["k"] > 0).sum())
        assert (s.draft_steps == 0) == (s.drafting == 0)
        assert s.draft_steps >= int(g["drafted"].max())
        assert (g["draft_s"] == s.draft_s).all() and (g["verify_s"] == s.verify_s).all()
        assert s.end_s - s.start_s == pytest.approx(s.draft_s + s.verify_s + overhead)
        assert (g["batch_size"] == s.batch_size).all()
        assert (g["batch_tokens"] == s.verify_tokens).all()
        assert (g["batch_context_tokens"] == s.context_tokens).all()


def test_every_observation_gets_the_batch_context(tiny, monkeypatch):
    """The fast path (observe_values) tells the same batch context as the traced rounds."""
    from control.fixed import FixedController

    seen = []

    class Told(FixedController):
        def observe_values(self, *values):
            seen.append(values[10:])
            super().observe_values(*values)

    _with_planner(monkeypatch, lambda: None)
    monkeypatch.setattr(sim.api, "make_controller", lambda name, config: Told(config))
    fast = simulate(tiny, "fixed", {"k": 3}, seed=4, baseline=False)
    traced = simulate(tiny, "fixed", {"k": 3}, seed=4, baseline=False, trace=True)
    pd.testing.assert_frame_equal(fast.requests, traced.requests)
    r = traced.rounds
    told = seen  # the traced run calls observe(Observation), not observe_values
    assert len(told) == len(r)
    assert sorted(told) == sorted(
        zip(r["batch_size"], r["batch_tokens"], r["batch_context_tokens"])
    )
    assert max(b for b, _, _ in told) > 1


# -- true rates -------------------------------------------------------------------------------
def _model(n=50, seed=11, **cfg):
    a, b = np.random.SeedSequence(seed).spawn(2)
    return AcceptanceModel(
        AcceptanceConfig(**cfg), n, np.random.default_rng(a), np.random.default_rng(b)
    )


def _stream(m, ids, with_rates):
    pos = np.zeros(len(ids), dtype=np.int64)
    out = []
    for _ in range(20):
        if with_rates:
            m.true_rates(ids, pos)
        L = m.run_lengths(ids, pos)
        out.append(L)
        em = np.minimum(L, 4) + 1
        m.advance(ids, em)
        pos = pos + em
    return np.concatenate(out)


@pytest.mark.parametrize(
    "cfg",
    [
        {"model": "iid", "rate": 0.6},
        {"model": "beta"},
        {"model": "markov"},
        {"model": "decay", "rate": 0.8},
    ],
)
def test_true_rates_draw_nothing(cfg):
    ids = np.arange(0, 50, 3)
    assert np.array_equal(_stream(_model(**cfg), ids, False), _stream(_model(**cfg), ids, True))


def test_true_rates_are_the_configured_rates():
    ids, pos = np.array([0, 7, 3, 3]), np.array([0, 5, 9, 2])
    assert np.array_equal(_model(model="iid", rate=0.6).true_rates(ids, pos), [0.6] * 4)
    assert np.array_equal(_model(model="decay", rate=0.8).true_rates(ids, pos), [0.8] * 4)
    # beta: each request's own rate, the Beta draw of the init stream
    a, _ = np.random.SeedSequence(11).spawn(2)
    cfg = AcceptanceConfig(model="beta", beta_mean=0.7, beta_concentration=8.0)
    own = np.random.default_rng(a).beta(0.7 * 8.0, 8.0 - 0.7 * 8.0, 50)
    m = _model(model="beta", beta_mean=0.7, beta_concentration=8.0)
    assert m.cfg == cfg
    assert np.array_equal(m.true_rates(ids, pos), own[ids])
    # markov: the current regime's rate, before and after the regimes move
    m = _model(model="markov", p_easy_to_hard=0.3, p_hard_to_easy=0.3)
    for _ in range(3):
        expect = np.where(m.easy[ids], m.cfg.easy_rate, m.cfg.hard_rate)
        assert np.array_equal(m.true_rates(ids, pos), expect)
        m.advance(np.arange(50), np.full(50, 5))


def test_true_rates_of_a_mixture():
    m = _model(n=200, model="mixture", mixture_rates=(0.9, 0.4), mixture_weights=(0.3, 0.7))
    rates = m.true_rates(np.arange(200), np.zeros(200, dtype=np.int64))
    assert set(rates.tolist()) == {0.9, 0.4}
    assert np.array_equal(rates, m.rate)


def test_true_rates_of_a_replayed_trace(tmp_path):
    rows = [(0, 0, 2), (0, 1, 0), (0, 2, 3), (1, 0, 64), (1, 1, 1), (2, 0, 0)]
    pd.DataFrame(rows, columns=["request_id", "position", "run_length"]).to_csv(
        tmp_path / "positions.csv", index=False
    )
    m = _model(n=4, model="replay", replay_path=str(tmp_path / "positions.csv"))
    rates = m.true_rates(np.array([0, 1, 2, 3]), np.zeros(4, dtype=np.int64))
    # request 0: 5 accepted, 3 rejections; 1: 65 accepted, 1 rejection (64 hit the cap);
    # 2: nothing accepted; request 3 replays request 0
    assert rates.tolist() == [5 / 8, 65 / 66, 0.0, 5 / 8]


def test_seeded_planner_gets_the_modelled_startup_profile(tiny, monkeypatch):
    """``deployment.seed_planner_costs``: every replica's planner is handed the engine's start-up
    profile read off the latency model (verify passes and draft phases at batch 1 and
    max_batch), exactly those modelled seconds; off (the default) it is handed nothing. A
    verify row's tokens are the pass's, B rows × (k + 1), as ``RoundStats.verify_tokens``
    counts them (they once held k + 1, so a B-row pass was priced as a B-times-smaller one)."""
    from control.dspark import DSparkConfig
    from control.dspark_planner import DSparkPlanner
    from sim.cluster import Cluster

    class Seeded(DSparkPlanner):
        def __init__(self):
            super().__init__(DSparkConfig(profile_prior_rounds=32.0))
            self.seeds = []

        def seed_costs(self, rows):
            self.seeds.append(list(rows))
            super().seed_costs(rows)

    _, planners = _run(tiny, monkeypatch, Seeded)
    assert all(p.seeds == [] for p in planners)
    on = tiny.with_overrides({"deployment.seed_planner_costs": True})
    res, planners = _run(on, monkeypatch, Seeded)
    assert len(planners) == on.deployment.replicas
    cl = Cluster(on)
    B = on.deployment.max_batch
    batches = {1, B} | {b for b in (2, 4, 8, 16, 32, 64, 128) if b < B}
    for p in planners:
        (rows,) = p.seeds
        assert {(r[0], r[1]) for r in rows} == {
            (w, b) for w in ("verify", "draft") for b in batches
        }
        for path, b, n, ctx, s in rows:
            if path == "verify":
                assert n % b == 0 and n // b >= 1  # every row verifies k + 1 >= 1 tokens
                want = cl.lat_t.seconds(b, n, ctx)
            else:
                want = n * cl.lat_d.seconds(b, b, ctx)
            assert s == want and ctx in (64 * b, 192 * b)
        verify_ns = {(b, n) for path, b, n, _, _ in rows if path == "verify"}
        assert (B, B) in verify_ns and (B, 2 * B) in verify_ns  # k = 0 and 1 at max_batch
    again, _ = _run(on, monkeypatch, Seeded)
    _same(res, again)
