"""The batched engine (issue 12): continuous batching over a slotted cache, one packed verify pass.

float64 tiny models. Greedy: every sequence equals its own target-only greedy output with a
different k per row in the same round, rows joining and leaving mid-run, for every drafter.
Batch invariance: a sequence's rounds and tokens do not depend on its batch-mates (threshold mode
and sampling included: each sequence samples from its own generator). Sampling at batch > 1 keeps
the target's distribution per row. Padding poison: NaN in every free slot and every cache position
beyond a row's written prefix changes nothing. The planner contract of ``control.batch``.
"""

import dataclasses

import pytest
import torch

from control import make_controller
from control.batch import RoundPlanner
from control.errors import DSparkError
from control.types import Decision
from real.engine import Request
from real.quality import FixedDecision
from real.sampling import probs
from tests.real.conftest import CFG, make_engine, prompt

BCFG = dataclasses.replace(CFG, slots=3)
KS = (0, 1, 2, 3, 5, 8, 4)


def _requests(n, new=(30, 18, 41, 25, 12, 36, 22), ks=KS, plen=(12, 7, 15, 9, 3, 11, 14)):
    return [
        Request(
            i,
            prompt(100 + i, plen[i % len(plen)]),
            new[i % len(new)],
            make_controller("fixed", {"k": ks[i % len(ks)]}),
        )
        for i in range(n)
    ]


@pytest.mark.parametrize("drafter", ["tf", "conv", "ngram", "ngram+conv", "ngram+tf"])
def test_batched_greedy_equals_target_greedy_per_sequence(drafter):
    eng = make_engine(drafter, cfg=BCFG)
    reqs = _requests(7)
    refs = [eng.greedy_reference(r.prompt, r.max_new_tokens) for r in reqs]
    eng.round_log = []
    rounds = []
    seqs = eng.run_batch(
        reqs,
        on_round=lambda ev: rounds.append(
            [(s.req.request_id, s.records[-1].k, s.records[-1].drafted) for s, _ in ev]
        ),
    )
    for s, ref in zip(seqs, refs):
        assert s.tokens == ref, (drafter, s.req.request_id)
        assert sum(r.emitted for r in s.records) == len(ref)
        assert all(r.emitted == r.accepted + 1 for r in s.records)
        assert [r.round for r in s.records] == list(range(len(s.records)))
    assert eng.free_slots == 3 and not eng.running
    # several rows with different k in one round, at most 3 rows, rows joined mid-run
    assert any(len({k for _, k, _ in r}) > 1 for r in rounds)
    assert max(len(r) for r in rounds) == 3
    first_round = {
        rid: next(i for i, r in enumerate(rounds) if any(x[0] == rid for x in r))
        for rid in range(7)
    }
    assert max(first_round.values()) > 0
    # the batch context the controllers were told
    for s in seqs:
        for r in s.records:
            assert 1 <= r.batch_size <= 3 and r.batch_tokens >= r.drafted + 1
            assert r.batch_context_tokens >= r.context_tokens
    if drafter != "ngram":
        assert any(0 < r.accepted < r.drafted for s in seqs for r in s.records)


def test_max_running_caps_the_batch_and_keeps_it_full():
    """``max_running`` = 2 on a 3-slot engine: never more than 2 rows in a round, a waiting
    request joins the round after a row finishes (so the batch stays at 2 while work waits),
    every request served with its own target-greedy output; an impossible cap is one error."""
    eng = make_engine("tf", cfg=BCFG)
    reqs = _requests(5)
    refs = [eng.greedy_reference(r.prompt, r.max_new_tokens) for r in reqs]
    eng.round_log = []
    seqs = eng.run_batch(reqs, max_running=2)
    assert [s.tokens for s in seqs] == refs
    sizes = [st.batch_size for st in eng.round_log]
    assert max(sizes) == 2
    first_single = sizes.index(1)  # the batch shrinks only once nothing waits any more
    assert all(b == 2 for b in sizes[:first_single])
    assert all(b == 1 for b in sizes[first_single:])
    assert sum(st.emitted for st in eng.round_log) == sum(len(r) for r in refs)
    for bad in (0, 4):
        with pytest.raises(DSparkError, match="max_running"):
            eng.run_batch(_requests(2), max_running=bad)


