"""The batch's per-sequence state as arrays (``control.seqstate``): a member's rows follow it
into a planner's store, through the store's growth, out when it leaves and back in, exactly;
the planner's gathers read what the members observed."""

import numpy as np

from control.batch import BatchContext
from control.dspark import DSparkConfig, DSparkController
from control.registry import make_planner
from control.seqstate import ALPHA, PLANNED, SUM_N, SeqArrays

CFG = DSparkConfig(k_max=6)


def observe(m, k, n, t):
    m.observe_values(t, k, n, (), 0.001, 0.01, 100, 0, n + 1, ())


def expected_counts(history, decay):
    """sum_n, sum_rej by the controller's formula (forget, then add), in Python floats."""
    sn = sr = 0.0
    for k, n in history:
        sn = sn * decay + n
        sr = sr * decay + (1 if n < k else 0)
    return sn, sr


def test_rows_follow_a_member_through_adoption_growth_departure_and_return():
    planner = make_planner("dspark", CFG)
    decay = 1.0 - 1.0 / CFG.memory_rounds
    rng = np.random.default_rng(3)
    members = [DSparkController(CFG) for _ in range(40)]  # past the store's 16 slots
    hist: dict[int, list] = {id(m): [] for m in members}
    t = 0.0
    for r in range(30):
        batch = members[:20] if r < 10 else members[10:40] if r < 20 else members
        ks = [d.k for d in planner.plan(t, batch, BatchContext(len(batch), 100 * len(batch)))]
        t += 0.02
        for m, k in zip(batch, ks):
            n = int(rng.integers(0, k + 1))
            observe(m, k, n, t)
            hist[id(m)].append((k, n))
        st = planner.seqs
        slots = [m._slot for m in batch]
        assert all(m._store is st for m in batch)
        assert len(set(slots)) == len(batch)
        # the members that left keep their slots while they live (every one does here)
        assert st.used.sum() == (20 if r < 10 else 40)
    for m in members:
        assert (m.sum_n, m.sum_rej) == expected_counts(hist[id(m)], decay)
        assert m.tokens == sum(n + 1 for _, n in hist[id(m)])
        assert isinstance(m.sum_n, float) and isinstance(m.tokens, int)
    left = members[0]  # listed in rounds 0-9 and 20-29 only
    assert left.rounds == 20 and left._store is planner.seqs


def test_a_member_that_leaves_keeps_its_rows_and_a_gone_member_frees_its_slot():
    """A sequence that leaves the batch keeps its slot untouched (its evidence since the last
    plan is not pooled); once the driver drops it, its slot is free for a newcomer."""
    import gc

    planner = make_planner("dspark", CFG)
    a, b = DSparkController(CFG), DSparkController(CFG)
    planner.plan(0.0, [a, b], BatchContext(2, 200))
    observe(a, 3, 2, 0.02)
    observe(b, 3, 3, 0.02)
    before = (a.sum_n, a.recent_rej, a.counts, a.planned_k)
    planner.plan(0.03, [b], BatchContext(1, 100))
    assert a._store is planner.seqs and (a._slot, b._slot) == (0, 1)
    assert (a.sum_n, a.recent_rej, a.counts, a.planned_k) == before
    assert a.counts[2] == 1  # refused after 2: kept until a plan pools it
    # b's round (all 3 accepted) was pooled by the full plan (costs not ready yet)
    assert not any(b.counts) and planner.profile[CFG.k_max + 1 + 3] == 1.0
    assert b.plan_rates is not None and a.plan_rates is not None
    assert 0 not in planner.seqs.free
    del a
    gc.collect()
    assert 0 in planner.seqs.free and not planner.seqs.used[0]
    c = DSparkController(CFG)
    planner.plan(0.06, [b, c], BatchContext(2, 200))
    assert c._slot == 0 and c.counts == [0] * (2 * (CFG.k_max + 1)) and c.sum_n == 0.0


