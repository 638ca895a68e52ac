"""Block drafter (sim.block): one drafter forward per drafting round at B tokens per row,
whatever k <= B; k capped at B; acceptance per position from the head's calibration curve."""

import numpy as np
import pytest
from conftest import scenario
from test_hand_computed import two_request_scenario

from control.errors import ConfigError
from sim import simulate
from sim.acceptance import AcceptanceConfig, AcceptanceModel
from sim.block import BLOCK_PRESETS
from sim.cluster import Cluster
from sim.params import EngineParams


def block_scenario(tmp_path, block_size: int, **deployment):
    scn = two_request_scenario(tmp_path, {"scheduler": "prefill-first", **deployment})
    return scn.with_overrides({"draft.kind": "block", "draft.block_size": block_size})


def test_exact_event_times_constant(tmp_path):
    """The scripted two requests of test_hand_computed (constant target 0.01 s, drafter
    forward 0.001 s, prefill 0.02 s, prefill-first) with a block drafter of B = 4 at k = 2:
    each round pays ONE drafter forward (0.001), not k = 2 steps."""
    res = simulate(block_scenario(tmp_path, 4), "fixed", {"k": 2}, trace=True, baseline=False)
    r = res.requests.set_index("request_id")
    # prefills [0, 0.02] (A) and [0.02, 0.04] (B); round 1 [0.04, 0.051] = one forward 0.001
    # + verify 0.01: A accepts 2 -> 3 tokens, done; B accepts 0 -> 1 token; round 2
    # [0.051, 0.062]: B accepts 2 but needs 1 more token.
    assert r.loc[0, "first_token_s"] == pytest.approx(0.02, abs=1e-12)
    assert r.loc[1, "first_token_s"] == pytest.approx(0.04, abs=1e-12)
    assert r.loc[0, "finish_s"] == pytest.approx(0.051, abs=1e-12)
    assert r.loc[1, "finish_s"] == pytest.approx(0.062, abs=1e-12)
    rd = res.rounds
    assert list(rd["now_s"]) == pytest.approx([0.051, 0.051, 0.062])
    assert list(rd["draft_s"]) == pytest.approx([0.001, 0.001, 0.001])
    assert list(rd["accepted"]) == [2, 0, 2]


def roofline_block(tmp_path, k: int, block_size: int = 6):
    scn = block_scenario(tmp_path, block_size).with_overrides(
        {"latency.backend": "roofline", "drafter.preset": "DSpark-block-7"}
    )
    return scn, simulate(scn, "fixed", {"k": k}, trace=True, baseline=False)


def test_exact_event_times_roofline(tmp_path):
    """Every round of the scripted requests on the roofline model: it ends at its start + one
    drafter forward over the drafting rows at B = 6 tokens each + one verify pass of
    Σ(k + 1) tokens, the rows' contexts summed; rounds follow each other from the end of the
    prefills."""
    scn, res = roofline_block(tmp_path, 2)
    cl = Cluster(scn)
    d, t = cl.roof_d, cl.roof_t
    rd = res.rounds
    # prefills (prefill-first): one pass of A's 10 tokens, then B's
    prefill_a = cl.lat_t.pass_seconds(0, 0, 0.0, 1, 10, 55, 0) + d.pass_seconds(
        0, 0, 0.0, 1, 10, 55, 0
    )
    assert res.requests.set_index("request_id").loc[0, "first_token_s"] == pytest.approx(
        prefill_a, rel=1e-12
    )
    start = float(res.requests["first_token_s"].max())  # B's prefill ends: round 1 starts
    r1 = d.seconds(2, 12, 22.0) + t.seconds(2, 6, 22.0)  # 2 rows x B=6; verify 2 x (2 + 1)
    r2 = d.seconds(1, 6, 12.0) + t.seconds(1, 3, 12.0)  # B alone at context 12
    assert list(rd["now_s"]) == pytest.approx([start + r1, start + r1, start + r1 + r2], rel=1e-12)
    assert list(rd["draft_s"]) == pytest.approx(
        [d.seconds(2, 12, 22.0)] * 2 + [d.seconds(1, 6, 12.0)], rel=1e-12
    )
    # the forward at B tokens a row is what the latency model prices, not k one-token steps
    assert d.seconds(1, 6, 12.0) != pytest.approx(2 * d.seconds(1, 1, 12.0), rel=1e-3)