def test_rows_in_a_round_share_one_verify_pass():
    eng = make_engine("tf", cfg=BCFG)
    eng.round_log = []
    seqs = eng.run_batch(_requests(5))
    recs = sorted((r for s in seqs for r in s.records), key=lambda r: r.now_s)
    by_round: dict = {}
    for r in recs:
        by_round.setdefault(r.now_s, []).append(r)
    assert len(by_round) == len(eng.round_log)
    for (_t, rows), st in zip(sorted(by_round.items()), eng.round_log):
        assert st.batch_size == len(rows)
        assert st.verify_tokens == sum(r.drafted + 1 for r in rows) == rows[0].batch_tokens
        assert st.context_tokens == sum(r.context_tokens for r in rows)
        assert st.draft_steps >= max(r.drafted for r in rows)
        assert st.accepted == sum(r.accepted for r in rows)
        assert all(r.verify_s == rows[0].verify_s for r in rows)


@pytest.mark.parametrize("mode", ["threshold", "sampling"])
def test_batch_invariance(mode):
    """A sequence's rounds and tokens are the same alone and among different batch-mates."""
    cfg = (
        BCFG
        if mode == "threshold"
        else dataclasses.replace(BCFG, temperature=1.0, top_k=20, seed=3)
    )

    def ctrl(i):
        if mode == "threshold":
            return FixedDecision(Decision(k=KS[i % len(KS)] or 2, mode="threshold", beta=0.4))
        return make_controller("fixed", {"k": KS[i % len(KS)]})

    def reqs(ids):
        return [Request(i, prompt(100 + i, 6 + i), 20 + 3 * i, ctrl(i)) for i in ids]

    eng = make_engine("tf", cfg=cfg, scale=0.1)
    alone = {i: eng.run_batch(reqs([i]))[0] for i in (0, 3)}
    for mates in ([0, 1, 2], [4, 3, 0, 5, 6], [3, 6, 0]):
        got = {s.req.request_id: s for s in eng.run_batch(reqs(mates))}
        for i in (0, 3):
            if i in got:
                a, b = alone[i], got[i]
                assert a.tokens == b.tokens, (mode, mates, i)
                assert [(r.k, r.drafted, r.accepted, r.lossy_accepts) for r in a.records] == [
                    (r.k, r.drafted, r.accepted, r.lossy_accepts) for r in b.records
                ]
    if mode == "threshold":
        assert sum(r.lossy_accepts for s in alone.values() for r in s.records) > 0


def test_batched_sampling_keeps_target_distribution_per_row():
    """First emitted token of every row, over many batches, ~ that row's target distribution."""
    cfg = dataclasses.replace(BCFG, slots=4, temperature=1.0, top_k=20, top_p=0.95, seed=11)
    eng = make_engine("tf", cfg=cfg)
    prompts = [prompt(50), prompt(51, 9)]
    with torch.inference_mode():
        target = [probs(eng.target(torch.tensor([p]))[0, -1:], cfg.sampling)[0] for p in prompts]
    counts = [torch.zeros_like(t) for t in target]
    n_batches, rid = 150, 0
    for _ in range(n_batches):
        reqs = []
        for b in range(4):
            reqs.append(
                Request(rid, prompts[b % 2], 2 + b % 3, make_controller("fixed", {"k": 1 + b % 3}))
            )
            rid += 1
        for s in eng.run_batch(reqs):
            counts[s.req.request_id % 2][s.tokens[0]] += 1
    for c, t in zip(counts, target):
        tv = 0.5 * float((c / c.sum() - t).abs().sum())
        assert tv < 0.1, tv


