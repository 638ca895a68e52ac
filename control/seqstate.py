"""Per-sequence state of a ``dspark`` batch as arrays (struct of arrays, a slot per member).

A :class:`SeqArrays` holds, for each slot, the numbers the round planner reads
(:mod:`control.dspark_planner`): the forgotten acceptance counts, the TPOT history, α and the
planned length, the start of its first round, its context and its planned survival stop
(one float row, columns ``SUM_N`` … ``SURVIVAL``), its forgetting factors, the per-position
counts since the last full plan, and the rates that plan predicted. A sequence
(:class:`~control.dspark.DSparkController`) holds views of its own rows and updates them in
place when it observes a round, so a plan reads the batch with one gather, never by visiting
each sequence's attributes. A sequence no planner drives lives in a store of its own (one
slot); a planner moves it into its store when it first plans it and back out when it leaves
the batch (:meth:`SeqArrays.adopt`, :meth:`SeqArrays.release`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import njit

#: columns of the float row
SUM_N, SUM_REJ, RECENT_N, RECENT_REJ, DECODE_S, TOKENS, ALPHA, PLANNED, FIRST_S, CONTEXT = range(10)
SURVIVAL = 10  # the survival stop of the planned length (acceptance_source "confidence")
COLUMNS = 11


class SeqArrays:
    """Slots of per-sequence planner state for draft lengths up to ``k_max``."""

    def __init__(self, k_max: int, capacity: int = 1) -> None:
        self.k_max = k_max
        self.capacity = 0
        self.values = np.zeros((0, COLUMNS))
        self.counts = np.zeros((0, 2 * (k_max + 1)))  # see DSparkController.counts
        self.rates = np.zeros((0, k_max))  # the last full plan's per-position rates
        self.has_rates = np.zeros(0, dtype=bool)
        self.decay = np.ones(0)  # each slot's forgetting of SUM_N / SUM_REJ a round
        self.fast = np.ones(0)  # and of RECENT_N / RECENT_REJ
        self.owners = np.empty(0, dtype=object)  # the member in each slot (None: free)
        self.seen = np.zeros(0, dtype=np.int64)  # the last plan that listed each slot
        self.used = np.zeros(0, dtype=bool)  # whether a member holds each slot
        self.free: list[int] = []
        self.tick = 0
        self.adopted = 0  # members moved in from a store of their own (new to the batch)
        self._grow(capacity)

    @classmethod
    def single(cls, k_max: int) -> SeqArrays:
        """A store of one free slot, built directly (a sequence's own: every new controller
        and every member that leaves a batch gets one)."""
        st = cls.__new__(cls)
        st.k_max, st.capacity, st.tick, st.adopted = k_max, 1, 0, 0
        st.values = np.zeros((1, COLUMNS))
        st.counts = np.zeros((1, 2 * (k_max + 1)))
        st.rates = np.zeros((1, k_max))
        st.has_rates = np.zeros(1, dtype=bool)
        st.decay, st.fast = np.ones(1), np.ones(1)
        st.owners, st.free = np.empty(1, dtype=object), [0]
        st.seen = np.zeros(1, dtype=np.int64)
        st.used = np.zeros(1, dtype=bool)
        return st

    def _grow(self, capacity: int) -> None:
        old = self.capacity
        self.values = resized(self.values, capacity)
        self.counts = resized(self.counts, capacity)
        self.rates = resized(self.rates, capacity)
        self.has_rates = resized(self.has_rates, capacity)
        self.decay = resized(self.decay, capacity)
        self.fast = resized(self.fast, capacity)
        self.seen = resized(self.seen, capacity)
        self.used = resized(self.used, capacity)
        self.owners = resized(self.owners, capacity)
        self.free += range(capacity - 1, old - 1, -1)  # lowest slot first
        self.capacity = capacity
        for slot in np.flatnonzero(self.used).tolist():  # row views follow the new arrays
            self.owners[slot]._bind(self, slot)

    def new_slot(self, member: Any, slot: int | None = None) -> int:
        """A zeroed slot for ``member`` (α 1, no planned length, no first round, no predicted
        rates): a free one, or ``slot`` (the member's own, cleared). The member's ``_bind``
        writes its forgetting factors."""
        if slot is None:
            if not self.free:
                self._grow(max(2 * self.capacity, 4))
            slot = self.free.pop()
        self.values[slot] = 0.0
        self.values[slot, ALPHA] = 1.0
        self.values[slot, PLANNED] = -1.0
        self.values[slot, FIRST_S] = -1.0
        self.counts[slot] = 0.0
        self.has_rates[slot] = False
        self.owners[slot] = member
        self.used[slot] = True
        member._bind(self, slot)
        return slot

    def adopt(self, member: Any) -> int:
        """Move ``member``'s rows from the store it is in into a slot of this one."""
        src, old = member._store, member._slot
        self.adopted += 1
        slot = self.new_slot(member)
        self.values[slot] = src.values[old]
        self.counts[slot] = src.counts[old]
        self.has_rates[slot] = src.has_rates[old]
        self.rates[slot] = src.rates[old]
        src.owners[old] = None
        src.used[old] = False
        src.free.append(old)
        return slot

    def slots_of(self, members) -> np.ndarray:
        """The members' slots (adopting any in another store); slots whose member is not
        listed have left the batch and move to a store of their own."""
        self.tick += 1
        idx = np.array([m._slot if m._store is self else self.adopt(m) for m in members], np.intp)
        self.seen[idx] = self.tick
        if len(self.free) + len(idx) < self.capacity:
            for slot in np.flatnonzero(self.used & (self.seen != self.tick)).tolist():
                self.release(slot)
        return idx

    def record(
        self,
        idx: np.ndarray,
        now_s: float,
        drafted: Any,
        accepted: Any,
        emitted: Any,
        draft_s: float,
        verify_s: float,
        context: Any,
        confidences: Any = None,
    ) -> None:
        """One round of the members in slots ``idx`` (their drafted, accepted and emitted
        tokens and contexts, in slot order), recorded at once: for each, what its own
        ``_record`` does with a round (:class:`~control.dspark_goodput.GoodputPolicyController`),
        the same float operations in the same order: the counts forgotten and added to, the
        context, the first round's start, the decode seconds and tokens, and the per-position
        count of a round that drafted. ``confidences`` (each member's, for members whose
        evidence is what their drafter's confidences predicted): the counts take
        :func:`expected_outcome` of a member's confidences where it has some."""
        n = np.asarray(accepted, dtype=np.int64)
        d = np.asarray(drafted, dtype=np.int64)
        got, rej = n.astype(float), (n < d).astype(float)
        if confidences is not None:
            for i, c in enumerate(confidences):
                if c:
                    got[i], rej[i] = expected_outcome(c)
        e = np.asarray(emitted, dtype=float)
        cx = np.asarray(context, dtype=float)
        record_round(self.values, self.counts, self.decay, self.fast, idx, now_s, d, n, e, got, rej, cx, draft_s, verify_s, self.k_max)  # fmt: skip

    def release(self, slot: int) -> None:
        """The member in ``slot`` leaves: its rows go to a store of its own."""
        SeqArrays.single(self.k_max).adopt(self.owners[slot])


@njit(cache=True, error_model="numpy")
def record_round(values, counts, decay, fast, idx, now_s, drafted, accepted, emitted, got, rej, context, draft_s, verify_s, k_max):  # fmt: skip  # pragma: no cover - compiled
    """One round of the members in slots ``idx`` (:meth:`control.seqstate.SeqArrays.record`),
    in place, member by member as each member's own record does it: the counts forgotten and
    added to (``got`` accepted, ``rej`` refused), the context, the first round's start, the
    decode seconds and tokens, and the per-position count of a round that drafted."""
    start = now_s - draft_s - verify_s
    for i in range(idx.shape[0]):
        s = idx[i]
        f, g = decay[s], fast[s]
        values[s, SUM_N] = values[s, SUM_N] * f + got[i]
        values[s, SUM_REJ] = values[s, SUM_REJ] * f + rej[i]
        values[s, RECENT_N] = values[s, RECENT_N] * g + got[i]
        values[s, RECENT_REJ] = values[s, RECENT_REJ] * g + rej[i]
        values[s, CONTEXT] = context[i] + emitted[i]
        if values[s, FIRST_S] < 0.0:
            values[s, FIRST_S] = start
        values[s, DECODE_S] = now_s - values[s, FIRST_S]
        values[s, TOKENS] += emitted[i]
        d, n = drafted[i], accepted[i]
        if d > 0:
            counts[s, n if n < d else k_max + 1 + n] += 1.0


def expected_outcome(confidences: Any) -> tuple[float, float]:
    """``(accepted, rejected)`` a round's confidences predict: ``c_j`` the chance that draft
    position j is accepted given the positions before it were, the expected accepted tokens
    ``Σ_j Π_{i≤j} c_i`` and the chance ``1 − Π_j c_j`` that the round ends in a rejection. For
    one rate a at every position their ratio ``accepted / (accepted + rejected)`` is a for any
    draft length, as the outcome counts' is in expectation."""
    s, got = 1.0, 0.0
    for c in confidences:
        s *= c
        got += s
    return got, 1.0 - s


def resized(a: np.ndarray, capacity: int) -> np.ndarray:
    """``a`` with ``capacity`` rows: its first rows kept, new ones zero (``None`` for objects)."""
    out = (np.empty if a.dtype == object else np.zeros)((capacity, *a.shape[1:]), dtype=a.dtype)
    out[: len(a)] = a[:capacity]
    return out
