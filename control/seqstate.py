"""Per-sequence state of a ``dspark`` batch as arrays (struct of arrays, a slot per member).

A :class:`SeqArrays` holds, for each slot, the numbers the round planner reads
(:mod:`control.dspark_planner`): the forgotten acceptance counts, the TPOT history, α and the
planned length, the start of its first round, its context and its planned survival stop
(one float row, columns ``SUM_N`` … ``SURVIVAL``), its forgetting factors, the per-position
counts since the last full plan, and the rates that plan predicted. A sequence
(:class:`~control.dspark.DSparkController`) holds views of its own rows and updates them in
place when it observes a round, so a plan reads the batch with one gather, never by visiting
each sequence's attributes. A sequence no planner drives lives in a store of its own (one
slot); a planner moves it into its store when it first plans it (:meth:`SeqArrays.adopt`). A
sequence that leaves the batch keeps its slot, untouched, for as long as it lives: the store
holds its members weakly and frees a slot when its member is gone (a finished request the
driver dropped), so a departure costs the planner nothing and a sequence that returns finds
its rows where it left them.
"""

from __future__ import annotations

import weakref
from functools import partial
from typing import Any

import numpy as np
from numba import njit

from control.seqrounds import INT_COLUMNS, ROW_FIELDS, SUMS, WINDOW, observe_rounds

#: columns of the float row
SUM_N, SUM_REJ, RECENT_N, RECENT_REJ, DECODE_S, TOKENS, ALPHA, PLANNED, FIRST_S, CONTEXT = range(10)
SURVIVAL = 10  # the survival stop of the planned length (acceptance_source "confidence")
TTFT = 11  # the request's time to first token (NaN until the driver tells it)
SOLO = 12  # 1 when the sequence keeps a planner of its own (it once planned alone)
READS = 13  # 1 when the sequence's evidence is what its drafter's confidences predicted
COLUMNS = 14


def layout(k_max: int, window: int) -> dict[str, tuple[tuple[int, ...], Any]]:
    """Each array of a :class:`SeqArrays`: its shape per slot and its dtype (objects start
    None, everything else 0; a member's ``_bind`` writes its own constants, its ``_views``
    takes views of rows the store moved or reallocated)."""
    return {
        "values": ((COLUMNS,), float),  # the float row (columns above)
        "counts": ((2 * (k_max + 1),), float),  # see DSparkController.counts
        "rates": ((k_max,), float),  # the last full plan's per-position rates
        "has_rates": ((), bool),
        "decay": ((), float),  # each slot's forgetting of SUM_N / SUM_REJ a round
        "fast": ((), float),  # and of RECENT_N / RECENT_REJ
        "owners": ((), object),  # a weak reference to each slot's member
        "seen": ((), np.int64),  # the last listing (slots_of) of each slot
        "used": ((), bool),  # whether a member holds each slot
        # each member's window, retry cap and blocks (control.seqrounds): its integer row, its
        # ring of recent rounds (as wide as the widest window so far) and the ring's sums
        "ints": ((INT_COLUMNS,), np.int64),
        "ring": ((window, ROW_FIELDS), float),
        "wsum": ((SUMS,), float),
        # the hand-outs (control.handout): each slot's decision as last taken, its k, the
        # decision last handed out and the length it was cut to, and whether the member's
        # decision may have changed since it was taken (new, rebuilt, a one-round block end)
        "base": ((), object),
        "base_k": ((), np.int64),
        "out": ((), object),
        "out_x": ((), np.int64),
        "dirty": ((), bool),
    }


