"""What a ``dspark`` sequence does with each round besides its evidence, kept in arrays: its
window of recent rounds, its retry cap's cool-down and its blocks (:mod:`control.dspark_base`
describes them), a slot per sequence in the batch's :class:`~control.seqstate.SeqArrays`.

A round is recorded for a whole batch in one compiled call (:func:`observe_rounds`), exactly as
each sequence's own ``_observed`` records it; only a sequence whose round may close a block
(its sentence ends to read, :meth:`control.blocks.BlockPlanner._close`) or whose decision
changed (a cool-down started or ended) is visited in Python afterwards.

- **Window** (:class:`SlotWindow`): a ring of the last ``W`` rounds per slot, fields
  ``(n, rej, drafted, emitted, draft_s, round_s, lossy, now_s)``, with running sums
  ``s += new − old`` whose float sums are recomputed (summed in ring order) each time the ring
  wraps: the rule :class:`~control.window.RoundWindow` follows lazily, so both give the same
  â, TPOT and lossy share bit for bit.
- **Retry cap**: ``fails`` fruitless drafting rounds in a row start a cool-down of
  ``cooldown_rounds`` rounds (``retry_cap``), counted down one a round.
- **Blocks** (:class:`SlotBlocks`): a :class:`~control.blocks.BlockPlanner` whose counts live
  in the slot; the compiled call does its common case (no block can close this round).
"""

from __future__ import annotations

from typing import Any

from numba import njit

from control.blocks import BlockPlanner

#: columns of a slot's integer row: the state ...
ROUNDS, FAILS, COOLDOWN, COOLDOWNS, PUSHES = range(5)
IN_BLOCK, TOTAL, CLOSED, LAST_BOUNDARY = range(5, 9)
#: ... and the member's constants, written when it binds to a slot
WINDOW, BLOCK, SNAP_FROM, RETRY, RETRY_CAP, COOLDOWN_ROUNDS = range(9, 15)
INT_COLUMNS = 15
#: fields of a window row, and of the window's sums (the first seven)
N, REJ, DRAFTED, EMITTED, DRAFT_S, ROUND_S, LOSSY, NOW_S = range(8)
ROW_FIELDS = 8
SUMS = 7
#: bits of a member's event after a round (:func:`observe_rounds`)
CHANGED, MAY_CLOSE = 1, 2


def bind_constants(row: Any, config: Any, retry: bool) -> None:
    """Write a member's constants into its slot's integer row ``row``: its window size, block
    size and snap point (as :class:`~control.blocks.BlockPlanner` derives them), whether
    fruitless rounds lead to a cool-down, the retry cap and the cool-down's length."""
    b = (
        config.block_tokens
        if config.span_tokens <= 0
        else min(config.block_tokens, config.span_tokens)
    )
    row[WINDOW] = config.window_rounds
    row[BLOCK] = b
    row[SNAP_FROM] = max(1, b - config.snap_tokens)
    row[RETRY] = 1 if retry else 0
    row[RETRY_CAP] = config.retry_cap
    row[COOLDOWN_ROUNDS] = config.cooldown_rounds


class SlotWindow:
    """The window of the sequence in ``slot`` of ``store`` (read-only here; rounds are pushed
    by :func:`observe_rounds`): what :class:`~control.window.RoundWindow` answers."""

    __slots__ = ("_ints", "_ring", "_sums")

    def __init__(self, store: Any, slot: int, ints: Any = None) -> None:
        # Python ints in and out (``ints``: the slot's integer row as a memoryview, if at hand)
        self._ints: Any = memoryview(store.ints[slot]) if ints is None else ints
        self._ring = store.ring[slot]
        self._sums: Any = memoryview(store.wsum[slot])

    @property
    def count(self) -> int:
        return min(self._ints[PUSHES], self._ints[WINDOW])

    def clear(self) -> None:
        """Forget every round (the slot's ring and sums; its constants stay)."""
        self._ints[PUSHES] = 0
        self._ring[:] = 0.0
        for j in range(SUMS):
            self._sums[j] = 0.0

    def a_hat(self) -> float | None:
        """â = Σn / (Σn + rejections) over the window; None when no token was verified."""
        s = self._sums
        trials = s[N] + s[REJ]
        return None if trials == 0 else s[N] / trials

    def tpot_s(self) -> float | None:
        """Seconds of draft + verify per emitted token over the window; None without data."""
        s = self._sums
        return None if s[EMITTED] <= 0 or s[ROUND_S] <= 0.0 else s[ROUND_S] / s[EMITTED]

    def wall_tpot_s(self) -> float | None:
        """Wall-clock seconds per emitted token from the end of the window's oldest round to
        the end of its newest, over the tokens of the rounds after the oldest."""
        count = self.count
        if count < 2:
            return None
        p, w = self._ints[PUSHES], self._ints[WINDOW]
        old, new = self._ring[(p - count) % w], self._ring[(p - 1) % w]
        tokens = self._sums[EMITTED] - float(old[EMITTED])
        span = float(new[NOW_S] - old[NOW_S])
        return None if tokens <= 0 or span <= 0.0 else span / tokens

    def lossy_fraction(self) -> float:
        """Accepted tokens that strict verification would have refused / accepted tokens."""
        s = self._sums
        return s[LOSSY] / s[N] if s[N] > 0 else 0.0


