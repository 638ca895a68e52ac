"""The ``dspark`` planner's re-planning back-off (``replan_backoff``, ``control.dspark_planner``
item 6): a full plan that keeps every sequence's length doubles the interval to the next one, a
plan that changes a length resets it, and a prompt starting or ending to wait re-plans at once
(a new draft limit too: ``test_planner_replay.py``)."""

from itertools import pairwise

import pytest

from control.dspark import DSparkConfig
from tests.control.test_planner_idle import CFG, PAYING, run

EXPLORE = 64  # probes at rounds 63, 127, ... (each followed by a full plan)
BACKLOG = {200, 201, 202}  # a prompt waits in these rounds: plans at 200 and 203
WARM = 8  # the cold start plans every round until the cost model is ready


def plans(a_true, backoff, seed=0):
    cfg = DSparkConfig(k_max=8, replan_backoff=backoff, explore_every=EXPLORE)
    stable: list[int] = []
    _, out = run(300, PAYING, a_true=a_true, cfg=cfg, backlog_at=BACKLOG, seed=seed, stable=stable)
    return [r for r, (_, full) in enumerate(out) if full], stable


def triggered(r):
    """A full plan at round r that the back-off does not time: a probe, the plan after it, or
    the prompt backlog appearing or clearing."""
    return r % EXPLORE in (EXPLORE - 1, 0) or r in (200, 203)


@pytest.mark.parametrize("a_true", [0.99, 0.6])
def test_the_next_full_plan_comes_after_replan_rounds_doubled_per_kept_plan(a_true):
    full, stable = plans(a_true, backoff=3)
    gaps = []
    for r1, r2 in pairwise(full):
        if r1 < WARM or triggered(r2):
            continue
        assert r2 - r1 == CFG.replan_rounds << stable[r1], (r1, r2, stable[r1])
        gaps.append(r2 - r1)
    assert max(gaps) == CFG.replan_rounds << 3  # the interval reached its cap, 2^3 · 2
    assert max(stable) == 3


def test_a_plan_that_changes_a_length_resets_the_interval():
    full, stable = plans(0.6, backoff=3)
    resets = [r for r in full if r >= WARM and stable[r] == 0 and stable[r - 1] > 0]
    assert resets  # at acceptance 0.6 the sequences' stops move now and then
    for r in resets:
        assert r + CFG.replan_rounds in full or triggered(r + 1)


def test_a_prompt_starting_or_ending_to_wait_replans_at_once():
    for a_true in (0.99, 0.6):
        full, _ = plans(a_true, backoff=3)
        assert 200 in full and 203 in full


def test_without_the_backoff_a_full_plan_comes_every_replan_rounds():
    """Off (the default), the interval never grows; that the default's decisions are the
    recorded planner's is ``test_planner_replay.py``'s."""
    full, stable = plans(0.99, backoff=0)
    assert not any(stable)
    assert all(b - a <= CFG.replan_rounds for a, b in pairwise(full))