def _poison(eng):
    """After every model step, NaN-fill every free slot and, in every other slot, every cache
    position at or beyond the end of what that slot's latest step wrote."""
    d = eng.drafter
    d = getattr(d, "model", d)  # a hybrid's model drafter
    models = [eng.target] + ([d.model] if hasattr(d, "model") else [])
    for m in models:
        hi: dict[int, int] = {}
        orig = m.step_packed

        def step(ids, segs, state, logits=True, _orig=orig, _hi=hi):
            out = _orig(ids, segs, state, logits)
            for s, p, t in zip(segs.slots, segs.starts, segs.lens):
                _hi[s] = p + t
            live = {s.slot for s in eng.running} | set(segs.slots)
            for s in range(state["slots"]):
                end = _hi.get(s, 0) if s in live else 0
                for kc, vc in state.get("kv", []):
                    kc[s, :, end:] = float("nan")
                    vc[s, :, end:] = float("nan")
                for buf in state.get("buf", []):
                    buf[s, end + buf.shape[1] - state["length"] :] = float("nan")
            return out

        m.step_packed = step


@pytest.mark.parametrize("drafter", ["tf", "conv", "ngram+tf"])
def test_padding_poison_changes_nothing(drafter):
    clean = make_engine(drafter, cfg=BCFG)
    dirty = make_engine(drafter, cfg=BCFG)
    _poison(dirty)
    a = clean.run_batch(_requests(6))
    b = dirty.run_batch(_requests(6))
    for x, y in zip(a, b):
        assert x.tokens == y.tokens
        assert [(r.drafted, r.accepted) for r in x.records] == [
            (r.drafted, r.accepted) for r in y.records
        ]
    assert any(r.accepted < r.drafted for s in b for r in s.records)


class _Planner(RoundPlanner):
    """Caps every member's k at a round-level m and records what it was told."""

    def __init__(self, m):
        self.m, self.plans, self.stats = m, [], []

    def plan(self, now_s, members, batch):
        self.plans.append((now_s, len(members), batch))
        return [Decision(k=min(c.decide(now_s).k, self.m)) for c in members]

    def observe_round(self, stats):
        self.stats.append(stats)


def test_round_planner_contract():
    eng = make_engine("tf", cfg=BCFG)
    reqs = _requests(5)
    refs = [eng.greedy_reference(r.prompt, r.max_new_tokens) for r in reqs]
    pl = _Planner(3)
    seqs = eng.run_batch(reqs, planner=pl)
    assert [s.tokens for s in seqs] == refs
    recs = [r for s in seqs for r in s.records]
    assert len(pl.plans) == len(pl.stats) == len({r.now_s for r in recs})
    assert all(r.k <= 3 for r in recs)
    for (now, B, ctx), st in zip(pl.plans, pl.stats):
        assert ctx.batch_size == B == st.batch_size and ctx.max_draft == BCFG.k_max
        assert ctx.context_tokens == st.context_tokens
        assert st.start_s == now <= st.end_s
        assert st.draft_s >= 0 and st.verify_s > 0
    assert sum(st.emitted for st in pl.stats) == sum(len(s.tokens) for s in seqs)
    assert sum(st.accepted for st in pl.stats) == sum(r.accepted for r in recs)


def test_slots_are_freed_and_requests_checked():
    eng = make_engine("tf", cfg=BCFG)
    with pytest.raises(DSparkError, match="exceeds max_len"):
        eng.run_batch([Request(0, prompt(1), BCFG.max_len, make_controller("fixed"))])
    it = eng.stream(prompt(2), 30, make_controller("fixed", {"k": 2}))
    next(it)
    assert eng.free_slots == 2
    it.close()  # an abandoned stream gives its slot back
    assert eng.free_slots == 3 and not eng.running
    s = eng.run_batch([Request(0, prompt(3), 0, make_controller("fixed"))])[0]
    assert s.tokens == [] and s.done and eng.free_slots == 3


