"""The worth of a displaced prompt token in the ``dspark`` planner: fixed, or learned as the
workload's output per prompt token (``prompt_value_source``), and what the plan is charged."""

import pytest

from control.batch import BatchContext, RoundStats
from control.dspark import DSparkConfig
from control.dspark_planner import PROMPT_VALUE_KEEP, DSparkPlanner


def _round(emitted: int, prefill: int) -> RoundStats:
    return RoundStats(0.0, 0.01, 4, 4, 2, 12, 4000, 0.002, 0.008, 6, emitted, prefill)


def _fed(cfg: DSparkConfig, rounds: int, emitted: int, prefill: int) -> DSparkPlanner:
    p = DSparkPlanner(cfg)
    for _ in range(rounds):
        p.observe_round(_round(emitted, prefill))
    return p


def test_observed_value_is_the_forgotten_ratio_of_emitted_to_prefilled_with_its_prior():
    cfg = DSparkConfig(prompt_token_value=0.8, prompt_value_prior_tokens=1000.0)
    n, e, pre = 300, 6, 500  # 6 output tokens and 500 prompt tokens a round
    mass = (1.0 - PROMPT_VALUE_KEEP**n) / (1.0 - PROMPT_VALUE_KEEP)  # Σ keep^i, i < n
    prior = 1000.0 * PROMPT_VALUE_KEEP**n  # the prior is forgotten like the evidence
    want = (e * mass + prior * 0.8) / (pre * mass + prior)
    assert _fed(cfg, n, e, pre).prompt_value() == pytest.approx(want, rel=1e-12)
    # a replica that prefills little a round: its own ratio wins in the end, the prior does not
    # hold the value up for good (a prior not forgotten would: 0.26 here)
    sparse = _fed(
        DSparkConfig(prompt_token_value=0.8, prompt_value_prior_tokens=65536.0), 8000, 3, 150
    )
    assert sparse.prompt_value() == pytest.approx(0.02, rel=0.05)
    # long prompts, few outputs: far below the prior; short prompts: above it
    assert _fed(cfg, 3000, 2, 2000).prompt_value() < 0.01
    assert _fed(cfg, 3000, 40, 20).prompt_value() > 1.5


def test_before_any_round_and_under_the_fixed_source_the_configured_value_holds():
    assert DSparkPlanner(DSparkConfig(prompt_token_value=0.3)).prompt_value() == 0.3
    fixed = DSparkConfig(prompt_token_value=0.3, prompt_value_source="fixed")
    assert _fed(fixed, 500, 1, 4000).prompt_value() == 0.3
    no_prior = DSparkConfig(prompt_token_value=0.3, prompt_value_prior_tokens=0.0)
    assert DSparkPlanner(no_prior).prompt_value() == 0.3  # nothing prefilled, no prior mass


def test_the_plan_charges_each_displaced_prompt_token_the_learned_value():
    """Under a token budget with a backlog, a verified token beyond the budget's free room
    pushes one prompt token out: the penalty's slope there is the planner's prompt value."""
    p = _fed(DSparkConfig(), 200, 3, 900)
    fns = p.cost_functions(BatchContext(8, 8000, None, prefill_backlog=5000, token_budget=512))
    assert fns.penalty_slope is not None
    assert float(fns.penalty_slope(600.0)) == pytest.approx(p.prompt_value(), rel=1e-12)
    assert p.state()["prompt_value"] == p.prompt_value()