class SeqArrays:
    """Slots of per-sequence planner state for draft lengths up to ``k_max``."""

    # the arrays of layout(), one row per slot (declared for the type checker)
    values: np.ndarray
    counts: np.ndarray
    rates: np.ndarray
    has_rates: np.ndarray
    decay: np.ndarray
    fast: np.ndarray
    owners: np.ndarray
    seen: np.ndarray
    used: np.ndarray
    ints: np.ndarray
    ring: np.ndarray
    wsum: np.ndarray
    base: np.ndarray
    base_k: np.ndarray
    out: np.ndarray
    out_x: np.ndarray
    dirty: np.ndarray

    def __init__(self, k_max: int, capacity: int = 1) -> None:
        self._allocate(k_max, 0, 1)
        self._grow(capacity)

    @classmethod
    def single(cls, k_max: int, window: int = 1) -> SeqArrays:
        """A store of one free slot with a ring of ``window`` rounds, built directly (a
        sequence's own: every new controller gets one)."""
        st = cls.__new__(cls)
        st._allocate(k_max, 1, window)
        st.free = [0]
        return st

    def _allocate(self, k_max: int, capacity: int, window: int) -> None:
        """Every array of :func:`layout` with ``capacity`` slots, none taken."""
        self.k_max, self.capacity = k_max, capacity
        for name, (shape, dtype) in layout(k_max, window).items():
            full = (capacity, *shape)
            setattr(self, name, np.empty(full, dtype) if dtype is object else np.zeros(full, dtype))
        self.free: list[int] = []
        self.tick = 0  # listings so far
        self.adopted = 0  # members moved in from a store of their own (new to the batch)

    def _grow(self, capacity: int) -> None:
        old = self.capacity
        for name in layout(0, 0):
            setattr(self, name, resized(getattr(self, name), capacity))
        self.free += range(capacity - 1, old - 1, -1)  # lowest slot first
        self.capacity = capacity
        self._rebind()

    def _rebind(self) -> None:
        """Every member's row views onto the store's arrays (after they were reallocated)."""
        for slot in np.flatnonzero(self.used).tolist():
            member = self.owners[slot]()
            if member is not None:
                member._views(self, slot)

    def _gone(self, slot: int, ref: Any) -> None:
        """The member in ``slot`` is gone (its weak reference ``ref`` died): a free slot."""
        if self.owners[slot] is ref:
            self.owners[slot] = None
            self.used[slot] = False
            self.free.append(slot)

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
        self.values[slot, TTFT] = np.nan
        self.counts[slot] = 0.0
        self.has_rates[slot] = False
        self.owners[slot] = weakref.ref(member, partial(self._gone, slot))
        self.used[slot] = True
        self.ints[slot] = 0
        self.ring[slot] = 0.0
        self.wsum[slot] = 0.0
        self.dirty[slot] = True
        member._bind(self, slot)
        return slot

    def widen(self, window: int) -> None:
        """Rings of at least ``window`` rounds (a member's window wider than any so far)."""
        if window > self.ring.shape[1]:
            ring = np.zeros((self.capacity, window, ROW_FIELDS))
            ring[:, : self.ring.shape[1]] = self.ring
            self.ring = ring
            self._rebind()

    def adopt(self, member: Any) -> int:
        """Move ``member``'s rows from the store it is in into a slot of this one."""
        src, old = member._store, member._slot
        self.adopted += 1
        if not self.free:
            self._grow(max(2 * self.capacity, 4))
        slot = self.free.pop()
        self.values[slot] = src.values[old]
        self.counts[slot] = src.counts[old]
        self.has_rates[slot] = src.has_rates[old]
        self.rates[slot] = src.rates[old]
        self.ints[slot] = src.ints[old]
        self.widen(src.ints[old, WINDOW])
        w = src.ints[old, WINDOW]  # the ring's rounds past the window are never read
        self.ring[slot, :w] = src.ring[old, :w]
        self.wsum[slot] = src.wsum[old]
        self.decay[slot], self.fast[slot] = src.decay[old], src.fast[old]
        self.dirty[slot] = True
        self.seen[slot] = self.tick
        self.owners[slot] = weakref.ref(member, partial(self._gone, slot))
        self.used[slot] = True
        src.owners[old] = None
        src.used[old] = False
        src.free.append(old)
        member._views(self, slot)  # its constants came with its rows
        return slot

    def slots_of(self, members) -> np.ndarray:
        """The members' slots, adopting any in another store; a member back after missing a
        listing counts as new to the batch (``adopted``), as one adopted now does."""
        self.tick += 1
        idx = np.array([m._slot if m._store is self else self.adopt(m) for m in members], np.intp)
        self.adopted += int(np.count_nonzero(self.seen[idx] < self.tick - 1))
        self.seen[idx] = self.tick
        return idx

    def __getstate__(self) -> dict[str, Any]:  # weak references do not pickle
        state = dict(self.__dict__)
        state["owners"] = np.array([None if r is None else r() for r in self.owners], object)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        owners = self.owners
        self.owners = np.empty(len(owners), dtype=object)
        for slot, member in enumerate(owners.tolist()):
            if member is not None:
                self.owners[slot] = weakref.ref(member, partial(self._gone, slot))

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
        lossy: Any = None,
        sentence_ends: Any = None,
    ) -> np.ndarray:
        """One round of the members in slots ``idx`` (their drafted, accepted and emitted
        tokens and contexts, in slot order), recorded at once: for each, what its own
        ``_record`` does with a round (:class:`~control.dspark_goodput.GoodputPolicyController`),
        the same float operations in the same order: the counts forgotten and added to, the
        context, the first round's start, the decode seconds and tokens, and the per-position
        count of a round that drafted. ``confidences`` (each member's, for members whose
        evidence is what their drafter's confidences predicted): the counts take
        :func:`expected_outcome` of a member's confidences where it has some. Then what each
        member's ``_observed`` does with the round (its window, retry cap and blocks:
        :func:`control.seqrounds.observe_rounds`, with its lossy accepts and sentence ends);
        returns each member's event (0: nothing left to do in Python)."""
        size = len(idx)
        n, d = int_array(accepted, size), int_array(drafted, size)
        got = rej = _NONE
        if confidences is not None:
            got, rej = n.astype(float), (n < d).astype(float)
            for i, c in enumerate(confidences):
                if c:
                    got[i], rej[i] = expected_outcome(c)
        e, cx = int_array(emitted, size), int_array(context, size)
        # (lossy accepts and sentence ends are rare: all-zero columns are not converted)
        lo = int_array(lossy, size) if lossy is not None and not all_zero(lossy, 0) else np.zeros(size, np.int64)  # fmt: skip
        has = sentence_ends is not None and not all_zero(sentence_ends, ())
        ends = np.fromiter(map(bool, sentence_ends), bool, size) if has else np.zeros(size, bool)  # fmt: skip
        events = np.empty(size, dtype=np.int64)
        record_round(self.values, self.counts, self.decay, self.fast, self.ints, self.ring, self.wsum, idx, now_s, d, n, e, got, rej, cx, lo, ends, draft_s, verify_s, self.k_max, events)  # fmt: skip
        return events