def test_reset_clears_the_member_rows_in_place():
    planner = make_planner("dspark", CFG)
    m = DSparkController(CFG)
    planner.plan(0.0, [m], BatchContext(1, 100))
    observe(m, 4, 1, 0.02)
    store, slot = m._store, m._slot
    m.reset()
    assert (m._store, m._slot) == (store, slot)
    assert (m.sum_n, m.sum_rej, m.tokens, m.planned_k, m.plan_rates) == (0.0, 0.0, 0, -1, None)
    assert m.counts == [0] * (2 * (CFG.k_max + 1)) and m.alpha == 1.0


def test_the_planner_reads_the_rows_the_members_write():
    st = SeqArrays(4, 2)
    m = DSparkController(DSparkConfig(k_max=4))
    slot = st.adopt(m)
    m.alpha = 0.625
    observe(m, 2, 2, 0.5)
    assert st.values[slot, ALPHA] == 0.625 and st.values[slot, SUM_N] == 2.0
    assert st.values[slot, PLANNED] == -1.0
    assert st.counts[slot].tolist() == [0.0] * 7 + [1.0, 0.0, 0.0]


def test_a_controller_copies_and_pickles_with_its_rows():
    import copy
    import pickle

    m = DSparkController(CFG)
    observe(m, 3, 1, 0.02)
    for twin in (copy.deepcopy(m), pickle.loads(pickle.dumps(m))):
        assert (twin.sum_n, twin.counts, twin.tokens) == (m.sum_n, m.counts, m.tokens)
        observe(twin, 3, 3, 0.04)
        assert twin.sum_n > m.sum_n and m.counts[1] == 1 and twin.counts[CFG.k_max + 4] == 1


def test_a_batch_recorded_at_once_equals_each_member_recording_its_own(monkeypatch):
    """``SeqArrays.record`` (the planner's ``observe_members``) writes, bit for bit, the rows
    each member's own ``observe_values`` writes: members of two memory settings, rounds that
    draft nothing, refuse, accept all, a first round and later ones, members whose evidence is
    what their confidences predicted beside members whose evidence is their outcomes; and the
    members' windows, blocks and round counts move the same."""
    monkeypatch.setattr("control.dspark_planner.RECORD_AT_ONCE", 1)  # 12 members, at once
    cfgs = (
        DSparkConfig(k_max=6),
        DSparkConfig(k_max=6, memory_rounds=7, recent_rounds=3),
        DSparkConfig(k_max=6, acceptance_source="confidence"),
    )
    rng = np.random.default_rng(11)
    twins = []
    for _ in range(2):
        planner = make_planner("dspark", cfgs[0])
        members = [DSparkController(cfgs[i % 3]) for i in range(12)]
        twins.append((planner, members))
    t = 0.0
    for r in range(40):
        ks = rng.integers(0, 7, 12).tolist()
        ns = [int(rng.integers(0, k + 1)) for k in ks]
        es = [n + 1 for n in ns]
        cx = rng.integers(10, 3000, 12).tolist()
        cf = [tuple(rng.uniform(0.2, 1.0, k).tolist()) for k in ks]
        draft_s, verify_s = 0.001 * max(ks), 0.02 + 0.01 * r
        t += draft_s + verify_s
        for side, (planner, members) in enumerate(twins):
            planner.plan(t, members, BatchContext(12, sum(cx)))
            if side == 0:
                for m, k, n, c, e, f in zip(members, ks, ns, cx, es, cf):
                    m.observe_values(t, k, n, f, draft_s, verify_s, c, 0, e, (), 12)
            else:
                planner.observe_members(
                    members, t, ks, ns, cf, draft_s, verify_s, cx, [0] * 12, es,
                    [()] * 12, 0, 0,
                )  # fmt: skip
    (p0, m0), (p1, m1) = twins
    s0, s1 = p0.seqs, p1.seqs
    i0, i1 = [m._slot for m in m0], [m._slot for m in m1]
    assert s0.values[i0].tobytes() == s1.values[i1].tobytes()
    assert s0.counts[i0].tobytes() == s1.counts[i1].tobytes()
    own = [m.sum_n for m in m0[0::3]]
    assert [m.sum_n for m in m0[2::3]] != own  # the confidence members' evidence differs
    assert [m.first_s for m in m0] == [m.first_s for m in m1] != [-1.0] * 12
    assert [m.context_tokens for m in m0] == [m.context_tokens for m in m1]
    for a, b in zip(m0, m1):
        assert a.state() == b.state()
    for name in ("ints", "ring", "wsum"):
        assert getattr(s0, name)[i0].tobytes() == getattr(s1, name)[i1].tobytes()