@pytest.mark.parametrize("drafter", ["tf", "ngram"])
def test_batch1_planner_outlives_a_request_and_is_seeded_once(drafter):
    """``generate`` drives a round-planning controller (dspark) through one planner per
    (class, config) for the engine's life, as a simulated replica does: handed the engine's
    start-up cost profile once (the cells a round times: verify passes at batch 1 and all
    slots, draft phases when a model drafter is present), learning across requests; and the
    output is still the target's greedy output (float64)."""
    eng = make_engine(drafter)
    outs = []
    seeded = {"profile_prior_rounds": 32.0}  # the default, spelled out
    for i in range(3):
        p = prompt(40 + i)
        outs.append((eng.generate(p, 20, make_controller("dspark", seeded)).tokens, p))
    (planner,) = [v for v in eng._planners.values() if v is not None]
    assert planner.rounds > 20  # one planner saw every request's rounds
    rows = eng._cost_rows
    paths = {(r[0], r[1]) for r in rows}
    assert {("verify", 1), ("verify", eng.slots)} <= paths
    assert (("draft", 1) in paths) == (drafter == "tf")  # the n-gram lookup has no model step
    assert all(r[4] > 0 for r in rows)
    assert len(eng._seeded) == 1  # seeded once, not per request
    for toks, p in outs:
        assert toks == eng.greedy_reference(p, 20)
    # a controller that decides alone gets no planner; an unseeded dspark planner no profile
    assert eng.planner_for(make_controller("fixed")) is None
    fresh = make_engine(drafter)
    fresh.generate(prompt(40), 5, make_controller("dspark", {"profile_prior_rounds": 0.0}))
    assert fresh._cost_rows is None and not fresh._seeded


def test_a_drafter_stopped_before_its_first_token_keeps_what_it_fed():
    """A τ stop before the first draft token still ran the drafter over the committed tokens:
    they stay valid in its cache, so the next round feeds only the new one (no catch-up that
    grows round after round), and the output is still the target's greedy output."""
    eng = make_engine("tf")
    eng.round_log = []
    p = prompt(7)
    ctrl = make_controller("confidence-stop", {"tau": 0.999999, "k_max": 4})
    out = eng.generate(p, 30, ctrl).tokens
    assert out == eng.greedy_reference(p, 30)
    # asked to draft, drafted nothing: the drafter's first step ran, and counts as one
    stopped = [s for s in eng.round_log if s.drafting and s.verify_tokens == s.batch_size]
    assert len(stopped) >= 10  # the perturbed drafter is never that sure
    assert all(s.draft_steps == 1 for s in stopped)
    assert all(s.catchup_tokens == 0 for s in eng.round_log[1:])


@pytest.mark.parametrize("tau", [0.0, 0.3, 0.9])
def test_round_stats_count_the_drafter_forwards_the_round_ran(tau):
    """``RoundStats.draft_steps`` is the number of drafter forwards of the round (a τ stop's
    step included, as the simulator counts it) and ``drafting`` the rows the drafter served:
    the forwards are counted by wrapping the drafter model's step, not by the formula."""
    eng = make_engine("tf", cfg=BCFG)
    eng.round_log = []
    model = eng.drafter.model
    calls: list[int] = []
    step = model.step_packed

    def counted(*a, **kw):
        calls.append(len(eng.round_log))  # the round in progress
        return step(*a, **kw)

    model.step_packed = counted
    reqs = [
        Request(
            i,
            prompt(300 + i, 5 + 3 * i),
            20 + 4 * i,
            make_controller("confidence-stop", {"tau": tau, "k_max": 2 + 2 * (i % 3)}),
        )
        for i in range(6)
    ]
    eng.run_batch(reqs)
    model.step_packed = step
    forwards = [calls.count(i) for i in range(len(eng.round_log))]
    assert [s.draft_steps for s in eng.round_log] == forwards
    assert all((s.drafting == 0) == (s.draft_steps == 0) for s in eng.round_log)
    if tau > 0:  # some rounds end on a stop, so the count is not the longest draft
        assert any(s.draft_steps > s.verify_tokens - s.batch_size for s in eng.round_log)
