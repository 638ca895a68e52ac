"""The ``dspark`` round planner replays its recorded decisions exactly.

Seeded synthetic batches (members joining and leaving, easy/hard acceptance stretches, a
chunked-prefill backlog, SLOs set and unset, both objectives, the batch-1 solo path) drive a
:class:`~control.dspark_planner.DSparkPlanner` and its
:class:`~control.dspark.DSparkController` members for a few hundred rounds. Every round's draft
lengths (k per member) must equal those in ``planner_replay.json``, recorded from the planner
before its state moved into arrays, and its predicted goodput (stored as the float's hex) must
match to 1e-7: numpy's BLAS picks its kernels by CPU, and kernels that sum in another order move
the cost fits in their last bits (2e-9 of the goodput, relative, between two x86 machines'
kernels), never the decisions recorded. Regenerate only for an intended change of decisions:
``DSPARK_REGEN_REPLAY=1 .venv/bin/pytest tests/control/test_planner_replay.py``.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np
import pytest

from control.batch import BatchContext, RoundStats, Slo
from control.dspark import DSparkConfig, DSparkController
from control.registry import make_planner

FIXTURE = Path(__file__).with_name("planner_replay.json")
ROUNDS = 300
BUDGET = 512  # tokens per forward pass (chunked prefill)

#: the recordings' planner: the weights as configured, caps ranked by goodput without an SLO,
#: prompt chunks a stretch of the round time whatever waits, a waiting prompt's value at most 8x,
#: the best row of the SLO rank (no hurdle)
FIXED = {
    "belief_weights": "fixed",
    "no_slo_rank": "goodput",
    "slo_prefill": "stretch",
    "ttft_value_max": 8.0,
    "slo_rank_hurdle": 0.0,
}
#: name -> (config overrides, SLO or None, starting batch, arrival waves {round: joiners})
CASES = {
    "slo_goodput_slo": (FIXED, Slo(2.0, 0.05), 12, {80: 10, 190: 24}),
    "slo_goodput_noslo": (FIXED, None, 12, {80: 10, 190: 24}),
    "throughput_slo": ({**FIXED, "objective": "throughput"}, Slo(2.0, 0.05), 16, {60: 30, 200: 3}),
    "throughput_noslo": ({**FIXED, "objective": "throughput"}, None, 40, {150: 40}),
    "horizon_spread_cooldown": (
        {
            **FIXED,
            "slo_horizon_rounds": 8.0,
            "slo_spread": 0.1,
            "goodput_cooldown": True,
            "k_max": 8,
        },
        Slo(1.0, 0.03),
        20,
        {100: 12},
    ),
    "fixed_prompt_value_replan1": (
        {**FIXED, "prompt_value_source": "fixed", "replan_rounds": 1, "explore_every": 7},
        Slo(2.0, 0.05),
        8,
        {50: 8, 120: 30},
    ),
    # the defaults (weights chosen by their predictions, control.belief_weights; without an SLO
    # and no prompt queueing, caps ranked by mean time per token; with one, prompt chunks a cost
    # a round while prompts wait beyond the pass, control.prefill_backlog)
    "defaults_slo": ({}, Slo(2.0, 0.05), 24, {80: 10, 190: 24}),
    "defaults_noslo": ({}, None, 24, {80: 10, 190: 24}),
}


class Member:
    """A synthetic sequence: its controller, acceptance rates of its easy and hard stretches,
    which stretch it is in, its context and the output tokens it has left."""

    def __init__(self, rng: np.random.Generator, cfg: DSparkConfig, slo: Slo | None) -> None:
        self.ctrl = DSparkController(cfg)
        if slo is not None:
            self.ctrl.set_slo(slo)
        self.rates = (float(rng.beta(8, 2)), float(rng.beta(2, 5)))
        self.hard = bool(rng.random() < 0.3)
        self.context = int(rng.integers(50, 2000))
        self.left = int(rng.integers(5, 120))


def run_batch(name: str, at_once: bool = False) -> dict:
    """One recorded batch: per round the members' k and the planner's goodput (hex).
    ``at_once``: the members observe each round through the planner's ``observe_members``
    (as the simulator and the engine drive it), else each its own ``observe_values``."""
    over, slo, b0, waves = CASES[name]
    cfg = DSparkConfig(**over)
    rng = np.random.default_rng(sum(map(ord, name)))
    planner = make_planner("dspark", cfg)
    if slo is not None:
        planner.set_slo(slo)
    members = [Member(rng, cfg, slo) for _ in range(b0)]
    backlog, waiting_since, now = 0, None, 0.0
    ks_out, goodput = [], []
    for r in range(ROUNDS):
        for _ in range(waves.get(r, 0) + int(rng.random() < 0.15)):
            members.append(Member(rng, cfg, slo))
            backlog += int(rng.integers(100, 900))
            waiting_since = now if waiting_since is None else waiting_since
        B = len(members)
        ctx_sum = sum(m.context for m in members)
        batch = BatchContext(
            B, ctx_sum, 16 if len(name) % 2 else None, backlog, BUDGET if backlog else None,
            waiting_since,
        )  # fmt: skip
        ks = [
            min(d.k, m.left - 1)
            for d, m in zip(planner.plan(now, [m.ctrl for m in members], batch), members)
        ]
        ks_out.append(ks)
        goodput.append(float(planner.last_goodput).hex())
        n_tok, steps, drafting = sum(ks) + B, max(ks), sum(1 for k in ks if k)
        prefill = min(backlog, max(BUDGET - n_tok, 0)) if backlog else 0
        backlog -= prefill
        waiting_since = None if backlog == 0 else waiting_since
        verify_s = 0.02 + 1.2e-4 * (n_tok + prefill) + 2e-8 * ctx_sum
        draft_s = (0.002 + steps * (8e-4 + 1e-5 * drafting)) if steps else 0.0
        end = now + draft_s + verify_s
        acc_sum = emit_sum = 0
        rows = []
        for m, k in zip(members, ks):
            if rng.random() < 0.05:
                m.hard = not m.hard
            a = m.rates[m.hard]
            n = 0
            while n < k and rng.random() < a:
                n += 1
            e = min(n + 1, m.left)
            if at_once:
                rows.append((k, n, m.context, e))
            else:
                m.ctrl.observe_values(end, k, n, (), draft_s, verify_s, m.context, 0, e, (), B)
            m.context += e
            m.left -= e
            acc_sum += n
            emit_sum += e
        if at_once:
            d, n, cx, e = (list(col) for col in zip(*rows))
            planner.observe_members(
                [m.ctrl for m in members], end, d, n, None, draft_s, verify_s, cx, [0] * B, e,
                [()] * B, 0, 0,
            )  # fmt: skip
        planner.observe_round(
            RoundStats(now, end, B, drafting, steps, n_tok, ctx_sum, draft_s, verify_s,
                       acc_sum, emit_sum, prefill)
        )  # fmt: skip
        now = end
        members = [m for m in members if m.left > 0] or [Member(rng, cfg, slo)]
    return {"k": ks_out, "goodput": goodput}


def run_solo() -> dict:
    """The batch-1 path: a controller with no round planner plans a batch of itself."""
    rng = np.random.default_rng(7)
    ctrl = DSparkController(DSparkConfig(k_max=10, **FIXED))
    ks, goodput, now = [], [], 0.0
    for r in range(ROUNDS):
        k = ctrl.decide(now).k
        ks.append(k)
        goodput.append(float(ctrl._solo.last_goodput).hex())
        a = 0.85 if (r // 40) % 2 == 0 else 0.35
        n = 0
        while n < k and rng.random() < a:
            n += 1
        draft_s, verify_s = (0.001 + 6e-4 * k) if k else 0.0, 0.015 + 3e-4 * (k + 1)
        now += draft_s + verify_s
        ctrl.observe_values(now, k, n, (), draft_s, verify_s, 500 + r, 0, n + 1, ())
    return {"k": ks, "goodput": goodput}


def record() -> dict:
    out = {name: run_batch(name) for name in CASES}
    out["solo"] = run_solo()
    return out


@pytest.fixture(scope="module")
def recorded() -> dict:
    if os.environ.get("DSPARK_REGEN_REPLAY") == "1":
        FIXTURE.write_text(json.dumps(record(), separators=(",", ":")) + "\n")
    return json.loads(FIXTURE.read_text())


@pytest.mark.parametrize(
    ("name", "at_once"),
    [(n, False) for n in [*CASES, "solo"]] + [(n, True) for n in CASES],  # solo: no planner
)
def test_replay_bit_identical(recorded, name, at_once, monkeypatch):
    if at_once:  # every batch through the recording at once, whatever its size
        monkeypatch.setattr("control.dspark_planner.RECORD_AT_ONCE", 1)
    got = run_solo() if name == "solo" else run_batch(name, at_once)
    want = recorded[name]
    for r, (a, b) in enumerate(zip(got["k"], want["k"])):
        assert a == b, f"{name}: round {r} draft lengths differ"
    assert len(got["k"]) == len(want["k"]) == ROUNDS
    assert len(got["goodput"]) == len(want["goodput"])
    for r, (a, b) in enumerate(zip(got["goodput"], want["goodput"])):
        x, y = float.fromhex(a), float.fromhex(b)
        assert (math.isnan(x) and math.isnan(y)) or x == pytest.approx(y, rel=1e-7), (name, r)


def test_recorded_batches_exercise_the_planner(recorded):
    """The recording covers what it claims: batches that grow and shrink, drafts of several
    lengths, rounds that draft nothing."""
    for name in CASES:
        sizes = {len(ks) for ks in recorded[name]["k"]}
        assert max(sizes) - min(sizes) >= 10, name
        flat = {k for ks in recorded[name]["k"] for k in ks}
        assert len(flat) >= 3, name


@pytest.mark.parametrize("cols", [1, 16, 63, 64, 256])
def test_position_powers_are_numpy_bit_for_bit(cols):
    from control.goodput_kernel import position_powers

    x = np.random.default_rng(cols).uniform(0.0, 1.0, (16, cols))
    powers, cum = position_powers(x, 16)
    assert powers[1:].tobytes() == np.cumprod(x, axis=0).tobytes()
    assert cum.tobytes() == np.cumsum(powers, axis=0).tobytes()


@pytest.mark.parametrize("backoff", [0, 3])
def test_a_limit_below_the_last_caps_window_searches_every_cap(backoff):
    """The engine's max_draft falling more than 3 below the last cap (a smaller static cache)
    plans within the new limit instead of searching an empty window of caps (with the
    re-planning back-off too: a new limit re-plans at once)."""
    cfg = DSparkConfig(replan_backoff=backoff)
    planner = make_planner("dspark", cfg)
    members = [DSparkController(cfg) for _ in range(4)]
    t = 0.0
    for r in range(60):
        limit = 16 if r < 50 else 2
        ks = [d.k for d in planner.plan(t, members, BatchContext(4, 1000, limit))]
        if r == 49:
            assert planner.last_cap > 5  # every draft accepted: the plan drafts long
        if r >= 50:
            assert max(ks) <= 2
        n_tok, steps = sum(ks) + 4, max(ks)
        verify_s, draft_s = 0.02 + 1e-4 * n_tok, 0.001 * steps
        end = t + verify_s + draft_s
        for m, k in zip(members, ks):
            m.observe_values(end, k, k, (), draft_s, verify_s, 250, 0, k + 1, ())
        drafting = sum(1 for k in ks if k)
        planner.observe_round(
            RoundStats(t, end, 4, drafting, steps, n_tok, 1000, draft_s, verify_s, sum(ks), n_tok)
        )
        t = end
    assert planner.last_cap == 2