def test_a_member_with_a_planner_of_its_own_is_observed_one_by_one(monkeypatch):
    """A sequence that once planned alone (``decide``) keeps telling its own planner its
    rounds when a batch planner later drives it: ``observe_members`` then gives every member
    the rows and the solo planner the rounds that each member's own ``observe_values`` gives."""
    monkeypatch.setattr("control.dspark_planner.RECORD_AT_ONCE", 1)
    cfg = DSparkConfig(k_max=6)
    twins = []
    for side in range(2):
        planner = make_planner("dspark", cfg)
        members = [DSparkController(cfg) for _ in range(10)]
        members[3].decide(0.0)  # its own planner, from a batch-1 round
        for r in range(5):
            t = 0.03 * (r + 1)
            ks = [d.k for d in planner.plan(t, members, BatchContext(10, 1000))]
            ns, cx = [min(k, 1) for k in ks], [100 + 10 * i for i in range(10)]
            es = [n + 1 for n in ns]
            if side:
                planner.observe_members(
                    members, t, ks, ns, None, 0.005, 0.02, cx, [0] * 10, es, [()] * 10,
                    sum(ks) + 10, 1000,
                )  # fmt: skip
            else:
                for m, k, n, c, e in zip(members, ks, ns, cx, es):
                    m.observe_values(t, k, n, (), 0.005, 0.02, c, 0, e, (), 10, sum(ks) + 10, 1000)
        twins.append((planner, members))
    (p0, m0), (p1, m1) = twins
    assert m1[3]._solo.rounds == m0[3]._solo.rounds == 5
    assert m1[3]._solo.costs.rounds == m0[3]._solo.costs.rounds == 5
    assert p0.seqs.values[[m._slot for m in m0]].tobytes() == (
        p1.seqs.values[[m._slot for m in m1]].tobytes()
    )


def test_confidence_evidence_is_what_the_confidences_predicted():
    """``acceptance_source = "confidence"``: a round's counts are the expected accepted tokens
    ``Σ_j Π_{i≤j} c_i`` and the chance of a rejection ``1 − Π c_j``, whatever verification
    accepted; the per-position outcome counts (what the planner holds its plans to) are the
    outcomes. For one rate at every position the two evidences agree on the rate."""
    from control.seqstate import expected_outcome

    got, rej = expected_outcome((0.9, 0.5, 0.4))
    assert got == 0.9 + 0.9 * 0.5 + 0.9 * 0.5 * 0.4 and rej == 1.0 - 0.9 * 0.5 * 0.4
    for a, d in ((0.7, 1), (0.7, 5), (0.35, 9)):
        g, r = expected_outcome((a,) * d)
        assert abs(g / (g + r) - a) < 1e-12
    m = DSparkController(DSparkConfig(k_max=6, acceptance_source="confidence"))
    o = DSparkController(DSparkConfig(k_max=6))
    assert m.reads_confidences and not o.reads_confidences
    for c in (m, o):
        c.observe_values(0.02, 3, 0, (0.9, 0.5, 0.4), 0.001, 0.01, 100, 0, 1, ())
    assert (m.sum_n, m.sum_rej) == (got, rej) and (o.sum_n, o.sum_rej) == (0.0, 1.0)
    assert m.counts == o.counts and m.counts[0] == 1  # refused at the first position