_NONE = np.zeros(0)  # no per-member evidence given: record_round counts the outcomes


def int_array(x: Any, size: int) -> np.ndarray:
    """``x`` (``size`` integers: a driver's list, or an array) as an int64 array."""
    if isinstance(x, np.ndarray):
        return x.astype(np.int64, copy=False)
    return np.fromiter(x, np.int64, size)


def all_zero(x: Any, zero: Any) -> bool:
    """Whether every item of ``x`` is falsy (a list counted against ``zero``, the drivers'
    empty item, in one C call; anything else item by item)."""
    if isinstance(x, list) and x.count(zero) == len(x):
        return True
    return not any(x)


@njit(cache=True, error_model="numpy")
def record_round(values, counts, decay, fast, ints, ring, wsum, idx, now_s, drafted, accepted, emitted, got, rej, context, lossy, has_ends, draft_s, verify_s, k_max, events):  # fmt: skip  # pragma: no cover - compiled
    """One round of the members in slots ``idx`` (:meth:`control.seqstate.SeqArrays.record`),
    in place, member by member as each member's own record does it: the counts forgotten and
    added to (``got`` accepted and ``rej`` refused where given, else the round's outcome), the
    context, the first round's start, the decode seconds and tokens, and the per-position count
    of a round that drafted; then each member's window, retry cap and blocks
    (:func:`control.seqrounds.observe_rounds`, its events into ``events``)."""
    start = now_s - draft_s - verify_s
    given = got.shape[0] > 0
    for i in range(idx.shape[0]):
        s = idx[i]
        d, n = drafted[i], accepted[i]
        if given:
            a, r = got[i], rej[i]
        else:
            a, r = float(n), 1.0 if n < d else 0.0
        f, g = decay[s], fast[s]
        values[s, SUM_N] = values[s, SUM_N] * f + a
        values[s, SUM_REJ] = values[s, SUM_REJ] * f + r
        values[s, RECENT_N] = values[s, RECENT_N] * g + a
        values[s, RECENT_REJ] = values[s, RECENT_REJ] * g + r
        values[s, CONTEXT] = context[i] + emitted[i]
        if values[s, FIRST_S] < 0.0:
            values[s, FIRST_S] = start
        values[s, DECODE_S] = now_s - values[s, FIRST_S]
        values[s, TOKENS] += emitted[i]
        if d > 0:
            counts[s, n if n < d else k_max + 1 + n] += 1.0
    observe_rounds(ints, ring, wsum, idx, now_s, drafted, accepted, emitted, lossy, has_ends, draft_s, draft_s + verify_s, events)  # fmt: skip


@njit(cache=True, error_model="numpy")
def any_set(values, idx, col):  # pragma: no cover - compiled
    """Whether column ``col`` of any slot in ``idx`` is nonzero (a flag: ``SOLO``, ``READS``)."""
    for i in range(idx.shape[0]):
        if values[idx[i], col] != 0.0:
            return True
    return False


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