def test_draft_cost_independent_of_k(tmp_path):
    """k = 1, 3 and 6 (all <= B = 6) give the same draft seconds in every round that drafts."""
    draft = {}
    for k in (1, 3, 6):
        _, res = roofline_block(tmp_path, k)
        draft[k] = res.rounds["draft_s"].iloc[0]
    assert draft[1] == draft[3] == draft[6] > 0


def test_k_capped_at_block(tmp_path):
    """A controller's k = 12 drafts at most B = 4 tokens; the planner is told the engine's cap
    on k (none here), as the engine tells its own, and the block cuts what a round drafts."""
    scn = block_scenario(tmp_path, 4)
    params = EngineParams.of(scn, Cluster(scn))
    assert params.max_draft is None and params.draft_cap == 4
    capped = EngineParams.of(scn.with_overrides({"deployment.max_draft_tokens": 3}), Cluster(scn))
    assert capped.max_draft == 3 and capped.draft_cap == 3
    res = simulate(scn, "fixed", {"k": 12}, trace=True, baseline=False)
    assert list(res.rounds["drafted"]) == [4, 4, 4]
    assert list(res.rounds["draft_s"]) == pytest.approx([0.001] * 3)


def test_presets_and_checks():
    scn = scenario({"draft": {"kind": "block", "preset": "DFlash-block-16"}})
    assert Cluster(scn).block_size == 16
    scn = scenario(
        {"draft": {"kind": "block", "preset": "DSpark-block-7"}, "acceptance": {"model": "curve"}}
    )
    assert scn.acceptance.position_rates == BLOCK_PRESETS["DSpark-block-7"][1]
    assert Cluster(scn).block_size == 7
    with pytest.raises(ConfigError, match=r"draft\.block_size is set but draft\.kind"):
        scenario({"draft": {"block_size": 8}})
    with pytest.raises(ConfigError, match=r"needs acceptance\.position_rates"):
        scenario({"acceptance": {"model": "curve"}})


def test_curve_acceptance_survival():
    """P(L >= j) = Π_{i <= j} r_i, the last rate repeating past the table."""
    rates = (0.9, 0.6, 0.5)
    m = AcceptanceModel(
        AcceptanceConfig(model="curve", position_rates=rates, max_run_tokens=8),
        200_000,
        np.random.default_rng(1),
        np.random.default_rng(2),
    )
    L = m.run_lengths(np.arange(200_000), np.zeros(200_000, dtype=np.int64))
    surv = np.cumprod([0.9, 0.6, 0.5, 0.5, 0.5])
    got = [(L >= j).mean() for j in range(1, 6)]
    assert got == pytest.approx(surv.tolist(), abs=4e-3)
    assert m.true_rates(np.array([0]), np.array([0]))[0] == 0.9


def test_block_size_is_tunable():
    """B is a tuned param (4-16) of the [draft] section."""
    import dataclasses

    from sim.block import DraftConfig

    f = {x.name: x for x in dataclasses.fields(DraftConfig)}["block_size"]
    assert f.metadata["tune"] == (4, 16)


@pytest.mark.parametrize("model", ["curve", "iid"])
def test_a_calibrated_head_is_calibrated_and_keeps_the_rates(model):
    """``head_concentration`` κ: at every position a round tried (inside its run, or its first
    rejection) the head's confidence is calibrated — binned by confidence, the share accepted
    is the bin's mean confidence — and its mean at position j, over all rounds, is the rate
    r_j; the run lengths are the rates' (the head only reads them)."""
    n, K = 100_000, 4
    cfg = AcceptanceConfig(
        model=model, rate=0.7, position_rates=(0.9, 0.6, 0.5), head_concentration=3.0
    )
    m = AcceptanceModel(cfg, n, np.random.default_rng(1), np.random.default_rng(2))
    ids = np.arange(n)
    L = m.run_lengths(ids, np.zeros(n, dtype=np.int64))
    c = m.confidences(ids, np.zeros(n, dtype=np.int64), L, K)
    rates = [0.9, 0.6, 0.5, 0.5] if model == "curve" else [0.7] * 4
    assert c.mean(axis=0) == pytest.approx(rates, abs=5e-3)
    j = np.arange(K)[None, :]
    tried = j <= L[:, None]
    acc = (j < L[:, None])[tried]
    conf = c[tried]
    bins = np.digitize(conf, [0.2, 0.4, 0.6, 0.8])
    for b in range(5):
        sel = bins == b
        assert sel.sum() > 2000
        assert acc[sel].mean() == pytest.approx(conf[sel].mean(), abs=0.015)
    assert c[:, 0].std() > 0.15  # a sharp head: its confidences spread