def row_property(view: str, j: int, doc: str = "") -> property:
    """A number kept in column ``j`` of the slot row held in attribute ``view`` (a memoryview:
    Python numbers in and out), read and written in place."""

    def get(self: Any) -> Any:
        return getattr(self, view)[j]

    def put(self: Any, value: Any) -> None:
        getattr(self, view)[j] = value

    return property(get, put, doc=doc)


class SlotBlocks(BlockPlanner):
    """A :class:`~control.blocks.BlockPlanner` whose counts live in a slot's integer row."""

    __slots__ = ("_ints",)
    tokens_in_block = row_property("_ints", IN_BLOCK)
    total_tokens = row_property("_ints", TOTAL)
    blocks_closed = row_property("_ints", CLOSED)
    last_boundary = row_property("_ints", LAST_BOUNDARY)
    block_tokens = property(lambda self: self._ints[BLOCK])
    snap_from = property(lambda self: self._ints[SNAP_FROM])

    def __init__(self, store: Any, slot: int, ints: Any = None) -> None:
        self._ints = memoryview(store.ints[slot]) if ints is None else ints


@njit(cache=True, error_model="numpy")
def observe_rounds(ints, ring, wsum, idx, now_s, drafted, accepted, emitted, lossy, has_ends, draft_s, round_s, events):  # fmt: skip  # pragma: no cover - compiled
    """One round of the members in slots ``idx`` (their drafted, accepted and emitted tokens,
    lossy accepts and whether the round holds a sentence end, in slot order), as each
    member's ``_observed`` does it (:func:`observe_slot`); ``events[i]``: member i's event."""
    for i in range(idx.shape[0]):
        events[i] = observe_slot(ints, ring, wsum, idx[i], now_s, drafted[i], accepted[i], emitted[i], lossy[i], has_ends[i], draft_s, round_s)  # fmt: skip


@njit(cache=True, error_model="numpy")
def observe_slot(ints, ring, wsum, s, now_s, d, n, e, lo, has_ends, draft_s, round_s):  # fmt: skip  # pragma: no cover - compiled
    """One round of the member in slot ``s`` as its ``_observed`` does it: the window's push,
    the round count, the retry cap, and the blocks where none can close. Its event:
    ``CHANGED`` when its decision changed (a cool-down started or ended), ``MAY_CLOSE`` when its
    round may close a block (left to :meth:`~control.blocks.BlockPlanner._close`, its counts
    untouched here)."""
    # the window: ring slot j takes the round, the sums move by new - old
    w, p = ints[s, WINDOW], ints[s, PUSHES]
    j = p % w
    rej = 1.0 if n < d else 0.0
    if p >= w:
        o = ring[s, j]
        wsum[s, N] += n - o[N]
        wsum[s, REJ] += rej - o[REJ]
        wsum[s, DRAFTED] += d - o[DRAFTED]
        wsum[s, EMITTED] += e - o[EMITTED]
        wsum[s, LOSSY] += lo - o[LOSSY]
        wsum[s, DRAFT_S] += draft_s - o[DRAFT_S]
        wsum[s, ROUND_S] += round_s - o[ROUND_S]
    else:
        wsum[s, N] += n
        wsum[s, REJ] += rej
        wsum[s, DRAFTED] += d
        wsum[s, EMITTED] += e
        wsum[s, LOSSY] += lo
        wsum[s, DRAFT_S] += draft_s - 0.0
        wsum[s, ROUND_S] += round_s - 0.0
    r = ring[s, j]
    r[N], r[REJ], r[DRAFTED], r[EMITTED] = n, rej, d, e
    r[DRAFT_S], r[ROUND_S], r[LOSSY], r[NOW_S] = draft_s, round_s, lo, now_s
    p += 1
    ints[s, PUSHES] = p
    if p % w == 0:  # the ring wrapped: its float sums summed afresh, in ring order
        a = 0.0
        b = 0.0
        for q in range(w):
            a += ring[s, q, DRAFT_S]
            b += ring[s, q, ROUND_S]
        wsum[s, DRAFT_S] = a
        wsum[s, ROUND_S] = b
    # the round count and the retry cap
    ints[s, ROUNDS] += 1
    ev = 0
    if ints[s, COOLDOWN]:
        ints[s, COOLDOWN] -= 1
        if ints[s, COOLDOWN] == 0:
            ev = CHANGED
    elif d and ints[s, RETRY]:
        if n:
            ints[s, FAILS] = 0
        else:
            ints[s, FAILS] += 1
            if ints[s, FAILS] >= ints[s, RETRY_CAP]:
                ints[s, FAILS] = 0
                ints[s, COOLDOWN] = ints[s, COOLDOWN_ROUNDS]
                ints[s, COOLDOWNS] += 1
                ev = CHANGED
    # the blocks: BlockPlanner.feed's common case
    t = ints[s, IN_BLOCK] + e
    if t < ints[s, SNAP_FROM] or (t < ints[s, BLOCK] and not has_ends):
        ints[s, IN_BLOCK] = t
        ints[s, TOTAL] += e
    else:
        ev |= MAY_CLOSE
    return ev


def observe_one(store: Any, slot: int, now_s, drafted, n, draft_s, round_s, lossy, e, ends) -> int:
    """:func:`observe_slot` for the one sequence in ``slot``; its event."""
    return observe_slot(store.ints, store.ring, store.wsum, slot, now_s, drafted, n, e, lossy, bool(ends), draft_s, round_s)  # fmt: skip
