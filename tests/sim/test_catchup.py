"""Drafter catch-up (issue 12): after rounds at k = 0 the drafter has not seen the tokens those
rounds fed the target; the next round it drafts in, it first prefills them (batched into its
first step). Exact event times and a per-round check of every draft phase."""

import pytest
from conftest import h100_8b_scenario

import sim.api
from control.fixed import FixedConfig, FixedController
from control.types import Decision
from sim import simulate
from sim.cluster import Cluster
from sim.latency import causal_pairs


class Scripted(FixedController):
    """k = ``script(rounds observed so far)``."""

    def __init__(self, script) -> None:
        super().__init__(FixedConfig())
        self.script = script

    def decide(self, now_s: float) -> Decision:
        return Decision(k=self.script(self.rounds))


def scripted(monkeypatch, script) -> None:
    monkeypatch.setattr(sim.api, "make_controller", lambda name, config: Scripted(script))


def two_requests(tmp_path):
    (tmp_path / "trace.csv").write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2024-01-01 00:00:00.000,100,12\n"
        "2024-01-01 00:00:00.000,120,12\n"
    )
    return h100_8b_scenario(tmp_path, "trace.csv", acceptance={"rate": 0.7})


def test_catch_up_is_a_batched_drafter_prefill_of_the_missed_tokens(tmp_path, monkeypatch):
    # both prompts are prefilled in one step, then three rounds at k = 0, then k = 3
    scripted(monkeypatch, lambda r: 0 if r < 3 else 3)
    scn = two_requests(tmp_path)
    res = simulate(scn, "fixed", trace=True, baseline=False)
    cl = Cluster(scn)
    rd = res.rounds
    ends = sorted(set(rd["now_s"]))
    first = rd[rd["now_s"] == ends[3]]
    assert list(first["k"]) == [3, 3] and (rd[rd["now_s"] < ends[3]]["k"] == 0).all()
    assert (rd[rd["now_s"] < ends[3]]["draft_s"] == 0).all()
    ctx = first["context_tokens"].tolist()
    assert ctx == [100 + 4, 120 + 4]  # the prefill's token and one per k = 0 round
    behind = 3
    prefix = [c - 1 - behind for c in ctx]  # what each drafter holds
    pairs = sum(causal_pairs(behind, p) for p in prefix)
    d = cl.lat_d
    draft = d.pass_seconds(
        2, 2, float(sum(ctx)), 2, 2 * behind, pairs, sum(prefix)
    ) + 2 * d.seconds(2, 2, float(sum(ctx)))
    assert first["draft_s"].iloc[0] == pytest.approx(draft, rel=1e-12)
    assert draft > 3 * d.seconds(2, 2, float(sum(ctx)))  # the catch-up costs time
    tokens = int(first["drafted"].sum()) + 2
    verify = cl.lat_t.seconds(2, tokens, float(sum(ctx)))
    assert ends[3] == pytest.approx(ends[2] + draft + verify, rel=1e-12)
    # the next round drafts with nothing to catch up
    nxt = rd[rd["now_s"] == ends[4]]
    ctx = nxt["context_tokens"].tolist()
    assert nxt["draft_s"].iloc[0] == pytest.approx(3 * d.seconds(2, 2, float(sum(ctx))), rel=1e-12)
    assert res.summary["drafter_catchup_tokens"] == 2 * behind


def expected_draft_s(cl, rows, behind) -> float:
    """A round's draft phase from its trace rows (no prompt chunks, no τ stop)."""
    drafting = rows[rows["k"] > 0]
    if drafting.empty:
        return 0.0
    d, dc, steps = len(drafting), float(drafting["context_tokens"].sum()), int(drafting["k"].max())
    chunks = [
        (behind[r], c - 1 - behind[r])
        for r, c in zip(drafting["request_id"], drafting["context_tokens"])
        if behind[r]
    ]
    if not chunks:
        return steps * cl.lat_d.seconds(d, d, dc)
    n, tok = len(chunks), sum(b for b, _ in chunks)
    pairs, prefix = sum(causal_pairs(b, p) for b, p in chunks), sum(p for _, p in chunks)
    return cl.lat_d.pass_seconds(d, d, dc, n, tok, pairs, prefix) + (steps - 1) * cl.lat_d.seconds(
        d, d, dc
    )


def test_every_draft_phase_carries_its_rows_catch_up(tiny, monkeypatch):
    """Rows at k = 0 beside drafting rows in the same rounds; every round's draft phase is
    recomputed from the trace with the test's own count of each drafter's missed tokens."""
    scripted(monkeypatch, lambda r: 0 if r % 5 < 2 else 3)
    scn = tiny.with_overrides({"deployment.scheduler": "prefill-first"})
    res = simulate(scn, "fixed", seed=3, trace=True, baseline=False)
    cl = Cluster(scn)
    rd = res.rounds
    behind = dict.fromkeys(rd["request_id"], 0)
    caught = mixed = 0
    for _, rows in rd.groupby("now_s", sort=True):
        got = rows["draft_s"].iloc[0]
        assert got == pytest.approx(expected_draft_s(cl, rows, behind), rel=1e-12, abs=1e-15)
        mixed += 0 < (rows["k"] > 0).sum() < len(rows)
        for r, k in zip(rows["request_id"], rows["k"]):
            caught += behind[r] if k else 0
            behind[r] = 0 if k else behind[r] + 1
    assert mixed > 0 and caught > 0
    assert res.summary["drafter_catchup_tokens"] == caught
    assert res.requests["finished"].all()


def test_no_catch_up_without_rounds_at_k0(tiny):
    for k in (0, 4):
        assert (
            simulate(tiny, "fixed", {"k": k}, baseline=False).summary["drafter_catchup_tokens"] == 0
        )
