"""The peer controllers (vLLM Dynamic SD, Adaptive K, adaptive verification; SGLang adaptive):
exact decisions on hand-computed inputs, batched (planner) and alone (batch of one)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from control import make_config, make_controller
from control.batch import BatchContext, RoundStats
from control.errors import ConfigError
from control.goodput import CostFunctions
from control.peer_common import dsd_k, dsd_rows, table_fields
from control.peer_vllm_adaptive_k import best_k, goodputs
from control.peer_vllm_verification import admission, lengths_by_budget
from control.registry import make_planner
from tests.control.helpers import obs


@pytest.fixture(scope="module")
def tiny_scenario():
    from sim.config import load_scenario

    return load_scenario(Path(__file__).resolve().parents[2] / "configs" / "tiny.toml")


PEERS = ("vllm-dsd", "vllm-adaptive-k", "vllm-adaptive-verification", "sglang-adaptive")


def members(name: str, n: int, config=None) -> list:
    return [make_controller(name, config) for _ in range(n)]


def stats(batch: int, drafting: int, accepted: int) -> RoundStats:
    return RoundStats(0.0, 1.0, batch, drafting, 1, batch, 0, 0.1, 0.2, accepted, accepted + batch)


def round_of(planner, ms, batch: BatchContext, outcomes) -> list[int]:
    """One batched round: plan, each member observes its ``(drafted, accepted)``, the planner
    observes the round. Returns the planned k."""
    ks = [d.k for d in planner.plan(0.0, ms, batch)]
    for m, (d, n) in zip(ms, outcomes):
        m.observe(obs(d, n))
    planner.observe_round(
        stats(len(ms), sum(1 for d, _ in outcomes if d), sum(n for _, n in outcomes))
    )
    return ks


# ---------------------------------------------------------------------------- Dynamic SD
@pytest.mark.parametrize(
    "batch, k", [(1, 3), (64, 3), (65, 1), (128, 1), (129, 0), (512, 0), (4096, 0)]
)
def test_dsd_table_lookup_at_the_row_boundaries(batch, k):
    # vLLM's documented example table [[1, 64, 3], [65, 128, 1], [129, 512, 0]] is the default
    cfg = make_config("vllm-dsd")
    assert dsd_rows(cfg) == ((1, 64, 3), (65, 128, 1), (129, 512, 0))
    p = make_planner("vllm-dsd")
    assert [d.k for d in p.plan(0.0, members("vllm-dsd", 2), BatchContext(batch, 0))] == [k, k]


def test_dsd_engine_cap_and_batch_of_one():
    p = make_planner("vllm-dsd")
    assert [d.k for d in p.plan(0.0, members("vllm-dsd", 1), BatchContext(1, 0, 2))] == [2]
    # alone: the batch size of its last round (1 before any)
    c = make_controller("vllm-dsd")
    assert c.decide(0.0).k == 3
    c.observe(obs(3, 1))
    assert c.decide(0.0).k == 3
    c.observe_values(0.0, 3, 1, (), 0.0, 0.0, 0, 0, 2, (), 100)  # a round in a batch of 100
    assert c.decide(0.0).k == 1
    c.reset()
    assert c.decide(0.0).k == 3


def test_dsd_table_checks_and_fields():
    with pytest.raises(ConfigError, match="k_1 = 5 exceeds num_speculative_tokens = 3"):
        make_config("vllm-dsd", {"k_1": 5})
    with pytest.raises(ConfigError, match="end_bs_2 = 64 must be above the previous row's end 64"):
        make_config("vllm-dsd", {"end_bs_2": 64})
    with pytest.raises(ConfigError, match="max_bs = 100 must be above the previous row's end 128"):
        make_config("vllm-dsd", {"max_bs": 100})
    f = table_fields([[1, 16, 5], [17, 32, 4], [33, 512, 0]], "t")
    assert f == {
        "rows": 3,
        "end_bs_1": 16,
        "k_1": 5,
        "end_bs_2": 32,
        "k_2": 4,
        "max_bs": 512,
        "k_3": 0,
    }
    cfg = make_config("vllm-dsd", {**f, "num_speculative_tokens": 5})
    assert dsd_rows(cfg) == ((1, 16, 5), (17, 32, 4), (33, 512, 0))
    assert [dsd_k(dsd_rows(cfg), b) for b in (16, 17, 33)] == [5, 4, 0]
    with pytest.raises(ConfigError, match=r"t\[1\] = \[18, 32, 4\]: rows must cover"):
        table_fields([[1, 16, 5], [18, 32, 4]], "t")
    with pytest.raises(ConfigError, match="7 rows; allowed at most 6"):
        table_fields([[i, i, 0] for i in range(1, 8)], "t")
    with pytest.raises(ConfigError, match=r"t\[0\] = \[1, 2\]: expected"):
        table_fields([[1, 2]], "t")


# ---------------------------------------------------------------------------- Adaptive K
def test_adaptive_k_goodput_formula_by_hand():
    # G(K) = (1 + Σ_i Π_{j≤i} α_j) / (1 + K·c + p·bs); α = 0.9, 0.8, 0.5; c = 0.1; p·bs = 0.02
    g = goodputs([0.9, 0.8, 0.5], 0.1, 0.002, 10, 3)
    assert g == pytest.approx([1 / 1.02, 1.9 / 1.12, 2.62 / 1.22, 2.98 / 1.32], rel=1e-12)
    cfg = make_config("vllm-adaptive-k", {"num_speculative_tokens": 3, "c_draft": 0.1})
    assert best_k(cfg, [0.9, 0.8, 0.5], 10, 3) == 3
    # c = 0.3: 1.9/1.32 = 1.439, 2.62/1.62 = 1.617, 2.98/1.92 = 1.552 -> K = 2
    cfg3 = make_config("vllm-adaptive-k", {"num_speculative_tokens": 3, "c_draft": 0.3})
    assert best_k(cfg3, [0.9, 0.8, 0.5], 10, 3) == 2
    # no K reaches G = 1: 1.05/1.52 < 1 -> speculation off, unless min_tokens forbids it
    off = make_config("vllm-adaptive-k", {"num_speculative_tokens": 3, "c_draft": 0.5})
    assert best_k(off, [0.05, 0.05, 0.05], 10, 3) == 0
    one = make_config(
        "vllm-adaptive-k", {"num_speculative_tokens": 3, "c_draft": 0.5, "min_tokens": 1}
    )
    assert best_k(one, [0.05, 0.05, 0.05], 10, 3) == 1


def test_adaptive_k_ema_and_cooldown_on_a_scripted_batch():
    cfg = {
        "num_speculative_tokens": 3,
        "ema_alpha": 0.5,
        "alpha_prior": 0.5,
        "c_draft": 0.1,
        "bs_penalty": 0.0,
        "cooldown_steps": 2,
    }
    p = make_planner("vllm-adaptive-k", cfg)
    ms = members("vllm-adaptive-k", 2, cfg)
    ctx = BatchContext(2, 0)
    # α = .5,.5,.5: G = 1.5/1.1, 1.75/1.2, 1.875/1.3 -> K = 2
    assert round_of(p, ms, ctx, [(2, 2), (2, 2)]) == [2, 2]
    assert p.alphas == [0.75, 0.75, 0.5]  # positions 1, 2 tried twice, accepted twice
    # G = 1.75/1.1, 2.3125/1.2, 2.59375/1.3 -> K = 3, then it holds for 2 steps
    assert round_of(p, ms, ctx, [(3, 0), (3, 0)]) == [3, 3]
    assert p.alphas == [0.375, 0.75, 0.5]
    assert round_of(p, ms, ctx, [(3, 0), (3, 0)]) == [3, 3]  # held (best is 3 anyway)
    assert round_of(p, ms, ctx, [(3, 0), (3, 0)]) == [3, 3]  # held (best is 2: 1.328/1.2)
    # α1 = 0.09375: G1 = 1.09375/1.1 < 1 is the best -> speculation off, held for 2 steps;
    # every position is then untracked and reads the prior again
    assert p.alphas[0] == 0.09375
    assert round_of(p, ms, ctx, [(0, 0), (0, 0)]) == [0, 0]
    assert p.alphas == [0.5, 0.5, 0.5]
    assert round_of(p, ms, ctx, [(0, 0), (0, 0)]) == [0, 0]
    assert round_of(p, ms, ctx, [(0, 0), (0, 0)]) == [0, 0]
    assert round_of(p, ms, ctx, [(2, 1), (2, 0)]) == [2, 2]  # the cooldown is over: K = 2
    assert p.alphas == [0.5, 0.25, 0.5]  # position 1: 1 of 2 accepted; position 2: 0 of 1


def test_adaptive_k_bounded_by_a_dsd_table():
    cfg = {"rows": 2, "end_bs_1": 4, "max_bs": 64, "k_1": 6, "k_2": 1}
    p = make_planner("vllm-adaptive-k", cfg)
    # α = 0.85 everywhere, c = 0.1144: the best K in 1..10 is 6 at batch 4; the table caps
    assert [d.k for d in p.plan(0.0, members("vllm-adaptive-k", 4, cfg), BatchContext(4, 0))] == [
        6
    ] * 4
    assert [d.k for d in p.plan(0.0, members("vllm-adaptive-k", 5, cfg), BatchContext(5, 0))] == [
        1
    ] * 5


# ---------------------------------------------------------------------------- SGLang
SG = {
    "candidate_steps": [1, 3, 7],
    "num_steps": 3,
    "ema_alpha": 0.5,
    "warmup_batches": 2,
    "update_interval": 2,
}


@pytest.mark.parametrize(
    "down, expected",
    [
        # ema from 2 (tier 3 − 1): 2.5, 2.75, 2.875, 2.9375 -> batch 4 (warm-up 2 + interval 2)
        # decides: target round(3.9375) = 4 is above tier 3 -> up to 7; 1.96875, 1.484375 ->
        # batch 6: round(2.484375 + 0.25) = 3 is at or below tier 3 -> down to 3; 0.742,
        # 0.371 -> batch 8: round(1.371 + 0.25) = 2 is above tier 1 -> stays at 3
        (-0.25, [3, 3, 3, 7, 7, 3, 3, 3]),
        # without the margin round(1.371) = 1 reaches tier 1
        (0.0, [3, 3, 3, 7, 7, 3, 3, 1]),
    ],
)
def test_sglang_tiers_with_warmup_interval_and_hysteresis(down, expected):
    cfg = {**SG, "down_hysteresis": down}
    accept = [3, 3, 3, 3, 1, 1, 0, 0]
    p = make_planner("sglang-adaptive", cfg)
    assert p.ema == 2.0
    got = []
    for x in accept:  # a batch of 2 requests each accepting x draft tokens
        p.observe_round(stats(2, 2, 2 * x))
        got.append(p.steps)
    assert got == expected
    assert p.ema == 0.37109375
    # alone, a sequence's own accepted length is its batch's mean: the same tiers
    c = make_controller("sglang-adaptive", cfg)
    tiers = []
    for x in accept:
        d = c.decide(0.0)
        c.observe(obs(d.k, x))
        tiers.append(c.decide(0.0).k)
    assert tiers == expected
    # a batch where nobody drafted is no verify batch
    p.observe_round(stats(2, 0, 0))
    assert p.batches == 8


def test_sglang_up_hysteresis_and_multi_tier_walks():
    cfg = {**SG, "candidate_steps": [1, 2, 3, 5], "num_steps": 1, "warmup_batches": 0}
    p = make_planner("sglang-adaptive", {**cfg, "update_interval": 1, "ema_alpha": 1.0})
    p.observe_accept_length(4.0)  # target 5: walks 1 -> 2 -> 3 -> 5 in one decision
    assert p.steps == 5
    p.observe_accept_length(0.0)  # target 1: walks down to 1
    assert p.steps == 1
    q = make_planner(
        "sglang-adaptive", {**cfg, "update_interval": 1, "ema_alpha": 1.0, "up_hysteresis": 1.0}
    )
    q.observe_accept_length(1.4)  # round(2.4 − 1) = 1: not above tier 1
    assert q.steps == 1
    q.observe_accept_length(1.6)  # round(2.6 − 1) = 2 -> tier 2, and not above 2
    assert q.steps == 2


def test_sglang_initial_snap_and_engine_cap():
    assert make_planner("sglang-adaptive", {"num_steps": 5}).steps == 3  # tie 3/7 -> smaller
    assert make_planner("sglang-adaptive", {"num_steps": 6}).steps == 7
    assert make_planner("sglang-adaptive", {"num_steps": 64}).steps == 7
    p = make_planner("sglang-adaptive", {"num_steps": 7})
    assert [d.k for d in p.plan(0.0, members("sglang-adaptive", 2), BatchContext(2, 0, 4))] == [
        4,
        4,
    ]
    with pytest.raises(ConfigError, match="must be a non-empty increasing list"):
        make_config("sglang-adaptive", {"candidate_steps": [3, 1]})


# ---------------------------------------------------------------------------- verification
def test_verification_admission_order():
    # request 0 survives .9, .81; request 1 .5, .2: its position 1 ranks below request 0's 2
    S = np.array([[0.9, 0.5], [0.81, 0.2]])
    owner = admission(S)
    assert owner.tolist() == [0, 0, 1, 1]
    assert lengths_by_budget(owner, 2).tolist() == [[0, 0], [1, 0], [2, 0], [2, 1], [2, 2]]
    # ties: by position, then batch order (each request's slots stay a prefix)
    assert admission(np.full((2, 2), 0.5)).tolist() == [0, 1, 0, 1]


class _Costs:
    """A stub cost model: verify 1 + 0.1·N, a draft step 0.2, nothing else."""

    ready = True

    def functions(self, *args, **kwargs) -> CostFunctions:
        return CostFunctions(
            verify_s=lambda n: 1.0 + 0.1 * np.asarray(n, dtype=float),
            verify_slope=lambda n: np.full(np.shape(n), 0.1),
            step_s=lambda d: np.full(np.shape(d), 0.2),
        )

    def observe(self, s) -> None:
        pass


def _verification(config):
    cfg = {"num_speculative_tokens": 2, **config}
    p = make_planner("vllm-adaptive-verification", cfg)
    ms = members("vllm-adaptive-verification", 2, cfg)
    # estimates .9, .9 and .5, .4 (evidence so heavy that the prior does not move them)
    ms[0].evidence = np.array([[0.9e9, 0.9e9], [1e9, 1e9]])
    ms[1].evidence = np.array([[0.5e9, 0.4e9], [1e9, 1e9]])
    return p, ms


@pytest.mark.parametrize(
    "config, costs, expected",
    [
        # the cost model not ready: every request verifies its full window
        ({}, False, [2, 2]),
        # (B + Σ admitted S) / T over m = 0..4: 2/1.2, 2.9/1.5, 3.71/1.8, 4.21/1.9, 4.41/2.0
        # -> m = 3: request 0 verifies 2, request 1 one
        ({}, True, [2, 1]),
        # a table of K = 2 at batch 2: budget N·K = 4 (vLLM's rule), or the optimum capped
        ({"rows": 1, "k_1": 2}, True, [2, 2]),
        ({"rows": 1, "k_1": 2, "dsd_budget": "cap"}, True, [2, 1]),
        ({"rows": 1, "k_1": 1, "dsd_budget": "cap"}, True, [2, 0]),
    ],
)
def test_verification_budget(config, costs, expected):
    p, ms = _verification(config)
    if costs:
        p.costs = _Costs()
    assert np.allclose(p.scores(ms, 2), [[0.9, 0.5], [0.81, 0.2]])
    assert [d.k for d in p.plan(0.0, ms, BatchContext(2, 0))] == expected


@pytest.mark.parametrize("source", ["auto", "online"])
def test_verification_cuts_a_drafted_block_at_the_budgets_score(source):
    """With a block drafter whose confidences it reads, every request drafts its window and
    the driver cuts it at the score of the m-th admitted slot (m = 3: 0.5), so the block's own
    confidences decide which slots are verified; online estimates keep the planned lengths."""
    from control.types import draft_stop

    p, ms = _verification({"acceptance_source": source})
    p.costs = _Costs()
    decs = p.plan(0.0, ms, BatchContext(2, 0, block_draft=True))
    if source == "online":
        assert [(d.k, d.survival) for d in decs] == [(2, 0.0), (1, 0.0)]
        return
    assert [(d.k, d.survival) for d in decs] == [(2, 0.5), (2, 0.5)]
    # a round whose block is confident for request 1 and doubtful for request 0
    assert [
        draft_stop(c, 2, d.tau, d.survival) for c, d in zip([(0.6, 0.7), (0.9, 0.9)], decs)
    ] == [1, 2]
    assert [d.k for d in p.plan(0.0, ms, BatchContext(2, 0))] == [2, 1]  # no block: as before


@pytest.mark.parametrize(
    "source, first", [("confidence", [0.9, 0.3, 0.0]), ("online", [1.0, 0.0, 0.0])]
)
def test_verification_evidence(source, first):
    cfg = {"num_speculative_tokens": 3, "acceptance_source": source, "memory_rounds": 8.0}
    p = make_planner("vllm-adaptive-verification", cfg)
    (c,) = members("vllm-adaptive-verification", 1, cfg)
    p.plan(0.0, [c], BatchContext(1, 0))
    c.observe(obs(3, 1, conf=(0.9, 0.3, 0.2)))  # tried positions 1, 2; position 3 never
    p.observe_round(stats(1, 1, 1))
    assert c.evidence.tolist() == [first, [1.0, 1.0, 0.0]]
    # pooled: (succ + 4·0.85) / (tried + 4) = 4.4/5, 3.4/5, 0.85
    assert p.pooled() == pytest.approx([4.4 / 5, 3.4 / 5, 0.85])
    c.observe(obs(0, 0))  # a round without a draft: the evidence fades by 1 − 1/8
    p.observe_round(stats(1, 0, 0))
    assert c.evidence == pytest.approx(np.array([first, [1.0, 1.0, 0.0]]) * 0.875)
    assert c.reads_confidences == (source != "online")


# ---------------------------------------------------------------------------- every peer
@pytest.mark.parametrize("name", PEERS)
def test_peer_alone_decides_like_a_batch_of_one(name):
    """Without a planner (batch-1 drivers, replay) a peer's decide is its private planner's
    plan for a batch of itself; a planner fed the same rounds decides the same."""
    alone = make_controller(name)
    p = make_planner(name)
    (m,) = members(name, 1)
    rng = np.random.default_rng(5)
    for _ in range(40):
        d = alone.decide(0.0)
        (dp,) = p.plan(0.0, [m], BatchContext(1, m.context_tokens))
        assert d.k == dp.k
        n = int(min(d.k, rng.geometric(0.3) - 1))
        o = obs(d.k, n, draft_s=0.001 * d.k, verify_s=0.01, conf=tuple(rng.random(d.k)))
        alone.observe(o)
        m.observe(o)
        p.observe_round(RoundStats.of_observation(o))
    assert alone.state()["rounds"] == 40


@pytest.mark.parametrize("name", PEERS)
def test_peer_runs_in_the_simulator(name, tiny_scenario):
    from sim.api import simulate

    res = simulate(tiny_scenario, name, seed=0, trace=True, baseline=False)
    s, r = res.summary, res.rounds
    assert s["requests_finished"] == 30 and s["requests_unfinished"] == 0
    cfg = res.controller_config
    top = getattr(cfg, "num_speculative_tokens", None) or max(cfg.candidate_steps)
    assert r["k"].max() <= top and r["accepted"].sum() > 0
    if name == "sglang-adaptive":  # tiers, or fewer at a request's last tokens
        assert r["k"].isin(cfg.candidate_steps).mean() > 0.9


def test_dsd_default_equals_fixed_k3_below_batch_64(tiny_scenario):
    # tiny serves at most 16 at once: the default table's first row, K = 3, every round
    from sim.api import simulate

    a = simulate(tiny_scenario, "vllm-dsd", seed=1, baseline=False).summary
    b = simulate(tiny_scenario, "fixed", {"k": 3}, seed=1, baseline=False).summary
    assert {k: v for k, v in a.items() if k != "controller"} == pytest.approx(
        {k: v for k, v in b.items() if k != "controller"}, nan_ok=True
    )
